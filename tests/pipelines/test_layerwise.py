"""The layer-by-layer pipeline gives what the whole-model pipeline gives: the same dims (every compressor, every kind
of importance, gradients included), the same scores and the same compressed models."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from gac.api import CompressConfig
from gac.checkpoint.lazy import Resident
from gac.compressors import make_compressor
from gac.errors import GacError
from gac.evaluate.perplexity import perplexity
from gac.objectives import select_dims
from gac.pipelines.layerwise.pipeline import analyze as analyze_by_layer
from gac.pipelines.layerwise.analyze import analyze_layerwise
from gac.pipelines.layerwise.materialize import materialize_layerwise
from gac.pipelines.whole_model import analyze as analyze_whole
from gac.pipelines.whole_model import materialize_variants
from tests.helpers_tiny import tiny_model

CALIB = torch.randint(0, 320, (6, 32), generator=torch.Generator().manual_seed(1))  # [n, seq]
HELD_OUT = torch.randint(0, 320, (3, 32), generator=torch.Generator().manual_seed(2))


def selected_whole(model, cfg):
    """The whole-model pipeline's analysis of CALIB and the objective's selection."""
    return select_dims(model, analyze_whole(model, CALIB, cfg), cfg)


def selected_by_layer(model, cfg):
    """The layer-by-layer pipeline's (the weights read from the model itself), and the objective's selection."""
    return select_dims(model, analyze_by_layer(model, Resident(model), CALIB, cfg), cfg)

CASES = [
    ("svd", {}),  # magnitude, forward sweep only
    ("asvd", {}),  # the loss model: output-gradient Fisher from the reverse sweep
    ("svd_llm", {}),
    ("palu", {}),
    ("prune", {"layers": "all"}),  # taylor: weight gradients from the reverse sweep
    ("prune", {"layers": "1", "importance": "fisher", "head_mode": "none"}),  # a layer with no unit
    ("asvd", {"importance": "taylor"}),
    ("palu", {"importance": "fisher"}),
    ("svd_llm", {"importance": "activation"}),
]


@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                                                       for n, o in CASES])
def test_layerwise_equals_whole_model(name, options):
    model = tiny_model()
    cfg = CompressConfig(compressor=name, ratio=0.2, compressor_options=options, progress=False)
    whole = selected_whole(model, cfg)
    layerwise = selected_by_layer(model, cfg)
    assert layerwise.dims == whole.dims
    assert [u.name for u in layerwise.units] == [u.name for u in whole.units]
    for a, b in zip(whole.units, layerwise.units):
        assert b.score == pytest.approx(a.score, rel=1e-5)  # normalized over all layers, as the whole model's
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = materialize_variants(model, whole)
    got = materialize_layerwise(model, Resident(model), layerwise.compressor, layerwise.units, layerwise.dims,
                                progress=False)
    assert set(got) == {"unaligned", "gac"}
    for variant in got:
        ref, out = expected[variant].state_dict(), got[variant].state_dict()
        assert set(out) == set(ref)
        assert all(torch.allclose(out[k], ref[k], rtol=1e-4, atol=1e-6) for k in ref), variant
        assert perplexity(got[variant], HELD_OUT, progress=False) == pytest.approx(
            perplexity(expected[variant], HELD_OUT, progress=False), rel=1e-5)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the original is untouched


CACHED = [("svd", {}, torch.float32), ("asvd", {}, torch.float32), ("svd_llm", {}, torch.float32),
          ("palu", {}, torch.float32), ("prune", {"layers": "all"}, torch.float32), ("svd_llm", {}, torch.bfloat16)]


@pytest.mark.parametrize("name, options, dtype", CACHED, ids=[f"{n}-{str(d)[6:]}" for n, _, d in CACHED])
def test_cached_factors_cut_as_the_whole_model_cuts(name, options, dtype, monkeypatch):
    """The factors the analysis cached give the same tensors, to the bit, as the whole-model pipeline's cut;
    materialization factorizes nothing, reads each layer's file once and removes the cache at the end."""
    model = tiny_model().to(dtype)
    cfg = CompressConfig(compressor=name, ratio=0.2, compressor_options=options, progress=False)
    whole = selected_whole(model, cfg)
    sel = selected_by_layer(model, cfg)
    assert sel.dims == whole.dims
    cache_dir = Path(sel.units.factors.dir.name)
    if name != "prune":  # one file per layer (prune keeps nothing beyond its units), in the weights' dtype
        assert sorted(p.name for p in cache_dir.iterdir()) == ["layer-0.safetensors", "layer-1.safetensors"]
        assert all(t.dtype == dtype for t in sel.units.factors[0].values())
    expected = materialize_variants(model, whole)

    def never(*args, **kwargs):
        raise AssertionError("materialization factorizes nothing")

    monkeypatch.setattr(sel.compressor, "factorize_units", never)
    cached = materialize_layerwise(model, Resident(model), sel.compressor, sel.units, sel.dims, progress=False)
    for variant in ("unaligned", "gac"):
        ref, out = expected[variant].state_dict(), cached[variant].state_dict()
        assert set(out) == set(ref)
        assert all(out[k].dtype == ref[k].dtype and torch.equal(out[k], ref[k]) for k in ref), variant
    assert not cache_dir.exists()
    with pytest.raises(GacError, match="factor cache .* read once: analyze again"):  # the cache is spent
        materialize_layerwise(model, Resident(model), sel.compressor, sel.units, sel.dims, progress=False)


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_factor_cache_is_removed_on_interrupt(monkeypatch, tmp_path):
    """Interrupted in materialization, or in the analysis after a layer's factors were cached: no cache is left."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where TemporaryDirectory puts the cache
    model = tiny_model()
    compressor = make_compressor("svd_llm")
    groups = compressor.groups(model)
    units = analyze_layerwise(model, Resident(model), compressor, groups, CALIB, keep=0.8, progress=False)
    assert len(list(tmp_path.glob("gac-factors-*/layer-*.safetensors"))) == 2
    with monkeypatch.context() as m:
        m.setattr(compressor, "load_cut_state", _interrupt)
        with pytest.raises(KeyboardInterrupt):
            materialize_layerwise(model, Resident(model), compressor, units, {"gac": {u.name: 4 for u in units}},
                                  progress=False)
    assert not list(tmp_path.iterdir())

    analyze, cached = compressor.analyze, []

    def interrupted_at_layer_0(*args, **kwargs):  # the reverse sweep analyzes layer 1 first
        cached.append([p.name for p in tmp_path.glob("gac-factors-*/*")])
        return (_interrupt if len(cached) == 2 else analyze)(*args, **kwargs)

    monkeypatch.setattr(compressor, "analyze", interrupted_at_layer_0)
    with pytest.raises(KeyboardInterrupt):
        analyze_layerwise(model, Resident(model), compressor, groups, CALIB, keep=0.8, progress=False)
    assert cached == [[], ["layer-1.safetensors"]]
    assert not list(tmp_path.iterdir())


def test_layerwise_keeps_spectra_only():
    model = tiny_model()
    compressor = make_compressor("svd_llm")
    units = analyze_layerwise(model, Resident(model), compressor, compressor.groups(model), CALIB, keep=0.8,
                              progress=False)
    assert units and all(u.svd.U is None and u.svd.Vh is None and u.svd.scale is None for u in units)
    assert all(u.curve is not None and u.svd.S.numel() > 0 for u in units)


def test_variants_share_the_original_tensors():
    model = tiny_model()
    cfg = CompressConfig(compressor="prune", ratio=0.2, compressor_options={"layers": "1"}, progress=False)
    sel = selected_by_layer(model, cfg)
    got = materialize_layerwise(model, Resident(model), sel.compressor, sel.units, sel.dims, progress=False)
    original = {p.data_ptr() for p in model.parameters()}
    for variant in got.values():
        untouched = [p for n, p in variant.named_parameters() if not n.startswith("model.layers.1.")]
        assert untouched and all(p.data_ptr() in original for p in untouched)  # not copied


def test_measured_sensitivity_needs_the_whole_model():
    model = tiny_model()
    cfg = CompressConfig(compressor="asvd", ratio=0.2, compressor_options={"importance": None}, progress=False)
    with pytest.raises(GacError, match="whole model"):
        selected_by_layer(model, cfg)
