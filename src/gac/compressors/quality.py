"""Retained quality of a unit at each candidate dim, from the compressor's own model of it: minus the loss model's
predicted loss (low-rank units with a curve), minus the importance a weight's lost spectral energy carries (without
one), minus the importance of the channels or heads pruned away. Higher is better; 0 is the original.

Each unit type states which of these it is (`Unit.quality_values`); the maths is here, on plain arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def curve_quality(curve: np.ndarray, candidates: Sequence[int | None]) -> list[float]:
    """Minus the predicted loss increase at each rank, `curve` [max_dim + 1] (rank 0..max_dim)."""
    loss = np.asarray(curve, dtype=np.float64)
    return [0.0 if d is None else -float(loss[min(d, len(loss) - 1)]) for d in candidates]


def energy_quality(energy: np.ndarray, weight: float, candidates: Sequence[int | None]) -> list[float]:
    """Minus `weight` (the unit's importance) x the share of spectral energy lost at each rank; `energy`: each
    singular direction's share."""
    lost = 1.0 - np.concatenate([[0.0], np.cumsum(energy)])  # [k + 1]: energy lost at rank r
    return [0.0 if d is None else -weight * float(max(lost[min(d, len(lost) - 1)], 0.0)) for d in candidates]


def pruned_quality(gains: np.ndarray, step: int, candidates: Sequence[int | None]) -> list[float]:
    """Minus the importance of the steps pruned away at each dim; `gains`: each successive step's importance."""
    kept = np.concatenate([[0.0], np.cumsum(gains)])  # importance kept with k steps
    return [0.0 if d is None else -float(kept[-1] - kept[d // step]) for d in candidates]
