"""gac.api.compress end to end on a tiny random model: the report contract, budget and alignment."""

from __future__ import annotations

import json
import re

import pytest

from gac.api import CompressConfig, compress
from gac.errors import GacError
from gac.pipelines.evaluation import NOT_EVALUATED
from tests.helpers_compress import fast_config


@pytest.mark.parametrize("compressor", ["svd", "asvd"])
def test_compress_report_contract(tiny_model_dir, tmp_path, compressor):
    out = tmp_path / "out"
    result = compress(fast_config(tiny_model_dir, compressor=compressor, ratio=0.3, out=str(out)))
    r = json.loads((out / "report.json").read_text())
    assert r == json.loads(json.dumps(result.report.to_dict()))
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
    assert (out / "dims.png").read_bytes().startswith(b"\x89PNG")  # the `gac inspect` plot, saved with the model


def test_no_align_saves_the_compressor_dims(tiny_model_dir, tmp_path):
    from gac.checkpoint.gac_dir import read_plan

    out = tmp_path / "raw"
    result = compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.3, out=str(out), align=False,
                                  evaluate=False))
    plan = read_plan(out)
    assert plan["variant"] == "unaligned"
    assert plan["dims"] == result.report.dims["unaligned"]
    for v in result.report.to_dict()["variants"].values():  # --no-eval: the evaluated report's keys, null
        for key in NOT_EVALUATED:
            assert key in v and v[key] is None, key
    md = (out / "report.md").read_text()
    assert "n/a" in md and "None" not in md and "(±" not in md


def test_alignment_option_is_honoured(tiny_model_dir):
    result = compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.3, alignment=4, evaluate=False))
    assert all(d % 4 == 0 for d in result.report.dims["gac"].values())
    assert result.out is None  # no --out: nothing written


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.2, 1.5])
def test_ratio_outside_open_interval(ratio):
    with pytest.raises(GacError, match="ratio"):
        CompressConfig(ratio=ratio)


def test_the_config_owns_the_choice_of_objective():
    """Neither objective given: the parameter objective at DEFAULT_RATIO (the CLI's default, which passes no ratio);
    a speedup alone has no ratio; both are one line, for an API caller as for the CLI."""
    from gac.api import DEFAULT_RATIO
    from gac.objectives.latency.config import SpeedupConfig

    assert CompressConfig().ratio == DEFAULT_RATIO == 0.15 and CompressConfig(ratio=0.3).ratio == 0.3
    latency = CompressConfig(speedup=SpeedupConfig(1.2))
    assert latency.ratio is None and latency.analysis_ratio == DEFAULT_RATIO  # the analysis probes at the default
    with pytest.raises(GacError, match="speedup and ratio exclude each other") as e:
        CompressConfig(ratio=0.15, speedup=SpeedupConfig(1.2))
    assert "\n" not in str(e.value)


def test_config_errors_name_the_fields_and_the_cli_its_flags():
    """CompressConfig's refusals name its own fields; the CLI words the same error with the flags that set them."""
    from gac.cli.options import in_flags
    from gac.errors import ConfigError
    from gac.objectives.latency.config import SpeedupConfig

    with pytest.raises(ConfigError) as e:
        CompressConfig(speedup=SpeedupConfig(1.2), align=False)
    assert str(e.value) == ("speedup and align=False exclude each other (align=False is for the compressor's own "
                            "dims under a ratio): give one of them")
    assert in_flags(e.value) == ("--speedup and --no-align exclude each other (--no-align is for the compressor's "
                                 "own dims under a ratio): give one of them")
    with pytest.raises(ConfigError) as e:
        CompressConfig(compressor="auto", pipeline="layerwise")
    assert "compressor=auto analyzes" in str(e.value) and "drop pipeline=layerwise/max_memory" in str(e.value)
    assert "--compressor auto analyzes" in in_flags(e.value) and "drop --layerwise/--max-memory" in in_flags(e.value)


def _library_refusals():
    """(a library config's refusal, the flag the CLI names in it) for configs below CompressConfig."""
    from gac.calibration.texts import TextConfig
    from gac.compressors.prune import PruneConfig
    from gac.evaluate.latency import LatencyConfig
    from gac.export.export import ExportConfig
    from gac.heal.distill import DistillConfig
    from gac.heal.run import HealConfig

    return {"seq_len": (lambda: TextConfig(seq_len=0), "--seq-len"),
            "calib_windows": (lambda: TextConfig(calib_windows=0), "--calib-windows"),
            "prefill_tokens": (lambda: LatencyConfig(prefill_tokens=0), "--prefill-tokens"),
            "drop_experts": (lambda: PruneConfig(drop_experts=1.0), "--drop-experts"),
            "distill.lr": (lambda: DistillConfig(lr=2.0), "--heal-lr"),
            "samples": (lambda: HealConfig(samples=2), "--heal-samples"),
            "pad_mlp=True": (lambda: ExportConfig("m", "o", format="hf", pad_mlp=True), "--pad-mlp")}


@pytest.mark.parametrize("field", ["seq_len", "calib_windows", "prefill_tokens", "drop_experts", "distill.lr",
                                   "samples", "pad_mlp=True"])
def test_library_configs_name_their_fields_and_the_cli_its_flags(field):
    """Below CompressConfig too (texts, latency, compressors, healing, export), a refusal names the field in Python
    and the flag on the command line: one check, neither vocabulary in the other."""
    from gac.cli.options import in_flags
    from gac.errors import ConfigError

    build, flag = _library_refusals()[field]
    with pytest.raises(ConfigError) as e:
        build()
    assert field in str(e.value) and "--" not in str(e.value)
    cli = in_flags(e.value)
    assert flag in cli and not re.search(rf"(?<![-\w]){re.escape(field)}", cli) and "\n" not in cli


def test_every_config_flag_is_an_option_of_the_cli():
    """CONFIG_FLAGS names flags that exist: each is an option of some `gac` command."""
    from gac.cli import main
    from gac.cli.options import CONFIG_FLAGS

    options = {o for cmd in main.commands.values() for p in cmd.params for o in p.opts}
    assert set(CONFIG_FLAGS.values()) - options == set()


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
    r = result.report.to_dict()
    gac_dims = r["dims"]["gac"].values()
    assert all(d % 8 == 0 and d % 16 != 0 for d in gac_dims)
    assert r["variants"]["gac"]["params"] <= r["budget_params"]
    # why each dim was dropped, per weight: the multiples of 16 near d* are cliffs
    assert r["profile_excluded"] and set(r["profile_excluded"]) <= set(r["dims"]["gac"])
    assert r["profile_excluded_dims"] == sum(map(len, r["profile_excluded"].values()))
    for why in r["profile_excluded"].values():
        assert all(int(d) % 16 == 0 and reason.startswith("cliff") for d, reason in why.items())


@pytest.mark.slow
@pytest.mark.parametrize("compressor, options", [
    ("svd", {}),
    ("prune", {"importance": "magnitude", "layers": "all"}),  # MLP widths swept, whole-head widths on their grid
])
def test_auto_profile_measures_every_compressor(tiny_model_dir, compressor, options):
    """--profile auto sweeps around the compressor's dims on this device (low-rank pairs, or GEMM N for widths)."""
    result = compress(fast_config(tiny_model_dir, compressor=compressor, ratio=0.3, profile="auto",
                                  compressor_options=options, evaluate=False))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["aligned_fraction"] == 1.0
    assert r["variants"]["gac"]["params"] <= r["budget_params"]
    assert r["profile_excluded_dims"] == sum(map(len, r["profile_excluded"].values()))
    assert not any(name.endswith("self_attn") for name in r["profile_excluded"])  # never measured


@pytest.mark.slow
def test_auto_profile_sweeps_are_cached(tiny_model_dir, tmp_path, monkeypatch):
    """A second compression with --profile auto on the same device reads its sweeps back instead of measuring."""
    import gac.hw.profile as hp

    monkeypatch.setenv("GAC_CACHE_DIR", str(tmp_path / "cache"))
    first = compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.3, profile="auto", evaluate=False))
    assert list((tmp_path / "cache" / "profiles" / "auto").glob("*.json"))

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although the sweep was cached")

    monkeypatch.setattr(hp, "run_profile", no_measuring)
    second = compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.3, profile="auto", evaluate=False))
    assert second.report.dims == first.report.dims
    assert second.report.profile_excluded == first.report.profile_excluded


def test_static_rule_when_profile_candidates_cannot_fit(tiny_model_dir, caplog):
    """Profile candidates that cannot fit the budget at any window (here: only each weight's largest dim) fall back
    to the static rule with a warning, instead of failing an otherwise feasible compression."""
    from gac.calibration.texts import load_windows
    from gac.checkpoint.loading import load_model
    from gac.objectives import select_dims
    from gac.objectives.parameter import select_within_budget
    from gac.pipelines.whole_model import analyze

    cfg = fast_config(tiny_model_dir, compressor="svd", ratio=0.3, evaluate=False)
    loaded = load_model(cfg.model)
    calib, _ = load_windows(loaded.tokenizer, cfg.text)
    selected = select_dims(loaded.model, analyze(loaded.model, calib, cfg), cfg)

    def too_big(u, dim, window=1):  # a "profile" that only ever offers the largest useful dim
        return [u.max_dim]

    too_big.excluded = {}
    result = select_within_budget(selected.units, selected.dims["unaligned"], selected.budget,
                                  alignment=cfg.alignment, window=cfg.window, candidates_for=too_big)
    assert result.params <= selected.budget and all(d % 8 == 0 for d in result.dims.values())
    assert "static alignment rule" in caplog.text


@pytest.mark.slow
def test_infeasible_ratio_fails_from_the_shapes_before_calibration(tiny_model_dir, monkeypatch):
    import gac.pipelines.whole_model

    def never(*a, **k):
        raise AssertionError("calibration ran")

    monkeypatch.setattr(gac.pipelines.whole_model, "calibrate", never)  # the whole-model pipeline's calibration
    with pytest.raises(GacError, match=r"use ratio=0\.\d+ or lower") as info:
        compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.99, evaluate=False))
    assert "\n" not in str(info.value)
    largest = float(str(info.value).split("ratio=")[1].split()[0])
    with pytest.raises(AssertionError, match="calibration ran"):  # the ratio it names passes the check
        compress(fast_config(tiny_model_dir, compressor="svd", ratio=largest, evaluate=False))


def test_compressing_a_compressed_model_is_refused(tiny_model_dir, tmp_path):
    out = tmp_path / "once"
    compress(fast_config(tiny_model_dir, compressor="svd", ratio=0.3, out=str(out), evaluate=False))
    with pytest.raises(GacError, match="already compressed.*gac repair"):
        compress(fast_config(out, compressor="asvd", ratio=0.3, evaluate=False))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gram", "gram32"])
@pytest.mark.parametrize("compressor", ["asvd", "svd_llm", "palu"])
def test_gram_factorization_gives_the_same_dims(tiny_model_dir, compressor, method):
    """The fast Gram paths (float64, the default on CUDA; float32, the default on CPU) choose the same dims as the
    exact SVD."""
    exact = compress(fast_config(tiny_model_dir, compressor=compressor, ratio=0.3, evaluate=False,
                                 factorization="svd"))
    gram = compress(fast_config(tiny_model_dir, compressor=compressor, ratio=0.3, evaluate=False,
                                factorization=method))
    assert gram.report.dims == exact.report.dims


def test_factorization_auto_resolves_by_device():
    assert CompressConfig(device="cpu").factorization_method == "gram32"
    assert CompressConfig(device="cuda:0").factorization_method == "gram"
    with pytest.raises(GacError, match="unknown factorization"):
        CompressConfig(factorization="qr")
