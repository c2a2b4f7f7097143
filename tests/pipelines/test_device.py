"""The layer-by-layer pipeline on a device given as a parameter of the same code (weights streamed from the
safetensors files one layer at a time, statistics and factorizations where the layer is): explicit equals the
default CPU run; on CUDA (skipped cleanly without one) the same dims and perplexities as on the CPU."""

from __future__ import annotations

import pytest
import torch

from gac.api import CompressConfig, compress
from gac.calibration.texts import TextConfig
from gac.checkpoint.gac_dir import load
from gac.checkpoint.lazy import LazyCheckpoint
from gac.evaluate.latency import LatencyConfig
from gac.pipelines.layerwise.analyze import ActivationStore, FactorCache
from tests.helpers_tiny import save_tiny, tiny_model

TEXT = TextConfig(seq_len=32, calib_windows=4, eval_windows=2)
FAST = LatencyConfig(warmup=0, prefill_rounds=1, decode_rounds=1, prefill_tokens=8, decode_context=4)
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu,
                                   pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory):
    return save_tiny(tiny_model(seed=3), tmp_path_factory.mktemp("src") / "tiny")


def _run(source_dir, out, **kw):
    return compress(CompressConfig(model=str(source_dir), compressor="asvd", ratio=0.2, text=TEXT, latency=FAST,
                                   progress=False, pipeline="layerwise", out=str(out), factorization="gram", **kw))


@pytest.mark.slow
def test_explicit_device_equals_the_default_cpu_run(source_dir, tmp_path):
    default = _run(source_dir, tmp_path / "default")
    explicit = _run(source_dir, tmp_path / "explicit", device="cpu")
    assert explicit.report.dims == default.report.dims
    for variant, figures in default.report.variants.items():
        assert explicit.report.variants[variant].ppl == figures.ppl
    expected, got = load(default.out).model.state_dict(), load(explicit.out).model.state_dict()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_weights_and_stores_come_back_on_the_device(source_dir, device):
    source = LazyCheckpoint(source_dir, device=device)
    assert source.model.get_input_embeddings().weight.device.type == device
    source.load_layer(0)
    assert {p.device.type for p in source.model.model.layers[0].parameters()} == {device}
    source.release_layer(0)
    x = torch.randn(2, 3, device=device)
    with ActivationStore(spill=True, device=device) as store, FactorCache(device=device) as cache:
        store[0], cache[0] = [x], {"w": x}
        assert store[0][0].device.type == device and torch.equal(store[0][0].cpu(), x.cpu())
        assert cache[0]["w"].device.type == device and torch.equal(cache[0]["w"].cpu(), x.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_layerwise_run_matches_the_cpu_run(source_dir, tmp_path):
    cpu = _run(source_dir, tmp_path / "cpu", device="cpu").report
    cuda = _run(source_dir, tmp_path / "cuda", device="cuda").report
    assert cuda.pipeline == "layerwise" and cuda.device == "cuda"
    assert cuda.dims == cpu.dims
    for variant, figures in cpu.variants.items():
        assert cuda.variants[variant].ppl == pytest.approx(figures.ppl, rel=1e-3)
        assert cuda.variants[variant].prefill_ms > 0
