"""The report table gac compress prints: what it compares depends on the objective."""

from __future__ import annotations

from gac.cli.output import print_report
from gac.evaluate.report import report_markdown

COMMON = {"model": "m", "compressor": "prune", "device": "cpu", "device_name": "cpu", "dtype": "float32",
          "alignment": 8, "compressible_params": 1000}


def _variant(params, prefill_ms, **extra):
    return {"params": params, "aligned_fraction": 1.0, "ppl": 10.0, "prefill_ms": prefill_ms,
            "decode_ms_per_token": 1.0, **extra}


def test_ratio_report_compares_with_the_budget_and_the_unaligned_model(capsys):
    r = {**COMMON, "ratio": 0.2, "budget_params": 800,
         "variants": {"baseline": _variant(1000, 10.0), "unaligned": _variant(800, 9.0), "gac": _variant(800, 6.0)}}
    print_report(r)
    out = capsys.readouterr().out
    assert "ratio 0.2" in out and "budget 800 params" in out and "vs budget" in out
    assert "1.250" in out and "1.500x" in out  # baseline params / budget; unaligned / gac prefill


def test_speedup_report_compares_with_the_original_at_the_objective_shape(capsys):
    r = {**COMMON, "ratio": None, "budget_params": 1000,
         "objective": {"kind": "latency", "speedup": 1.1, "phase": "decode", "shape": "1x512"},
         "variants": {"baseline": _variant(1000, 10.0, measured_ms=4.0, predicted_ms=4.0, prediction_error_pct=0.0),
                      "gac": _variant(600, 8.0, measured_ms=3.2, predicted_ms=3.3, prediction_error_pct=3.1)}}
    print_report(r)
    out = capsys.readouterr().out
    assert "speedup 1.1x at decode 1x512" in out and "ratio None" not in out and "budget" not in out
    assert "aimed" not in out  # no margin recorded (reports before it)
    print_report({**r, "objective": {**r["objective"], "margin": 0.03}})
    assert "speedup 1.1x at decode 1x512 (aimed 3% past)" in capsys.readouterr().out
    assert "vs original" in out and "0.600" in out and "1.250x" in out  # 600 / 1000 params; 4.0 / 3.2 measured
    md = report_markdown(r)
    assert "no parameter budget" in md and "| gac | 600 | 0.600 |" in md
