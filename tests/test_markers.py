"""The suite's own markers: the quick loop (`-m "not slow"`) leaves out every embedded-model and vLLM test."""

import pytest


@pytest.mark.integration
def test_an_integration_test_is_slow(request):
    assert request.node.get_closest_marker("slow") is not None


@pytest.mark.vllm
def test_a_vllm_test_is_slow(request):
    assert request.node.get_closest_marker("slow") is not None


def test_a_plain_test_is_not(request):
    assert request.node.get_closest_marker("slow") is None
