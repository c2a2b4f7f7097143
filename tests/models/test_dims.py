"""inspect_model lists every compressible dim and its shares are exactly right on models of known dims."""

import pytest
import torch
import transformers

from gac.evaluate.dims_plot import plot_dims
from gac.models.dims import inspect_model
from gac.models.adapters import adapter_for
from gac.models.dims import params_and_alignment
from gac.models.surgery import factorize
from tests.helpers_tiny import TINY

ALIGNMENTS = (8, 16, 32, 64)
LAYERS = TINY["num_hidden_layers"]


def _model(**override):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{**TINY, **override})).eval()


def _lowrank(model, ranks: dict):
    for name, r in ranks.items():
        m = model.get_submodule(name)
        factorize(model, name, torch.randn(r, m.in_features), torch.randn(m.out_features, r))
    return model


def _check_consistent(model, result):
    names = adapter_for(model.config).linear_names(model.config)
    for a in ALIGNMENTS:
        assert result.share_misaligned[a] == pytest.approx(1 - params_and_alignment(model, names, a)[1], abs=1e-12)


def test_baseline_lists_every_linear_dim():
    # hidden 64, MLP 160, 4 heads of 16, 2 KV heads: q/o 64x64, k/v 32x64, gate/up 160x64, down 64x160
    model = _model()
    r = inspect_model(model, ALIGNMENTS)
    kinds = [d.kind for d in r.dims]
    assert {k: kinds.count(k) for k in set(kinds)} == {"out_features": 7 * LAYERS, "in_features": 7 * LAYERS,
                                                       "mlp_width": LAYERS, "head_dim": LAYERS}
    assert r.judged_over == "linear" and len(r.judged) == 14 * LAYERS
    assert {d.value for d in r.dims if d.kind == "head_dim"} == {16}
    assert {d.value for d in r.dims if d.kind == "mlp_width"} == {160}
    assert [d.layer for d in r.dims if d.kind == "mlp_width"] == list(range(LAYERS))
    # per layer 14 dims; not /64: k out 32, v out 32, gate out 160, up out 160, down in 160
    assert r.share_misaligned == {8: 0.0, 16: 0.0, 32: 0.0, 64: 5 / 14}
    assert r.counts()[64] == {"judged": 28, "misaligned": 10}
    _check_consistent(model, r)


def test_unaligned_width():
    model = _model(intermediate_size=150)
    r = inspect_model(model, ALIGNMENTS)
    # per layer: gate out, up out, down in (150) misaligned everywhere; k/v out 32 also at 64
    assert r.share_misaligned == {8: 3 / 14, 16: 3 / 14, 32: 3 / 14, 64: 5 / 14}
    bad = r.misaligned(8)
    assert {(d.kind, d.value) for d in bad} == {("out_features", 150), ("in_features", 150), ("mlp_width", 150)}
    assert len(bad) == 4 * LAYERS  # 3 judged linear dims + the (unjudged) mlp_width row per layer
    assert sum(d.judged for d in bad) == 3 * LAYERS
    _check_consistent(model, r)


def test_compressed_shares_are_over_ranks():
    ranks = {"model.layers.0.self_attn.q_proj": 13, "model.layers.0.mlp.up_proj": 16,
             "model.layers.1.self_attn.o_proj": 24, "model.layers.1.mlp.down_proj": 27,
             "model.layers.1.mlp.gate_proj": 32}
    model = _lowrank(_model(intermediate_size=150), ranks)
    r = inspect_model(model, ALIGNMENTS)
    assert r.judged_over == "compressed" and sorted(d.value for d in r.judged) == sorted(ranks.values())
    assert r.share_misaligned == {8: 2 / 5, 16: 3 / 5, 32: 4 / 5, 64: 1.0}
    assert {d.name: d.value for d in r.dims if d.kind == "rank"} == ranks
    assert {d.layer for d in r.dims if d.kind == "rank"} == {0, 1}
    _check_consistent(model, r)


def _narrow(model, name, out_f=None, in_f=None):
    old = model.get_submodule(name)
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child,
            torch.nn.Linear(in_f or old.in_features, out_f or old.out_features, bias=False))


def test_pruned_widths_are_judged():
    # layer 0: MLP pruned 160 -> 150; layer 1: attention pruned to 3 query heads and 1 KV head (head_dim 16)
    model = _model()
    _narrow(model, "model.layers.0.mlp.gate_proj", out_f=150)
    _narrow(model, "model.layers.0.mlp.up_proj", out_f=150)
    _narrow(model, "model.layers.0.mlp.down_proj", in_f=150)
    for proj, out_f in (("q_proj", 48), ("k_proj", 16), ("v_proj", 16)):
        _narrow(model, f"model.layers.1.self_attn.{proj}", out_f=out_f)
    _narrow(model, "model.layers.1.self_attn.o_proj", in_f=48)
    r = inspect_model(model, ALIGNMENTS)
    assert r.judged_over == "compressed"
    assert {(d.name, d.kind, d.value) for d in r.judged} == {
        ("model.layers.0.mlp", "mlp_width", 150), ("model.layers.1.self_attn.q_proj", "out_features", 48),
        ("model.layers.1.self_attn.k_proj", "out_features", 16)}
    assert r.share_misaligned == {8: 1 / 3, 16: 1 / 3, 32: 1.0, 64: 1.0}
    _check_consistent(model, r)


def test_aligned_compressed_model():
    ranks = {n: 32 for n in ("model.layers.0.self_attn.k_proj", "model.layers.1.mlp.up_proj")}
    model = _lowrank(_model(), ranks)
    r = inspect_model(model, (8, 16, 32))
    assert r.share_misaligned == {8: 0.0, 16: 0.0, 32: 0.0} and r.misaligned(16) == []
    assert {(d.kind, d.value) for d in r.misaligned()} == {("head_dim", 16)}  # listed, never judged


def test_json_and_plot(tmp_path):
    model = _lowrank(_model(intermediate_size=150), {"model.layers.1.mlp.down_proj": 27})
    r = inspect_model(model, (8, 16))
    js = r.to_json()
    assert js["share_misaligned"] == {"8": 1.0, "16": 1.0} and js["counts"]["8"] == {"judged": 1, "misaligned": 1}
    assert len(js["dims"]) == len(r.dims) and js["dims"][0]["aligned"].keys() == {"8", "16"}
    path = tmp_path / "dims.png"
    plot_dims(r, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_alignments():
    with pytest.raises(ValueError):
        inspect_model(_model(), (0, 8))
