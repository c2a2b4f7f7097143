"""The main job on the embedded SmolLM2-135M (reduced windows so it fits the test budget)."""

from __future__ import annotations

import pytest
import torch

from gac.api import CompressConfig, compress
from gac.calibration.texts import TextConfig, load_windows
from gac.checkpoint.loading import embedded_copy, load_model
from gac.evaluate.latency import LatencyConfig
from gac.evaluate.perplexity import perplexity

pytestmark = pytest.mark.integration


TEXT = TextConfig(seq_len=128, calib_windows=4, eval_windows=2)


@pytest.fixture(scope="module")
def asvd_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "asvd"
    cfg = CompressConfig(model="smollm2-135m", compressor="asvd", ratio=0.15, out=str(out), progress=False,
                         text=TEXT,
                         latency=LatencyConfig(prefill_tokens=64, decode_context=16, warmup=1, prefill_rounds=3,
                                               decode_rounds=4))
    return compress(cfg)


def test_alignment_and_budget(asvd_run):
    r = asvd_run.report
    v = r.variants
    assert v["unaligned"].aligned_fraction < 0.5  # ASVD's own ranks are irregular
    assert v["gac"].aligned_fraction == 1.0
    assert v["gac"].params <= r.budget_params
    assert v["gac"].params >= 0.98 * r.budget_params
    assert v["unaligned"].params <= r.budget_params
    assert v["baseline"].params == r.compressible_params > 100_000_000


def test_gac_quality_matches_unaligned(asvd_run):
    v = asvd_run.report.variants
    assert v["gac"].ppl <= 1.05 * v["unaligned"].ppl
    assert v["baseline"].ppl < v["unaligned"].ppl


def test_saved_model_round_trip(asvd_run):
    import gac

    loaded = gac.load(asvd_run.out)
    ids = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = asvd_run.models["gac"](ids).logits
        got = loaded.model(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert loaded.tokenizer is not None


def test_the_embedded_models_copy_loads_what_its_gguf_holds(asvd_run):
    """The run read the GGUF and kept a transformers copy; the copy loads in seconds and measures the baseline's
    perplexity to the bit on the run's own windows (the same tensors, the same tokenizer)."""
    assert embedded_copy("smollm2-135m", torch.float32).is_dir()
    loaded = load_model("smollm2-135m")
    held_out = load_windows(loaded.tokenizer, TEXT)[1]
    assert perplexity(loaded.model, held_out, progress=False) == asvd_run.report.variants["baseline"].ppl
