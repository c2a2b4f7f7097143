"""The suite's own markers and units of work: the quick loop (`-m "not slow"`) leaves out every embedded-model and
vLLM test; under pytest-xdist a file runs whole on one worker, the serving and export directories each on one."""

import pytest

from tests.conftest import SHARED_UNITS, work_unit


@pytest.mark.integration
def test_an_integration_test_is_slow(request):
    assert request.node.get_closest_marker("slow") is not None


@pytest.mark.vllm
def test_a_vllm_test_is_slow(request):
    assert request.node.get_closest_marker("slow") is not None


def test_a_plain_test_is_not(request):
    assert request.node.get_closest_marker("slow") is None


def test_work_units_keep_shared_fixtures_on_one_worker(request):
    assert work_unit("tests/serve/test_vllm.py::test_x[asvd]") == "tests/serve"
    assert work_unit("tests/serve/test_layout.py::test_y") == "tests/serve"
    assert work_unit("tests/export/test_engine.py::test_y") == "tests/export"
    assert work_unit("tests/heal/test_heal.py::test_z[a::b]") == "tests/heal/test_heal.py"
    assert work_unit("tests/test_markers.py::test_a_plain_test_is_not") == "tests/test_markers.py"
    assert work_unit(request.node.nodeid) == "tests/test_markers.py"
    units = [work_unit(item.nodeid) for item in request.session.items]
    shared = [u for u in units if u in SHARED_UNITS]
    assert SHARED_UNITS == ("tests/serve", "tests/export")  # the longest unit first
    assert units[:len(shared)] == sorted(shared, key=SHARED_UNITS.index)  # collected first, in that order
