"""SVD-LLM: truncation-aware data whitening. With S the Cholesky factor of X^T X (calibration inputs), the SVD
of W S truncated at rank r minimizes ||(W - W_r) X^T||_F exactly; S^-1 is folded back into the first factor.
Each linear is whitened by its own inputs, so grouped-query attention (k/v narrower than q) needs nothing special."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from gac.calibration.importance import LOWRANK_IMPORTANCE, check_proxy
from gac.calibration.stats import LinearStats, calibrated
from gac.compressors.base import LowRankCompressor, LowRankUnit
from gac.compressors.config import CompressorConfig
from gac.compressors.linalg import whiten


@dataclass(frozen=True)
class SVDLLMConfig(CompressorConfig):
    name: ClassVar[str] = "svd_llm"
    # "output": gac's loss model (compressors/loss_model.py), the best allocation measured; a proxy name scales the
    # whitened spectral energy instead; None: measured sensitivity
    importance: str | None = "output"

    def __post_init__(self) -> None:
        if self.importance is not None:
            check_proxy(self.importance, LOWRANK_IMPORTANCE)


class SVDLLMCompressor(LowRankCompressor[SVDLLMConfig]):
    name = "svd_llm"
    own_xtx = True

    def input_scale(self, weight: torch.Tensor, stats: LinearStats | None) -> torch.Tensor:
        return whiten(calibrated(stats).gram.matrix().to(weight.device))  # [in, in] float64, lower-triangular

    def importance(
        self,
        model: nn.Module,
        units: Sequence[LowRankUnit],
        stats: dict[str, LinearStats],
        probe: torch.Tensor | None,
        keep: float,
        progress: bool,
    ) -> list[float]:
        # Measured sensitivity, as for asvd (here per unit of lost whitened energy); magnitude without probe text.
        if probe is None:
            return super().importance(model, units, stats, probe, keep, progress)
        return self.measured_sensitivity(model, units, probe, keep, progress)
