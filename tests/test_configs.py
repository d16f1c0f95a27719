"""The test config grid itself: the coverage it promises (tests/configs.py) holds."""

from __future__ import annotations

import itertools

import configs
import pytest


def _values(cfg):
    """The grid's axis labels read back from a config (not from its name)."""
    heads = "mha" if cfg.kv_heads == cfg.n_heads else "mqa" if cfg.kv_heads == 1 else "gqa"
    bias = {v: k for k, v in configs.BIASES.items()}[(cfg.attn_bias, cfg.mlp_bias)]
    return ({v: k for k, v in configs.NORMS.items()}[cfg.norm],
            {v: k for k, v in configs.MLPS.items()}[cfg.mlp],
            {v: k for k, v in configs.POSITIONS.items()}[cfg.pos],
            bias, "tied" if cfg.tie_embeddings else "untied", heads)


def test_grid_covers_every_pair_of_axis_values():
    seen = {(i, a[i], j, a[j]) for a in map(_values, (e.config for e in configs.grid()))
            for i, j in itertools.combinations(range(len(configs.AXES)), 2)}
    for (i, axis_i), (j, axis_j) in itertools.combinations(enumerate(configs.AXES), 2):
        for a, b in itertools.product(axis_i, axis_j):
            assert (i, a, j, b) in seen, f"no grid config has {a} with {b}"


def test_names_are_unique_and_say_what_the_grid_config_is():
    names = configs.ids(configs.everything())
    assert len(names) == len(set(names))
    for entry in configs.grid():
        assert entry.name == "-".join(_values(entry.config))


def test_grouped_query_entries_really_group():
    for entry in configs.grid():
        cfg = entry.config
        if cfg.kv_heads not in (1, cfg.n_heads):
            assert cfg.kv_heads >= 2 and cfg.kv_group_size >= 2, entry.name


def test_full_product_is_every_combination():
    product = list(configs.product())
    assert len(product) == len({e.name for e in product}) == 2 * 4 * 3 * 4 * 2 * 3
    assert {e.name for e in configs.grid()} <= {e.name for e in product}


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="gqa-odd"):
        configs.named("gqa-even")
