"""Shared fixtures: a tiny random Llama-family model with a real (tiny, trained-here) tokenizer, saved as an
HF directory, so every test runs offline in seconds (the builders: tests/helpers_tiny.py); and the suite's hooks:
each test's tier and each worker's unit of work (tests/helpers_tiers.py)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
from pathlib import Path

# Set before torch loads libgomp (which llama.cpp's ggml shares): with OpenMP's default spin-waiting, torch and
# llama.cpp in one process (the export tests) made each other 5-10x slower on 2 busy cores; passive waits do not.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers import installed_for_ci
from tests.helpers_tiers import SHARED_UNITS, space_refusal, tier_markers, work_unit
from tests.helpers_tiny import save_tiny, tiny_model


@pytest.fixture(scope="session")
def llama_cpp():
    """llama-cpp-python (required under CI)."""
    return installed_for_ci("llama_cpp", "llama-cpp-python", "llamacpp")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Profiles, sweeps and perplexities that tests cache go to a temporary directory, never the user's ~/.cache/gac
    (for the whole session: module fixtures, set up before any function's, heal and profile too)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GAC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "gac-cache"))
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """An HF model directory (config, safetensors, tokenizer) of a tiny random Llama."""
    return save_tiny(tiny_model(), tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_phi_dir(tmp_path_factory):
    """An HF model directory of a tiny random Phi (dense/fc1/fc2 names, ungated MLP, biases everywhere)."""
    return save_tiny(tiny_model("phi"), tmp_path_factory.mktemp("tiny-phi"))


@pytest.fixture()
def tiny():
    """A fresh tiny random Llama model (eval mode)."""
    return tiny_model()


MAX_WORKERS = 4  # past this, SHARED_UNITS' two directories bound the wall time and more workers only add memory


def pytest_collection_modifyitems(config, items):
    """Each test's tier (tier_markers). SHARED_UNITS' directories come first (a stable sort), so that workers start
    on them."""
    for item in items:
        marked = {m.name for m in item.iter_markers()}
        for name in tier_markers(marked, set(getattr(item, "fixturenames", ()))):
            item.add_marker(name)
    order = {unit: i for i, unit in enumerate(SHARED_UNITS)}
    items.sort(key=lambda item: order.get(work_unit(item.nodeid), len(order)))


# What starts a process, whichever library asks: Popen (subprocess.run, check_output, os.popen), fork (os.spawn*,
# multiprocessing's fork), fork_exec (multiprocessing's spawn), posix_spawn, system
PROCESS_STARTERS = (("subprocess", "Popen._execute_child"), ("os", "fork"), ("os", "forkpty"), ("os", "posix_spawn"),
                    ("os", "posix_spawnp"), ("os", "system"), ("_posixsubprocess", "fork_exec"))


class EmbeddedModelGuard:
    """A finder first on sys.meta_path that fails the test when an embedded model's package is looked up: gac finds
    the model's GGUF through importlib.util.find_spec (gac.checkpoint.loading.embedded_gguf)."""

    def __init__(self):
        from gac.checkpoint.loading import EMBEDDED

        self.packages = frozenset(EMBEDDED.values())

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.packages:
            pytest.fail(f"a quick test may not read the embedded model ({fullname}): mark it `integration`")
        return None


def _refuse_process(*args, **kwargs):
    pytest.fail("a quick test may not start a process: mark it `subprocess`, or run gac in this process with "
                "tests.helpers.gac_cli")


@contextlib.contextmanager
def quick_guard():
    """While a quick test runs (its fixtures' set-up and teardown too), starting a process or looking up the
    embedded model fails the test (pytest.fail: no `except Exception` swallows it), so a test that does either
    without its marker fails instead of slowing the tier."""
    guard = EmbeddedModelGuard()
    with pytest.MonkeyPatch.context() as mp:
        for module, name in PROCESS_STARTERS:
            owner, _, attr = name.rpartition(".")
            target = importlib.import_module(module)
            mp.setattr(getattr(target, owner) if owner else target, attr, _refuse_process)
        sys.meta_path.insert(0, guard)  # in place: an import hook another module adds meanwhile stays
        try:
            yield
        finally:
            sys.meta_path.remove(guard)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A quick test runs under quick_guard, in the quick tier and in the full suite alike."""
    if item.get_closest_marker("quick") is None:
        return (yield)
    with quick_guard():
        return (yield)


def pytest_sessionstart(session):
    """The main process (not a pytest-xdist worker) checks the disk under the temporary root first."""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    line = space_refusal(Path(config.option.basetemp or tempfile.gettempdir()), config.getoption("markexpr") or "")
    if line:
        pytest.exit(line, returncode=2)


def pytest_configure(config):
    """Each pytest-xdist worker computes on its share of the cores: with every worker on all of them, a parallel
    region's threads wait at its barrier for a thread the other worker's work has taken off its core."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker a core, at most MAX_WORKERS (each may hold the embedded model or start vLLM)."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def pytest_xdist_make_scheduler(config, log):
    """Whole work units to each worker (pytest-xdist's --dist loadgroup does not group under pytest 9.2, its
    issue #1386; its scope scheduler with our units does)."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnits(config, log)
