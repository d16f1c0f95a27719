"""Tiny Llamas, a tokenizer and data for the gate inside the trainers (tests/integrations), with
the defects each trainer's gate must stop before the first optimizer step, planted:

  LeakyLlama(after=0)       its logits read the target (the next input id) from the start: the
                            gate's `causal` fails
  LeakyLlama(after=k)       the same leak, switched on after k forwards the trainer takes (train
                            mode, gradients, labels): the gate passes and the loss collapses to
                            near zero within the first steps
  LateLeakLlama             the leak of LeakyLlama, weaker (its loss stays far from zero) and only in
                            rows longer than 64 tokens: the audit's own probes (64 tokens) pass
                            it, the training shape at the run's length fails `causal`
  HalfLeakLlama             the leak of LeakyLlama, only under float16 autocast (what TrainingArguments'
                            fp16=True runs): `autocast` fails on that path, and only there
  tiny_mixtral(cls, on)      a tiny Mixtral (4 experts, 2 a token) whose config turns the router aux
                            loss on or off (output_router_logits, router_aux_loss_coef 0.02)
  AuxTwiceMixtral           adds coef x aux_loss to its loss a second time: `router_aux_loss`
                            fails; the run steps on it only where output_router_logits is on
  ReentrantLlama            activation checkpointing through torch.utils.checkpoint with
                            use_reentrant=True and no enable_input_require_grads: with the input
                            embeddings frozen, no gradient reaches a layer's weights (the bug of
                            transformers#26221, rebuilt): the gate's `checkpointing` fails
  OwnCountLlama             its loss ignores the trainer's num_items_in_batch and divides by its
                            own label count: accumulated micro-batches weigh their tokens unequally
                            (transformers#34191): `model_loss` and `batch_loss` fail
  shifted_twice_collator    labels the collator shifted already, which the model shifts again
                            (transformers#47395): audit_batch's `shift` fails
  masked_flattening_collator  DataCollatorWithFlattening's packed rows (restarting position_ids)
                            with an all-ones attention_mask beside them: transformers reads the
                            documents from the restarts only where no mask is passed, so each
                            document attends to the ones before it: `batch_as_sent` fails
  block_mask_collator       DataCollatorWithFlattening's packed rows with a 4-D additive
                            attention_mask (1, 1, T, T): block-diagonal (correct), or causal over
                            the whole row (`blocks=False`, a collator bug: every document reads
                            the ones before it): `batch_as_sent` fails
  NarrowLlama(takes)        a forward that names only `takes` (no **kwargs): a batch entry it
                            does not name (position_ids, cu_seq_lens_q, labels) raises
                            TypeError, which the gate reports as `batch_as_sent`, naming the form
A tokenizer whose pad is its eos with transformers' own DataCollatorForLanguageModeling masks
every eos label (transformers#23530): audit_batch's `last_token` fails.
"""

from __future__ import annotations

import functools
import inspect

import torch
import transformers as tf
from torch.utils.checkpoint import checkpoint

V, EOS = 37, 36
WORDS = [f"w{i}" for i in range(V - 1)] + ["</s>"]


def config(**overrides) -> tf.LlamaConfig:
    return tf.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=24,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=64, eos_token_id=EOS, bos_token_id=None,
                          pad_token_id=None, **overrides)


def tiny_llama(cls=None, **kwargs) -> tf.LlamaForCausalLM:
    torch.manual_seed(0)
    return (cls or tf.LlamaForCausalLM)(config(), **kwargs)


def documents(count: int = 16, *, seed: int = 0, lengths=(6, 12)) -> list[dict]:
    """`count` documents of random ids (never eos), each ended by eos, of lengths in the range."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        n = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen))
        rows.append({"input_ids": torch.randint(0, EOS, (n - 1,), generator=gen).tolist()
                     + [EOS]})
    return rows


def tokenizer(*, pad_is_eos: bool = True) -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer of the V words (w0 .. w35, </s>); its pad is its eos, as people
    set it for a Llama that has no pad token."""
    import tokenizers

    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(WORDS)}, unk_token="</s>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    if pad_is_eos:
        tok.pad_token = tok.eos_token
    return tok


class LeakyLlama(tf.LlamaForCausalLM):
    """Logits that read the next input id (the target), from the start (after=0) or after
    `after` training forwards (see the module docstring)."""

    def __init__(self, config, after: int = 0) -> None:
        super().__init__(config)
        self.after, self.trained_calls = after, 0

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                num_items_in_batch=None, **kwargs):
        if self.training and torch.is_grad_enabled() and labels is not None:
            self.trained_calls += 1
        shift_labels = kwargs.pop("shift_labels", None)
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, **kwargs)
        leaking = self.after == 0 or self.trained_calls > self.after
        if input_ids is not None and leaking:
            ahead = torch.roll(input_ids, -1, dims=1)  # (B, T): the target of each position
            out.logits = out.logits + 30.0 * torch.nn.functional.one_hot(ahead, V)
        if labels is not None:
            out.loss = self.loss_function(out.logits, labels, V, shift_labels=shift_labels,
                                          num_items_in_batch=num_items_in_batch)
        return out


class LateLeakLlama(tf.LlamaForCausalLM):
    """Logits that read the next input id, a little (+3), only in rows longer than `past`."""

    def __init__(self, config, past: int = 64) -> None:
        super().__init__(config)
        self.past = past

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                num_items_in_batch=None, **kwargs):
        shift_labels = kwargs.pop("shift_labels", None)
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, **kwargs)
        if input_ids is not None and input_ids.shape[1] > self.past:
            ahead = torch.roll(input_ids, -1, dims=1)  # (B, T): the target of each position
            out.logits = out.logits + 3.0 * torch.nn.functional.one_hot(ahead, V)
        if labels is not None:
            out.loss = self.loss_function(out.logits, labels, V, shift_labels=shift_labels,
                                          num_items_in_batch=num_items_in_batch)
        return out


class HalfLeakLlama(LeakyLlama):
    """LeakyLlama's leak, switched on under float16 autocast alone."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                num_items_in_batch=None, **kwargs):
        device = self.lm_head.weight.device.type
        self.after = 0 if torch.is_autocast_enabled(device) and \
            torch.get_autocast_dtype(device) == torch.float16 else 10**9
        return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, labels=labels,
                               num_items_in_batch=num_items_in_batch, **kwargs)


def tiny_mixtral(cls=None, *, router_aux: bool = True) -> tf.MixtralForCausalLM:
    torch.manual_seed(0)
    cfg = tf.MixtralConfig(vocab_size=V, hidden_size=16, intermediate_size=24,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=64, num_local_experts=4,
                           num_experts_per_tok=2, output_router_logits=router_aux,
                           router_aux_loss_coef=0.02, eos_token_id=EOS, bos_token_id=None,
                           pad_token_id=None)
    return (cls or tf.MixtralForCausalLM)(cfg)


class AuxTwiceMixtral(tf.MixtralForCausalLM):
    """Its router aux loss added twice where it is on."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                output_router_logits=None, **kwargs):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, labels=labels,
                              output_router_logits=output_router_logits, **kwargs)
        if out.loss is not None and out.aux_loss is not None:
            out.loss = out.loss + self.config.router_aux_loss_coef * out.aux_loss
        return out


class ReentrantLlama(tf.LlamaForCausalLM):
    """Checkpointing switched on as transformers did before #26221 was mended."""

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        self._set_gradient_checkpointing(True, functools.partial(checkpoint, use_reentrant=True))


class OwnCountLlama(tf.LlamaForCausalLM):
    """Takes num_items_in_batch and ignores it (its loss is the mean over its own labels)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                num_items_in_batch=None, **kwargs):
        return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, labels=labels, **kwargs)


def shifted_twice_collator(features: list[dict]) -> dict:
    """Right-padded ids with labels shifted by the collator (label t = id t + 1), which the model
    shifts once more."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), longest), EOS)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        ids[row, :n] = torch.tensor(f["input_ids"])
        mask[row, :n] = 1
        labels[row, :n - 1] = ids[row, 1:n]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def masked_flattening_collator(features: list[dict]) -> dict:
    """DataCollatorWithFlattening's batch with an all-ones attention_mask added."""
    batch = tf.DataCollatorWithFlattening()(features)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    return batch


def block_mask_collator(features: list[dict], *, blocks: bool = True) -> dict:
    """DataCollatorWithFlattening's batch with a 4-D additive mask: 0 where a token may attend
    (causal, within its document when `blocks`), float32's lowest value elsewhere."""
    batch = tf.DataCollatorWithFlattening()(features)
    positions = batch["position_ids"][0]  # (T,)
    document = torch.cumsum(positions == 0, 0)  # (T,): which document each token is in
    length = len(positions)
    allowed = torch.ones(length, length, dtype=torch.bool).tril()  # (T, T)
    if blocks:
        allowed &= document[:, None] == document[None, :]
    mask = torch.zeros(length, length).masked_fill(~allowed, torch.finfo(torch.float32).min)
    batch["attention_mask"] = mask[None, None]  # (1, 1, T, T)
    return batch


def narrow_llama(*takes: str) -> tf.LlamaForCausalLM:
    """A tiny Llama whose forward names only `takes` (input_ids first): nothing else can be
    passed to it, as Python refuses a keyword a function does not name."""
    def forward(self, input_ids=None, **given):
        unknown = [name for name in given if name not in takes]
        if unknown:
            raise TypeError(f"forward() got an unexpected keyword argument {unknown[0]!r}")
        return tf.LlamaForCausalLM.forward(self, input_ids=input_ids, **given)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    forward.__signature__ = inspect.Signature(
        [inspect.Parameter("self", kind)] + [inspect.Parameter(name, kind, default=None)
                                             for name in takes])
    return tiny_llama(type("NarrowLlama", (tf.LlamaForCausalLM,), {"forward": forward}))


class LabelReadingLlama(tf.LlamaForCausalLM):
    """Given labels, its logits read the label it is scored against (target leakage through
    the labels): causal on ids alone and its loss the cross entropy of the logits it returns,
    so the model audit passes; on the trainer's call, the loss is near zero before any step."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None,
                num_items_in_batch=None, **kwargs):
        shift_labels = kwargs.pop("shift_labels", None)
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, **kwargs)
        if labels is not None:
            target = torch.roll(labels, -1, dims=1).clamp(min=0)  # (B, T): label t + 1
            out.logits = out.logits + 30.0 * torch.nn.functional.one_hot(target, V)
            out.loss = self.loss_function(out.logits, labels, V, shift_labels=shift_labels,
                                          num_items_in_batch=num_items_in_batch)
        return out
