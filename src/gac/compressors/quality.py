"""Retained quality of a unit at each candidate dim, from the compressor's own model of it: minus the loss model's
predicted loss (low-rank units with a curve), minus the importance a weight's lost spectral energy carries (without
one), minus the importance of the channels or heads pruned away. Higher is better; 0 is the original."""

from __future__ import annotations

import numpy as np

from gac.compressors.base import LowRankUnit, Unit
from gac.compressors.prune import scaled_step_gains


def quality_values(unit: Unit, candidates: list) -> list[float]:
    """One value per candidate dim (None: the group as the original has it), comparable across the units of one
    compressor: the knapsack adds them up."""
    if isinstance(unit, LowRankUnit):
        return _lowrank(unit, candidates)
    if hasattr(unit, "step_gains"):  # prune units: importance of each successive channel or head step
        return _pruned(unit, candidates)
    raise TypeError(f"{type(unit).__name__} has no quality model")


def _lowrank(u: LowRankUnit, candidates: list) -> list[float]:
    if u.curve is not None:
        loss = np.asarray(u.curve, dtype=np.float64)  # predicted loss increase at rank 0..max_dim
        return [0.0 if d is None else -float(loss[min(d, len(loss) - 1)]) for d in candidates]
    energy = u.svd.energy_fraction.double().cpu().numpy()  # share of ||W S||^2 per singular direction
    lost = 1.0 - np.concatenate([[0.0], np.cumsum(energy)])  # [k + 1]: energy lost at rank r
    weight = u.score * u.numel  # the unit's importance, spread over its energy
    return [0.0 if d is None else -weight * float(max(lost[min(d, len(lost) - 1)], 0.0)) for d in candidates]


def _pruned(u: Unit, candidates: list) -> list[float]:
    gains = scaled_step_gains(u)  # as the compressor allocates
    kept = np.concatenate([[0.0], np.cumsum(gains)])  # importance kept with k steps
    return [0.0 if d is None else -float(kept[-1] - kept[d // u.dim_step]) for d in candidates]
