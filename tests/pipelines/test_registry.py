"""The pipelines registered by name (gac.pipelines.PIPELINES): each a Pipeline under its own name with its own
forecast, a name no pipeline has refused in one line naming the choices, and a third pipeline one module and a
registry line, forecast and taken by name with nothing else edited."""

from __future__ import annotations

import dataclasses

import pytest

from gac.api import CompressConfig
from gac.cli.options import in_flags
from gac.config import AUTO_PIPELINE, WHOLE_MODEL
from gac.errors import ConfigError, GacError
from gac.pipelines import PIPELINES, get_pipeline
from gac.pipelines.base import Pipeline
from gac.pipelines.choice import plan_memory
from gac.pipelines.memory import Forecast, Workload, forecast
from gac.pipelines.whole_model import WholeModel
from tests.helpers_forecast import RATE, llama  # the forecast's test model and rate


@pytest.mark.parametrize("name", list(PIPELINES))
def test_each_name_gives_its_pipeline_and_its_forecast(name):
    pipeline = get_pipeline(name)
    assert isinstance(pipeline, Pipeline) and pipeline.name == name and pipeline.title
    assert forecast(llama(4), pipeline=name, flops_per_s=RATE).pipeline == name
    assert WHOLE_MODEL in PIPELINES and AUTO_PIPELINE not in PIPELINES


def test_an_unknown_pipeline_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="choose whole, layerwise") as e:
        get_pipeline("offloaded")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError) as e:  # before any work: the name is checked first
        plan_memory(CompressConfig(model="no-such-model", pipeline="offloaded"))
    assert str(e.value) == "unknown pipeline=offloaded: choose auto, whole, layerwise"
    assert in_flags(e.value) == "unknown --pipeline offloaded: choose auto, whole, layerwise"


class Offloaded(WholeModel):
    """A third pipeline, as a user would add one: the whole model's stages, its own (here halved) forecast."""

    name = "offloaded"
    title = "the offloaded pipeline"

    def forecast(self, work: Workload) -> Forecast:
        whole = super().forecast(work)
        return dataclasses.replace(whole, pipeline=self.name, peak_bytes=whole.peak_bytes // 2)


PIPELINE = Offloaded()


def test_a_third_pipeline_is_a_module_and_a_registry_line(monkeypatch, tmp_path):
    monkeypatch.setitem(PIPELINES, Offloaded.name, __name__)
    whole, offloaded = (forecast(llama(16), pipeline=p, flops_per_s=RATE) for p in (WHOLE_MODEL, Offloaded.name))
    assert offloaded.pipeline == "offloaded" and offloaded.peak_bytes == whole.peak_bytes // 2
    d = tmp_path / "cfg"
    llama(16).save_pretrained(d)
    cfg = CompressConfig(model=str(d), evaluate=False, pipeline="offloaded")
    choice = plan_memory(dataclasses.replace(cfg, max_memory=f"cpu={whole.peak_bytes}"))
    assert (choice.pipeline, choice.reason) == ("offloaded", "--pipeline offloaded asks for it")
    with pytest.raises(GacError, match="the offloaded pipeline needs about"):  # its own forecast, refused before work
        plan_memory(dataclasses.replace(cfg, max_memory=f"cpu={whole.peak_bytes // 4}"))
