"""The compressor interface and the shared low-rank family (svd, asvd, svd_llm).

A compressor works on dimension groups (gac.models.groups) and never spells a module name nor cuts a module:
  groups(model)                       which groups it resizes
  analyze(model, groups, stats, ...)  one Unit per group: importance per parameter and its loss model
  allocate(units, budget)             its own (unaligned) dims d*, {group name: dim or None (kept whole)}
  cut(unit, dim)                      the tensors of the group at `dim` (Factors, Keep or KeepHeads)
`materialize` hands the cuts to gac.models.surgery, the one module that changes a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gac.compressors.allocation import DENSE, allocate_ranks
from gac.linalg import ScaledSVD, factorize_from_svd, scaled_svd
from gac.models.groups import DimGroup, RankGroup, groups_of, linears_of


@dataclass
class Unit:
    """A dimension group as a compressor sees it: the group and its importance per parameter (mean 1 over the
    units of a model). The geometry is the group's; these properties only forward it."""

    group: DimGroup
    score: float = 0.0

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def numel(self) -> int:
        return self.group.numel

    @property
    def params_per_dim(self) -> int:
        return self.group.params_per_dim

    @property
    def fixed_params(self) -> int:
        return self.group.fixed_params

    @property
    def min_dim(self) -> int:
        return self.group.min_dim

    @property
    def max_dim(self) -> int:
        return self.group.max_dim

    @property
    def dim_step(self) -> int:
        return self.group.step

    @property
    def profile_op(self) -> str:
        return self.group.profile_op

    @property
    def profile_shape(self) -> dict:
        return self.group.profile_shape

    def params(self, dim: int | None) -> int:
        return self.group.params(dim)

    def marginal_score(self, dim: int) -> float:
        """Importance per parameter at dim d* for the knapsack (the loss model's slope there)."""
        return self.score


@dataclass
class LowRankUnit(Unit):
    """A rank group with the spectrum of its (scaled) weight."""

    svd: ScaledSVD | None = None

    @property
    def in_features(self) -> int:
        return self.group.in_features

    @property
    def out_features(self) -> int:
        return self.group.out_features

    def marginal_score(self, rank: int) -> float:
        """The share of this weight's importance the next singular direction carries, per parameter it costs:
        the slope of the loss model at d*, so the knapsack's linear objective is a first-order model of quality
        around the compressor's own dims."""
        energy = self.svd.energy_fraction
        return self.score * self.numel * float(energy[min(rank, energy.numel() - 1)]) / self.params_per_dim


class Compressor:
    """What every compressor shares: its config, its importance proxy, materialization through surgery."""

    name = "compressor"
    needs_xtx = False

    def __init__(self, config):
        self.config = config

    @property
    def proxy(self) -> str | None:
        """The importance proxy chosen in the config (gac.importance.PROXIES), or None for the compressor's own."""
        return getattr(self.config, "importance", None)

    @property
    def needs_windows(self) -> bool:
        """Whether analyze needs the calibration windows (a gradient pass for taylor or fisher)."""
        from gac.importance import GRADIENT_PROXIES

        return self.proxy in GRADIENT_PROXIES

    def groups(self, model) -> list[DimGroup]:
        raise NotImplementedError

    def cut(self, unit: Unit, dim: int):
        raise NotImplementedError

    def materialize(self, model, units: list[Unit], dims: dict) -> dict:
        """Cut every unit whose dim is not None into `model`, in place; returns the model's saved structure."""
        from gac.models import surgery
        from gac.models.structure import structure_of

        cuts = []
        for u in units:
            if dims[u.name] is not None:
                u.group.check(dims[u.name])
                cuts.append((u.group, self.cut(u, dims[u.name])))
        surgery.apply(model, cuts)
        return structure_of(model)


def normalize_scores(units: list[Unit], scores) -> list[Unit]:
    """Set each unit's score to its share of the mean (mean 1 over the units)."""
    mean = float(np.mean(scores)) or 1.0
    for u, s in zip(units, scores):
        u.score = s / mean
    return units


class LowRankCompressor(Compressor):
    """Factorize every compressible linear as b(a(x)). Subclasses define the input scaling and the importance."""

    name = "lowrank"

    def groups(self, model) -> list[RankGroup]:
        return groups_of(model, "rank")

    # --- what subclasses change -------------------------------------------------------------
    def input_scale(self, weight: torch.Tensor, stats) -> torch.Tensor | None:
        """Per-input-channel scale applied before the SVD (None: plain SVD)."""
        return None

    def importance(self, model, units: list[LowRankUnit], stats: dict, probe, keep: float,
                   progress: bool) -> list[float]:
        """Importance per parameter of each weight, before normalization. Default: weight magnitude."""
        return [float(model.get_submodule(u.group.linear).weight.detach().float().pow(2).mean()) for u in units]

    def measured_sensitivity(self, model, units: list[LowRankUnit], probe, keep: float,
                             progress: bool) -> list[float]:
        """ASVD's sensitivity: the calibration-loss rise when a weight alone is truncated, per unit of its lost
        (scaled) spectral energy, spread over the weight's parameters."""
        from gac.compressors.sensitivity import loss_per_energy

        per_energy = loss_per_energy(model, units, probe, keep, progress)
        return [p / u.numel for p, u in zip(per_energy, units)]

    # --- shared -------------------------------------------------------------------------------
    def analyze(self, model, groups: list[RankGroup], stats: dict, *, probe=None, keep: float = 0.85,
                progress: bool = True, windows=None) -> list[LowRankUnit]:
        """Scaled SVD of every weight and its importance (probe: a short calibration window for measured
        importance; keep: 1 - ratio; windows: the calibration windows, for a gradient-based proxy)."""
        from tqdm.auto import tqdm

        units = []
        for g in tqdm(groups, desc=f"{self.name}: factorizing", unit="weight", disable=not progress):
            w = model.get_submodule(g.linear).weight.detach()  # [out, in]
            units.append(LowRankUnit(g, svd=scaled_svd(w, self.input_scale(w, stats.get(g.linear)))))
        if self.proxy is None:
            scores = self.importance(model, units, stats, probe, keep, progress)
        else:
            from gac.importance import weight_scores

            scores = weight_scores(self.proxy, model, linears_of(groups), stats=stats, windows=windows,
                                   progress=progress)
        return normalize_scores(units, scores)

    def allocate(self, units: list[LowRankUnit], budget: int) -> dict[str, int | None]:
        """The compressor's own (unconstrained) ranks under the budget; None keeps a weight dense."""
        ranks = allocate_ranks(
            [u.svd.energy_fraction.cpu().numpy() for u in units],
            [u.score for u in units],
            [(u.out_features, u.in_features) for u in units],
            budget,
        )
        return {u.name: r for u, r in zip(units, ranks)}

    def cut(self, unit: LowRankUnit, dim: int):
        from gac.models.surgery import Factors

        return Factors(*factorize_from_svd(unit.svd, dim))


__all__ = ["DENSE", "Compressor", "LowRankCompressor", "LowRankUnit", "Unit", "normalize_scores"]
