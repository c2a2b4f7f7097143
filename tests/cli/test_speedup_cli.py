"""`gac compress --speedup`: options that exclude each other and bad values fail in one line (exit 2) before any
work; a run on a tiny model writes the latency objective into report.json or names the best reachable speedup."""

from __future__ import annotations

import json

import pytest

from gac.evaluate.report import kept_round
from tests.helpers import gac_cli, run_gac
from tests.helpers_compress import FAST_ARGS as FAST

TOKENS = FAST.index("--prefill-tokens")
FAST_SPEEDUP = FAST[:TOKENS] + FAST[TOKENS + 2:]  # --speedup times at its --shape: no --prefill-tokens


@pytest.mark.parametrize("extra, expected", [
    (["--speedup", "1.2", "--prefill-tokens", "64"], "--prefill-tokens"),
    (["--speedup", "1.2", "--ratio", "0.2"], "exclude each other"),
    (["--speedup", "1.2", "--no-align"], "exclude each other"),
    (["--speedup", "1.2", "--profile", "auto"], "exclude each other"),
    (["--phase", "decode"], "give --speedup too"),
    (["--speedup", "1.2", "--shape", "512"], "--shape"),
    (["--speedup", "0.9"], "--speedup"),
    (["--param-cap", "0.9"], "give --speedup too"),
    (["--no-guard"], "give --speedup too"),
    (["--speedup", "1.2", "--param-cap", "1.5"], "outside (0, 1]"),
    (["--speedup", "1.2", "--param-cap", "0"], "--param-cap"),
    (["--margin", "0.03"], "give --speedup too"),
    (["--speedup", "1.2", "--margin", "-0.01"], "outside [0, 0.5)"),
    (["--speedup", "1.2", "--margin", "0.5"], "--margin"),
    (["--speedup", "1.2", "--margin", "nan"], "--margin"),
    (["--retime"], "give --speedup too"),
])
def test_speedup_option_errors(tiny_model_dir, tmp_path, extra, expected):
    p = gac_cli("compress", "--model", str(tiny_model_dir), "--out", str(tmp_path / "o"), *FAST_SPEEDUP, *extra)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


def _speedup_run(tiny_model_dir, out, *extra):
    return run_gac("compress", "--model", str(tiny_model_dir), "--compressor", "prune", "--prune-layers", "all",
                   "--speedup", "1.05", "--shape", "1x64", "--param-cap", "0.95", "--margin", "0.01", "--out",
                   str(out), *FAST_SPEEDUP, *extra)


@pytest.mark.subprocess
def test_speedup_run(tiny_model_dir, tmp_path):
    out = tmp_path / "o"
    p = _speedup_run(tiny_model_dir, out)
    if p.returncode == 2:  # a tiny model on a busy CPU may predict no speedup at all: then one line says so
        assert "best reachable speedup" in p.stderr and "Traceback" not in p.stderr, p.stderr
        return
    assert p.returncode == 0, p.stderr
    r = json.loads((out / "report.json").read_text())
    assert r["objective"] == {"kind": "latency", "speedup": 1.05, "phase": "prefill", "shape": "1x64",
                              "margin": 0.01, "param_cap": 0.95, "guard": True, "whole_heads": True}
    assert {"predicted_ms", "measured_ms"} <= set(r["variants"]["gac"])
    assert (r["latency"]["batch"], r["latency"]["prefill_tokens"]) == (1, 64)  # every model timed at the objective's
    lo = r["latency_objective"]
    assert "history" not in lo["guard"]["latency"] and kept_round(lo, lo["stream"])["round"] == lo["round"]
    assert all(row["params"] <= 0.95 * r["compressible_params"] for row in r["latency_objective"]["rounds"])
    guard = r["latency_objective"]["guard"]  # the parameter objective's choice beside it keeps the cap too
    assert guard["kept"] in ("latency", "parameter") and "parameter" in guard
    if guard["parameter"].get("params") is not None:  # a tiny model on a busy CPU: no ratio may be predicted fast
        assert guard["parameter"]["params"] <= 0.95 * r["compressible_params"]


@pytest.mark.subprocess
def test_a_second_run_replays_the_timings_and_keeps_the_same_model(tiny_model_dir, tmp_path, monkeypatch):
    """The same command again on this machine replays every timing the first recorded (gac.objectives.latency.journal):
    the same rounds and dims, report.md saying so; --retime times afresh."""
    monkeypatch.setenv("GAC_CACHE_DIR", str(tmp_path / "cache"))
    reports = []
    for i, extra in enumerate([(), (), ("--retime",)]):
        p = _speedup_run(tiny_model_dir, tmp_path / f"o{i}", *extra)
        if p.returncode == 2:  # a tiny model on a busy CPU may predict no speedup at all: then one line says so
            assert "best reachable speedup" in p.stderr and "Traceback" not in p.stderr, p.stderr
            return
        assert p.returncode == 0, p.stderr
        reports.append(json.loads((tmp_path / f"o{i}" / "report.json").read_text()))
    first, second, fresh = (r["latency_objective"] for r in reports)
    assert first["journal"]["replayed"] == 0 < first["journal"]["measured"]
    assert second["journal"] == {**first["journal"], "replayed": first["journal"]["measured"], "measured": 0}
    assert second["rounds"] == first["rounds"] and reports[1]["dims"] == reports[0]["dims"]
    assert "timings replayed as this machine recorded them" in (tmp_path / "o1" / "report.md").read_text()
    assert fresh["journal"]["replayed"] == 0 < fresh["journal"]["measured"] and not fresh["journal"]["replay"]
