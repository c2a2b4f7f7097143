"""The compressor interface, and the shared low-rank family (svd, asvd): analyze, allocate, materialize."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gac.compressors.allocation import DENSE, allocate_ranks
from gac.linalg import ScaledSVD, factorize_from_svd, lowrank_params, max_useful_rank, scaled_svd


@dataclass
class WeightAnalysis:
    """What a compressor learned about one weight: its spectrum and importance.

    The fields and properties below (name, score, numel, params_per_dim, fixed_params, min_dim, max_dim,
    profile_op, profile_shape) are the "unit" protocol gac.api relies on; every compressor's units provide them.
    A unit whose dims must stay on a grid (whole attention heads) also sets dim_step > 1 (default 1).
    """

    name: str
    out_features: int
    in_features: int
    svd: ScaledSVD
    score: float  # importance per parameter, normalized to mean 1 over the weights of a model

    @property
    def numel(self) -> int:
        return self.out_features * self.in_features

    @property
    def params_per_dim(self) -> int:
        return self.in_features + self.out_features

    fixed_params = 0
    min_dim = 1
    profile_op = "lowrank"  # the hardware-profile sweep whose latency depends on this unit's dim

    @property
    def max_dim(self) -> int:
        return max_useful_rank(self.in_features, self.out_features)

    @property
    def profile_shape(self) -> dict:
        return {"in": self.in_features, "out": self.out_features}

    def marginal_score(self, rank: int) -> float:
        """Importance per parameter at rank d*: the share of this weight's importance the next singular
        direction carries, per parameter it costs. This is the slope of the loss model at d*, so the knapsack's
        linear objective is a first-order model of quality around the compressor's own dims."""
        energy = self.svd.energy_fraction
        return self.score * self.numel * float(energy[min(rank, energy.numel() - 1)]) / self.params_per_dim

    def params(self, rank: int | None) -> int:
        return self.numel if rank is DENSE else lowrank_params(self.in_features, self.out_features, rank)


class LowRankCompressor:
    """Factorize every compressible linear as b(a(x)). Subclasses define the input scaling and the importance."""

    name = "lowrank"
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

    # --- what subclasses change -------------------------------------------------------------
    def input_scale(self, weight: torch.Tensor, stats) -> torch.Tensor | None:
        """Per-input-channel scale applied before the SVD (None: plain SVD)."""
        return None

    def importance(self, model, analyses: list[WeightAnalysis], stats: dict, probe, keep: float,
                   progress: bool) -> list[float]:
        """Importance per parameter of each weight, before normalization. Default: weight magnitude."""
        return [float(model.get_submodule(a.name).weight.detach().float().pow(2).mean()) for a in analyses]

    def measured_sensitivity(self, model, analyses: list[WeightAnalysis], probe, keep: float,
                             progress: bool) -> list[float]:
        """ASVD's sensitivity: the calibration-loss rise when a weight alone is truncated, per unit of its lost
        (scaled) spectral energy, spread over the weight's parameters."""
        from gac.compressors.sensitivity import loss_per_energy

        per_energy = loss_per_energy(model, analyses, probe, keep, progress)
        return [p / a.numel for p, a in zip(per_energy, analyses)]

    # --- shared -------------------------------------------------------------------------------
    def analyze(self, model, names: list[str], stats: dict, *, probe=None, keep: float = 0.85,
                progress: bool = True, windows=None) -> list[WeightAnalysis]:
        """Scaled SVD of every weight and its importance (probe: a short calibration window for measured
        importance; keep: 1 - ratio; windows: the calibration windows, for a gradient-based proxy)."""
        from tqdm.auto import tqdm

        out = []
        for name in tqdm(names, desc=f"{self.name}: factorizing", unit="weight", disable=not progress):
            w = model.get_submodule(name).weight.detach()  # [out, in]
            svd = scaled_svd(w, self.input_scale(w, stats.get(name)))
            out.append(WeightAnalysis(name, w.shape[0], w.shape[1], svd, 0.0))
        if self.proxy is None:
            scores = self.importance(model, out, stats, probe, keep, progress)
        else:
            from gac.importance import weight_scores

            scores = weight_scores(self.proxy, model, names, stats=stats, windows=windows, progress=progress)
        mean = float(np.mean(scores)) or 1.0
        for a, s in zip(out, scores):
            a.score = s / mean
        return out

    def allocate(self, analyses: list[WeightAnalysis], budget: int) -> dict[str, int | None]:
        """The compressor's own (unconstrained) ranks under the budget; None keeps a weight dense."""
        ranks = allocate_ranks(
            [a.svd.energy_fraction.cpu().numpy() for a in analyses],
            [a.score for a in analyses],
            [(a.out_features, a.in_features) for a in analyses],
            budget,
        )
        return {a.name: r for a, r in zip(analyses, ranks)}

    def materialize(self, model, analyses: list[WeightAnalysis], ranks: dict[str, int | None]) -> dict:
        """Replace each weight by its rank-r factorization in place; returns the structure to save."""
        from gac.models.surgery import replace_with_lowrank

        lowrank = {}
        for a in analyses:
            r = ranks[a.name]
            if r is DENSE:
                continue
            A, B = factorize_from_svd(a.svd, r)
            replace_with_lowrank(model, a.name, A, B)
            lowrank[a.name] = int(r)
        return {"lowrank": lowrank}

