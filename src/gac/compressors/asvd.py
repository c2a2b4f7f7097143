"""ASVD: activation-aware SVD. Input channels are scaled by (mean |x|)^alpha before the SVD so directions
that carry large activations are kept; importance per parameter comes from the activations too."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gac.calibration.importance import LOWRANK_IMPORTANCE, check_proxy
from gac.compressors.base import LowRankCompressor
from gac.errors import ConfigError


@dataclass(frozen=True)
class ASVDConfig:
    alpha: float = 1.0  # the scaling exponent: 1 whitens independent input channels (ASVD uses 0.5, which
    # measured worse); 0 is plain SVD
    # "output": gac's loss model (compressors/loss_model.py), the best allocation measured; a proxy name scales the
    # scaled spectral energy instead; None: measured sensitivity
    importance: str | None = "output"

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 2.0:
            raise ConfigError(f"asvd {{alpha}} {self.alpha} is outside [0, 2]: use e.g. {{alpha:1}}")
        if self.importance is not None:
            check_proxy(self.importance, LOWRANK_IMPORTANCE)


class ASVDCompressor(LowRankCompressor):
    name = "asvd"

    def input_scale(self, weight: torch.Tensor, stats) -> torch.Tensor:
        mean_abs = stats.mean_abs.to(weight.device)  # [in]
        floor = mean_abs.max().clamp_min(1e-12) * 1e-6  # channels never seen active still keep a tiny scale
        return mean_abs.clamp_min(floor).pow(self.config.alpha)

    def importance(self, model, units, stats, probe, keep, progress):
        # Measured sensitivity (base.measured_sensitivity); without probe text, activation-weighted magnitude
        # ||W diag(mean|x|)||^2 / numel.
        if probe is None:
            return [
                float(
                    (model.get_submodule(u.group.linear).weight.detach().float() * stats[u.group.linear].mean_abs)
                    .pow(2)
                    .mean()
                )
                for u in units
            ]
        return self.measured_sensitivity(model, units, probe, keep, progress)


CONFIG, COMPRESSOR = ASVDConfig, ASVDCompressor
