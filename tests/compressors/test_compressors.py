"""The low-rank compressors on the tiny model: analyze, allocate under budget, materialize, run."""

import copy
import math

import pytest
import torch

from gac.calibration.stats import calibrate
from gac.compressors import REGISTRY, make_compressor
from gac.compressors.allocation import DENSE
from gac.errors import GacError
from gac.models.adapters import adapter_for
from gac.models.dims import params_and_alignment
from gac.models.modeling_gac import LowRankLinear

COMPRESSORS = ["svd", "asvd"]


def _windows(vocab, n=4, seq=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, seq), generator=g)  # [n, seq]


@pytest.fixture()
def setup(tiny):
    names = adapter_for(tiny.config).linear_names(tiny.config)
    windows = _windows(tiny.config.vocab_size)
    return tiny, names, windows


def _analyze(name, model, names, windows, probe=None):
    # with a probe, asvd's measured sensitivity (importance=None) is the path under test; else its default
    comp = make_compressor(name, importance=None) if probe is not None and name == "asvd" else make_compressor(name)
    stats = calibrate(model, windows, names, batch_size=2, xtx=comp.needs_xtx, progress=False)
    return comp, comp.analyze(model, comp.groups(model), stats, probe=probe, progress=False, windows=windows)


def _first(comp, model, stats):
    return comp.analyze(model, comp.groups(model)[:1], stats, progress=False)[0]


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits.float()


@pytest.mark.parametrize("name", COMPRESSORS)
def test_compress_under_budget_and_model_runs(name, setup):
    model, names, windows = setup
    comp, analyses = _analyze(name, model, names, windows)
    compressible, _ = params_and_alignment(model, names, 8)
    assert compressible == sum(a.numel for a in analyses)
    budget = math.floor(0.85 * compressible)
    ranks = comp.allocate(analyses, budget)
    assert set(ranks) == set(names)
    assert sum(a.params(ranks[a.name]) for a in analyses) <= budget

    compressed = copy.deepcopy(model)
    structure = comp.materialize(compressed, analyses, ranks)
    lowrank = {n: r for n, r in ranks.items() if r is not DENSE}
    assert structure == {"lowrank": lowrank}
    assert lowrank  # at 85% some weights must be factorized
    for n in names:
        module = compressed.get_submodule(n)
        assert isinstance(module, LowRankLinear) == (n in lowrank)
        if n in lowrank:
            assert module.rank == lowrank[n]
    params, _ = params_and_alignment(compressed, names, 8)
    assert params <= budget
    assert params == sum(a.params(ranks[a.name]) for a in analyses)  # measured == planned

    ids = windows[:2]
    out = _logits(compressed, ids)
    assert out.shape == (2, windows.shape[1], model.config.vocab_size)
    assert bool(torch.isfinite(out).all())
    assert not torch.equal(out, _logits(model, ids))  # the original was left untouched and differs
    assert all(not isinstance(model.get_submodule(n), LowRankLinear) for n in names)


@pytest.mark.parametrize("name", COMPRESSORS)
def test_full_rank_materialization_reproduces_logits(name, setup):
    model, names, windows = setup
    comp, analyses = _analyze(name, model, names, windows)
    full = {a.name: min(a.in_features, a.out_features) for a in analyses}
    compressed = copy.deepcopy(model)
    comp.materialize(compressed, analyses, full)
    assert all(isinstance(compressed.get_submodule(n), LowRankLinear) for n in names)
    ref, got = _logits(model, windows[:2]), _logits(compressed, windows[:2])
    assert float((got - ref).norm() / ref.norm()) <= 1e-4
    # and a truncated model is measurably different: the comparison above is not vacuous
    half = {a.name: max(1, min(a.in_features, a.out_features) // 4) for a in analyses}
    truncated = copy.deepcopy(model)
    comp.materialize(truncated, analyses, half)
    assert float((_logits(truncated, windows[:2]) - ref).norm() / ref.norm()) > 1e-3


@pytest.mark.parametrize("name,probe", [("svd", False), ("asvd", False), ("asvd", True)])
def test_scores_normalized_finite_positive(name, probe, setup):
    model, names, windows = setup
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _, analyses = _analyze(name, model, names, windows, probe=windows[:2] if probe else None)
    scores = torch.tensor([a.score for a in analyses], dtype=torch.float64)
    assert len(analyses) == len(names)
    assert bool(torch.isfinite(scores).all())
    assert bool((scores > 0).all())
    assert float(scores.mean()) == pytest.approx(1.0, rel=1e-9)
    assert float(scores.std()) > 0  # scores distinguish the weights
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the probe restored every weight


def test_asvd_scales_change_the_factorization(setup):
    """alpha=0 is plain SVD; alpha>0 uses the activation scale (a different spectrum)."""
    model, names, windows = setup
    stats = calibrate(model, windows, names, batch_size=2, progress=False)
    plain = _first(make_compressor("svd"), model, stats)
    a0 = _first(make_compressor("asvd", alpha=0.0, importance="magnitude"), model, stats)
    a1 = _first(make_compressor("asvd", alpha=1.0, importance="magnitude"), model, stats)
    assert torch.allclose(a0.svd.S, plain.svd.S, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(a1.svd.S, plain.svd.S, rtol=1e-2)


def test_unknown_compressor_raises():
    with pytest.raises(GacError, match="unknown compressor 'nope'") as info:
        make_compressor("nope")
    assert all(n in str(info.value) for n in REGISTRY)


def test_a_compressor_says_whether_it_factorizes_and_what_one_layer_caches():
    """What the memory forecast and export read off the compressor instead of switching on its class."""
    from gac.pipelines.memory import Shapes

    factorizes = {n: make_compressor(n).factorizes for n in REGISTRY}
    assert factorizes == {"svd": True, "asvd": True, "svd_llm": True, "prune": False, "palu": True}
    s = Shapes(layers=2, hidden=64, intermediate=160, q_width=64, kv_width=32, vocab=320, tied=True)
    cached = {n: make_compressor(n).cut_state_bytes(s, 4) for n in REGISTRY}
    assert cached["prune"] == 0 and 0 < cached["palu"] < cached["svd"] == cached["asvd"] == cached["svd_llm"]
    assert cached["palu"] == 2 * 4 * 32 * (64 + 32)  # K and V: A [kv, hidden] and B blocks at full rank


@pytest.mark.parametrize("alpha", [-0.1, 2.01, 5.0])
def test_asvd_alpha_outside_range_raises(alpha):
    with pytest.raises(GacError, match="alpha"):
        make_compressor("asvd", alpha=alpha)


@pytest.mark.parametrize("alpha", [0.0, 2.0])
def test_asvd_alpha_bounds_accepted(alpha):
    assert make_compressor("asvd", alpha=alpha).config.alpha == alpha


def test_asvd_default_alpha_whitens_independent_channels():
    """Why asvd's default alpha is 1: for inputs whose channels are independent, mean|x| is proportional to each
    channel's standard deviation, so W diag(mean|x|) is W whitened and its truncated SVD is the rank-r factorization
    of least output error E||(W - W_r) x||^2 (the optimum SVD-LLM's full whitening reaches); ASVD's own 0.5 stays short
    of it. (The sweep on the embedded model: docs/results/allocation.md.)"""
    from types import SimpleNamespace

    from gac.compressors.asvd import ASVDConfig
    from gac.compressors.linalg import factorize_from_svd, scaled_svd

    g = torch.Generator().manual_seed(0)
    n_in, n_out, rank = 48, 40, 12
    std = torch.logspace(0, 2, n_in)  # channels from 1 to 100 in scale, independent
    x = torch.randn(20000, n_in, generator=g, dtype=torch.float64) * std  # [tokens, in]
    w = torch.randn(n_out, n_in, generator=g)
    stats = SimpleNamespace(mean_abs=x.abs().mean(0).float())

    def output_error(scale):
        A, B = factorize_from_svd(scaled_svd(w, scale), rank)  # the factors asvd materializes, scaling undone
        return float(((w - B @ A).double() @ x.T).square().mean())

    def asvd_error(alpha):
        return output_error(make_compressor("asvd", alpha=alpha).input_scale(w, stats))

    optimum = output_error(std.float())  # exact whitening of independent channels
    assert ASVDConfig().alpha == 1.0
    assert asvd_error(1.0) <= 1.01 * optimum
    assert asvd_error(0.5) > 1.2 * optimum and asvd_error(0.0) > asvd_error(0.5)
