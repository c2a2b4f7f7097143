"""The suite's own markers and units of work: the quick tier (`-m quick`) leaves out every test on an engine, on the
embedded model, in a process of its own or slow, and a quick test that starts a process or looks up the embedded
model fails; under pytest-xdist a file runs whole on one worker, the serving and export directories each on one."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from tests import helpers_tiers
from tests.helpers_tiers import SHARED_UNITS, space_refusal, tier_markers, work_unit


@pytest.mark.integration
def test_an_integration_test_is_slow(request):
    assert request.node.get_closest_marker("slow") is not None
    assert request.node.get_closest_marker("quick") is None


@pytest.mark.vllm
def test_a_vllm_test_is_slow(request):
    assert request.node.get_closest_marker("slow") is not None
    assert request.node.get_closest_marker("quick") is None


def test_a_plain_test_is_quick(request):
    assert request.node.get_closest_marker("slow") is None
    assert request.node.get_closest_marker("quick") is not None


def test_the_tier_is_read_off_markers_and_engine_fixtures():
    assert tier_markers(set(), {"tmp_path", "tiny_model_dir"}) == ["quick"]
    assert tier_markers({"parametrize"}, set()) == ["quick"]
    for engine in ("vllm", "llama_cpp", "lm_eval"):
        assert tier_markers(set(), {"tmp_path", engine}) == ["engine"]
    assert tier_markers({"vllm"}, {"vllm"}) == ["slow", "engine"]
    assert tier_markers({"integration"}, set()) == ["slow"]
    for marker in ("gpu", "slow", "subprocess"):
        assert tier_markers({marker}, set()) == []


def test_a_quick_test_may_not_start_a_process():
    for start in (lambda: subprocess.run(["true"], check=False), lambda: os.system("true")):
        with pytest.raises(pytest.fail.Exception, match="a quick test may not start a process: mark it `subprocess`"):
            start()


def test_a_quick_test_may_not_look_up_the_embedded_model():
    from gac.checkpoint.loading import EMBEDDED, embedded_gguf

    for package in EMBEDDED.values():
        with pytest.raises(pytest.fail.Exception, match=r"may not read the embedded model .*: mark it `integration`"):
            importlib.util.find_spec(package)
    with pytest.raises(pytest.fail.Exception, match="embedded model"):
        embedded_gguf("smollm2-135m")


@pytest.mark.subprocess
def test_a_test_marked_subprocess_may():
    assert subprocess.run(["true"], check=False).returncode == 0


def test_work_units_keep_shared_fixtures_on_one_worker(request):
    assert work_unit("tests/serve/test_vllm.py::test_x[asvd]") == "tests/serve"
    assert work_unit("tests/serve/test_layout.py::test_y") == "tests/serve"
    assert work_unit("tests/export/test_engine.py::test_y") == "tests/export"
    assert work_unit("tests/heal/test_heal.py::test_z[a::b]") == "tests/heal/test_heal.py"
    assert work_unit("tests/test_markers.py::test_a_plain_test_is_quick") == "tests/test_markers.py"
    assert work_unit(request.node.nodeid) == "tests/test_markers.py"
    units = [work_unit(item.nodeid) for item in request.session.items]
    shared = [u for u in units if u in SHARED_UNITS]
    assert SHARED_UNITS == ("tests/serve", "tests/export")  # the longest unit first
    assert units[:len(shared)] == sorted(shared, key=SHARED_UNITS.index)  # collected first, in that order


def test_a_full_run_on_a_nearly_full_disk_is_refused_in_one_line(tmp_path, monkeypatch):
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(helpers_tiers, "SUITE_DISK_BYTES", free + (1 << 30))
    line = space_refusal(tmp_path / "base", "")
    assert line is not None and line.startswith("error: ") and "\n" not in line and "--basetemp" in line
    monkeypatch.setattr(helpers_tiers, "SUITE_DISK_BYTES", free - (1 << 30))
    assert space_refusal(tmp_path / "base", "") is None
    monkeypatch.setattr(helpers_tiers, "SUITE_DISK_BYTES", free + (1 << 30))
    assert space_refusal(tmp_path / "base", "quick") is None


@pytest.mark.subprocess
def test_pytest_stops_before_any_test_when_the_disk_is_short(tmp_path):
    """The hook's own path: a --basetemp on a disk short of the need (the need raised past any disk's free space)."""
    probe = tmp_path / "conftest_probe.py"
    probe.write_text("import tests.helpers_tiers as t\nt.SUITE_DISK_BYTES = 1 << 62\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-p", "conftest_probe",
                          "--basetemp", str(tmp_path / "base"), "tests/test_markers.py::test_a_plain_test_is_quick"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": f"{tmp_path}:."})
    assert run.returncode == 2, run.stdout + run.stderr
    assert "not enough space for" in run.stdout + run.stderr and "choose another --basetemp" in run.stdout + run.stderr
    assert "passed" not in run.stdout
