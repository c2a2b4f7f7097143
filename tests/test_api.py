"""gac.api.compress end to end on a tiny random model: the report contract, budget and alignment."""

from __future__ import annotations

import json

import pytest

from gac.api import CompressConfig, compress
from gac.data import TextConfig
from gac.errors import GacError
from gac.evaluate.latency import LatencyConfig

FAST_TEXT = TextConfig(seq_len=32, calib_windows=4, eval_windows=2)
FAST_LATENCY = LatencyConfig(prefill_tokens=16, decode_context=8, warmup=1, prefill_rounds=2, decode_rounds=3)


def fast_config(model, **kw):
    return CompressConfig(model=str(model), text=FAST_TEXT, latency=FAST_LATENCY, progress=False, **kw)


@pytest.mark.parametrize("compressor", ["svd", "asvd"])
def test_compress_report_contract(tiny_model_dir, tmp_path, compressor):
    out = tmp_path / "out"
    result = compress(fast_config(tiny_model_dir, compressor=compressor, ratio=0.3, out=str(out)))
    r = json.loads((out / "report.json").read_text())
    assert r == json.loads(json.dumps(result.report))
    for key in ("model", "compressor", "ratio", "alignment", "device", "dtype", "compressible_params",
                "budget_params", "variants", "dims"):
        assert key in r
    assert r["budget_params"] == int((1 - 0.3) * r["compressible_params"])
    for variant in ("baseline", "unaligned", "gac"):
        v = r["variants"][variant]
        for key in ("params", "aligned_fraction", "ppl", "prefill_ms", "decode_ms_per_token"):
            assert v[key] is not None and v[key] >= 0, (variant, key)
        assert v["ppl"] > 1.0
    assert r["variants"]["baseline"]["params"] == r["compressible_params"]
    assert r["variants"]["unaligned"]["params"] <= r["budget_params"]
    assert r["variants"]["gac"]["params"] <= r["budget_params"]
    assert r["variants"]["gac"]["aligned_fraction"] == 1.0
    assert all(d % 8 == 0 for d in r["dims"]["gac"].values())
    assert set(r["dims"]["gac"]) == set(r["dims"]["unaligned"])
    assert (out / "report.md").read_text().count("|") > 10


def test_no_align_saves_the_compressor_dims(tiny_model_dir, tmp_path):
    from gac.models.io import read_plan

    out = tmp_path / "raw"
    result = compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.3, out=str(out), align=False,
                                  evaluate=False))
    plan = read_plan(out)
    assert plan["variant"] == "unaligned"
    assert plan["dims"] == result.report["dims"]["unaligned"]
    assert "ppl" not in result.report["variants"]["gac"]  # --no-eval path: params and alignment only


def test_alignment_option_is_honoured(tiny_model_dir):
    result = compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.3, alignment=4, evaluate=False))
    assert all(d % 4 == 0 for d in result.report["dims"]["gac"].values())
    assert result.out is None  # no --out: nothing written


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.2, 1.5])
def test_ratio_outside_open_interval(ratio):
    with pytest.raises(GacError, match="ratio"):
        CompressConfig(ratio=ratio)


def test_existing_output_refused_before_work(tiny_model_dir, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    with pytest.raises(GacError, match="already exists"):
        compress(fast_config(tiny_model_dir, out=str(out)))


def test_profile_candidates_drive_selection(tiny_model_dir, tmp_path):
    """A synthetic profile in which every multiple of 16 is a cliff: GAC must avoid them."""
    from gac.hw.profile import save_profile

    dims = list(range(1, 41))
    ms = [1.0 + d * 0.01 + (5.0 if d % 16 == 0 else 0.0) for d in dims]
    entry = {"op": "lowrank", "shape": {"in": 64, "out": 64}, "m": 16, "backend": None, "dims": dims, "ms": ms,
             "p10_ms": ms, "p90_ms": ms}
    profile = {"gac_profile": 1, "device": "cpu", "device_name": "synthetic", "torch": "x", "dtype": "float32",
               "threads": 1, "date": "2026-01-01", "ops": [entry]}
    path = save_profile(profile, tmp_path / "p.json")
    result = compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.3, profile=str(path), evaluate=False))
    gac_dims = result.report["dims"]["gac"].values()
    assert all(d % 8 == 0 and d % 16 != 0 for d in gac_dims)
    assert result.report["variants"]["gac"]["params"] <= result.report["budget_params"]
