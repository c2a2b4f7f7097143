"""Fixtures of the quantization tests: serve-sized tiny Llamas (head_dim 32) holding every structure gac writes,
at widths vLLM's int4 kernel takes or does not, saved as gac outputs (built by tests/helpers_quantize.py)."""

from __future__ import annotations

import pytest

from tests.helpers_quantize import UNFIT_WIDTH, save_gac, structures


@pytest.fixture(scope="session")
def lm_eval():
    """lm-evaluation-harness (a test extra): an engine, so a test asking for it is out of the quick tier."""
    import lm_eval

    return lm_eval


@pytest.fixture(scope="session")
def structures_dir(tmp_path_factory):
    return save_gac(structures(), tmp_path_factory.mktemp("quant") / "structures")


@pytest.fixture(scope="session")
def unfit_dir(tmp_path_factory):
    return save_gac(structures(UNFIT_WIDTH), tmp_path_factory.mktemp("quant") / "unfit")
