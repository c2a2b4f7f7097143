"""benchmarks/pareto.py's pure parts: the parameter objective's perplexity at a latency row's measured speedup,
and how two runs' chosen dims differ (--compare-phases)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("pareto_bench", ROOT / "benchmarks/pareto.py")
pareto = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pareto)

RATIOS = [{"ratio": 0.3, "measured_speedup": 1.4, "ppl": 40.0}, {"ratio": 0.1, "measured_speedup": 1.1, "ppl": 10.0},
          {"ratio": 0.2, "measured_speedup": 1.2, "ppl": 20.0}, {"ratio": 0.4, "measured_speedup": 1.5}]  # no ppl


def test_param_ppl_is_log_linear_between_the_bracketing_ratios():
    at = pareto.param_ppl_at(1.15, 15.0, RATIOS)
    assert at["param_bracket"] == [0.1, 0.2]
    assert at["param_ppl"] == pytest.approx(math.sqrt(10.0 * 20.0))  # halfway in speedup: the geometric mean
    assert at["ppl_vs_param_pct"] == pytest.approx(100 * (15.0 / math.sqrt(200.0) - 1))
    assert pareto.param_ppl_at(1.2, 20.0, RATIOS)["ppl_vs_param_pct"] == pytest.approx(0.0)  # on a ratio row
    assert pareto.param_ppl_at(1.3, 20.0, RATIOS)["param_bracket"] == [0.2, 0.3]


@pytest.mark.parametrize("speedup, rows", [(1.05, RATIOS), (1.45, RATIOS), (1.2, RATIOS[:1]), (1.2, [])])
def test_param_ppl_without_a_bracket_is_null_with_a_reason(speedup, rows):
    at = pareto.param_ppl_at(speedup, 10.0, rows)
    assert at["param_ppl"] is None and at["ppl_vs_param_pct"] is None
    assert f"{speedup:.3f}x is not between two ratio rows" in at["param_ppl_reason"]


def test_table_and_plot_show_the_parameter_objective_at_equal_speed(tmp_path):
    timing = {"predicted_ms": 9.0, "measured_ms": 9.0, "error_pct": 0.0, "aa_floor_pct": 0.1}
    lat = [{"target": t, "rounds": [{}], "measured_speedup": s, "ppl": 14.0, **timing} for t, s in ((1.1, 1.15),
                                                                                                      (1.5, 1.6))]
    for r in lat:
        r.update(pareto.param_ppl_at(r["measured_speedup"], r["ppl"], RATIOS))
    result = {"model": "m", "args": {"phase": "prefill", "shape": "1x512"}, "env": {},
              "compressors": [{"compressor": "asvd", "baseline_ppl": 9.0, "latency": lat,
                               "ratio": [{**r, **timing} for r in RATIOS]}]}
    text = pareto.markdown(result)
    assert "| vs params at equal measured speed |" in text and "-1.0% (params 14.14, ratios 0.1-0.2) |" in text
    assert "n/a: 1.600x is not between two ratio rows (measured 1.100x..1.400x) |" in text
    assert "| 1.150x | +4.5% |" in text and "| 1.600x | +6.7% |" in text  # measured against the target
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 1 + 2 + len(RATIOS) and all(line.count("|") == rows[0].count("|") for line in rows)
    pareto.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_equal_speed_band_from_the_aa_floor_and_the_twin():
    twin = {"ratio": 0.15, "ppl": 16.0, "measured_ms": 9.9, "measured_speedup": 1.14}
    run = {"baseline_ppl": 9.0, "ratio": RATIOS, "latency": [
        {"target": 1.1, "measured_speedup": 1.15, "measured_ms": 9.0, "ppl": 15.0, "aa_floor_pct": 1.0, "twin": twin}]}
    pareto.add_param_ppl(run)
    row = run["latency"][0]
    lo, hi = row["ppl_vs_param_band_pct"]  # the parameter curve read 1% faster and 1% slower
    assert lo < row["ppl_vs_param_pct"] < hi
    assert lo == pytest.approx(pareto.param_ppl_at(1.15 * 1.01, 15.0, RATIOS)["ppl_vs_param_pct"])
    assert hi == pytest.approx(pareto.param_ppl_at(1.15 / 1.01, 15.0, RATIOS)["ppl_vs_param_pct"])
    assert row["ppl_vs_twin_pct"] == pytest.approx(100 * (15.0 / 16.0 - 1))
    assert row["speed_vs_twin_pct"] == pytest.approx(10.0)  # the twin takes 9.9 ms to the row's 9.0
    text = pareto.markdown({"model": "m", "args": {"phase": "prefill", "shape": "1x512"}, "env": {},
                            "compressors": [{"compressor": "svd_llm", **run, "latency": [
                                {**row, "rounds": [{}], "error_pct": 0.0}],
                                "ratio": [{**r, "error_pct": 0.0, "aa_floor_pct": 1.0} for r in RATIOS]}]})
    assert "-6.2%, +10.0% (ratio 0.150, ppl 16.00, 1.140x) |" in text


def test_a_row_the_guard_kept_from_the_parameter_objective_is_its_own_twin():
    own = {"ratio": None, "ppl": 17.0, "measured_ms": 8.8, "measured_speedup": 1.18}
    run = {"baseline_ppl": 9.0, "ratio": RATIOS, "latency": [
        {"target": 1.1, "measured_speedup": 1.15, "measured_ms": 9.0, "ppl": 15.0, "aa_floor_pct": 1.0,
         "kept": "parameter", "twin": {"same": True, "ratio": 0.15}, "knapsack": own}]}
    pareto.add_param_ppl(run)
    row = run["latency"][0]
    assert row["ppl_vs_twin_pct"] == 0.0 and row["speed_vs_twin_pct"] == 0.0
    text = pareto.markdown({"model": "m", "args": {"phase": "prefill", "shape": "1x512"}, "env": {},
                            "compressors": [{"compressor": "asvd", **run, "latency": [
                                {**row, "rounds": [{}], "error_pct": 0.0}],
                                "ratio": [{**r, "error_pct": 0.0, "aa_floor_pct": 1.0} for r in RATIOS]}]})
    assert "| parameter |" in text and "the same model (ratio 0.150, kept by the guard) | 17.00, 1.180x |" in text


def test_group_kind_from_the_recorded_groups_or_the_name():
    assert pareto.group_kind("model.layers.1.self_attn") == "heads"
    assert pareto.group_kind("model.layers.1.mlp") == "mlp"
    assert pareto.group_kind("model.layers.1.mlp.down_proj") == "rank"
    assert pareto.group_kind("model.layers.1.self_attn.k_proj#g0") == "head_rank"
    assert pareto.group_kind("x", {"x": ["mlp", 64]}) == "mlp"


def _run(phase, *targets):
    return {"args": {"phase": phase, "shape": "1x512"}, "compressors": [
        {"compressor": "prune", "groups": {"l1.self_attn": ["heads", 128], "l1.mlp": ["mlp", 512],
                                           "l2.mlp": ["mlp", 512]},
         "latency": [{"target": t, "dims": d} for t, d in targets] + [{"target": 9.0, "error": "unreachable"}]},
        {"compressor": "asvd", "latency": [{"target": 1.1, "dims": {"l1.self_attn.q_proj": 8}}]}]}


def test_compare_phases_counts_differing_groups_and_sums_kept_dims_by_kind():
    a = _run("prefill", (1.1, {"l1.self_attn": None, "l1.mlp": 256, "l2.mlp": 512}),
             (1.2, {"l1.self_attn": 64, "l1.mlp": 128, "l2.mlp": 128}))
    b = _run("decode", (1.1, {"l1.self_attn": 64, "l1.mlp": 256, "l2.mlp": None}))
    b["compressors"].pop()  # asvd only in A: not compared
    (row,) = pareto.compare_phases(a, b)  # 1.1x is the only target both reached
    assert (row["compressor"], row["target"], row["groups"], row["differ"]) == ("prune", 1.1, 3, 1)
    assert row["by_kind"]["heads"] == {"groups": 1, "differ": 1, "kept_a": 128, "kept_b": 64, "whole_a": 1,
                                       "whole_b": 0}
    assert row["by_kind"]["mlp"] == {"groups": 2, "differ": 0, "kept_a": 768, "kept_b": 768, "whole_a": 1,
                                     "whole_b": 1}  # 512 and None (whole) are the same choice
    text = pareto.phases_markdown([row], a, b)
    assert "A: prefill 1x512, B: decode 1x512" in text and "| prune | 1.10x | 1/3 | heads | 1/1 | 128 | 64 |" in text


def test_compare_phases_without_recorded_groups_counts_whole_apart():
    row = pareto.compare_dims({"l1.self_attn": None, "l1.mlp": 64}, {"l1.self_attn": 32, "l1.mlp": 64})
    assert row["differ"] == 1 and row["by_kind"]["heads"]["kept_a"] == 0 and row["by_kind"]["heads"]["whole_a"] == 1


@pytest.mark.subprocess
def test_compare_phases_cli_needs_no_model(tmp_path):
    for name, phase in (("a", "prefill"), ("b", "decode")):
        (tmp_path / f"{name}.json").write_text(json.dumps(_run(phase, (1.1, {"l1.mlp": 64}))))
    script = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
              "assert 'torch' not in sys.modules, 'torch imported'")
    run = subprocess.run([sys.executable, "-c", script, str(ROOT / "benchmarks/pareto.py"), "--compare-phases",
                          str(tmp_path / "a.json"), str(tmp_path / "b.json")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "| prune | 1.10x | 0/1 | mlp | 0/1 | 64 | 64 | 0 | 0 |" in run.stdout and "asvd" in run.stdout


@pytest.mark.subprocess
def test_render_brackets_with_the_baseline_and_rewrites_table_and_plot(tmp_path):
    timing = {"predicted_ms": 9.0, "measured_ms": 9.0, "error_pct": 0.0, "aa_floor_pct": 0.1}
    lat = [{"target": 1.05, "rounds": [{}], "measured_speedup": 1.05, "ppl": 12.0, **timing}]
    result = {"model": "m", "args": {"phase": "prefill", "shape": "1x512"}, "env": {},
              "compressors": [{"compressor": "prune", "baseline_ppl": 9.0, "latency": lat,
                               "ratio": [{**r, **timing} for r in RATIOS]}]}
    path = tmp_path / "pareto.json"
    path.write_text(json.dumps(result))
    subprocess.run([sys.executable, str(ROOT / "benchmarks/pareto.py"), "--render", str(path)], check=True,
                   capture_output=True)
    row = json.loads(path.read_text())["compressors"][0]["latency"][0]
    assert row["param_bracket"] == [0.0, 0.1]  # below the smallest ratio: between the baseline and ratio 0.1
    assert row["param_ppl"] == pytest.approx(math.exp(0.5 * math.log(9.0) + 0.5 * math.log(10.0)))
    assert "ratios 0-0.1" in (tmp_path / "pareto.md").read_text()
    assert (tmp_path / "pareto.png").stat().st_size > 0
