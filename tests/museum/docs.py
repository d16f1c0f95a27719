"""docs/museum.md, written from the table (entries.py) alone, so a test can hold the page to
the table without running the museum: `python -m tests.museum --write-docs` rewrites it."""

from __future__ import annotations

from pathlib import Path

from .entries import ENTRIES, TODAY, Entry
from .not_rebuilt import NOT_REBUILT

PAGE = Path(__file__).resolve().parents[2] / "docs" / "museum.md"

SYMPTOM_WORDS = {
    "future_leak": "a future token moves an earlier logit",
    "window_read": "the last position reads token 0, outside its declared window",
    "cached_vs_full": "cached decoding differs from the full forward",
    "loss_with_items": "the loss ignores num_items_in_batch (sum / N)",
    "loss_with_shift_labels": "the loss ignores shift_labels",
    "loss_with_labels": "the labels= loss differs from next-token cross entropy",
    "dead_gradients": "parameters that never receive a gradient",
    "full_layer_windowed": "a layer declared full attention cannot read token 0",
    "forward_raises": "the plain forward raises on an input within the declared length",
    "packed_leak": "a packed document reads the one before it",
    "softcap_dropped": "the default attention path differs from the soft-capped one",
    "litgpt_cached_vs_full": "cached decoding differs from the full forward",
    "lens_cached_vs_full": "cached decoding differs from the full forward",
    "attention_vs_definition": "the first attention layer's output differs from causal "
                               "softmax(q k^T / sqrt(d)) v of its own projections",
    "routed_outside_groups": "tokens routed to experts outside the groups their scores "
                             "choose (share of choices)",
    "checkpoint_readout_bias": "a checkpoint's readout bias (lm_head.bias) is missing from "
                               "the loaded model's logits",
    "rotary_vs_declared": "the rotary tables differ from RoPE over the checkpoint's declared "
                          "rotary_dim",
    "padded_cached_vs_alone": "a left-padded row decoded through the cache differs from the "
                              "row alone",
    "aux_loss_gradient": "the load-balancing loss's gradient on the routers' weights differs "
                         "from its definition's (relative)",
}

INTRO = """# The museum: real released bugs, rebuilt

Each row is a bug of decoder code that shipped in a release on the package registry, rebuilt
at a tiny random-init config (hidden 32, 1-2 layers, V = 96) in that release's own wheel, on
CPU, beside its first fixed release as the control. For each row the museum

1. measures the symptom directly, without the gate (tests/museum/symptoms.py: the figure must
   exceed the row's threshold on the buggy release and stay at float32 rounding on the fixed
   one);
2. audits the model with the call a user makes (`da.audit(model)`, or `decoder-audit verify
   --hf DIR` on its save_pretrained folder where the row says so);
3. holds both to the table: the expected check fails on the buggy release as *today* says, and
   the control passes.

*today* is what the plain call does on the buggy release now: **caught** (the check fails),
**missed** (it passes or is skipped: the pending gate work named in the row turns it into a
catch), **both** (it fails on the buggy release and on the control alike, so it tells them
apart by nothing) or **crash** (the gate itself raises). Rows whose buggy release is older than the
declared floor (transformers 4.45) are marked *below floor*.

Rerun (builds each release's environment once into `.release-envs/`, then runs every row on
both releases):

    .ci/museum                                            # or:
    DA_MUSEUM=1 python -m pytest tests/museum -q
    python -m tests.museum --only ROW_ID                  # one row, its records printed

This page is written by `python -m tests.museum --write-docs` from `tests/museum/entries.py`;
tests/test_museum_table.py holds it to the table.
"""


TRIAL_INTRO = """## With the pending gate work tried

For these rows the gate work their *pending* names was tried in a local copy (not merged); with
it, the plain call did this:"""


def _row(entry: Entry) -> str:
    versions = f"{entry.buggy_version} → {entry.fixed_version}"
    if entry.below_floor:
        versions += " (below floor)"
    today = entry.today if not entry.pending else f"{entry.today} (pending: {entry.pending})"
    if entry.control != "pass":
        today += f"; control: {entry.control}"
    cells = [f"`{entry.id}`", entry.library, versions, entry.ref, entry.summary,
             SYMPTOM_WORDS[entry.symptom], f"`{entry.check}`", today]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _tally() -> str:
    """How many rows' buggy release the plain call fails with the expected check."""
    counts = {kind: sum(e.today == kind for e in ENTRIES) for kind in TODAY}
    said = ", ".join(f"{counts[kind]} {kind}" for kind in TODAY if counts[kind])
    return (f"The plain call fails the expected check on the buggy release in "
            f"{counts['caught'] + counts['both']} of {len(ENTRIES)} rows ({said}).")


def render() -> str:
    header = ("| id | library | buggy → fixed | ref | bug | symptom (measured without the gate) "
              "| check | today |\n|---|---|---|---|---|---|---|---|")
    rows = "\n".join(_row(e) for e in ENTRIES)
    notes = "\n".join(f"- `{e.id}`: {e.note}" for e in ENTRIES if e.note)
    trials = "\n".join(f"- `{e.id}`: {e.trial}" for e in ENTRIES if e.trial)
    refs = len({e.ref for e in ENTRIES})
    missing = "\n".join(f"- {ref}: {why}" for ref, why in NOT_REBUILT)
    return (f"{INTRO}\n## The rows ({len(ENTRIES)} rows, {refs} distinct references)\n\n"
            f"{_tally()}\n\n{header}\n{rows}\n\n## Notes\n\n{notes}\n\n"
            + (f"{TRIAL_INTRO}\n\n{trials}\n\n" if trials else "") +
            f"## Looked at and not rebuilt\n\n{missing}\n")
