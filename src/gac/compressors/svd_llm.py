"""SVD-LLM: truncation-aware data whitening. With S the Cholesky factor of X^T X (calibration inputs), the SVD
of W S truncated at rank r minimizes ||(W - W_r) X^T||_F exactly; S^-1 is folded back into the first factor.
Each linear is whitened by its own inputs, so grouped-query attention (k/v narrower than q) needs nothing special."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gac.compressors.base import LowRankCompressor
from gac.compressors.linalg import whiten


@dataclass(frozen=True)
class SVDLLMConfig:
    # "output": gac's loss model (compressors/loss_model.py), the best allocation measured; a proxy name scales the
    # whitened spectral energy instead; None: measured sensitivity
    importance: str | None = "output"

    def __post_init__(self):
        if self.importance is not None:
            from gac.calibration.importance import LOWRANK_IMPORTANCE, check_proxy

            check_proxy(self.importance, LOWRANK_IMPORTANCE)


class SVDLLMCompressor(LowRankCompressor):
    name = "svd_llm"
    own_xtx = True

    def input_scale(self, weight: torch.Tensor, stats) -> torch.Tensor:
        return whiten(stats.xtx.matrix().to(weight.device))  # [in, in] float64, lower-triangular

    def importance(self, model, units, stats, probe, keep, progress):
        # Measured sensitivity, as for asvd (here per unit of lost whitened energy); magnitude without probe text.
        if probe is None:
            return super().importance(model, units, stats, probe, keep, progress)
        return self.measured_sensitivity(model, units, probe, keep, progress)


CONFIG, COMPRESSOR = SVDLLMConfig, SVDLLMCompressor
