"""The museum's table: real bugs of decoder code that shipped in a release on the package
registry, each rebuilt in that release's own wheel beside its first fixed release (the control).

One row per bug (a bug that shipped in several model classes may have a row per class it is
rebuilt in; `ref` says when rows share one). Every row names:
- `buggy`, `fixed`: the requirements of the two environments (pinned, name==X), built by
  tests/releases.py over the project's venv;
- `ref`: the public issue or pull request that reports it, `fix`: what fixed it;
- `builder`: the function of builders.py that makes the tiny model, in either release;
- `symptom`, `args`: the function of symptoms.py that measures the bug without the gate, and its
  arguments; the buggy release must measure more than `threshold`, the fixed one at most
  `tolerance` (float32 rounding);
- `check`: the gate's check that should catch it through the plain call (`da.audit(model)`,
  or `decoder-audit verify --hf DIR` when `via` says so);
- `today`: what that call does on the buggy release now: "caught" (the check fails), "missed"
  (the check passes or is skipped) or "crash" (the gate raises); `pending` names the gate work
  that turns a miss or crash into a catch, so the row is flipped when it lands;
- `control`: what the call does on the fixed release: "pass", or "crash" where the gate itself
  fails on that release (pending work again); `standing` lists checks the control fails for a
  reason that is not this bug and is the same in both releases (said in `note`).

Nothing here imports torch or a release's library: the table is read by the runner, the docs
and the default test suite alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TODAY = ("caught", "missed", "crash")
CONTROL = ("pass", "crash")
VIA = ("audit", "verify --hf")
FLOOR = (4, 45)  # pyproject's transformers>=4.45


@dataclass(frozen=True)
class Entry:
    id: str
    library: str
    buggy: tuple[str, ...]
    fixed: tuple[str, ...]
    ref: str
    fix: str
    summary: str
    builder: str
    symptom: str
    check: str
    today: str
    args: dict = field(default_factory=dict)
    threshold: float = 1e-4
    tolerance: float = 1e-5
    pending: str = ""
    control: str = "pass"
    standing: tuple[str, ...] = ()
    audit: dict = field(default_factory=dict)
    via: str = "audit"
    note: str = ""

    @property
    def buggy_version(self) -> str:
        return _version_of(self.buggy, self.library)

    @property
    def fixed_version(self) -> str:
        return _version_of(self.fixed, self.library)

    @property
    def below_floor(self) -> bool:
        """A transformers release older than the project's declared floor."""
        if self.library != "transformers":
            return False
        return tuple(int(p) for p in self.buggy_version.split(".")[:2]) < FLOOR


def _version_of(requirements: tuple[str, ...], library: str) -> str:
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        if name == library:
            return version
    raise ValueError(f"{requirements!r} pins no release of {library}")


PENDING_WINDOW = "window liveness (issue 32, part 3)"
PENDING_LOSS = "model_loss through shift_labels and num_items_in_batch (issue 32, part 3)"
PENDING_PACKING = "packing on position-ids-only rows (issue 32, part 3)"
PENDING_CACHES = "kv_cache through caches the caller builds (issue 32, part 3)"
PENDING_PATHS = "the paths a model is already on: checkpointing, dtype (issue 32, part 3)"
PENDING_RANGE = "the gate on transformers < 4.51 (issue 32, part 2: branch range)"

ROFORMER_FAMILY = ("the BERT-style classes built as decoders (is_decoder=True) drop the causal "
                   "mask when the attention-mask code moved to masking_utils")

ENTRIES: tuple[Entry, ...] = (
    Entry("roformer-future", "transformers", ("transformers==5.17.0",), ("transformers==5.18.0",),
          ref="huggingface/transformers#48745", fix="5.18.0 (fix of #48745)",
          summary=f"RoFormerForCausalLM attends to future tokens: {ROFORMER_FAMILY}",
          builder="roformer_decoder", symptom="future_leak", check="causal", today="caught"),
    Entry("megatron-bert-future", "transformers", ("transformers==5.9.0",),
          ("transformers==5.18.0",),
          ref="huggingface/transformers#48745", fix="5.18.0 (fix of #48745)",
          summary=f"MegatronBertForCausalLM attends to future tokens (the first release with "
                  f"the bug): {ROFORMER_FAMILY}",
          builder="megatron_bert_decoder", symptom="future_leak", check="causal",
          today="caught"),
    Entry("x-transformers-qk-norm-scale", "x-transformers", ("x-transformers==2.25.4",),
          ("x-transformers==2.25.5",),
          ref="lucidrains/x-transformers#352", fix="2.25.5",
          summary="attn_qk_norm_dim_scale=True creates the per-head, per-dimension q/k scales "
                  "but the forward never multiplies by them (2.17.1 to 2.25.4): they never "
                  "receive a gradient",
          builder="x_transformers_qk_norm_dim_scale", symptom="dead_gradients",
          check="dead_parameters", today="caught", threshold=0.5, tolerance=0.0,
          audit={"vocab_size": 96}, standing=("inputs",),
          note="every x-transformers release accepts float ids and runs them (inputs), a "
               "standing finding of tests/gate/test_outside_libraries.py"),
)

BY_ID: dict[str, Entry] = {entry.id: entry for entry in ENTRIES}

# Bugs looked at and not rebuilt: (ref, why).
NOT_REBUILT: tuple[tuple[str, str], ...] = ()
