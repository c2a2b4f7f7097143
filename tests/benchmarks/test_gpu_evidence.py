"""The GPU evidence driver in its --tiny mode on CPU: every step runs and writes its results, a rerun goes
straight to the bench from the saved dims, and the summary renders tables and plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]  # the driver's whole --tiny run: about 2.5 min on two cores
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("evidence")
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "GAC_CACHE_DIR": str(out / "cache")}
    run = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_evidence.sh"), "all", str(out), "--tiny"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return out


def test_every_step_wrote_its_results(results):
    files = {p.name for p in results.iterdir() if p.is_file()}
    assert {"env.json", "log.txt", "sweeps.json", "smollm2.json", "smollm2_dims.json", "llama8b.json",
            "llama8b_dims.json"} <= files
    assert len(files) <= 8  # the GPU machine returns at most 8 files from a run
    log = (results / "log.txt").read_text()
    assert log.count(": exit 0") == log.count("== ") // 2 and "exit 124" not in log
    env = json.loads((results / "env.json").read_text())
    assert {"torch", "transformers", "before", "after"} <= set(env)


def test_sweeps_have_every_op_and_kernel_names(results):
    sweeps = json.loads((results / "sweeps.json").read_text())
    entry = sweeps["float32"]
    assert {e["op"] for e in entry["profile"]["ops"]} == {"gemm_n", "gemm_k", "sdpa", "lowrank"}
    assert all(ms > 0 for e in entry["profile"]["ops"] for ms in e["ms"])
    assert entry["kernels"]["gemm"] and all(g["kernels"] for g in entry["kernels"]["gemm"])
    assert all(s["first_backend_that_runs"] == "cpu" for s in entry["kernels"]["sdpa"])


@pytest.mark.parametrize("preset", ["smollm2", "llama8b"])
def test_model_step_benches_both_compressors_with_an_aa_floor(results, preset):
    record = json.loads((results / f"{preset}.json").read_text())
    assert set(record["compressors"]) == {"asvd", "prune"}
    for name, c in record["compressors"].items():
        assert "error" not in c, c.get("error")
        v = c["variants"]
        assert set(v) == {"baseline", "unaligned", "gac"}
        assert v["gac"]["aligned_fraction"] == 1.0 and v["baseline"]["flop_ratio_vs_baseline"] == 1.0
        assert v["gac"]["flop_ratio_vs_baseline"] < 1.0 and v["unaligned"]["flop_ratio_vs_baseline"] < 1.0
        bench = c["bench"]
        assert bench["aa_floor_pct"] is not None and [d["batch"] for d in bench["decode_points"]] == [1, 2]
        assert c["budget_params"] <= c["compressible_params"]
    dims = json.loads((results / f"{preset}_dims.json").read_text())
    assert set(dims) == {"asvd", "prune"} and all(set(d["dims"]) == {"unaligned", "gac"} for d in dims.values())


def test_rerun_goes_straight_to_the_bench_from_saved_dims(results, tmp_path):
    """--reuse-dims cuts variants of the saved shapes without any analysis: the same layer parameters."""
    import shutil

    out = tmp_path / "rerun"
    out.mkdir()
    shutil.copy(results / "llama8b_dims.json", out / "llama8b_dims.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_evidence.py"), "model", "--tiny", "--out",
                          str(out), "--reuse-dims", "--rounds", "1"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    again = json.loads((out / "llama8b.json").read_text())["compressors"]
    first = json.loads((results / "llama8b.json").read_text())["compressors"]
    for name in ("asvd", "prune"):
        assert again[name]["reused_dims"] is True
        for variant in ("unaligned", "gac"):
            assert again[name]["variants"][variant]["layer_params"] == first[name]["variants"][variant]["layer_params"]


def test_summary_renders_tables_and_plots(results, tmp_path):
    docs = tmp_path / "docs"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_evidence.py"), "summary", str(results),
                          "--docs", str(docs)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = (docs / "SUMMARY.md").read_text()
    assert "llama8b" in summary and "A/A control" in summary and "FLOP ratio" in summary
    assert list(docs.glob("*.png"))
