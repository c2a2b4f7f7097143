"""The pipeline axis: how a run reads, analyzes, cuts and writes a model, whole in memory or layer by layer. Both are
peers behind one interface (gac.pipelines.base.Pipeline), registered by name as llm-compressor registers its
calibration pipelines, and lazy: which one a run takes is gac.pipelines.choice's (the memory forecast)."""

import importlib

# name (report.json's "pipeline") -> module; each module defines PIPELINE (its gac.pipelines.base.Pipeline)
PIPELINES = {
    "whole": "gac.pipelines.whole_model",
    "layerwise": "gac.pipelines.layerwise.pipeline",
}


def get_pipeline(name: str):
    """The pipeline registered as `name` (a gac.pipelines.base.Pipeline)."""
    return importlib.import_module(PIPELINES[name]).PIPELINE
