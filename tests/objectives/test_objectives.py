"""The objective axis as types (gac.objectives): each objective is one Objective registered under its own name, the
config resolves the run's, and what differs with it is answered by it (no caller asks which objective runs)."""

from __future__ import annotations

import pathlib

import pytest

from gac.api import CompressConfig
from gac.errors import ConfigError
from gac.evaluate.latency import LatencyConfig
from gac.objectives import OBJECTIVES, objective_for
from gac.objectives.base import Objective
from gac.objectives.latency import LATENCY
from gac.objectives.latency.config import SpeedupConfig
from gac.objectives.parameter import PARAMETER

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "gac"


def test_each_objective_is_registered_under_its_name():
    assert set(OBJECTIVES) == {"parameter", "latency"}
    for name, objective in OBJECTIVES.items():
        assert isinstance(objective, Objective) and objective.name == name and objective.ranking


def test_the_config_resolves_its_objective():
    assert CompressConfig().objective is objective_for(CompressConfig(ratio=0.3)) is PARAMETER
    assert CompressConfig(speedup=SpeedupConfig(1.2)).objective is LATENCY
    with pytest.raises(ConfigError, match="exclude each other"):
        CompressConfig(ratio=0.3, speedup=SpeedupConfig(1.2))


def test_what_differs_with_the_objective_is_answered_by_it():
    """--speedup forces the whole model, compares its guard's streams on held-back windows and times the variants at
    its shape; the parameter objective does none of these."""
    base = LatencyConfig(prefill_tokens=7, batch=3)
    ratio, speedup = CompressConfig(latency=base), CompressConfig(latency=base, speedup=SpeedupConfig(1.2, seq=32))
    assert (PARAMETER.forces_whole_model, LATENCY.forces_whole_model) == (None, "--speedup")
    assert not PARAMETER.needs_held_back(ratio) and LATENCY.needs_held_back(speedup)
    assert ratio.evaluation_latency == base
    assert (speedup.evaluation_latency.prefill_tokens, speedup.evaluation_latency.batch) == (32, 1)
    assert PARAMETER.rank({"loss": 0.5}) < PARAMETER.rank({"loss": 0.6})
    reached, short = {"reached": True, "loss": 9.0, "speedup": 1.2}, {"reached": False, "loss": 0.1, "speedup": 1.5}
    assert LATENCY.rank(reached) < LATENCY.rank(short)
    assert "no built compressor reached" in LATENCY.why_kept(short, "")


def test_no_caller_asks_which_objective_runs():
    """Outside gac.objectives (and the CLI's mapping of --speedup to its config) no code branches on the speedup."""
    found = [
        f"{path.relative_to(SRC)}:{n}"
        for path in SRC.rglob("*.py")
        if "objectives" not in path.relative_to(SRC).parts[:1] and path.parts[-2:] != ("cli", "objective.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "speedup is None" in line or "speedup is not None" in line
    ]
    assert not found, found
