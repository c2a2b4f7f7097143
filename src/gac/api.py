"""The public entry point of `gac compress`: compress(CompressConfig) -> CompressResult. A facade: the config and
its checks are gac.config's, the run gac.pipelines.run's (the pipeline the memory forecast chooses, the objective
the config names, the compressor it builds)."""

from __future__ import annotations

from gac.config import DEFAULT_RATIO, CompressConfig
from gac.pipelines.outputs import CompressResult
from gac.pipelines.run import run

__all__ = ["DEFAULT_RATIO", "CompressConfig", "CompressResult", "compress"]


def compress(cfg: CompressConfig) -> CompressResult:
    """load -> calibrate -> analyze -> select -> materialize -> evaluate -> report -> save, as cfg says. The result's
    report is typed (gac.pipelines.outputs.Report); report.to_dict() is report.json."""
    return run(cfg)
