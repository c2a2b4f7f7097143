"""The compressor interface, and the shared low-rank family (svd, asvd): analyze, allocate, materialize."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from gac.compressors.allocation import DENSE, allocate_ranks
from gac.compressors.loss_model import (
    allocate_by_curves,
    lowrank_loss_curve,
    lowrank_options,
    slope_at,
    truncation_factors,
)
from gac.errors import GacError
from gac.linalg import (
    ScaledSVD,
    factorize_from_svd,
    lowrank_params,
    max_useful_rank,
    scaled_svd,
)


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
    curve: np.ndarray | None = None  # predicted loss increase at rank 0..max_dim (importance "output"), else None

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
        linear objective is a first-order model of quality around the compressor's own dims.
        With a loss curve (importance "output"): the predicted loss decrease per parameter over d* +- SLOPE_SPAN."""
        if self.curve is not None:
            losses, costs = self.options()
            return slope_at(losses, costs, min(rank, self.max_dim), SLOPE_SPAN)
        energy = self.svd.energy_fraction
        return self.score * self.numel * float(energy[min(rank, energy.numel() - 1)]) / self.params_per_dim

    allow_dense = True  # whether keeping the weight whole is one of its options

    def options(self) -> tuple[np.ndarray, np.ndarray]:
        """(predicted loss, parameters) of rank 0..max_dim, then dense when allowed (needs `curve`)."""
        return lowrank_options(self.curve, self.in_features, self.out_features, self.allow_dense)

    def params(self, rank: int | None) -> int:
        return self.numel if rank is DENSE else lowrank_params(self.in_features, self.out_features, rank)


log = logging.getLogger(__name__)

SLOPE_SPAN = 8  # ranks either side of d* for the knapsack's slope: GAC's candidates lie one alignment step away


def output_curve(svd: ScaledSVD, stats, out_fisher: torch.Tensor, cap: int, rows: slice | None = None) -> np.ndarray:
    """The loss model's curve (gac.compressors.loss_model) of one factorization, from calibration statistics:
    X^T X / tokens and the output-gradient Fisher of the rows it covers."""
    if stats.xtx is None:
        raise GacError("importance 'output' needs X^T X from calibration: calibrate with xtx=compressor.needs_xtx")
    gram = stats.xtx.to(svd.Vh.device) / max(stats.tokens, 1)
    f = out_fisher if rows is None else out_fisher[rows]
    return lowrank_loss_curve(*truncation_factors(svd.U, svd.S, svd.Vh, svd.scale, gram, f.to(svd.U.device)), cap)


def output_fishers(model, names: list[str], stats: dict, windows, progress: bool) -> dict:
    """{name: output-gradient Fisher [out]}: cached in stats[name].extra["out_fisher"] when a caller put it there,
    else measured by one gradient pass over the calibration windows."""
    from gac.importance import output_fisher

    if all("out_fisher" in stats[n].extra for n in names):
        return {n: stats[n].extra["out_fisher"] for n in names}
    if windows is None:
        raise GacError("importance 'output' needs the calibration windows for its output-gradient pass")
    return output_fisher(model, windows, names, progress=progress)


class LowRankCompressor:
    """Factorize every compressible linear as b(a(x)). Subclasses define the input scaling and the importance."""

    name = "lowrank"
    own_xtx = False  # whether the factorization itself needs X^T X

    @property
    def needs_xtx(self) -> bool:
        """Calibration must collect X^T X: for the factorization, or for the "output" loss model."""
        from gac.importance import OUTPUT

        return self.own_xtx or self.proxy == OUTPUT

    def __init__(self, config):
        self.config = config

    @property
    def proxy(self) -> str | None:
        """The importance proxy chosen in the config (gac.importance.PROXIES), or None for the compressor's own."""
        return getattr(self.config, "importance", None)

    @property
    def needs_windows(self) -> bool:
        """Whether analyze needs the calibration windows (a gradient pass for taylor or fisher)."""
        from gac.importance import GRADIENT_PROXIES, OUTPUT

        return self.proxy in (*GRADIENT_PROXIES, OUTPUT)

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
        from gac.importance import OUTPUT

        if self.proxy == OUTPUT:
            fishers = output_fishers(model, names, stats, windows, progress)
            start = time.perf_counter()
            for a in out:
                a.curve = output_curve(a.svd, stats[a.name], fishers[a.name], a.max_dim)
            log.info("loss model: %d curves in %.1f s", len(out), time.perf_counter() - start)
            scores = [float(a.curve[0]) / a.numel for a in out]  # predicted loss of the weight removed, per parameter
        elif self.proxy is None:
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
        if all(a.curve is not None for a in analyses):
            return allocate_by_loss_model(analyses, budget)
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


def allocate_by_loss_model(units, budget: int) -> dict[str, int | None]:
    """Ranks (or DENSE) minimizing the summed predicted loss of the units' curves under the budget; every unit
    keeps at least rank 1 (units: WeightAnalysis-like, with curve, options(), max_dim, params_per_dim)."""
    options = [u.options() for u in units]
    floor = sum(u.params_per_dim for u in units)
    if floor > budget:
        raise GacError(f"budget of {budget} parameters cannot give every weight rank 1 ({floor} needed): lower --ratio")
    picks = allocate_by_curves([o[0] for o in options], [o[1] for o in options], budget, start=[1] * len(units))
    return {u.name: (DENSE if j > u.max_dim else int(j)) for u, j in zip(units, picks)}
