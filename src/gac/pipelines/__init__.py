"""The pipeline axis: how a run reads, analyzes, cuts and writes a model, whole in memory or layer by layer. Each is a
gac.pipelines.base.Pipeline, with its own memory forecast, registered by name as llm-compressor registers its
calibration pipelines, and lazy: its module is imported when first asked for. Which one a run takes is
gac.pipelines.choice's (the memory forecast), unless the config names one."""

from __future__ import annotations

import importlib

from gac.config import AUTO_PIPELINE
from gac.errors import ConfigError
from gac.pipelines.base import Pipeline

# name (report.json's "pipeline", CompressConfig.pipeline) -> the module defining PIPELINE, its Pipeline (imported
# on first use: a pipeline's module reaches torch)
PIPELINES: dict[str, str] = {
    "whole": "gac.pipelines.whole_model",
    "layerwise": "gac.pipelines.layerwise.pipeline",
}


def check_pipeline(name: str) -> None:
    """A ConfigError naming the choices unless `name` is a registered pipeline or "auto" (the forecast chooses)."""
    if name != AUTO_PIPELINE and name not in PIPELINES:
        raise ConfigError(f"unknown {{pipeline:{name}}}: choose {', '.join([AUTO_PIPELINE, *PIPELINES])}")


def get_pipeline(name: str) -> Pipeline:
    """The pipeline registered as `name`."""
    if name not in PIPELINES:
        raise ConfigError(f"unknown {{pipeline:{name}}}: choose {', '.join(PIPELINES)}")
    pipeline = importlib.import_module(PIPELINES[name]).PIPELINE
    if not isinstance(pipeline, Pipeline) or pipeline.name != name:
        raise TypeError(f"{PIPELINES[name]}.PIPELINE is not the Pipeline named {name!r}")
    return pipeline
