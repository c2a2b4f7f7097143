"""The choice of pipeline: layer by layer exactly when the whole-model forecast exceeds the memory available (decided
by one function, tested here with given figures), forced by --layerwise / --whole-model, said in the log, the
report and --dry-run."""

from __future__ import annotations

import dataclasses

import pytest

from gac.api import CompressConfig
from gac.errors import GacError
from gac.pipelines import choice as choice_module
from gac.pipelines.choice import Available, available_memory, choose_pipeline, plan_memory
from gac.pipelines.memory import GIB, forecast
from tests.helpers import gac_cli
from tests.helpers_forecast import DOCS, RATE, llama  # the forecast's test model and rate



def test_layerwise_exactly_when_the_whole_model_would_not_fit():
    free = Available(24 * GIB, "MemAvailable")
    big = choose_pipeline(139 * GIB, free)
    assert big.pipeline == "layerwise"
    assert "139.0 GiB" in big.reason and "24.0 GiB (MemAvailable)" in big.reason  # both figures, and whence
    assert (big.whole_forecast_bytes, big.available_bytes, big.available_from) == (139 * GIB, 24 * GIB, "MemAvailable")
    small = choose_pipeline(2 * GIB, free)
    assert small.pipeline == "whole" and "2.0 GiB" in small.reason
    assert choose_pipeline(24 * GIB, free).pipeline == "whole"  # at the limit it fits
    assert choose_pipeline(24 * GIB + 1, free).pipeline == "layerwise"


def test_flags_force_the_pipeline_whatever_the_figures():
    free = Available(GIB, "MemAvailable")
    assert choose_pipeline(GIB // 2, free, forced="layerwise").pipeline == "layerwise"
    forced = choose_pipeline(100 * GIB, free, forced="whole")
    assert forced.pipeline == "whole" and "--whole-model" in forced.reason
    assert "--speedup" in choose_pipeline(None, free, forced="whole", forced_by="--speedup").reason


def test_unknown_figures_keep_the_whole_model():
    assert choose_pipeline(None, Available(GIB, "MemAvailable")).pipeline == "whole"  # e.g. a hub id: no config
    assert choose_pipeline(100 * GIB, None).pipeline == "whole"  # nothing to compare with


def test_available_memory_is_the_least_figure(monkeypatch):
    monkeypatch.setattr(choice_module, "_meminfo_available", lambda: Available(20 * GIB, "MemAvailable"))
    monkeypatch.setattr(choice_module, "_psutil_available", lambda: None)
    monkeypatch.setattr(choice_module, "_cgroup_room", lambda: Available(6 * GIB, "cgroup limit"))
    assert available_memory("cpu") == Available(6 * GIB, "cgroup limit")
    assert available_memory("cpu", "cpu=3GiB") == Available(3 * GIB, "--max-memory cpu")  # the budget given wins
    monkeypatch.setattr(choice_module, "_cgroup_room", lambda: None)
    assert available_memory("cpu") == Available(20 * GIB, "MemAvailable")


def test_this_machine_reports_some_memory():
    figure = available_memory("cpu")
    assert figure is None or (figure.bytes > 0 and figure.source)


def test_plan_follows_the_forecast_against_the_budget(tmp_path):
    d = tmp_path / "cfg"
    llama(16).save_pretrained(d)
    cfg = CompressConfig(model=str(d), evaluate=False)
    whole = forecast(llama(16), pipeline="whole", flops_per_s=RATE).peak_bytes
    layerwise = forecast(llama(16), flops_per_s=RATE).peak_bytes
    assert layerwise < whole
    roomy = plan_memory(dataclasses.replace(cfg, max_memory=f"cpu={whole + GIB}"))
    assert roomy.pipeline == "whole" and roomy.available_from == "--max-memory cpu"
    tight = plan_memory(dataclasses.replace(cfg, max_memory=f"cpu={(layerwise + whole) // 2}"))
    assert tight.pipeline == "layerwise" and tight.whole_forecast_bytes >= whole * 0.9
    with pytest.raises(GacError, match="needs about"):  # not even layer by layer: refused before any work
        plan_memory(dataclasses.replace(cfg, max_memory=f"cpu={layerwise // 2}"))
    for pipeline, budget in (("layerwise", whole + GIB), ("whole", layerwise + 1)):  # named: taken, whatever fits
        named = dataclasses.replace(cfg, max_memory=f"cpu={budget}", pipeline=pipeline)
        assert plan_memory(named).pipeline == pipeline


def test_dry_run_chooses_layer_by_layer_for_an_8b_model_by_itself():
    """No pipeline flag: the whole-model forecast (about 139 GiB in bfloat16) against a 24 GiB budget."""
    p = gac_cli("compress", "--model", str(DOCS / "llama-3-8b"), "--dry-run", "--max-memory", "cpu=24GiB")
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("pipeline:"))  # the printout, not the log
    assert line.startswith("pipeline: layerwise (the whole-model pipeline would need about")
    assert "24.0 GiB (--max-memory cpu)" in line
    forced = gac_cli("compress", "--model", str(DOCS / "llama-3-8b"), "--dry-run", "--whole-model")
    assert forced.returncode == 0, forced.stderr
    assert "pipeline: whole (--whole-model asks for it)" in forced.stdout
