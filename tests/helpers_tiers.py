"""The suite's tiers and units of work, as tests/conftest.py applies them at collection (and tests/test_markers.py
checks them)."""

from __future__ import annotations

from pathlib import Path

from gac.errors import GacError
from gac.io.validate import enough_space

SLOW_MARKERS = ("integration", "vllm")

# The quick tier (`pytest -m quick`): a test is quick unless it asks for an engine's fixture (it is then marked
# `engine`) or is marked one of NOT_QUICK. That a quick test neither reads the embedded model nor starts a process is
# checked while it runs (tests/conftest.py's quick_guard), so a test that does either is marked `integration` or
# `subprocess`.
ENGINE_FIXTURES = ("vllm", "llama_cpp", "lm_eval")
NOT_QUICK = ("engine", "gpu", "integration", "slow", "subprocess", "vllm")


# Directories whose files share session fixtures (vLLM's served models, llama.cpp's exports): under pytest-xdist
# each runs on one worker, started first and in this order (the longest units); every other file runs whole on one
# worker (its module fixtures built once)
SHARED_UNITS = ("tests/serve", "tests/export")


def work_unit(nodeid: str) -> str:
    """The unit pytest-xdist gives one worker: a directory above, else the test's file."""
    path = nodeid.split("::", 1)[0]
    directory = "/".join(path.split("/")[:2])
    return directory if directory in SHARED_UNITS else path


def tier_markers(marked: set[str], fixtures: set[str]) -> list[str]:
    """The markers collection adds to a test marked `marked` that asks for `fixtures`: every test on the embedded
    model or in vLLM is also `slow`, one asking for an engine fixture is `engine`, one marked none of NOT_QUICK
    then is `quick`."""
    added = ["slow"] if marked & set(SLOW_MARKERS) else []
    added += ["engine"] if fixtures & set(ENGINE_FIXTURES) else []
    return added + ([] if (marked | set(added)) & set(NOT_QUICK) else ["quick"])



# What the full suite writes at its peak under its temporary root (saved models, exports, caches), with room to
# spare; measured in docs/results/test-suite.md
SUITE_DISK_BYTES = 6 << 30


def space_refusal(root: Path, markexpr: str) -> str | None:
    """The one line that refuses a run whose temporary root lacks the full suite's disk (gac's own check of an
    output's space), so a nearly full disk fails at the start, not with a saved model half written near the end; the
    quick tier writes little and always runs."""
    if "quick" in markexpr:
        return None
    try:
        enough_space(root, SUITE_DISK_BYTES, "--basetemp")
    except GacError as e:
        return f"error: {e}"
    return None
