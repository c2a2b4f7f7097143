"""glibc's heap while models are timed (gac.hw.heap.timing_heap): under map_large_allocations' fixed threshold a
freed activation-sized tensor goes back to the OS at once; while timing it stays in the heap for the next call, as
under glibc's default; after, the fixed threshold holds again. Each case in a fresh process: the setting is
process-wide."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import RSS_SCRIPT

HEAP = RSS_SCRIPT + """
from gac.hw.heap import map_large_allocations, timing_heap
from gac.hw.timing import time_callable
def kept_after_free():  # bytes of a freed 8 MiB tensor that stay resident
    t = torch.ones(8 << 18)
    held = rss()
    del t
    return held - rss() < 0.25 * (8 << 20)
if sys.argv[1] == "fixed":
    assert map_large_allocations()
else:
    torch.ones(16 << 18)  # 16 MiB, freed at once: glibc's dynamic mmap threshold rises to it
before = kept_after_free()
with timing_heap():
    during = kept_after_free()
after = kept_after_free()
time_callable(lambda: torch.ones(8 << 18).sum(), repeats=2)  # the timer lifts and restores it itself
print(before, during, after, kept_after_free())
"""


def _run(mode: str) -> list[str]:
    return subprocess.run([sys.executable, "-c", HEAP, mode], capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_timing_lifts_the_fixed_mmap_threshold_and_restores_it():
    assert _run("fixed") == ["False", "True", "False", "False"]


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_timing_leaves_glibcs_default_heap_as_it_is():
    """Where gac set nothing, glibc's dynamic threshold keeps the freed tensor before, during and after a timing."""
    assert _run("default") == ["True", "True", "True", "True"]
