"""Latency taken one decoder layer at a time (the layer-by-layer pipeline): which layers are timed, and how their
timings become a model's figures."""

from __future__ import annotations

import pytest
import torch

from gac.evaluate.latency import LatencyConfig
from gac.evaluate.layer_latency import OUTSIDE, LayerLatency, PassThrough, layers_to_time

FAST = LatencyConfig(warmup=0, prefill_rounds=2, decode_rounds=2, prefill_tokens=8, decode_context=4)


def test_layers_timed_span_the_depth():
    assert layers_to_time(3) == [0, 1, 2]
    assert layers_to_time(32) == [0, 10, 21, 31]
    assert layers_to_time(4) == [0, 1, 2, 3]


def _t(prefill, decode, spread=1.0):
    return {"prefill_ms": prefill, "prefill_spread_pct": spread, "decode_ms_per_token": decode,
            "decode_spread_pct": spread}


def test_figures_are_the_outside_plus_the_layers_scaled_to_depth():
    timer = LayerLatency(FAST, depth=8, layers=[0, 7])
    timer.timings = {0: {"a": _t(12.0, 3.0, 2.0), "b": _t(10.0, 2.5), OUTSIDE: _t(2.0, 1.0)},
                     7: {"a": _t(14.0, 3.0), "b": _t(11.0, 2.5, 5.0), OUTSIDE: _t(2.0, 1.0)}}
    got = timer.figures()
    assert set(got) == {"a", "b"}  # the pass-through is not a variant
    assert got["a"]["prefill_ms"] == pytest.approx(2.0 + 8 / 2 * (10.0 + 12.0))  # outside + layers x depth / timed
    assert got["b"]["decode_ms_per_token"] == pytest.approx(1.0 + 4 * (1.5 + 1.5))
    assert got["a"]["prefill_spread_pct"] == 2.0 and got["b"]["prefill_spread_pct"] == 5.0  # the largest
    method = timer.method()
    assert method.method == "per_layer" and method.layers_timed == [0, 7] and method.depth == 8
    assert list(method.to_dict()) == ["method", "layers_timed", "depth", "how"]  # report.json's order


def test_a_layer_is_timed_beside_a_pass_through(tiny):
    """On a real model: each variant's layer alone in its model, side by side with the pass-through, which
    returns its input (the model without any layer)."""
    from gac.pipelines.layerwise.materialize import one_layer_model

    timer = LayerLatency(FAST, depth=2)
    layer = tiny.model.layers[1]
    timer.time_layer(1, {"baseline": layer}, lambda one: one_layer_model(tiny, one))
    assert set(timer.timings[1]) == {"baseline", OUTSIDE}
    assert all(t["prefill_ms"] > 0 and t["decode_ms_per_token"] > 0 for t in timer.timings[1].values())
    assert len(tiny.model.layers) == 2  # the model itself is untouched
    h = torch.randn(1, 3, 8)
    assert PassThrough()(h, None, mask=None) is h
