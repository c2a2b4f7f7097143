"""svd_llm whitening maths, and palu's grouped K/V factorization on a GQA model (2 KV heads, 4 query heads)."""

from __future__ import annotations

import copy

import pytest
import torch

from gac.calibration.stats import calibrate
from gac.compressors import make_compressor
from gac.compressors.linalg import factorize_from_svd, scaled_svd, whiten
from gac.errors import GacError
from gac.models.dims import params_and_alignment
from gac.models.groups import linears_of
from gac.models.modeling_gac import GroupedLowRankLinear
from tests.helpers_tiny import tiny_model


def test_whitened_truncation_beats_plain_svd_in_the_data_norm():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(12, 10, generator=g, dtype=torch.float64)
    X = torch.randn(200, 10, generator=g, dtype=torch.float64) * torch.linspace(0.1, 5, 10, dtype=torch.float64)
    S = whiten(X.T @ X)
    torch.testing.assert_close(S @ S.T, X.T @ X)
    for r in range(1, 10):
        Aw, Bw = factorize_from_svd(scaled_svd(W, S), r)
        Ap, Bp = factorize_from_svd(scaled_svd(W), r)
        err_w = torch.linalg.norm((W - (Bw @ Aw).double()) @ X.T)
        err_p = torch.linalg.norm((W - (Bp @ Ap).double()) @ X.T)
        assert err_w <= err_p * (1 + 1e-9)
    A, B = factorize_from_svd(scaled_svd(W, S), 10)
    torch.testing.assert_close((B @ A).double(), W, rtol=1e-5, atol=1e-5)  # weights go through fp32


def test_whiten_regularizes_a_singular_matrix():
    X = torch.randn(3, 6, dtype=torch.float64)  # rank 3 < 6: X^T X is only semi-definite
    S = whiten(X.T @ X)
    assert torch.isfinite(S).all() and (S.diagonal() > 0).all()


def _setup(model, compressor):
    names = linears_of(compressor.groups(model))
    ids = torch.randint(0, model.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(1))
    stats = calibrate(model, ids, names, xtx=compressor.needs_xtx, progress=False)
    units = compressor.analyze(model, compressor.groups(model), stats, probe=ids[:1], keep=0.7, progress=False, windows=ids)
    return names, ids, units


@pytest.mark.parametrize("group_size", [1, 2])
def test_palu_groups_kv_heads_and_stays_in_budget(group_size):
    model = tiny_model()
    palu = make_compressor("palu", group_size=group_size)
    names, ids, units = _setup(model, palu)
    assert all(n.endswith(("k_proj", "v_proj")) for n in names)
    kv_groups = model.config.num_key_value_heads // group_size
    assert len(units) == 2 * model.config.num_hidden_layers * kv_groups
    budget = int(0.7 * sum(u.numel for u in units))
    ranks = palu.allocate(units, budget)
    assert all(r is not None for r in ranks.values())  # palu never falls back to dense
    m = copy.deepcopy(model)
    structure = palu.materialize(m, units, ranks)
    params, _ = params_and_alignment(m, names, 8)
    assert params == sum(u.params(ranks[u.name]) for u in units) <= budget
    for name, group_ranks in structure["grouped_lowrank"].items():
        mod = m.get_submodule(name)
        assert isinstance(mod, GroupedLowRankLinear) and mod.ranks == group_ranks and len(group_ranks) == kv_groups
    with torch.inference_mode():
        assert torch.isfinite(m(ids).logits).all()


def test_palu_full_rank_is_exact():
    model = tiny_model()
    palu = make_compressor("palu")
    _, ids, units = _setup(model, palu)
    m = copy.deepcopy(model)
    palu.materialize(m, units, {u.name: min(u.in_features, u.out_features) for u in units})
    with torch.inference_mode():
        torch.testing.assert_close(m(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)


def test_palu_group_size_must_divide_kv_heads():
    with pytest.raises(GacError, match="divide"):
        _setup(tiny_model(), make_compressor("palu", group_size=3))
    with pytest.raises(GacError, match="group_size 0 must be >= 1"):
        make_compressor("palu", group_size=0)


def test_svd_llm_handles_gqa_projections():
    """k/v (32 outputs) are narrower than q (64): each is whitened by its own inputs and factorized."""
    model = tiny_model()
    c = make_compressor("svd_llm")
    names, ids, units = _setup(model, c)
    shapes = {u.name.rsplit(".", 1)[-1]: (u.out_features, u.in_features) for u in units}
    assert shapes["k_proj"] == (32, 64) and shapes["q_proj"] == (64, 64)
    ranks = c.allocate(units, int(0.7 * sum(u.numel for u in units)))
    m = copy.deepcopy(model)
    c.materialize(m, units, ranks)
    with torch.inference_mode():
        assert torch.isfinite(m(ids).logits).all()
