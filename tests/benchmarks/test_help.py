"""Every benchmark script still imports what it needs and parses its options (`--help`), so none rots unseen: a
benchmark's figures are printed, never asserted, and a full run takes minutes to hours."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py"))


def test_the_benchmarks_are_found():
    assert len(BENCHMARKS) >= 10


@pytest.mark.subprocess
@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_parses_help(script):
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                       cwd=script.parent)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "usage:" in p.stdout and "Traceback" not in p.stderr
