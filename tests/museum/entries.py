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
  (the check passes or is skipped), "both" (the check fails on the buggy release and on the
  control alike, so it tells them apart by nothing) or "crash" (the gate raises); `pending`
  names the gate work that turns it into a catch, so the row is flipped when it lands; `trial`
  says what the call did with that work tried locally (branch range merged), where it was;
- `control`: what the call does on the fixed release: "pass"; "fail" where the gate raises a
  false alarm on that release, or "crash" where the gate itself raises there (both name the
  pending work in `pending`); `standing` lists checks the control fails for a reason that is not
  this bug and is the same in both releases (said in `note`).

Nothing here imports torch or a release's library: the table is read by the runner, the docs
and the default test suite alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TODAY = ("caught", "missed", "both", "crash")
CONTROL = ("pass", "fail", "crash")
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
    trial: str = ""

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


ROFORMER_FAMILY = ("the BERT-style classes built as decoders (is_decoder=True) drop the causal "
                   "mask when the attention-mask code moved to masking_utils")

W4 = {"window": 4}
WINDOW_445 = ("the 4.45 mask builder (_prepare_4d_causal_attention_mask_with_cache_position) "
              "drops config.sliding_window on the eager and SDPA paths: every layer attends its "
              "whole causal past")
QWEN_FULL_LAYERS = ("the eager and SDPA mask applies config.sliding_window to every layer, "
                    "while the flash path (and, from 4.53, layer_types) windows only the layers "
                    "at index >= max_window_layers: layers declared full attention are windowed "
                    "in")
LOSS_517 = ("its labels= loss is written by hand or called without the caller's loss keywords, "
            "until #48493 passed them through (5.17.0)")


DOUBLE_SOFTMAX = ("from 5.0.0 to 5.5.4 the router returns its softmax probabilities as "
                  "router_logits (the variable reused), and load_balancing_loss_func softmaxes "
                  "them again: the aux loss sees distributions flattened towards 1/E and sends "
                  "the routers a fraction of its gradient (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, "
                  "FlexOlmo, MiniMax, Qwen3-Next and the Qwen3 VL/Omni/3.5 MoEs)")


def _t(version: str) -> tuple[str, ...]:
    return (f"transformers=={version}",)


ENTRIES: tuple[Entry, ...] = (
    # --- causal masking ---------------------------------------------------------------------
    Entry("roformer-future", "transformers", _t("5.17.0"), _t("5.18.0"),
          ref="huggingface/transformers#48745", fix="5.18.0",
          summary=f"RoFormerForCausalLM attends to future tokens: {ROFORMER_FAMILY}",
          builder="roformer_decoder", symptom="future_leak", check="causal", today="caught"),
    Entry("megatron-bert-future", "transformers", _t("5.9.0"), _t("5.18.0"),
          ref="huggingface/transformers#48745", fix="5.18.0",
          summary=f"MegatronBertForCausalLM attends to future tokens (5.9.0, the first release "
                  f"with the bug): {ROFORMER_FAMILY}",
          builder="megatron_bert_decoder", symptom="future_leak", check="causal",
          today="caught"),
    # --- sliding windows --------------------------------------------------------------------
    Entry("phi3-window-dropped", "transformers", _t("4.45.2"), _t("4.46.0"),
          ref="huggingface/transformers#32945", fix="#33586 (4.46.0)",
          summary=f"Phi-3's declared sliding window is not applied: {WINDOW_445}",
          builder="phi3_windowed", symptom="window_read", args=W4, check="window",
          today="caught"),
    Entry("qwen2-window-dropped-445", "transformers", _t("4.45.2"), _t("4.46.0"),
          ref="huggingface/transformers#32945 (same cause; found by diffing the 4.45.2 and "
              "4.46.0 wheels)", fix="4.46.0",
          summary=f"Qwen2 with use_sliding_window=True attends past its window: {WINDOW_445}",
          builder="qwen2_windowed", symptom="window_read", args=W4, check="window",
          today="caught"),
    Entry("starcoder2-window-dropped", "transformers", _t("4.45.2"), _t("4.46.0"),
          ref="huggingface/transformers#32945 (same cause; found by diffing the 4.45.2 and "
              "4.46.0 wheels)", fix="4.46.0",
          summary=f"Starcoder2's declared sliding window is not applied: {WINDOW_445}",
          builder="starcoder2_windowed", symptom="window_read", args=W4, check="window",
          today="caught"),
    Entry("qwen2-window-dropped-448", "transformers", _t("4.48.3"), _t("4.49.0"),
          ref="huggingface/transformers#35924", fix="4.49.0",
          summary="the 4.48 attention refactor removed the window from Qwen2's mask builder "
                  "while still handing sliding_window to the attention function, which only "
                  "flash-attention reads: eager and SDPA attend the whole past again",
          builder="qwen2_windowed", symptom="window_read", args=W4, check="window",
          today="caught"),
    Entry("qwen2-window-on-full-layers", "transformers", _t("4.52.4"), _t("4.53.0"),
          ref="huggingface/transformers#35896", fix="4.53.0 (layer_types)",
          summary=f"{QWEN_FULL_LAYERS} Qwen2",
          builder="qwen2_full_declared", symptom="full_layer_windowed", args=W4,
          check="window", today="caught", threshold=0.5, tolerance=0.0),
    Entry("qwen3-window-on-full-layers", "transformers", _t("4.52.4"), _t("4.53.0"),
          ref="huggingface/transformers#35896", fix="4.53.0 (layer_types)",
          summary=f"{QWEN_FULL_LAYERS} Qwen3",
          builder="qwen3_full_declared", symptom="full_layer_windowed", args=W4,
          check="window", today="caught", threshold=0.5, tolerance=0.0),
    Entry("gemma2-raises-past-window", "transformers", _t("4.48.1"), _t("4.48.2"),
          ref="huggingface/transformers#35681", fix="#35681 (4.48.2)",
          summary="after the 4.48 attention refactor, Gemma2ForCausalLM's plain forward raises "
                  "IndexError in its HybridCache for any input longer than sliding_window (the "
                  "window was no longer passed to the cache update)",
          builder="gemma2_windowed", symptom="forward_raises", check="inputs",
          today="caught", control="fail", standing=("oracle",),
          note="the control fails kv_cache for another genuine bug, not this one: the chunk "
               "bug of gemma2-hybrid-cache-chunk (a chunk of several tokens into the "
               "HybridCache), still in 4.48.2; both releases fail oracle too: Gemma 2's "
               "default SDPA path drops attn_logit_softcapping in every release before "
               "5.21.0 (the bug of gemma2-sdpa-drops-softcap), a standing finding"),
    Entry("gemma2-sdpa-drops-softcap", "transformers", _t("5.20.2"), _t("5.21.0"),
          ref="huggingface/transformers#31887 (SDPA cannot soft-cap, said there; found by "
              "diffing the 5.20.2 and 5.21.0 wheels)", fix="5.21.0",
          summary="Gemma 2's default attention path (SDPA) silently drops "
                  "attn_logit_softcapping (50): scores beyond the cap are not squashed; 5.21.0 "
                  "makes eager the default and SDPA refuses a soft-cap",
          builder="gemma2_windowed", symptom="softcap_dropped", check="oracle",
          today="caught"),
    Entry("vaultgemma-sdpa-drops-softcap", "transformers", _t("5.20.2"), _t("5.21.0"),
          ref="huggingface/transformers#31887 (SDPA cannot soft-cap, said there; found by "
              "diffing the 5.20.2 and 5.21.0 wheels)", fix="5.21.0",
          summary="VaultGemma (Gemma 2's block, from 4.57.0) runs on SDPA by default and "
                  "silently drops attn_logit_softcapping (50), as Gemma 2 did: scores beyond the "
                  "cap are not squashed; 5.21.0 makes eager the default and SDPA refuses a "
                  "soft-cap",
          builder="vaultgemma_lm", symptom="softcap_dropped", args={"scale": 300.0},
          check="oracle", today="caught", threshold=1e-2),
    # --- caches -----------------------------------------------------------------------------
    Entry("gemma2-hybrid-cache-past-window", "transformers", _t("4.51.3"), _t("4.52.1"),
          ref="huggingface/transformers#37574", fix="#38046 (4.52.1)",
          summary="HybridCache's sliding update rolls the window one step late once the "
                  "sequence reaches the window (a prompt shorter than the window, then decoding "
                  "past it): every later token attends a wrong set of keys",
          builder="gemma2_windowed", symptom="cached_vs_full",
          args={"prefill": 3, "cache": "hybrid"}, check="kv_cache", today="both",
          control="fail", standing=("oracle",),
          note="the control fails kv_cache for another genuine bug, the chunk bug of "
               "gemma2-hybrid-cache-chunk (still in 4.52.1): the gate tells the two releases "
               "apart by nothing; both releases fail oracle too: Gemma 2's default SDPA "
               "path drops attn_logit_softcapping in every release before 5.21.0 (the bug of "
               "gemma2-sdpa-drops-softcap), a standing finding"),
    Entry("litgpt-window-cache", "litgpt", ("litgpt==0.5.11", "transformers==4.57.6"),
          ("litgpt==0.5.12", "transformers==4.57.6"),
          ref="Lightning-AI/litgpt#2145", fix="#2153 (0.5.12)",
          summary="cached decoding ignores the sliding window: the window bias is built against "
                  "the step's own row index, not its absolute position, so a windowed layer "
                  "reads the whole cache (Gemma 2/3 degrade past the window)",
          builder="litgpt_gemma_windowed", symptom="litgpt_cached_vs_full", check="kv_cache",
          today="caught", audit={"vocab_size": 96}, control="fail",
          standing=("params", "oracle"),
          note="the control fails kv_cache for a second genuine bug: a cached prefill longer "
               "than the window (8 > 4) reads wrong keys in 0.5.12 (0.5.13 refuses it with "
               "ValueError: 'silently violates causality'); the buggy release fails on the "
               "steps past the window too. litgpt pins huggingface_hub < 1, which the project's transformers 5 cannot "
               "import (torchmetrics imports transformers): its environment holds "
               "transformers 4.57.6 beside it. Both releases' config is read as a spec, and "
               "its GemmaMLP with exact GELU (gelu_approximate 'none') is a gated MLP no "
               "DecoderConfig expresses: params and oracle fail closed, naming it"),
    Entry("gemma2-hybrid-cache-chunk", "transformers", _t("4.55.4"), _t("4.57.0"),
          ref="huggingface/transformers#40893", fix="#40893 (4.57.0)",
          summary="HybridCache's static sliding layer takes one new token at a time: a chunk of "
                  "several tokens after the prefill (chunked prefill, a chat continued on its "
                  "cache) overwrites the window wrongly (4.56 raises IndexError instead)",
          builder="gemma2_windowed", symptom="cached_vs_full",
          args={"prefill": 3, "chunk": 3, "cache": "hybrid"}, check="kv_cache",
          today="caught", standing=("oracle",),
          note="both releases fail oracle: Gemma 2's default SDPA path drops "
               "attn_logit_softcapping in every release before 5.21.0 (the bug of "
               "gemma2-sdpa-drops-softcap), a standing finding"),
    Entry("cohere2-padded-window-cache", "transformers", _t("4.48.1"), _t("4.48.2"),
          ref="huggingface/transformers#35681 (the same fix, in Cohere 2's copy of Gemma 2's "
              "layer; found by diffing the 4.48.1 and 4.48.2 wheels)", fix="#35681 (4.48.2)",
          summary="after the 4.48 attention refactor, Cohere 2's windowed layers cut a decode "
                  "step's mask to its last sliding_window columns, not at the offset the "
                  "HybridCache's window sits at: a left-padded row decoded through the cache "
                  "past its window is masked off its own keys (its pads no longer where the mask "
                  "says)",
          builder="cohere2_windowed", symptom="padded_cached_vs_alone",
          args={"cache": "hybrid", "prefill": 6}, check="padding", today="caught",
          threshold=1e-3, standing=("kv_cache",),
          note="both releases fail kv_cache the same way, a standing finding of these "
               "releases: the gate's cached decode raises inside Cohere 2's HybridCache "
               "(RuntimeError: size of tensor a (3) must match b (2)), and with a cache sized "
               "for the row a chunk of 3 tokens after the prefill differs from the full forward "
               "(0.0077 on 4.48.2), the chunk bug of gemma2-hybrid-cache-chunk. The symptom's "
               "prefill (6) is past the window (4): a shorter one meets the bug of "
               "gemma2-hybrid-cache-past-window on both releases"),
    Entry("nemotron-prefill-no-cache", "transformers", _t("4.46.3"), _t("4.47.0"),
          ref="huggingface/transformers#34739", fix="#34742 (4.47.0)",
          summary="NemotronModel never creates a cache when called with use_cache=True and no "
                  "past_key_values, and numbers a continuation's positions from 0: a prefill "
                  "followed by cached steps decodes each step as if it were the first token",
          builder="nemotron_lm", symptom="cached_vs_full", check="kv_cache", today="caught"),
    Entry("granite-moe-hybrid-chunked-prefill", "transformers", _t("5.12.1"), _t("5.13.0"),
          ref="huggingface/transformers#46741", fix="#46741 (5.13.0)",
          summary="the Mamba-2 mixer of the hybrid models ignores the cached SSM state for a "
                  "chunk of several tokens after the prefill (chunked prefill, speculative "
                  "decoding): every chunk restarts its state",
          builder="granite_moe_hybrid_lm", symptom="cached_vs_full",
          args={"prefill": 6, "chunk": 3, "T": 12}, check="kv_cache", today="caught"),
    Entry("zamba2-chunked-prefill", "transformers", _t("5.12.1"), _t("5.13.0"),
          ref="huggingface/transformers#46741", fix="#46741 (5.13.0)",
          summary="Zamba2 (Mamba-2 + shared attention): the same chunked-prefill state bug as "
                  "GraniteMoeHybrid, in its own copy of the mixer",
          builder="zamba2_lm", symptom="cached_vs_full",
          args={"prefill": 6, "chunk": 3, "T": 12}, check="kv_cache", today="caught"),
    Entry("lens-alibi-cache", "transformer-lens",
          ("transformer-lens==2.8.1", "transformers==4.57.6"),
          ("transformer-lens==2.9.0", "transformers==4.57.6"),
          ref="TransformerLensOrg/TransformerLens#776", fix="#777 (2.9.0)",
          summary="with a key/value cache, the ALiBi bias added to a step's scores is the first "
                  "query rows' (rows 0..q) instead of the last ones' (the Bloom family decodes "
                  "wrongly with use_past_kv_cache=True)",
          builder="lens_alibi", symptom="lens_cached_vs_full", check="kv_cache",
          today="caught", audit={"vocab_size": 96},
          standing=("inputs", "dead_parameters", "params", "oracle"),
          note="TransformerLens 2.x needs a transformers 4 (its environment holds 4.57.6); "
               "both releases accept negative ids (inputs) and keep a learned W_pos that ALiBi "
               "never reads (dead_parameters), standing findings of that library; their config "
               "is read as a spec, and the TransformerLens reader reads learned and rotary "
               "positions only (DecoderConfig's pos='alibi' is read from Hugging Face's BLOOM "
               "and MPT): params and oracle fail closed, naming "
               "positional_embedding_type='alibi'"),
    # --- packing ----------------------------------------------------------------------------
    Entry("llama-packed-position-ids", "transformers", _t("4.53.0"), _t("4.53.1"),
          ref="huggingface/transformers#39194", fix="#39194 (4.53.1)",
          summary="packed rows sent as position ids only (DataCollatorWithFlattening) leak "
                  "across documents on SDPA and eager: 4.53.0's new masking_utils built a plain "
                  "causal mask; 4.53.1 reads document boundaries from the position ids",
          builder="llama_padding_free", symptom="packed_leak", args={"use_cache": False},
          check="packing", today="caught",
          audit={"training": {"batch_size": 4, "seq_len": 32, "pack": True}},
          note="audited as a padding-free trainer declares it: training packed "
               "(TrainingPath(batch_size=4, seq_len=32, pack=True), what TrainerGate reads "
               "from DataCollatorWithFlattening) "
               "and config.use_cache=False; with use_cache on, the leak remains in every release "
               "through 5.24 (a cache disables the boundary detection), which the packing check "
               "fails on any release"),
    # --- attention numerics -----------------------------------------------------------------
    Entry("opt-attention-scaled-twice", "transformers", _t("4.52.1"), _t("4.52.4"),
          ref="huggingface/transformers#38277", fix="#38290 (4.52.4)",
          summary="the 4.52 attention refactor of OPT kept its query scaled by 1/sqrt(d) in the "
                  "projection and also handed scaling=1/sqrt(d) to the attention function: every "
                  "score is divided by d instead of sqrt(d) (4.52.0 to 4.52.3, eager and SDPA)",
          builder="opt_lm", symptom="attention_vs_definition", check="oracle", today="caught",
          threshold=1e-2, standing=("inputs",),
          note="inputs fails on both releases (OPT accepts rank-3 ids and flattens them), a "
               "standing finding"),
    Entry("gpt-bigcode-attention-scale-inverted", "transformers", _t("4.55.0"), _t("4.55.4"),
          ref="huggingface/transformers#40041", fix="#40041 (4.55.1)",
          summary="GPT-BigCode's move to the attention interface (4.54.0) set its scaling to "
                  "head_dim**0.5 where head_dim**-0.5 belongs: StarCoder and SantaCoder's scores "
                  "are multiplied by sqrt(d) instead of divided by it (4.54.0 to 4.55.0, eager and "
                  "SDPA)",
          builder="gpt_bigcode_lm", symptom="attention_vs_definition", check="oracle",
          today="caught", threshold=1e-2,
          note="the control is 4.55.4, a later fixed release whose environment other rows "
               "already build (the first fixed release is 4.55.1)"),
    Entry("phi-lm-head-bias-dropped", "transformers", _t("4.48.0"), _t("4.48.1"),
          ref="huggingface/transformers#35625", fix="#35650 (4.48.1)",
          summary="the 4.48 refactor built PhiForCausalLM's lm_head with bias=False: the readout "
                  "bias that Phi-1, 1.5 and 2 checkpoints carry is dropped at load (an unused "
                  "weight), and every logit misses it",
          builder="phi_lm", symptom="checkpoint_readout_bias", check="params", today="caught",
          threshold=1e-2),
    Entry("minimax-m2-legacy-rotary-dim", "transformers", _t("5.17.0"), _t("5.18.0"),
          ref="huggingface/transformers#48241", fix="#48486 (5.18.0)",
          summary="MiniMaxM2Config keeps the legacy rotary_dim that every released MiniMax-M2 "
                  "checkpoint declares its partial RoPE with (64 of head_dim 128) as an unread "
                  "attribute: rope_parameters gets no partial_rotary_factor and every layer "
                  "rotates the whole head on a full-width frequency ladder",
          builder="minimax_m2_legacy_rotary", symptom="rotary_vs_declared",
          args={"rotary_dim": 4}, check="oracle", today="caught", threshold=1e-2),
    # --- routed experts ---------------------------------------------------------------------
    Entry("mixtral-router-double-softmax", "transformers", _t("5.5.4"), _t("5.6.0"),
          ref="huggingface/transformers#45120", fix="#45131 (5.6.0)",
          summary=f"MixtralForCausalLM: {DOUBLE_SOFTMAX}",
          builder="mixtral_moe", symptom="aux_loss_gradient", check="router_aux_loss",
          today="caught", threshold=0.1),
    Entry("flex-olmo-router-double-softmax", "transformers", _t("5.5.4"), _t("5.6.0"),
          ref="huggingface/transformers#45120 (same cause: FlexOlmo's router, fixed by the same "
              "PR; found by diffing the 5.5.4 and 5.6.0 wheels)", fix="#45131 (5.6.0)",
          summary=f"FlexOlmoForCausalLM: {DOUBLE_SOFTMAX}",
          builder="flex_olmo_moe", symptom="aux_loss_gradient", check="router_aux_loss",
          today="caught", threshold=0.1),
    Entry("glm4-moe-masked-groups-zero", "transformers", _t("5.5.4"), _t("5.6.0"),
          ref="huggingface/transformers#45440", fix="#45441 (5.6.0)",
          summary="routing by groups (DeepSeek-V3's router, copied into GLM-4.5's Glm4Moe, "
                  "Dots1, Solar Open, EXAONE MoE, GLM-4.7-Flash) fills the experts of the groups "
                  "not chosen with 0.0, not -inf: once the selection bias makes sigmoid(logit) + "
                  "bias negative, those experts outrank the chosen group's and tokens go to "
                  "experts outside their groups (every release through 5.5.4)",
          builder="glm4_moe_grouped", symptom="routed_outside_groups", check="oracle",
          today="caught", threshold=0.1, tolerance=0.0,
          note="the tiny model's selection biases are set below zero (linspace(-1.2, -0.8)), as "
               "an aux-loss-free balancer leaves them: at their init (zeros) the scores stay "
               "positive and the two releases agree. Every release of this router before 5.0 is "
               "also buggy, but there the gate's layout table does not read Glm4Moe's experts "
               "(a ModuleList in transformers 4): params and oracle fail both sides"),
    # --- the model's own loss ---------------------------------------------------------------
    Entry("xglm-pad-target", "transformers", _t("4.49.0"), _t("4.50.0"),
          ref="huggingface/transformers#35878", fix="#35878 (4.50.0)",
          summary="XGLM's labels= loss shifts the labels and appends pad_token_id as the target "
                  "of the last position, which cross entropy does not ignore: every row is "
                  "trained to predict padding at its end",
          builder="xglm_lm", symptom="loss_with_labels", check="model_loss", today="caught",
          standing=("inputs",),
          note="inputs fails on both releases (XGLM accepts rank-3 ids and flattens them), a "
               "standing finding"),
    Entry("gpt-neox-items-dropped", "transformers", _t("4.48.3"), _t("4.49.0"),
          ref="huggingface/transformers#34191 (the accumulation fix it misses; found by diffing "
              "the 4.48.3 and 4.49.0 wheels)", fix="4.49.0",
          summary="GPTNeoXForCausalLM.forward takes **kwargs ('unused for now') and drops "
                  "num_items_in_batch: the Trainer, seeing loss kwargs accepted, no longer "
                  "divides by the accumulation steps, and the loss is normalised per micro-batch",
          builder="gpt_neox_lm", symptom="loss_with_items", check="model_loss",
          today="caught"),
    Entry("xglm-items-dropped", "transformers", _t("5.16.1"), _t("5.17.0"),
          ref="huggingface/transformers#48493", fix="#48493 (5.17.0)",
          summary=f"XGLMForCausalLM ignores num_items_in_batch: {LOSS_517}",
          builder="xglm_lm", symptom="loss_with_items", check="model_loss", today="caught"),
    Entry("mamba-items-dropped", "transformers", _t("5.16.1"), _t("5.17.0"),
          ref="huggingface/transformers#48493", fix="#48493 (5.17.0)",
          summary=f"MambaForCausalLM ignores num_items_in_batch and shift_labels: {LOSS_517}",
          builder="mamba_lm", symptom="loss_with_items", check="model_loss", today="caught",
          via="verify --hf"),
    Entry("bloom-shift-labels-dropped", "transformers", _t("5.16.1"), _t("5.17.0"),
          ref="huggingface/transformers#48493", fix="#48493 (5.17.0)",
          summary=f"BloomForCausalLM ignores shift_labels (the targets sequence parallelism "
                  f"sends): {LOSS_517}",
          builder="bloom_lm", symptom="loss_with_shift_labels", check="model_loss",
          today="caught"),
    # --- parameters -------------------------------------------------------------------------
    Entry("x-transformers-qk-norm-scale", "x-transformers", ("x-transformers==2.25.4",),
          ("x-transformers==2.25.5",),
          ref="lucidrains/x-transformers#352", fix="2.25.5",
          summary="attn_qk_norm_dim_scale=True creates the per-head, per-dimension q/k scales "
                  "but the forward never multiplies by them (2.17.1 to 2.25.4): they never "
                  "receive a gradient",
          builder="x_transformers_qk_norm_dim_scale", symptom="dead_gradients",
          check="dead_parameters", today="caught", threshold=0.5, tolerance=0.0,
          audit={"vocab_size": 96}, standing=("inputs", "params", "oracle"),
          note="every x-transformers release accepts float ids and runs them (inputs), a "
               "standing finding of tests/gate/test_outside_libraries.py; both releases' "
               "modules are read as a spec, and their q/k norm (with its per-dimension scales) "
               "is an option no DecoderConfig expresses: params and oracle fail closed, "
               "naming it"),
)

BY_ID: dict[str, Entry] = {entry.id: entry for entry in ENTRIES}
