"""benchmarks/same_results_torchrun.py refuses a --speedup pair whose two sides would time with different threads:
rank 0 times with its node's threads (one per rank), so one process must too, or the kept models differ by design."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "same_results_torchrun.py"


@pytest.mark.subprocess
def test_speedup_pair_with_other_threads_is_refused_before_any_run(tmp_path):
    argv = [
        sys.executable,
        str(SCRIPT),
        "--threads",
        "1",
        "--out",
        str(tmp_path / "runs"),
        "prune",
        "--",
        "--speedup",
        "1.1",
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "rank 0 times with the node's 2 threads: give --threads 2" in p.stderr
    assert not (tmp_path / "runs").exists()
