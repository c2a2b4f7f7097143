"""Memory bounded by one layer: the peak of a run that goes layer by layer (chosen by itself under a memory
budget, evaluated as by default: perplexity and per-layer latency) grows with depth by less than two layers'
weights. Each run in its own process (benchmarks/memory.py's
child), its peak anonymous memory compared: file pages of the memory-mapped weights, which the kernel maps more of
when the files are still cached, are left out."""

from __future__ import annotations

import pytest

from benchmarks.memory import COMPRESS, make_model, run_one

HIDDEN = 1024  # one layer's float32 weights: 52 MiB, well above the run's noise


@pytest.mark.slow
def test_layerwise_peak_grows_by_less_than_two_layers(tmp_path):
    options = [o for o in COMPRESS if o != "--no-eval"]
    options += ["--eval-windows", "2", "--prefill-tokens", "16", "--max-memory", "cpu=1200MiB"]
    runs = {}
    for layers in (2, 8):
        model_dir = tmp_path / f"llama-{layers}"
        layer_bytes = make_model(model_dir, layers, HIDDEN)
        runs[layers] = run_one(model_dir, tmp_path / "out", options)
        assert runs[layers]["exit"] == 0, runs[layers]["tail"]
        assert runs[layers]["chosen"] == "layerwise"  # no flag names the pipeline
    growth = runs[8]["peak_anon"] - runs[2]["peak_anon"]
    # holding every layer would add 6 layers' weights (312 MiB); measured growth: docs/results/layerwise-8b.md
    assert growth < 2 * layer_bytes, f"{growth / 2**20:.0f} MiB more at 8 layers than at 2"
