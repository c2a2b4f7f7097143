"""The pipeline interface: how a run reads, analyzes, cuts and writes a model, and what that costs (its memory
forecast). Two peers implement it, the whole model in memory (gac.pipelines.whole_model) and layer by layer in bounded
memory (gac.pipelines.layerwise), registered by name in gac.pipelines.PIPELINES; gac.pipelines.run drives either
through the same stages, so selection (the objective), evaluation and the report are one path."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from gac.compressors import compressor_for
from gac.config import CompressConfig

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from gac.checkpoint.lazy import LazyCheckpoint, Resident
    from gac.compressors.base import Compressor
    from gac.evaluate.layer_latency import LayerLatency
    from gac.models.groups import DimGroup
    from gac.objectives.base import Analyzed, Selected
    from gac.pipelines.memory import Forecast, Workload


@dataclass
class Opened:
    """A run's model as its pipeline opened it."""

    model: (
        PreTrainedModel  # whole in memory, or (layer by layer) a shell whose layers the source brings in one at a time
    )
    tokenizer: PreTrainedTokenizerBase | None  # None: none beside the weights (a run then stops)
    name: str  # the model's name in report.json
    source: LazyCheckpoint | Resident | None = None  # layer by layer: where each layer's weights are read from


@dataclass
class Measured:
    """What a layer-wise run measures as the layers go by: perplexities, and the layers' timings."""

    ppl: dict  # {variant or "baseline": float}
    latency: LayerLatency


class Pipeline(ABC):
    """How a run reads, analyzes, cuts and writes a model; the run's stages between are gac.pipelines.run's."""

    name: ClassVar[str]  # its key in PIPELINES, CompressConfig.pipeline, report.json's "pipeline"
    title: ClassVar[str]  # in a sentence: "the whole-model pipeline"

    @abstractmethod
    def forecast(self, work: Workload) -> Forecast:
        """Peak memory, disk and time of a run through this pipeline, added up from `work` (gac.pipelines.memory's
        terms, from the model's config alone)."""

    def check(self, compressor: Compressor) -> None:
        """Refuse, in one line (a ConfigError), a compressor this pipeline cannot run; the forecast asks first."""
        return None  # here every compressor runs

    @abstractmethod
    def open(self, cfg: CompressConfig) -> Opened:
        """The model to compress, its tokenizer and name (and, layer by layer, its weight source)."""

    @abstractmethod
    def analyze(
        self,
        opened: Opened,
        calib: torch.Tensor,
        cfg: CompressConfig,
        compressor: Compressor,
        held_back: torch.Tensor | None = None,
    ) -> Analyzed:
        """Calibrate on `calib` [n, seq] and let the compressor analyze every group; the model is not changed."""

    def output(self, cfg: CompressConfig) -> contextlib.AbstractContextManager[Path | None]:
        """The directory the saved variant's weights are streamed to while it is cut (None: saved whole at the end,
        or no output)."""
        return contextlib.nullcontext()

    @abstractmethod
    def materialize(
        self, opened: Opened, selected: Selected, cfg: CompressConfig, held_out: torch.Tensor, streamed_to: Path | None
    ) -> tuple[dict, Measured | None]:
        """({variant: model}, the baseline first; what was measured on the way, else None)."""

    @abstractmethod
    def write(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: CompressConfig,
        *,
        plan: dict,
        files: dict,
        streamed_to: Path | None,
        finish: Callable | None = None,
    ) -> Path:
        """Save the saved variant with its plan and `files` to cfg.out; `finish` (the directory) runs before it is
        moved into place."""


def compressor_groups(
    model: nn.Module, cfg: CompressConfig, compressor: Compressor | None = None
) -> tuple[Compressor, Sequence[DimGroup]]:
    """(the run's compressor, built from cfg where not given and set to its factorization; its groups on `model`),
    the objective's target checked from the shapes alone, before any calibration (the parameter objective's budget)."""
    compressor = compressor or compressor_for(cfg.compressor)
    compressor.factorization = cfg.factorization_method
    groups = compressor.groups(model)
    cfg.objective.check_groups(groups, cfg)
    return compressor, groups
