"""Measured importance (ASVD's sensitivity idea): how much the calibration loss rises when one weight alone is
truncated. One probe per weight calibrates its singular-value energy into loss units."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from gac.calibration.stats import weight_of
from gac.compressors.linalg import ScaledSVD, factorize_from_svd
from gac.models.groups import RankGroup

PROBE_TOKENS = 256  # the loss probe of measured importance: one calibration window, cut to this length


class Truncated(Protocol):
    """A low-rank unit as the probe truncates it (gac.compressors.base.LowRankUnit)."""

    @property
    def group(self) -> RankGroup: ...
    @property
    def spectrum(self) -> ScaledSVD: ...
    @property
    def max_dim(self) -> int: ...
    @property
    def numel(self) -> int: ...
    @property
    def params_per_dim(self) -> int: ...


@torch.inference_mode()
def _loss(model: nn.Module, ids: torch.Tensor) -> float:
    return float(model(ids, labels=ids, use_cache=False).loss)


@torch.inference_mode()
def loss_per_energy(
    model: nn.Module, analyses: Sequence[Truncated], probe: torch.Tensor, keep: float, progress: bool = True
) -> list[float]:
    """For each weight: (loss rise when truncated to the rank holding `keep` of its parameters) / (energy lost).

    probe: token ids [n, seq] from the calibration text. The weight is restored after each probe.
    """
    device = next(model.parameters()).device
    ids = probe.to(device)
    base = _loss(model, ids)
    out = []
    for a in tqdm(analyses, desc="sensitivity", unit="weight", disable=not progress):
        weight = weight_of(model, a.group.linear)
        rank = max(1, min(a.max_dim, int(keep * a.numel / a.params_per_dim)))
        A, B = factorize_from_svd(a.spectrum, rank)
        saved = weight.data.clone()
        weight.data.copy_(B @ A)  # [out, in]: the truncated weight, dense
        rise = _loss(model, ids) - base
        weight.data.copy_(saved)
        lost = float(1.0 - a.spectrum.energy_fraction[:rank].sum())
        out.append(max(rise, 1e-6) / max(lost, 1e-9))
    return out
