"""`ModelFacts`: what the gate knows about a model before it checks anything, decided once.

    facts = model_facts(model, vocab_size=V, max_seq_len=T)   # the plain call's facts
    report = audit(model, facts=facts)                         # the same facts, not decided again
    report.facts                                               # and the report says what they were

A fact comes from one of three places, and `facts.origin[name]` says which:
  "config"        the model's own `DecoderConfig` (`model.config`): our Decoder, or a module
                  built to its layout; every fact it holds is the model's, so an argument that
                  disagrees is a ConfigError naming both values;
  "hugging face"  a transformers model's config and structure (`references.hf_models`): V and the
                  input vocabulary from its embeddings (an argument that disagrees is a
                  ConfigError), the pad id from its config, and the length policy: a learned
                  position table is a hard limit, anything else has none. Both are read by
                  inference, so an explicit max_seq_len or pad_token_id wins;
  "argument"      what the caller said (`audit(model, vocab_size=...)`, `--vocab-size`);
  "default"       nothing said: no max_seq_len, the intervention length 64, no pad id.

White-box means a `DecoderConfig` and every weight name a `Decoder` of that config has; a module
with a DecoderConfig but other names (the torch.nn twin, say) is a black box whose V and
max_seq_len come from its config. Some facts are found by calling the model, once, before the
checks (runner.py): where its attention patterns can be read, whether its cache can be stepped,
whether d loss / d input can be taken. `reference` names the float64 oracle's way into the model's
weights: "decoder" (our names), "spec" (a declared architecture, `spec=`, the config of a
Hugging Face class whose config is read as a spec, or the config a peer library's model carries,
`references.peer_configs`, with the module's weights placed on its names by
`references.layouts`; a peer's config with an option no spec expresses is "spec" with no spec, so
params and oracle fail naming it), or None with `reference_reason`.

The facts every check's `needs` (registry.py) are read from are the properties at the end.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..config import DecoderConfig
from ..errors import ConfigError
from ..generation.convention import Convention, convention
from .sharding import class_name, local, on_every_rank
from .wrappers import adapter_update, forwarded_to, is_fsdp, unwrapped

# The forms a packed row is sent in (gate/checks/packing.py says what each sends).
PACK_FORMS = ("document_ids", "4d_mask", "position_ids", "flash_kwargs")

# Causal and prefix interventions run at most this long by default (batched cuts cost
# (cuts + 1) * T tokens; GPT-2 small at T=1024 would take minutes on a laptop CPU).
DEFAULT_INTERVENTION_LEN = 64


@dataclass(frozen=True)
class TrainingPath:
    """How a training run will call the model (given by the trainer, or by a caller who says
    how they train): the gate audits that path too (train_mode, autocast, the shape probe)."""

    batch_size: int
    """Rows per forward: the global batch over ranks and micro-batches."""
    seq_len: int
    """T of a training row."""
    precision: str = "fp32"
    """"fp32", or "bf16" / "fp16": the forward runs under torch.autocast(bfloat16 / float16)."""
    checkpointing: bool = False
    """Activation checkpointing on (`gradient_checkpointing_enable()`)."""
    pack: bool = False
    """Several documents packed into each row (through the model's packing interface)."""
    pack_form: str | None = None
    """The one form the trainer sends packed rows in (gate.packing.FORMS: "document_ids",
    "4d_mask", "position_ids", "flash_kwargs"), or None: every form the model takes is checked.
    A module of its own declares a position_ids interface this way."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"training {name}={value!r} must be a positive integer")
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"training precision={self.precision!r} is not 'fp32', 'bf16' or "
                              "'fp16'")
        if self.pack_form is not None:
            if self.pack_form not in PACK_FORMS:
                raise ConfigError(f"training pack_form={self.pack_form!r} is not one of "
                                  f"{list(PACK_FORMS)}")
            if not self.pack:
                raise ConfigError(f"training pack_form={self.pack_form!r} needs pack=True")


@dataclass(frozen=True)
class ModelFacts:
    """The facts of one model under audit (see the module docstring). Frozen: decided once."""

    model: str
    """The model's class name."""
    vocab_size: int
    """V: the last axis of the logits."""
    input_vocab_size: int
    """Ids the input embedding accepts, [0, input_vocab_size): V unless the model reads more."""
    max_seq_len: int | None
    """A hard length limit the model enforces (max_seq_len + 1 tokens must be rejected), or None."""
    intervention_len: int
    """Positions every behavioural check covers (capped by max_seq_len)."""
    pad_token_id: int | None
    """An id the model reads as padding, never drawn as content."""
    config: DecoderConfig | None
    """The DecoderConfig of a white-box model (our layout), else None."""
    convention: Convention
    """How the model is called for padded batches and cached steps."""
    reference: str | None
    """How the oracle reads the weights: "decoder", "spec", or None."""
    reference_reason: str = ""
    """Why there is no reference, or why a declared spec's weights could not be placed (empty
    when the oracle can read them)."""
    readout: str | None = None
    """The name of the module that turns the last hidden state into logits (the output head:
    get_output_embeddings(), a module named lm_head / head / output, or the last Linear with
    V outputs), None when none is found."""
    tie: str | None = None
    """How the readout's weight relates to the input embedding's, found structurally: "one
    Parameter" (tied), "adapted" (one Parameter, but the readout or the embedding adds a PEFT
    adapter's update to it in the forward: the two differ as soon as the adapter trains),
    "shared storage" (two Parameters over one storage), "equal copies" (two Parameters with
    equal values: not tied), "separate", or None (no readout or embedding)."""
    declared_tie: bool | None = None
    """The tie the model declares (a DecoderConfig's tie_embeddings, a Hugging Face config's
    tie_word_embeddings), None when it declares none."""
    hugging_face: bool = False
    """An instance of a transformers PreTrainedModel."""
    router_aux_coef: float | None = None
    """A routed Hugging Face model's router_aux_loss_coef, where its forward takes
    output_router_logits and returns the load-balancing loss it adds to the loss."""
    computes_loss: bool = False
    """The forward takes labels= and returns its own .loss (Hugging Face's convention)."""
    packing: str | None = None
    """How decoder-audit's train packs documents into one row for this model: "document_ids"
    (our Decoder, or a forward that names them), "4d_mask" (a Hugging Face model: restarting
    position_ids and a 4-D block-diagonal attention mask), or None (no packing interface)."""
    packing_forms: tuple[str, ...] = ()
    """Every form of a packed row (PACK_FORMS) the model's forward takes: its interface, and
    for a Hugging Face model the padding-free forms its trainers send too (position_ids alone;
    flash attention's cu_seq_lens where it takes them). The packing check sends them all, or
    the one the training path names (`checked_packing_forms`)."""
    takes_use_cache: bool = False
    """The forward takes use_cache= (packed forms are tried with it on by default and off)."""
    checkpointing_enabled: bool = False
    """Activation checkpointing is switched on in the model as it came to the audit (Hugging
    Face's `is_gradient_checkpointing`, or a `gradient_checkpointing` flag that is True): the
    path its training takes, audited without a declaration."""
    windows: tuple[int | None, ...] | None = None
    """The sliding window each layer declares (None: full attention), from the model's
    DecoderConfig, its declared spec or its Hugging Face config (`references.hf_windows`); None
    when no layer declares one."""
    window_size: int | None = None
    """The smallest declared window (or the one declared on no layer), the span the window check
    reads past; None when no window is declared."""
    attention_layers: tuple[str, ...] = ()
    """The names of the per-layer attention modules, in layer order, found from the module
    classes (`attention_layers`); empty when they cannot be told apart."""
    has_input_embedding: bool = False
    """An input embedding was found (get_input_embeddings, token_embeddings, an nn.Embedding)."""
    attention: str | None = None
    """Where attention patterns come from: "trace" (ours), "output_attentions", or None (probed)."""
    attention_reason: str = ""
    """Why no pattern can be read (empty when one can)."""
    cache_reason: str = ""
    """Why the model's cache cannot be stepped, found by calling it (empty when it can)."""
    input_gradient_reason: str = ""
    """Why d loss / d input cannot be taken, found by one small backward (empty when it can)."""
    backward_reason: str = ""
    """Why no backward runs through the model on this device: a backend it calls has none here
    (flex attention on CPU), found by the input gradient's probe (empty when one runs)."""
    loss_reason: str = ""
    """Why the model's own loss cannot be taken although its forward takes labels= (the call does
    not fit its signature, or it returns no loss), found by one call (empty when it can)."""
    train_mode_reason: str = ""
    """Why the model cannot be run in train mode at the probes' length, found by one call, when
    no training path says what length training uses (empty when it runs)."""
    length_limit: int | None = None
    """Without a declared max_seq_len: the longest T the model runs, when a longer one raises
    (probed: a fixed-size position or rotary table nobody declared); the checks stay within it."""
    length_error: str = ""
    """What the model raised one token past `length_limit`."""
    probed: bool = False
    """The facts found by calling the model (above) have been filled in (runner.py)."""
    training: TrainingPath | None = None
    """How training will call the model, when the caller said (train always does)."""
    spec: DecoderConfig | None = None
    """The architecture the caller declared for a module that is not ours (`spec=`): the
    ledger, the tie and the oracle are checked against it (spec.py)."""
    placement: Any = None
    """Where the module's weights lie on the spec's canonical names (references.layouts
    Placement), None without a spec or when no layout was found (`reference_reason` says why;
    params and oracle then fail)."""
    origin: dict[str, str] = field(default_factory=dict)
    """fact name -> "config" | "spec" | "hugging face" | "argument" | "default"."""
    notes: tuple[str, ...] = ()
    """Sentences the report shows about how the facts were found."""

    # ---- what the registry's `needs` read ----------------------------------------------------
    @property
    def whitebox(self) -> bool:
        return self.config is not None

    @property
    def returns_router_aux(self) -> bool:
        """A routed spec whose model returns a load-balancing loss (its config declares a
        coefficient), whatever its routers score and choose by: transformers' families take it
        on the softmax of the raw router logits everywhere (router_loss.py)."""
        spec = self.spec
        return self.router_aux_coef is not None and spec is not None and spec.routed

    @property
    def traces_experts(self) -> bool:
        """A white-box DecoderConfig with routed layers (its trace records the expert weights)."""
        return self.config is not None and self.config.routed

    @property
    def probes_experts(self) -> bool:
        """Routed layers whose every expert the probe of expert_gradients can route tokens to
        and read a gradient of: ours, or a declared routed spec whose routers and every expert
        matrix the layout placed."""
        if self.traces_experts:
            return True
        spots = getattr(self.placement, "spots", None) or {}
        spec = self.spec
        return self.routes_experts and all(
            f"layers.{i}.ffn.experts.{e}.w1.weight" in spots
            for i in range(spec.n_layers) if spec.routes(i) for e in range(spec.n_experts))

    @property
    def routes_experts(self) -> bool:
        """Routed layers whose expert weights can be read per token: ours (`traces_experts`), or
        a declared routed spec whose every router the layout placed."""
        if self.traces_experts:
            return True
        spec, spots = self.spec, getattr(self.placement, "spots", None) or {}
        return spec is not None and spec.routed and all(
            f"layers.{i}.ffn.router.weight" in spots
            for i in range(spec.n_layers) if spec.routes(i))

    @property
    def has_ledger(self) -> bool:
        """A DecoderConfig of our layout, or a declared spec (whose weights params places, or
        fails to), or a peer's config read and refused (params fails naming its options)."""
        return self.config is not None or self.spec is not None or self.reference == "spec"

    @property
    def tied(self) -> bool:
        """The readout is the input embedding's Parameter (an adapter on either side or not), or
        is declared to be (a white-box config's tie_embeddings): tying_grad then checks the
        shared weight's gradient."""
        return (self.config is not None and self.config.tie_embeddings) or \
            self.tie in ("one Parameter", "adapted")

    @property
    def has_readout(self) -> bool:
        return self.tie is not None

    @property
    def has_max_seq_len(self) -> bool:
        return self.max_seq_len is not None

    @property
    def has_cache(self) -> bool:
        return self.convention.cached

    @property
    def takes_mask(self) -> bool:
        return self.convention.masked

    @property
    def has_reference(self) -> bool:
        return self.reference is not None

    @property
    def trains_under_autocast(self) -> bool:
        return self.training is not None and self.training.precision in ("bf16", "fp16")

    @property
    def trains_with_checkpointing(self) -> bool:
        return self.checkpointing_enabled or (self.training is not None and
                                              self.training.checkpointing)

    @property
    def runs_in_train_mode(self) -> bool:
        return not self.train_mode_reason

    @property
    def packs(self) -> bool:
        return bool(self.packing_forms)

    @property
    def checked_packing_forms(self) -> tuple[str, ...]:
        """The forms the packing check sends: the training path's pack_form, or every one the
        model takes."""
        wanted = None if self.training is None else self.training.pack_form
        return self.packing_forms if wanted is None else (wanted,)

    @property
    def trains_packed(self) -> bool:
        return self.training is not None and self.training.pack

    @property
    def has_attention(self) -> bool:
        return self.attention is not None

    @property
    def length_bound(self) -> int | None:
        """The longest input the model takes: its hard limit, declared or found; None: none."""
        return self.max_seq_len or self.length_limit

    @property
    def declares_window(self) -> bool:
        return self.windows is not None

    @property
    def window_binds(self) -> bool:
        """The smallest declared window excludes a token within the inputs the model takes."""
        return self.window_size is not None and (self.length_bound is None or
                                                 self.window_size + 1 <= self.length_bound)

    @property
    def has_attention_layers(self) -> bool:
        return bool(self.attention_layers)

    @property
    def loss_callable(self) -> bool:
        return not self.loss_reason

    @property
    def has_input_gradient(self) -> bool:
        return not self.input_gradient_reason

    @property
    def has_backward(self) -> bool:
        return not self.backward_reason

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "mode": "white-box" if self.whitebox else "black-box",
                "vocab_size": self.vocab_size, "input_vocab_size": self.input_vocab_size,
                "max_seq_len": self.max_seq_len, "intervention_len": self.intervention_len,
                "pad_token_id": self.pad_token_id, "convention": self.convention.name,
                "reference": self.reference, "attention": self.attention,
                "readout": self.readout, "tie": self.tie,
                "length_limit": self.length_limit, "packing": self.packing,
                "spec": None if self.spec is None else self.spec.to_dict(),
                "layout": None if self.placement is None else self.placement.layout,
                "training": None if self.training is None else {
                    "batch_size": self.training.batch_size, "seq_len": self.training.seq_len,
                    "precision": self.training.precision,
                    "checkpointing": self.training.checkpointing, "pack": self.training.pack,
                    "pack_form": self.training.pack_form},
                "packing_forms": list(self.packing_forms),
                "checkpointing_enabled": self.checkpointing_enabled,
                "origin": dict(self.origin)}


def model_facts(model: nn.Module, *, vocab_size: int | None = None,
                max_seq_len: int | None = None, input_vocab_size: int | None = None,
                pad_token_id: int | None = None,
                intervention_len: int | None = None,
                training: TrainingPath | None = None, spec: DecoderConfig | None = None,
                weights_map: Any = None) -> ModelFacts:
    """The facts of `model`: read from its DecoderConfig or Hugging Face config, from a declared
    `spec` (with `weights_map`, a function from its state dict to the canonical names, where
    its layout is not one `references.layouts` detects), and from the arguments (see the module
    docstring for which wins). Raises ConfigError for a value that is not a positive integer,
    for a disagreement with what the model declares, and for a black box whose V nobody gave."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"audit() needs a torch.nn.Module, got {type(model).__name__}")
    given = {"vocab_size": vocab_size, "max_seq_len": max_seq_len,
             "input_vocab_size": input_vocab_size, "pad_token_id": pad_token_id,
             "intervention_len": intervention_len}
    _check_integers(given)
    model, notes = unwrapped(model)  # the module inside DDP or torch.compile (wrappers.py)
    base = forwarded_to(model)  # a PEFT model declares what its base model does
    declared, origin, said = _declared(base)
    notes += said
    config = _whitebox_config(model, notes)
    reference, reason = _reference(model, config)
    spec_facts = _spec_facts(model, spec, weights_map, declared, origin,
                             whitebox=config is not None,
                             hf_readable=reference == "hugging face")
    values = _resolved(given, declared, origin)
    if values["vocab_size"] is None:
        raise ConfigError(
            f"{type(model).__name__} has no DecoderConfig, so audit() needs vocab_size=V "
            "(and max_seq_len=T to check that longer inputs are rejected)")
    spec = spec_facts.get("spec")
    if "unplaced" in spec_facts:
        reference, reason = None, spec_facts["unplaced"]
    if spec is not None or "peer" in spec_facts:
        # A declared spec is checked even where its weights cannot be placed: params and oracle
        # then fail naming what was not found (reference_reason), never skip to a pass; so is a
        # peer library's config whose options no spec expresses (spec None: they are named).
        reference, reason = "spec", "" if spec_facts["placement"] else spec_facts["reason"]
        reference, reason = _unsharded_reference(model, reference, reason)
    if "peer" in spec_facts:
        notes.append(f"{spec_facts['peer']} {type(model).__name__}: its config read as the spec"
                     + ("" if spec is not None else f" failed: {spec_facts['reason']}"))
    readout = _readout_facts(model, values["vocab_size"], _declared_tie(model, spec))
    windows, window_size = _declared_windows(base, config or spec, notes)
    return ModelFacts(
        model=class_name(model), vocab_size=values["vocab_size"],
        input_vocab_size=values["input_vocab_size"] or values["vocab_size"],
        max_seq_len=values["max_seq_len"],
        intervention_len=values["intervention_len"] or DEFAULT_INTERVENTION_LEN,
        pad_token_id=values["pad_token_id"], config=config, convention=convention(model),
        reference=reference, reference_reason=reason, **_path_facts(base, training),
        computes_loss=_takes(model, "labels"), hugging_face=_is_hugging_face(model),
        router_aux_coef=_router_aux_coef(model),
        **readout, has_input_embedding=input_embedding(model) is not None, training=training,
        spec=spec, placement=spec_facts.get("placement"), origin=origin, windows=windows,
        window_size=window_size,
        attention_layers=attention_layers(model, len(windows)) if windows else (),
        notes=tuple(notes))


def _unsharded_reference(model: nn.Module, reference: str | None, reason: str
                         ) -> tuple[str | None, str]:
    """No reference for a declared spec on a model FSDP2 sharded: the spec's oracle reads and
    writes the module's weights where the layout places them, and FSDP2's DTensors are not read
    there yet (our own Decoder's oracle reads them, gathered)."""
    if reference != "spec" or not is_fsdp(model):
        return reference, reason
    return None, ("sharded with FSDP2: the oracle of a declared spec does not read FSDP2's "
                  "sharded weights yet; audit the model before it is sharded (fully_shard) to "
                  "compare it with its spec's oracle")


def _router_aux_coef(model: nn.Module) -> float | None:
    """The config's router_aux_loss_coef where the forward takes output_router_logits (the
    Hugging Face MoE families' load-balancing loss); None elsewhere."""
    coef = getattr(getattr(model, "config", None), "router_aux_loss_coef", None)
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or \
            not _takes(model, "output_router_logits"):
        return None
    return float(coef)


def _resolved(given: dict[str, Any], declared: dict[str, Any], origin: dict[str, str]
              ) -> dict[str, Any]:
    """Each fact's value: the argument, else what the model declares, else None; `origin` says
    which. An argument that contradicts the model's own config (V, the input vocabulary, a
    DecoderConfig's max_seq_len) is a ConfigError naming both."""
    for name in ("vocab_size", "input_vocab_size") + (
            ("max_seq_len",) if origin.get("max_seq_len") == "config" else ()):
        if given[name] is not None and name in declared and given[name] != declared[name]:
            raise ConfigError(f"{name}={given[name]} disagrees with the model's "
                              f"{origin[name]} {name}={declared[name]}")
    values: dict[str, Any] = {}
    for name, value in given.items():
        if value is not None:
            values[name] = value
            origin.setdefault(name, "argument")
            if origin[name] in ("hugging face", "spec") and declared.get(name) != value:
                origin[name] = "argument"
        elif name in declared:
            values[name] = declared[name]
        else:
            values[name] = None
            origin[name] = "default"
    return values


def _spec_facts(model: nn.Module, spec: DecoderConfig | None, weights_map: Any,
                declared: dict[str, Any], origin: dict[str, str], *, whitebox: bool,
                hf_readable: bool) -> dict[str, Any]:
    """{"spec", "placement": where the module's weights lie on the spec's names (a Placement, or
    None), "reason": why none}. The spec is the one declared, or the config of a Hugging Face
    class the oracle reads (`hf_readable`). A declared spec's V, input vocabulary and (with
    learned positions) max_seq_len become the model's (added to `declared`, origin "spec").
    Empty without a spec, and for our own layout (`whitebox`), whose DecoderConfig is its spec
    (a spec that differs is a ConfigError)."""
    from ..references.layouts import place

    if spec is not None and not isinstance(spec, DecoderConfig):
        raise ConfigError(f"spec={spec!r} must be a DecoderConfig (load a JSON one with "
                          "DecoderConfig.load(path))")
    if spec is None:
        if weights_map is not None:
            raise ConfigError("weights_map= places a module's weights on a spec's names: it "
                              "needs spec= (--spec) too")
        if not hf_readable:
            return {} if whitebox else _peer_facts(model, declared, origin)
        from ..references.hf import hf_layout, hf_spec

        spec = hf_spec(model)
        placement, reason = place(model, spec, None, hf_layout(model))
        other = _another_form(placement)
        if other:  # not the model's defect: the table does not know this release's modules
            return {"unplaced": f"{type(model).__name__}'s {other}"}
        return {"spec": spec, "placement": placement, "reason": reason}
    own = getattr(model, "config", None)
    if isinstance(own, DecoderConfig) and own != spec:
        differ = sorted(k for k, v in spec.to_dict().items() if own.to_dict()[k] != v)
        raise ConfigError(f"spec disagrees with the model's own DecoderConfig on {differ} "
                          f"(spec {[getattr(spec, k) for k in differ]}, model "
                          f"{[getattr(own, k) for k in differ]})")
    if whitebox:
        return {}  # our own layout: its DecoderConfig is the spec, checked as ours
    _declare_values(spec.vocab_size, spec.max_seq_len if spec.pos == "learned" else None,
                    declared, origin)
    # a Hugging Face family whose weights' names do not tell their layout (GPT-BigCode) keeps
    # them in its own whatever spec is declared
    layout = None
    if weights_map is None and _is_hugging_face(model):
        from ..references.hf import hf_layout

        layout = hf_layout(model)
    return {"spec": spec, **dict(zip(("placement", "reason"),
                                     place(model, spec, weights_map, layout)))}


def _another_form(placement: Any) -> str:
    """Why a Hugging Face family's weights lie in another form than the table places (this
    release's modules: GraniteMoE's experts before transformers 5), or "": weights of the spec
    missing while weights of the module are placed nowhere, the same weights under other names.
    A weight dropped from the module is missing alone, one added is extra alone: those are the
    model's defects, and params names them."""
    if placement is None or not placement.leftover:
        return ""
    missing = [p.split(" ")[0] for p in placement.problems if "the module has no such" in p]
    if not missing:
        return ""
    return (f"weights lie in a form the families table does not place on this release (the "
            f"spec's {missing[0]} and {len(missing) - 1} more not found; the module's "
            f"{placement.leftover[0]} and {len(placement.leftover) - 1} more placed nowhere): "
            "audited black-box")


def _declare_values(vocab_size: int, max_seq_len: int | None, declared: dict[str, Any],
                    origin: dict[str, str]) -> None:
    """A spec's V (and input vocabulary), and max_seq_len where it has a learned position table,
    become the model's (origin "spec"). A learned table has max_seq_len rows: a hard limit.
    Rotary, ALiBi, sinusoidal and position-free models (Llama, torchtune, BLOOM and MPT, XGLM's
    table extended on demand) run past their config's length by design: there the spec's
    max_seq_len is a horizon, and a hard limit is the caller's to declare (max_seq_len=)."""
    values = [("vocab_size", vocab_size), ("input_vocab_size", vocab_size)]
    if max_seq_len is not None:
        values.append(("max_seq_len", max_seq_len))
    for name, value in values:
        if name == "vocab_size" and name in declared and declared[name] != value:
            raise ConfigError(f"spec vocab_size={value} disagrees with the model's "
                              f"{origin[name]} vocab_size={declared[name]}")
        declared[name], origin[name] = value, "spec"


def _peer_facts(model: nn.Module, declared: dict[str, Any], origin: dict[str, str]
                ) -> dict[str, Any]:
    """The spec a peer library's model carries in its config (`references.peer_configs`:
    TransformerLens, litgpt, nanoGPT, torchtune, x-transformers), as `_spec_facts` returns a
    declared one; its options no DecoderConfig expresses as {"spec": None, "placement": None,
    "reason": naming them}, so params and oracle fail closed. Empty for any other module."""
    from ..references.layouts import place
    from ..references.peer_configs import peer_spec

    found = peer_spec(model)
    if found is None:
        return {}
    if found.spec is None:
        if found.vocab_size is not None:  # V as the config says it: the audit fails closed
            _declare_values(found.vocab_size, None, declared, origin)
        return {"spec": None, "placement": None, "reason": found.reason, "peer": found.library}
    spec = found.spec
    _declare_values(spec.vocab_size, spec.max_seq_len if spec.pos == "learned" else None,
                    declared, origin)
    placement, reason = (found.placement, "") if found.placement is not None else \
        place(model, found.spec, None)
    return {"spec": found.spec, "placement": placement, "reason": reason,
            "peer": found.library}


def with_notes(facts: ModelFacts, *notes: str) -> ModelFacts:
    return replace(facts, notes=facts.notes + tuple(notes))


def _check_integers(given: dict[str, Any]) -> None:
    for name, value in given.items():
        low = 0 if name == "pad_token_id" else 1
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < low):
            what = "a non-negative" if low == 0 else "a positive"
            raise ConfigError(f"{name}={value!r} must be {what} integer")


def _declared(model: nn.Module) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """What the model itself declares: (values, where each came from, notes)."""
    config = getattr(model, "config", None)
    if isinstance(config, DecoderConfig):
        values = {"vocab_size": config.vocab_size, "max_seq_len": config.max_seq_len,
                  "input_vocab_size": config.vocab_size}
        return values, {name: "config" for name in values}, []
    if not _is_hugging_face(model):
        return {}, {}, []
    from ..references.hf_models import audit_facts

    hf = audit_facts(model)
    values = {"vocab_size": hf.vocab_size, "max_seq_len": hf.max_seq_len,
              "input_vocab_size": hf.input_vocab_size or hf.vocab_size,
              "pad_token_id": hf.pad_token_id}
    values = {name: value for name, value in values.items() if value is not None}
    notes = [f"Hugging Face {type(model).__name__}: {hf.length_policy}", *hf.notes]
    return values, {name: "hugging face" for name in values}, notes


def _is_hugging_face(model: nn.Module) -> bool:
    """An instance of transformers' PreTrainedModel (transformers is never imported here: a
    model of its classes implies it is loaded)."""
    base = sys.modules.get("transformers.modeling_utils")
    return base is not None and isinstance(model, base.PreTrainedModel)


class _NoDraws(TorchFunctionMode):
    """Skips `normal_` (the initial draws) while a Decoder is built on the meta device for its
    names. On meta it runs a Python decomposition that imports torch._dynamo: 2 s, and 120 000
    objects that every later gc.collect walks (0.15 s -> 0.4 s per collection; the runner
    collects between checks)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.normal_:
            return args[0]
        return func(*args, **(kwargs or {}))


def _whitebox_config(model: nn.Module, notes: list[str]) -> DecoderConfig | None:
    """The model's DecoderConfig when it has every parameter name a Decoder built from it has
    (extra ones are allowed: the params check reports them), else None (with a note when it
    has a DecoderConfig but other names)."""
    cfg = getattr(model, "config", None)
    if not isinstance(cfg, DecoderConfig):
        return None
    from ..model.decoder import Decoder

    with torch.device("meta"), _NoDraws():
        expected = {name for name, _ in Decoder(cfg).named_parameters(remove_duplicate=False)}
    present = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    if expected <= present:
        return cfg
    notes.append(f"{type(model).__name__} has a DecoderConfig but not the Decoder's weight "
                 "names: audited as a black box (V and max_seq_len from its config)")
    return None


def _reference(model: nn.Module, config: DecoderConfig | None) -> tuple[str | None, str]:
    """How the oracle reads the model's weights, decided from its class and config (no weight is
    converted here: a model whose weights do not fit its config fails the oracle check)."""
    if config is not None:
        return "decoder", ""
    from ..references.hf import hf_reference

    return hf_reference(model)


_HEAD_NAMES = ("lm_head", "head", "out_head", "output", "unembed", "embed_out")


def output_head(model: nn.Module, vocab_size: int) -> tuple[str, nn.Module] | None:
    """(name, module) of the readout: Hugging Face's get_output_embeddings(), else the last
    module named like a head (lm_head, head, out_head, output, ...) with a weight of V rows, else
    the last nn.Linear with V outputs; None when there is none."""
    names = {id(m): name for name, m in model.named_modules()}
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        try:
            found = getter()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Module) and id(found) in names:
            return names[id(found)], found
    heads = [(name, m) for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1] in _HEAD_NAMES
             and getattr(getattr(m, "weight", None), "shape", (None,))[0] == vocab_size]
    if heads:
        return heads[-1]
    linears = [(name, m) for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and m.out_features == vocab_size]
    return linears[-1] if linears else None


def _declared_tie(model: nn.Module, spec: DecoderConfig | None) -> bool | None:
    """The tie a model declares: its own DecoderConfig's, or its spec's. A Hugging Face config
    carries tie_word_embeddings in every family, True by default even in classes that never
    tie; it is a declaration only where its class ties by it: a class whose config is read as
    its spec (references.hf_config.spec_classes), so through that spec."""
    own = getattr(model, "config", None)
    if isinstance(own, DecoderConfig):
        return own.tie_embeddings
    return None if spec is None else spec.tie_embeddings


def _readout_facts(model: nn.Module, vocab_size: int, declared: bool | None
                   ) -> dict[str, Any]:
    """readout, tie and declared_tie (see ModelFacts)."""
    head, embedding = output_head(model, vocab_size), input_embedding(model)
    if head is None or embedding is None:
        return {"readout": None if head is None else head[0], "tie": None,
                "declared_tie": declared}
    w_out, w_in = getattr(head[1], "weight", None), getattr(embedding, "weight", None)
    if not isinstance(w_out, torch.Tensor) or not isinstance(w_in, torch.Tensor):
        return {"readout": head[0], "tie": None, "declared_tie": declared}
    if w_out is w_in:
        # a PEFT layer's weight is its base layer's: an update it adds unties the two
        adapted = adapter_update(head[1]) or adapter_update(embedding)
        tie = "adapted" if adapted else "one Parameter"
    elif w_out.device.type != "meta" and local(w_out).data_ptr() == local(w_in).data_ptr() \
            and w_out.shape == w_in.shape:
        tie = "shared storage"
    elif w_out.shape == w_in.shape and w_out.device == w_in.device and \
            w_out.device.type != "meta" and on_every_rank(
                bool(torch.equal(local(w_out).detach(), local(w_in).detach())), w_out):
        tie = "equal copies"
    else:
        tie = "separate"
    return {"readout": head[0], "tie": tie, "declared_tie": declared}


def _takes(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def packing_interface(model: nn.Module) -> str | None:
    """How decoder-audit's train packs documents into one row of `model` (ModelFacts.packing),
    read from its forward's parameters."""
    if _takes(model, "document_ids"):
        return "document_ids"
    if _is_hugging_face(model) and _takes(model, "position_ids") and \
            _takes(model, "attention_mask"):
        return "4d_mask"
    return None


def _declared_windows(model: nn.Module, cfg: DecoderConfig | None, notes: list[str]
                      ) -> tuple[tuple[int | None, ...] | None, int | None]:
    """(the window each layer declares, the window's size): by a Hugging Face model's own config
    in any of its forms (a window it declares on no layer included: every layer is then full),
    and by the attention modules it built from it (`_built_windows`), else by the DecoderConfig
    that is the model's architecture (its own, or a declared spec)."""
    if _is_hugging_face(model):
        from ..references.hf_windows import declared_windows, window_size

        found, size = declared_windows(model.config), window_size(model.config)
        found, size = _built_windows(model, found, size, notes)
    elif cfg is not None and cfg.sliding_window is not None:
        found = tuple(cfg.window(layer) for layer in range(cfg.n_layers))
        size = cfg.sliding_window
    else:
        return None, None
    if not found or size is None:
        return None, None
    return found, min((w for w in found if w is not None), default=size)


def _built_windows(model: nn.Module, found: tuple[int | None, ...] | None, size: int | None,
                   notes: list[str]) -> tuple[tuple[int | None, ...] | None, int | None]:
    """The windows with each layer's own declaration where its attention module carries one:
    transformers 5 builds a sliding layer's attention with layer_type "sliding_attention" and
    its sliding_window. A config edited after the model was built (layer_types[0] set to
    "full_attention", sliding_window set to None) changes the masks the model makes, not the
    layers it built: such a layer still declares its window, and is held to it (a Gemma 2 whose
    layer 0 ignored its window of 16 passed, the edited config declaring no window there)."""
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    names = attention_layers(model, len(found) if found else layers or 0)
    built = [getattr(model.get_submodule(name), "sliding_window", None)
             if getattr(model.get_submodule(name), "layer_type", None) == "sliding_attention"
             else None for name in names]
    differ = [i for i, window in enumerate(built) if isinstance(window, int) and window > 0
              and (found is None or found[i] != window)]
    if not differ:
        return found, size
    merged = [built[i] if i in differ else (found[i] if found else None)
              for i in range(len(names))]
    first = differ[0]
    says = "full attention" if not found or found[first] is None else f"a window of {found[first]}"
    notes.append(f"layer {first}'s attention module ({names[first]}) was built as a sliding layer "
                 f"of {built[first]} positions, where the config now declares {says}: the config "
                 "was edited after the model was built, and the window check holds each such "
                 "layer to the window it was built with"
                 + (f" (and {len(differ) - 1} more layers)" if len(differ) > 1 else ""))
    return tuple(merged), size if size is not None else built[first]


def attention_layers(model: nn.Module, layers: int) -> tuple[str, ...]:
    """The names of the per-layer attention modules, in order: the outermost modules whose class
    is named like attention (LlamaAttention, CausalSelfAttention, GPT2Attention, ...), when there
    are exactly `layers` of them; () otherwise."""
    found = [name for name, module in model.named_modules()
             if name and "attention" in type(module).__name__.lower()
             and any(True for _ in module.parameters())]
    outermost = [name for name in found
                 if not any(name.startswith(other + ".") for other in found)]
    return tuple(outermost) if len(outermost) == layers else ()


def _path_facts(model: nn.Module, training: TrainingPath | None) -> dict[str, Any]:
    """The facts of the paths a model takes beside its plain forward, read from its forward's
    parameters: packing (after a ConfigError for a training path whose pack_form the forward
    cannot take) and use_cache."""
    forms = packing_forms(model)
    wanted = None if training is None else training.pack_form
    if wanted is not None and wanted not in forms:
        raise ConfigError(f"training pack_form={wanted!r}: {type(model).__name__}'s forward takes "
                          f"only {list(forms) or 'no packed form'} (of {list(PACK_FORMS)})")
    return {"packing": packing_interface(model), "packing_forms": forms,
            "takes_use_cache": _takes(model, "use_cache"),
            "checkpointing_enabled": checkpointing_enabled(model)}


def checkpointing_enabled(model: nn.Module) -> bool:
    """Activation checkpointing is on in `model` (ModelFacts.checkpointing_enabled). A Hugging
    Face model is asked by the name its release does not deprecate: transformers 5 renamed
    `is_gradient_checkpointing` to `is_activation_checkpointing`, and the old name warns (a
    FutureWarning on every audit of such a model, from this call); older releases have only
    the old one."""
    try:
        flag = getattr(model, "is_activation_checkpointing", None)
        if flag is None:
            flag = getattr(model, "is_gradient_checkpointing",
                           getattr(model, "gradient_checkpointing", False))
    except Exception:  # noqa: BLE001 - a property that raises: nothing said about it
        return False
    return flag is True


def packing_forms(model: nn.Module) -> tuple[str, ...]:
    """The forms of a packed row `model`'s forward takes (ModelFacts.packing_forms): its
    document_ids; a Hugging Face model's 4-D mask and position_ids alone (what padding-free
    collators send); a module of its own's position_ids; flash attention's cu_seq_lens where the
    forward names them or a Hugging Face model runs a flash attention implementation."""
    interface = packing_interface(model)
    if interface == "document_ids":
        return ("document_ids",)
    if interface == "4d_mask":
        config = getattr(model, "config", None)
        flash = "flash" in str(getattr(config, "_attn_implementation", "") or "")
        return ("4d_mask", "position_ids") + (
            ("flash_kwargs",) if flash or _takes(model, "cu_seq_lens_q") else ())
    # a module of its own: the one padding-free form its forward names
    if _takes(model, "cu_seq_lens_q"):
        return ("flash_kwargs",)
    return ("position_ids",) if _takes(model, "position_ids") else ()


def input_embedding(model: nn.Module) -> nn.Module | None:
    """The module whose output is the per-position input of the model: Hugging Face's
    get_input_embeddings(), else the first module named `token_embeddings` (our Decoder, also
    inside a wrapper), else the first nn.Embedding; None when there is none."""
    getter = getattr(model, "get_input_embeddings", None)
    if callable(getter):
        try:
            found = getter()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Module):
            return found
    named = model.named_modules()
    return next((m for name, m in named if name.rsplit(".", 1)[-1] == "token_embeddings"),
                next((m for m in model.modules() if isinstance(m, nn.Embedding)), None))
