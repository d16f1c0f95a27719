"""Routed experts and latent attention in our Decoder: equal to the float64 oracle (per-token,
per-expert loops) in values and every gradient; the routing itself against the definition
written here; the meta device's gathered experts equal to the loop; the KV cache and
generation unchanged in meaning; the weight names DESIGN.md's table gains."""

from __future__ import annotations

import math

import configs
import pytest
import torch
from helpers import oracle_leaves, random_decoder

import decoder_audit as da
from decoder_audit.model.mlp import RoutedExperts

ROUTED = ("moe-softmax-shared", "moe-sigmoid-bias", "moe-topk-softmax-relu", "moe-unnormalised",
          "moe-capacity", "mla-moe", "moe-grouped", "moe-grouped-max", "moe-shared-gate",
          "gpt-oss-like", "cohere2-moe-like")
LATENT = ("mla-q-latent", "mla-moe")
EVERY = configs.params(configs.entries(*dict.fromkeys(ROUTED + LATENT)))


@pytest.mark.parametrize("cfg", EVERY)
def test_values_equal_the_float64_oracle(cfg):
    model = random_decoder(cfg, dtype=torch.float64)
    for batch, seq_len in ((1, 1), (3, cfg.max_seq_len), (2, 3)):
        ids = torch.randint(0, cfg.vocab_size, (batch, seq_len))
        slow = da.oracle_logits(model.state_dict(keep_vars=True), cfg, ids)
        torch.testing.assert_close(model(ids), slow, atol=1e-10, rtol=0)
        torch.testing.assert_close(model.run_with_trace(ids)[0], slow, atol=1e-10, rtol=0)


@pytest.mark.parametrize("cfg", EVERY)
def test_every_gradient_equals_the_oracle(cfg):
    model = random_decoder(cfg, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (3, cfg.max_seq_len))
    weights = torch.randn(3, cfg.max_seq_len, cfg.vocab_size, dtype=torch.float64)
    leaves = oracle_leaves(model, ids, weights)
    unreached = []  # outside the experts (which a token may not choose), every weight counts
    for name, param in model.named_parameters():
        fast, slow = param.grad, leaves[name].grad
        if "selection_bias" in name:  # chooses, never weighs: no gradient on either side
            assert fast is None and (slow is None or not slow.any())
            continue
        torch.testing.assert_close(torch.zeros_like(param) if fast is None else fast,
                                   torch.zeros_like(param) if slow is None else slow,
                                   atol=1e-10, rtol=0)
        if ".experts." not in name and (fast is None or not fast.any()):
            unreached.append(name)
    assert unreached == []


def _definition(cfg, logits, bias):
    """Each token's {expert: weight} from its router logits (E,), as the families define it."""
    out = []
    for row in logits.tolist():
        if cfg.router_order == "topk_score":
            keys = _grouped(cfg, [r + (0 if bias is None else b)
                                  for r, b in zip(row, bias or [0] * len(row))])
            top = sorted(range(len(row)), key=lambda e: keys[e], reverse=True)[:cfg.experts_per_token]
            exps = [math.exp(row[e]) for e in top]
            weights = [x / sum(exps) for x in exps] if cfg.router_scoring == "softmax" else [
                1 / (1 + math.exp(-row[e])) for e in top]
        else:
            t = torch.tensor(row, dtype=torch.float64)
            scores = (t.softmax(-1) if cfg.router_scoring == "softmax" else t.sigmoid()).tolist()
            keys = _grouped(cfg, [s + (0 if bias is None else b)
                                  for s, b in zip(scores, bias or [0] * len(row))])
            top = sorted(range(len(row)), key=lambda e: keys[e], reverse=True)[:cfg.experts_per_token]
            weights = [scores[e] for e in top]
        if cfg.normalize_topk:
            weights = [w / sum(weights) for w in weights]
        out.append({e: w * cfg.routed_scaling for e, w in zip(top, weights)})
    return out


def _grouped(cfg, keys):
    """DeepSeek's group-limited choice: keys outside the best groups_per_token groups (of E / G
    consecutive experts, ranked by their two best keys summed, or their best) set to -inf."""
    if cfg.expert_groups is None:
        return keys
    size = cfg.n_experts // cfg.expert_groups
    groups = [keys[g * size:(g + 1) * size] for g in range(cfg.expert_groups)]
    worth = [sum(sorted(g)[-2:]) if cfg.group_score == "top2_sum" else max(g) for g in groups]
    best = sorted(range(len(groups)), key=lambda g: worth[g], reverse=True)[:cfg.groups_per_token]
    return [k if e // size in best else -math.inf for e, k in enumerate(keys)]


@pytest.mark.parametrize("cfg", configs.params(configs.entries(
    "moe-softmax-shared", "moe-sigmoid-bias", "moe-topk-softmax-relu", "moe-unnormalised",
    "moe-grouped", "moe-grouped-max")))
def test_the_traced_gates_are_the_routing_definition(cfg):
    model = random_decoder(cfg, dtype=torch.float64)
    _, trace = model.run_with_trace(torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len)))
    layers = [i for i in range(cfg.n_layers) if cfg.routes(i)]
    assert layers and not any(f"layers.{i}.ffn.gates" in trace for i in range(cfg.n_layers)
                              if i not in layers)
    for i in layers:
        bias = model.layers[i].ffn.router.selection_bias
        bias = None if bias is None else bias.tolist()
        logits = trace[f"layers.{i}.ffn.router"].reshape(-1, cfg.n_experts)
        gates = trace[f"layers.{i}.ffn.gates"].reshape(-1, cfg.n_experts)
        for token, want in enumerate(_definition(cfg, logits, bias)):
            expected = torch.zeros(cfg.n_experts, dtype=torch.float64)
            expected[list(want)] = torch.tensor(list(want.values()), dtype=torch.float64)
            torch.testing.assert_close(gates[token], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("cfg", configs.params(configs.entries(*ROUTED)))
def test_the_gathered_experts_of_the_meta_device_equal_the_loop(cfg):
    torch.manual_seed(0)
    layer = next(i for i in range(cfg.n_layers) if cfg.routes(i))
    ffn = random_decoder(cfg, dtype=torch.float64).layers[layer].ffn
    assert isinstance(ffn, RoutedExperts)
    x = torch.randn(2, 5, cfg.d_model, dtype=torch.float64, requires_grad=True)
    tokens = x.reshape(-1, cfg.d_model)
    _, chosen, weights = ffn.route(tokens)
    gathered = ffn._gathered(tokens, chosen, weights)
    if ffn.shared is not None:
        gathered = gathered + ffn.shared_output(tokens)
    torch.testing.assert_close(ffn(x).reshape(-1, cfg.d_model), gathered, atol=1e-12, rtol=0)


@pytest.mark.parametrize("cfg", EVERY)
def test_cached_and_padded_generation_equal_the_full_forward(cfg):
    if cfg.capacity_factor is not None:
        pytest.skip("a model that drops tokens over capacity depends on the call's length")
    model = random_decoder(cfg, dtype=torch.float64, std=0.3)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    full = model(ids)
    cache = model.new_cache(2)
    steps = [model(ids[:, :3], cache=cache)] + [model(ids[:, t:t + 1], cache=cache)
                                                for t in range(3, cfg.max_seq_len)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=0)
    if cfg.latent_attention:  # the decompressed keys and values, Dh = 10 or 6 and Dv apart
        assert cache.keys.shape[-1] == cfg.head_dim and cache.values.shape[-1] == cfg.value_dim
    padded = torch.cat((torch.zeros(2, 2, dtype=torch.long), ids[:, :-2]), 1)
    mask = torch.ones_like(padded)
    mask[:, :2] = 0
    torch.testing.assert_close(model(padded, mask)[:, 2:], model(ids[:, :-2]), atol=1e-10, rtol=0)
    greedy = da.generate(model, ids[:, :2], max_new_tokens=cfg.max_seq_len - 2)
    plain = da.generate(model, ids[:, :2], max_new_tokens=cfg.max_seq_len - 2, use_cache=False)
    assert greedy.ids == plain.ids


def test_the_weight_names_extend_designs_table():
    moe = da.Decoder(configs.named("moe-softmax-shared"), device="meta")
    shapes = {n: tuple(p.shape) for n, p in moe.named_parameters()}
    assert "layers.0.ffn.w1.weight" in shapes  # first_dense_layers=1: a dense MLP of d_ff
    assert shapes["layers.0.ffn.w1.weight"] == (24, 16)
    assert shapes["layers.1.ffn.router.weight"] == (4, 16)  # (E, D)
    assert shapes["layers.2.ffn.experts.3.w3.weight"] == (10, 16)  # (Fe, D)
    assert shapes["layers.1.ffn.experts.0.w2.weight"] == (16, 10)
    assert shapes["layers.1.ffn.shared.w1.weight"] == (6, 16)  # one shared expert of 6
    mla = da.Decoder(configs.named("mla-q-latent"), device="meta")
    shapes = {n: tuple(p.shape) for n, p in mla.named_parameters() if n.startswith("layers.0.attn")}
    assert shapes == {  # H = 3 heads of 6 + 4, values of 5, latents of 9 (q) and 10 (kv)
        "layers.0.attn.q_a_proj.weight": (9, 16), "layers.0.attn.q_a_norm.weight": (9,),
        "layers.0.attn.q_b_proj.weight": (30, 9), "layers.0.attn.kv_a_proj.weight": (14, 16),
        "layers.0.attn.kv_a_norm.weight": (10,), "layers.0.attn.kv_b_proj.weight": (33, 10),
        "layers.0.attn.output_proj.weight": (16, 15)}


def test_the_selection_bias_is_a_parameter_that_requires_no_grad_and_is_saved(tmp_path):
    cfg = configs.named("moe-sigmoid-bias")
    model = random_decoder(cfg)
    bias = model.layers[0].ffn.router.selection_bias
    assert isinstance(bias, torch.nn.Parameter) and not bias.requires_grad
    da.save_checkpoint(model, tmp_path / "ckpt")
    again = da.load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(again.layers[0].ffn.router.selection_bias, bias)
    ids = torch.randint(0, cfg.vocab_size, (2, 5))
    torch.testing.assert_close(again(ids), model(ids), atol=0, rtol=0)


def test_latent_attention_rotates_only_the_shared_rotary_key():
    """Changing the non-rotary rows of kv_b_proj for head 0 moves head 0's keys only; the last R
    features of every head's key are the one rotary key, the same for all heads."""
    cfg = configs.named("mla-q-latent")
    model = random_decoder(cfg, dtype=torch.float64)
    _, trace = model.run_with_trace(torch.randint(0, cfg.vocab_size, (1, cfg.max_seq_len)))
    k = trace["layers.0.attn.k"]  # (B, H, T, Dh)
    rotary = k[..., cfg.nope_head_width:]
    for head in range(1, cfg.n_heads):
        torch.testing.assert_close(rotary[:, head], rotary[:, 0], atol=0, rtol=0)
    assert not torch.equal(k[:, 0, :, :cfg.nope_head_width], k[:, 1, :, :cfg.nope_head_width])


@pytest.mark.parametrize("name, field", [("moe-topk-softmax-relu", "n_experts=5"),
                                         ("mla-q-latent", "kv_latent_rank=10")])
def test_the_torch_twin_and_the_converter_refuse_them_naming_the_field(name, field):
    """moe-topk-softmax-relu is GPT-2's block otherwise (LayerNorm, ReLU, learned positions,
    MHA): without the refusal the converter would write a GPT-2 without its experts."""
    from decoder_audit.references.hf_config import hf_family
    from decoder_audit.references.torch_twin import TorchTwin

    cfg = configs.named(name)
    with pytest.raises(da.ConfigError, match=field):
        TorchTwin(cfg)
    with pytest.raises(da.ConfigError, match=field):
        hf_family(cfg)
    with pytest.raises(da.ConfigError, match=field):
        da.to_hf(da.Decoder(cfg))


@pytest.mark.parametrize("name", ["moe-softmax-shared", "mla-moe", "moe-shared-gate",
                                  "moe-sigmoid-bias"])
def test_expected_weights_are_the_decoders_own(name):
    from decoder_audit.references.spec_weights import expected_weights

    cfg = configs.named(name)
    model = da.Decoder(cfg, device="meta")
    assert expected_weights(cfg) == {n: tuple(p.shape) for n, p in model.named_parameters()
                                     } | {"lm_head.weight": (cfg.vocab_size, cfg.d_model)}


def test_a_tokens_expert_output_does_not_depend_on_how_many_tokens_share_the_expert():
    """One product of n rows picks its kernel by n (a row alone goes through gemv), and SiLU's
    vectorised kernel leaves a tensor's tail (n x 5 features here) to scalar code that rounds
    differently: a token alone in its expert, or with 15 others, must come out the same to the
    bit, or a correct routed model fails the gate's exact batch comparisons by an ulp."""
    cfg = configs.named("moe-softmax-shared").replace(d_model=64, n_heads=4, expert_width=5)
    expert = random_decoder(cfg, std=0.1).layers[1].ffn.experts[0]
    rows = torch.randn(16, cfg.d_model)
    together = expert(rows)
    for n in (1, 2, 3, 9, 16):
        assert torch.equal(expert(rows[:n]), together[:n]), n


def test_an_expert_no_token_chooses_still_gets_a_zero_gradient_for_ddp():
    """DistributedDataParallel reduces every parameter's gradient each step: an expert no token
    was sent to must get zeros, not none (before: `torchrun ... train` raised "Expected to have
    finished reduction in the prior iteration")."""
    cfg = configs.named("moe-sigmoid-bias")
    model = random_decoder(cfg, std=0.1)
    with torch.no_grad():
        model.layers[1].ffn.router.selection_bias[3] = -10.0  # never among a token's top 2
    _, trace = model.run_with_trace(torch.randint(0, cfg.vocab_size, (2, 5)))
    assert not trace["layers.1.ffn.gates"][..., 3].any()
    model(torch.randint(0, cfg.vocab_size, (2, 5))).sum().backward()
    unused = model.layers[1].ffn.experts[3]
    assert all(p.grad is not None and not p.grad.any() for p in unused.parameters())


def test_an_odd_non_rotary_part_still_rotates_interleaved_pairs():
    """Heads of 3 + 4 (interleaved RoPE): the rotary slice starts at an odd offset, which
    view_as_complex refused ("stride divisible by 2") before it was made contiguous."""
    cfg = configs.named("mla-q-latent").replace(nope_head_width=3)
    model = random_decoder(cfg, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    torch.testing.assert_close(model(ids), da.oracle_logits(model.state_dict(), cfg, ids),
                               atol=1e-10, rtol=0)
