"""ASVD: activation-aware SVD. Input channels are scaled by (mean |x|)^alpha before the SVD so directions
that carry large activations are kept; importance per parameter comes from the activations too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from gac.calibration.importance import LOWRANK_IMPORTANCE, check_proxy
from gac.calibration.stats import LinearStats, calibrated, weight_of
from gac.compressors.base import LowRankCompressor, LowRankUnit
from gac.compressors.config import CompressorConfig
from gac.errors import ConfigError


@dataclass(frozen=True)
class ASVDConfig(CompressorConfig):
    name: ClassVar[str] = "asvd"
    alpha: float = 1.0  # the scaling exponent: 1 whitens independent input channels (ASVD uses 0.5, which
    # measured worse); 0 is plain SVD
    # "output": gac's loss model (compressors/loss_model.py), the best allocation measured; a proxy name scales the
    # scaled spectral energy instead; None: measured sensitivity
    importance: str | None = "output"

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 2.0:
            raise ConfigError(f"asvd {{alpha}} {self.alpha} is outside [0, 2]: use e.g. {{alpha:1}}")
        if self.importance is not None:
            check_proxy(self.importance, LOWRANK_IMPORTANCE)


class ASVDCompressor(LowRankCompressor[ASVDConfig]):
    name = "asvd"

    def input_scale(self, weight: torch.Tensor, stats: LinearStats | None) -> torch.Tensor:
        mean_abs = calibrated(stats).mean_abs.to(weight.device)  # [in]
        floor = mean_abs.max().clamp_min(1e-12) * 1e-6  # channels never seen active still keep a tiny scale
        return mean_abs.clamp_min(floor).pow(self.config.alpha)

    def importance(
        self,
        model: nn.Module,
        units: Sequence[LowRankUnit],
        stats: dict[str, LinearStats],
        probe: torch.Tensor | None,
        keep: float,
        progress: bool,
    ) -> list[float]:
        # Measured sensitivity (base.measured_sensitivity); without probe text, activation-weighted magnitude
        # ||W diag(mean|x|)||^2 / numel.
        if probe is None:
            return [
                float(
                    (weight_of(model, u.group.linear).detach().float() * stats[u.group.linear].mean_abs).pow(2).mean()
                )
                for u in units
            ]
        return self.measured_sensitivity(model, units, probe, keep, progress)
