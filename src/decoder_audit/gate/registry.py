"""The gate's checks, in one table: name, title, family, the function, and what it needs.

The order of the table is the seeds' diagnosis order ("locate the first changed contract in this
order: IDs and positions; blocks; final normalisation; tied logits; target alignment; loss"):
first the input contract and the shape of what comes out, then the behavioural invariants of
the blocks (a nondeterministic or batch-mixing model makes every later comparison meaningless,
so those come first), then the white-box structure (ledger, tying, oracle), then the other
paths through the same weights (cached and padded generation, the backward pass), and last the
alignment of logits with targets. The names are stable: reports and tests use them.

The generation family comes after the oracle: a cached or padded run is judged against the full
forward, so the full forward must be proven first (a cache that agrees with a wrong forward
proves nothing, and a wrong forward makes every cached comparison fail for the wrong reason).
It comes before the alignment of logits with targets, which concerns the loss, not a path.

`needs` names the facts a check cannot run without (properties of `ModelFacts`); the runner
skips a check whose needs the facts lack, with the reason below, so no check function decides
what kind of model it has or whether it can run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .checks import alignment, attention, checkpointing, generation, inputs, invariance, kv_cache, model_loss, packing, reference, router_loss, routing, spec, training, weights, window
from .facts import ModelFacts
from .result import CheckResult
from .subject import Subject

# Why a check is skipped when the model's facts lack what it needs (a fact of facts.py each).
NEED_REASONS: dict[str, Callable[[ModelFacts], str]] = {
    "whitebox": lambda f: "black-box: needs a DecoderConfig and the Decoder's weight names",
    "has_ledger": lambda f: ("black-box: needs a DecoderConfig and the Decoder's weight names, "
                             "or the architecture declared with spec= (verify --spec cfg.json)"),
    "tied": lambda f: "untied: no shared weight",
    "has_readout": lambda f: "no input embedding and readout found (get_input_embeddings / "
                             "get_output_embeddings, token_embeddings / lm_head, an nn.Embedding "
                             "and a Linear with V outputs)",
    "has_max_seq_len": lambda f: (
        "no max_seq_len given, so no length is known to be too long (pass max_seq_len= to check)"
        if not f.length_limit else
        f"no max_seq_len given, though the model stops at T={f.length_limit} ({f.length_error} "
        f"at T={f.length_limit + 1}): pass max_seq_len={f.length_limit} to check that longer "
        "input is rejected"),
    "has_reference": lambda f: f.reference_reason if f.spec is not None else (
        "black-box: the oracle needs a DecoderConfig and our weight names, a declared spec= "
        "(verify --spec cfg.json), or a model the Hugging Face converter can read "
        f"({f.reference_reason})"),
    "has_cache": lambda f: f.cache_reason or (
        "the model takes no KV cache (neither a Decoder's new_cache + forward(cache=) nor the "
        "Hugging Face convention forward(past_key_values= or cache=, use_cache=))"),
    "takes_mask": lambda f: "the model's forward takes no attention_mask, so it cannot run "
                            "padded batches",
    "has_input_embedding": lambda f: "no input embedding found (neither get_input_embeddings(), "
                                     "a token_embeddings module nor an nn.Embedding)",
    "has_attention": lambda f: f.attention_reason,
    "declares_window": lambda f: "no sliding window declared (a DecoderConfig's or spec's "
                                 "sliding_window, a Hugging Face config's sliding_window or "
                                 "layer_types)",
    "window_binds": lambda f: (f"the declared window of {f.window_size} "
                               f"positions is not shorter than the longest input the model "
                               f"takes ({f.length_bound}): it never excludes a token"),
    "has_attention_layers": lambda f: (f"the {len(f.windows or ())} layers' attention modules "
                                       "could not be told apart (no module class named like "
                                       "attention per layer), so no layer's span can be read"
                                       + ("; the spec's oracle runs past the window instead "
                                          f"(T = {f.window_size + 1})"
                                          if f.reference == "spec" and f.window_size is not None
                                          and f.window_size <= spec.WINDOW_ORACLE_MAX else "")),
    "runs_in_train_mode": lambda f: f"{f.train_mode_reason}; a training path declared with its "
                                    "length (train declares one) has it checked there",
    "computes_loss": lambda f: "the forward takes no labels=: the loss is the caller's "
                               "(loss_alignment proves the next-token helpers)",
    "loss_callable": lambda f: f.loss_reason,
    "trains_packed": lambda f: "training is not declared to pack documents into rows (train "
                               "--pack runs it)",
    "packs": lambda f: "no packing interface: the forward takes neither document_ids (ours) nor "
                       "position_ids with an attention_mask (Hugging Face); a module of its own "
                       "names the form it takes with TrainingPath(pack_form=...)",
    "trains_with_checkpointing": lambda f: "activation checkpointing is neither on in the model "
                                           "(gradient_checkpointing_enable()) nor declared for "
                                           "training (train --checkpointing runs it)",
    "trains_under_autocast": lambda f: "training is not declared to run under bfloat16 or "
                                       "float16 autocast (train --precision bf16 runs it; from "
                                       "Python: audit(model, training=TrainingPath(batch_size, "
                                       "seq_len, precision='bf16' or 'fp16')))",
    "has_input_gradient": lambda f: f.input_gradient_reason,
    "has_backward": lambda f: f.backward_reason,
    "routes_experts": lambda f: "no routed experts known (a DecoderConfig with n_experts, whose "
                                "trace records each token's expert weights, or a declared spec "
                                "with n_experts whose routers the layout placed)",
    "returns_router_aux": lambda f: "no load-balancing loss returned (a routed spec whose "
                                    "forward takes output_router_logits and whose config has "
                                    "router_aux_loss_coef)",
    "probes_experts": lambda f: "no routed experts whose router and every expert the probe can "
                                "reach (a DecoderConfig with n_experts, or a declared routed "
                                "spec whose routers and expert matrices the layout placed)",
}


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    family: str
    run: Callable[[Subject], CheckResult]
    needs: tuple[str, ...] = ()
    # Compares with the clean runs the invariance checks share (Subject.clean_logits); the
    # runner forgets them before any other check, so they hold no memory past that family.
    shares_clean: bool = False
    # The paths a failure affects: the full forward is what both training and generation run;
    # the cache and the padded batches are generation's alone (a training step runs neither);
    # the model's own labels= loss is the path of the trainers that call it (transformers'
    # Trainer, TRL), never decoder-audit's train, which computes the loss itself.
    paths: tuple[str, ...] = ("training", "generation")
    # Where the check's expectation comes from (docs/gate.md's table of expectations): the
    # weights and the declared architecture, a second path sharing no code, a rule of the
    # contract (a definition every correct model meets), or the model itself on a related
    # input (a relation such as causality, whose only reference for a black box is the model).
    # Never another output of the same forward.
    expects: str = ""

    def missing(self, facts: ModelFacts) -> str | None:
        """The reason this check cannot run on a model with these facts, or None when it can."""
        for need in self.needs:
            if not getattr(facts, need):
                return NEED_REASONS[need](facts)
        return None


CHECKS: dict[str, Check] = {check.name: check for check in (
    Check("inputs", "ids and lengths 1..max_seq_len run; bad ids rejected", "inputs",
          inputs.check_inputs,
          expects="the declared contract: ids of rank 2 in [0, V), 1 <= T <= max_seq_len; a "
                  "typed error for anything else"),
    Check("overlength", "max_seq_len + 1 tokens rejected, never cropped", "inputs",
          inputs.check_overlength, needs=("has_max_seq_len",),
          expects="the declared max_seq_len: T + 1 tokens must raise"),
    Check("shapes", "logits (B, T, V); shape ledger of every trace site", "inputs",
          inputs.check_shapes,
          expects="(B, T, V) from the input and the declared V; the shape ledger from the config"),
    Check("raw_logits", "forward returns raw, finite logits (no softmax)", "inputs",
          inputs.check_raw_logits,
          expects="a rule of the contract: rows that are no distribution (nor "
                  "log-probabilities), finite"),
    Check("determinism", "same input twice in eval mode, identical logits", "invariance",
          invariance.check_determinism, shares_clean=True,
          expects="a relation: the same call again (no other reference exists for a repeat)"),
    Check("batch_independence", "a row does not change when other rows do", "invariance",
          invariance.check_batch_independence, shares_clean=True,
          expects="a relation: the row alone in a batch whose other rows differ"),
    Check("causal", "suffix changes leave earlier logits unchanged", "invariance",
          invariance.check_causal, shares_clean=True,
          expects="a relation: the rows before a cut, with the tokens after it changed"),
    Check("prefix", "a prefix alone equals the same rows of the full run", "invariance",
          invariance.check_prefix,
          expects="a relation: the prefix run alone"),
    Check("routing_independence", "a token's experts read no other row, no later token",
          "routing", routing.check_routing_independence, needs=("routes_experts",),
          expects="a relation, at each router: its choice with other rows or later tokens "
                  "changed"),
    Check("attention_rows", "attention rows sum to 1, zero on future keys", "attention",
          attention.check_attention_rows, needs=("has_attention",),
          expects="the definition of causal softmax attention: rows sum to 1, exactly 0 on "
                  "future keys"),
    Check("window", "each layer attends exactly its declared sliding window", "attention",
          window.check_window, needs=("declares_window", "window_binds",
                                      "has_attention_layers"),
          expects="the declared window of each layer: a token W or more back never reaches the "
                  "row"),
    Check("params", "measured parameter ledger reconciles with the config", "weights",
          weights.check_params, needs=("has_ledger",),
          expects="the analytic ledger of the declared architecture (config or spec)"),
    Check("tying", "a tie is one Parameter object, never a copy", "weights",
          weights.check_tying, needs=("has_readout",),
          expects="the declared tie: one Parameter object"),
    Check("tying_grad", "shared weight gradient = lookup + readout paths", "weights",
          weights.check_tying_grad, needs=("tied", "has_backward"),
          expects="the chain rule at the tie, from the same backward's recorded paths (oracle's "
                  "gradients are the independent check where a spec is known)"),
    Check("oracle", "fast forward equals the slow oracle (values, grads)", "reference",
          reference.check_oracle, needs=("has_reference", "has_backward"),
          expects="the float64 oracle (references/, no code shared with model/) fed the module's "
                  "weights (a declared spec's module also with stress, quiet and capped "
                  "weights)"),
    Check("dead_parameters", "every trainable parameter gets a gradient from the loss",
          "weights", weights.check_dead_parameters, needs=("has_input_gradient", "has_backward"),
          paths=("training",),
          expects="a rule: a nonzero gradient for every trainable parameter"),
    Check("expert_gradients", "every routed expert gets a gradient when routed to", "routing",
          routing.check_expert_gradients, needs=("probes_experts", "has_backward"),
          paths=("training",),
          expects="a rule: a nonzero gradient for every expert routed to"),
    Check("kv_cache", "prefill + cached steps and chunks equal the full forward", "generation",
          kv_cache.check_kv_cache, needs=("has_cache",), paths=("generation",),
          expects="the full forward, a second call (the oracle holds it to the weights where a "
                  "spec is known)"),
    Check("padding", "a padded row equals the row alone on its real tokens", "generation",
          generation.check_padding, needs=("takes_mask",), paths=("generation",),
          expects="each real prefix run alone, a second call (uncached for the masked rows, the "
                  "plain call for the cached ones)"),
    Check("train_mode", "train mode (dropout on): causal, batch-independent", "training",
          training.check_train_mode, needs=("runs_in_train_mode",), paths=("training",),
          expects="relations (causal, batch) in train mode, dropout masks held fixed"),
    Check("packing", "packed documents = each document alone; none reads another", "training",
          packing.check_packing, needs=("trains_packed", "packs"), paths=("training",),
          expects="a relation: each document run alone"),
    Check("checkpointing", "checkpointed logits and gradients = plain ones", "training",
          checkpointing.check_checkpointing, needs=("trains_with_checkpointing", "has_backward"),
          paths=("training",),
          expects="the same forward and backward without checkpointing (the run's own "
                  "checkpoint functions and frozen weights), a second call"),
    Check("autocast", "under bf16/fp16 autocast: causal, batch-independent, finite", "training",
          training.check_autocast, needs=("trains_under_autocast",), paths=("training",),
          expects="relations (causal, batch) under autocast, and a rule: finite at scaled-up "
                  "scores"),
    Check("model_loss", "its own loss: labels shifted once, shift_labels, -100, accumulation",
          "training", model_loss.check_model_loss, needs=("computes_loss", "loss_callable"),
          paths=("model loss",),
          expects="cross entropy written from its definition, on the logits of a second call "
                  "(the plain forward)"),
    Check("router_aux_loss", "its load-balancing loss = E sum F_e P_e, added times its coef",
          "training", router_loss.check_router_aux_loss,
          needs=("returns_router_aux", "computes_loss", "loss_callable"), paths=("model loss",),
          expects="each router's own weight on the input it received, in float64: the logits, E "
                  "sum F_e P_e, CE + coef x aux, the aux term's gradient"),
    Check("grad_causal", "loss gradient at t is exactly 0 at every later input", "generation",
          generation.check_grad_causal, needs=("has_input_embedding", "has_backward",
                                               "has_input_gradient"),
          expects="a rule: d loss_t / d input_s exactly 0 for s > t, nonzero at s = t"),
    Check("loss_alignment", "inputs/targets shifted by one, rows aligned", "alignment",
          alignment.check_loss_alignment,
          expects="an explicit per-(b, t) loop in float64, a second path sharing no code with "
                  "the objective helpers"),
)}

CHECK_ORDER: tuple[str, ...] = tuple(CHECKS)
CHECK_TITLES: dict[str, str] = {name: check.title for name, check in CHECKS.items()}
