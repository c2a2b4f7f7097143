"""The compressor interface and the shared low-rank family (svd, asvd, svd_llm).

A compressor works on dimension groups (gac.models.groups) and never spells a module name nor cuts a module:
  groups(model)                       which groups it resizes
  analyze(model, groups, stats, ...)  one Unit per group: importance per parameter and its loss model
  allocate(units, budget)             its own (unaligned) dims d*, {group name: dim or None (kept whole)}
  cut(unit, dim)                      the tensors of the group at `dim` (Factors, Keep or KeepHeads)
`materialize` hands the cuts to gac.models.surgery, the one module that changes a model. The layer-wise pipeline
keeps only what selection reads between analysis and materialization: cut_state(model, units) is what `cut` needs
beyond that ({key: tensor}, cached on disk per layer), load_cut_state(units, tensors) gives it back.
"""

from __future__ import annotations

import copy
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from gac.calibration.importance import GRADIENT_PROXIES, OUTPUT, output_fisher, weight_scores
from gac.calibration.stats import LinearStats, weight_of
from gac.compressors.allocation import DENSE, allocate_ranks
from gac.compressors.config import CompressorConfig
from gac.compressors.linalg import ScaledSVD, factorize_from_svd, scaled_svd
from gac.compressors.loss_model import (
    allocate_by_curves,
    lowrank_loss_curve,
    lowrank_options,
    slope_at,
    truncation_factors,
)
from gac.compressors.quality import curve_quality, energy_quality
from gac.compressors.sensitivity import loss_per_energy
from gac.errors import ConfigError, GacError
from gac.hw.threads import map_over_ranks
from gac.models import surgery
from gac.models.cuts import Cut, Factors
from gac.models.groups import DimGroup, RankGroup, groups_of, linears_of
from gac.models.kinds.rank import max_useful_rank
from gac.models.structure import structure_of

log = logging.getLogger(__name__)
SLOPE_SPAN = 8  # ranks either side of d* for the plan's score: GAC's candidates lie one alignment step away


@dataclass
class Unit:
    """A dimension group as a compressor sees it: the group and its importance per parameter (mean 1 over the
    units of a model). The geometry is the group's; these properties only forward it."""

    group: DimGroup
    score: float = 0.0
    raw_score: float = (
        0.0  # the score before normalization (a layer-wise analysis normalizes over all layers at the end)
    )

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
    def profile_shape(self) -> dict[str, int]:
        return self.group.profile_shape

    def params(self, dim: int | None) -> int:
        return self.group.params(dim)

    def marginal_score(self, dim: int) -> float:
        """Importance per parameter at dim d* for the knapsack (the loss model's slope there)."""
        return self.score

    def loss_gains(self, dim: int, candidates: list[int]) -> list[float] | None:
        """The predicted loss saved at each candidate relative to d* (the knapsack's values), or None: no loss
        model, the knapsack uses the linear score * (|W(d)| - |W(d*)|)."""
        return None

    def quality_values(self, candidates: Sequence[int | None]) -> list[float]:
        """Retained quality at each candidate dim (None: as the original), higher is better, 0 the original:
        what the latency objective's knapsack adds up (gac.compressors.quality)."""
        raise TypeError(f"{type(self).__name__} has no quality model")

    @property
    def loss_in_nats(self) -> bool:
        """Whether quality_values are minus a predicted increase of the mean next-token loss in nats, comparable
        across compressors (`--compressor auto`); an importance (relative, unitless) is not."""
        return False


ConfigT = TypeVar("ConfigT", bound=CompressorConfig)  # the config a compressor is built from, and dispatched by
GroupT = TypeVar("GroupT", bound=DimGroup)  # the kind of group a compressor resizes
UnitT = TypeVar("UnitT", bound=Unit)  # the unit it analyzes them into
Stats = dict[str, LinearStats]  # calibration statistics per linear (gac.calibration.stats)


class LayerShapes(Protocol):
    """One decoder layer's sizes as the memory forecast reads them off a config (gac.pipelines.memory.Shapes)."""

    @property
    def hidden(self) -> int: ...
    @property
    def kv_width(self) -> int: ...
    def factorized(self) -> list[tuple[int, int]]: ...


@dataclass
class LowRankUnit(Unit):
    """A rank group with the spectrum of its (scaled) weight and, with importance "output", the loss model's
    curve: predicted loss increase at rank 0..max_dim (gac.compressors.loss_model)."""

    group: RankGroup
    svd: ScaledSVD | None = None
    curve: np.ndarray | None = None
    factors: tuple[torch.Tensor, torch.Tensor] | None = None  # (A [max_dim, in], B [out, max_dim]), loaded

    @property
    def spectrum(self) -> ScaledSVD:
        """The scaled SVD factorize_units set (after release_factors, its singular values alone)."""
        if self.svd is None:
            raise GacError(f"{self.name} has no SVD: the compressor's factorize_units has not run on it")
        return self.svd

    @property
    def loss_curve(self) -> np.ndarray:
        """The loss model's curve (importance "output": add_loss_curves set it)."""
        if self.curve is None:
            raise GacError(f"{self.name} has no loss-model curve: analyze it with importance 'output'")
        return self.curve

    def options(self) -> tuple[np.ndarray, np.ndarray]:
        """(predicted loss, parameters) of rank 0..max_dim, then dense when the group allows it."""
        return lowrank_options(self.loss_curve, self.in_features, self.out_features, self.group.allows_dense)

    def loss_gains(self, dim: int, candidates: list[int]) -> list[float] | None:
        """The loss model's quality (quality_values) at each candidate, relative to d*: one model for both
        objectives."""
        if self.curve is None:
            return None
        at_dim, *at_candidates = curve_quality(self.curve, [dim, *candidates])
        return [q - at_dim for q in at_candidates]

    @property
    def factorization_work(self) -> int:
        """m n min(m, n) of its [out, in] weight: what its SVD and loss-model products cost, relative to another's."""
        return self.out_features * self.in_features * min(self.out_features, self.in_features)

    @property
    def loss_in_nats(self) -> bool:
        """With a loss-model curve: its dL is 1/2 tr(diag(f) dW C dW^T), f the Fisher of the per-token loss and C the
        inputs' second moment per token (gac.compressors.loss_model), so nats per token, whatever the compressor."""
        return self.curve is not None

    def quality_values(self, candidates: Sequence[int | None]) -> list[float]:
        """Minus the loss model's predicted loss, or without a curve minus the importance the lost spectral energy
        carries."""
        if self.curve is not None:
            return curve_quality(self.curve, candidates)
        energy = self.spectrum.energy_fraction.double().cpu().numpy()  # share of ||W S||^2 per singular direction
        return energy_quality(energy, self.score * self.numel, candidates)

    @property
    def in_features(self) -> int:
        return self.group.in_features

    @property
    def out_features(self) -> int:
        return self.group.out_features

    def marginal_score(self, rank: int) -> float:
        """The share of this weight's importance the next singular direction carries, per parameter it costs:
        the slope of the loss model at d*, so the knapsack's linear objective is a first-order model of quality
        around the compressor's own dims. With a loss curve: its predicted loss decrease per parameter over
        d* +- SLOPE_SPAN (the knapsack then reads each candidate's loss off the curve itself, loss_gains)."""
        if self.curve is not None:
            losses, costs = self.options()
            return slope_at(losses, costs, min(rank, self.max_dim), SLOPE_SPAN)
        energy = self.spectrum.energy_fraction
        return self.score * self.numel * float(energy[min(rank, energy.numel() - 1)]) / self.params_per_dim


class Compressor(ABC, Generic[ConfigT, GroupT, UnitT]):
    """What every compressor shares: its config, its importance proxy, materialization through surgery. ConfigT: the
    config it is built from (its type chooses this handler, gac.compressors.compressor_for); GroupT: the kind of group
    it resizes; UnitT: the unit analyze makes of each."""

    name = "compressor"
    own_xtx = False  # whether the cut itself needs X^T X (whitening)
    factorization = "svd"  # how low-rank compressors take their spectra: gac.compressors.linalg.FACTORIZATIONS
    factorizes = False  # whether its cut is a low-rank factorization (factors to hold; no llama.cpp architecture)

    def __init__(self, config: ConfigT):
        self.config = config

    @property
    def needs_xtx(self) -> bool:
        """Calibration must collect X^T X: for the cut, or for the "output" loss model."""
        return self.own_xtx or self.proxy == OUTPUT

    @property
    def proxy(self) -> str | None:
        """The importance proxy chosen in the config (gac.calibration.importance.PROXIES), or None for the compressor's
        own."""
        return self.config.importance

    @property
    def measures_sensitivity(self) -> bool:
        """Whether analyze runs the whole model once per weight (LowRankCompressor's may)."""
        return False

    @property
    def needs_windows(self) -> bool:
        """Whether analyze needs the calibration windows (a gradient pass for taylor or fisher)."""
        return self.proxy in (*GRADIENT_PROXIES, OUTPUT)

    @abstractmethod
    def groups(self, model: nn.Module) -> Sequence[GroupT]:
        """The groups of `model` it resizes."""

    @abstractmethod
    def analyze(
        self,
        model: nn.Module,
        groups: Sequence[GroupT],
        stats: Stats,
        *,
        probe: torch.Tensor | None = None,
        keep: float = 0.85,
        progress: bool = True,
        windows: torch.Tensor | None = None,
    ) -> list[UnitT]:
        """One unit per group: its importance and, where the compressor has one, its loss model."""

    @abstractmethod
    def allocate(self, units: list[UnitT], budget: int) -> dict[str, int | None]:
        """The compressor's own (unaligned) dims d* under `budget` parameters; None keeps a group whole."""

    @abstractmethod
    def cut(self, unit: UnitT, dim: int) -> Cut:
        """The tensors of the unit's group at `dim` (gac.models.surgery's Factors, Keep, KeepHeads or KeepExperts)."""

    def normalize(self, units: list[UnitT], scores: Sequence[float]) -> list[UnitT]:
        """Scores per parameter made relative (mean 1 over `units`)."""
        return normalize_scores(units, scores)

    def factorize_units(self, model: nn.Module, units: list[UnitT], stats: Stats) -> None:
        """What `cut` needs beyond the units' importance (the low-rank factors), from the weights and calibration
        statistics of the units' layer. Nothing for compressors whose units hold all they cut by."""

    def cut_state(self, model: nn.Module, units: list[UnitT]) -> dict[str, torch.Tensor]:
        """{key: tensor}: what `cut` needs beyond what release_factors keeps, for every dim selection may ask. A
        compressor that overrides factorize_units overrides this too; empty for units that hold all they cut by."""
        return {}

    def cut_state_bytes(self, shapes: LayerShapes, value_bytes: int) -> int:
        """The size of one layer's cut_state at `value_bytes` per value, from its shapes alone
        (gac.pipelines.memory.Shapes): what the memory forecast counts for the layer-wise factor cache."""
        return 0

    def load_cut_state(self, units: list[UnitT], tensors: dict[str, torch.Tensor]) -> None:
        """Give `units` back what cut_state returned (the tensors may be read from disk)."""

    def release_factors(self, units: list[UnitT]) -> None:
        """Drop what factorize_units computed, keeping what selection reads (spectra, curves, importances)."""

    def materialize(self, model: nn.Module, units: list[UnitT], dims: dict[str, int | None]) -> dict:
        """Cut every unit whose dim is not None into `model`, in place; returns the model's saved structure."""
        self.materialize_units(model, units, dims)
        return structure_of(model)

    def built(self, model: nn.Module, units: list[UnitT], dims: dict[str, int | None]) -> nn.Module:
        """A copy of `model` cut to `dims`, in eval mode; `model` itself is left as it is (a variant to time or
        evaluate beside it)."""
        copied = copy.deepcopy(model)
        self.materialize_units(copied, units, dims)
        return copied.eval()

    def materialize_units(self, model: nn.Module, units: list[UnitT], dims: dict[str, int | None]) -> None:
        """Cut every unit whose dim is not None into `model`, in place (through gac.models.surgery); a unit whose
        group changes the model even whole (DimGroup.changes_whole: experts dropped) is cut at its max_dim."""
        cuts: list[tuple[DimGroup, Cut]] = []
        for u in units:
            dim = dims[u.name]
            if dim is None and u.group.changes_whole:
                dim = u.max_dim
            if dim is not None:
                u.group.check(dim)
                cuts.append((u.group, self.cut(u, dim)))
        surgery.apply(model, cuts)


def normalize_scores(units: list[UnitT], scores: Sequence[float]) -> list[UnitT]:
    """Set each unit's score to its share of the mean (mean 1 over the units)."""
    mean = float(np.mean(scores)) or 1.0
    for u, s in zip(units, scores):
        u.score, u.raw_score = s / mean, s
    return units


class LowRankCompressor(Compressor[ConfigT, RankGroup, LowRankUnit]):
    """Factorize every compressible linear as b(a(x)). Subclasses define the input scaling and the importance."""

    name = "lowrank"
    factorizes = True

    def groups(self, model: nn.Module) -> Sequence[RankGroup]:
        return groups_of(model, "rank")

    # --- what subclasses change -------------------------------------------------------------
    def input_scale(self, weight: torch.Tensor, stats: LinearStats | None) -> torch.Tensor | None:
        """Per-input-channel scale applied before the SVD (None: plain SVD)."""
        return None

    def importance(
        self,
        model: nn.Module,
        units: Sequence[LowRankUnit],
        stats: Stats,
        probe: torch.Tensor | None,
        keep: float,
        progress: bool,
    ) -> list[float]:
        """Importance per parameter of each weight, before normalization. Default: weight magnitude."""
        return [float(weight_of(model, u.group.linear).detach().float().pow(2).mean()) for u in units]

    def measured_sensitivity(
        self, model: nn.Module, units: Sequence[LowRankUnit], probe: torch.Tensor, keep: float, progress: bool
    ) -> list[float]:
        """ASVD's sensitivity: the calibration-loss rise when a weight alone is truncated, per unit of its lost
        (scaled) spectral energy, spread over the weight's parameters."""
        per_energy = loss_per_energy(model, units, probe, keep, progress)
        return [p / u.numel for p, u in zip(per_energy, units)]

    @property
    def measures_sensitivity(self) -> bool:
        """Whether analyze measures importance as the probe loss with each weight truncated in turn (no proxy, and a
        subclass importance that reads the probe: asvd, svd_llm): a whole-model pass per weight."""
        return self.proxy is None and type(self).importance is not LowRankCompressor.importance

    # --- shared -------------------------------------------------------------------------------
    def analyze(
        self,
        model: nn.Module,
        groups: Sequence[RankGroup],
        stats: Stats,
        *,
        probe: torch.Tensor | None = None,
        keep: float = 0.85,
        progress: bool = True,
        windows: torch.Tensor | None = None,
    ) -> list[LowRankUnit]:
        """Scaled SVD of every weight and its importance (probe: a short calibration window for measured
        importance; keep: 1 - ratio; windows: the calibration windows, for a gradient-based proxy)."""
        units = [LowRankUnit(g) for g in groups]
        self.factorize_units(model, units, stats, progress=progress)
        if self.proxy == OUTPUT:
            add_loss_curves(model, units, stats, windows, progress)
            # predicted loss of the weight removed, per param
            scores = [float(u.loss_curve[0]) / u.numel for u in units]
        elif self.proxy is None:
            scores = self.importance(model, units, stats, probe, keep, progress)
        else:
            scores = weight_scores(
                self.proxy, model, linears_of(groups), stats=stats, windows=windows, progress=progress
            )
        return self.normalize(units, scores)

    def factorize_units(self, model: nn.Module, units: list[LowRankUnit], stats: Stats, progress: bool = False) -> None:
        """The scaled SVD of each unit's weight (rows), its input transform from the calibration statistics."""

        def factorize(u: LowRankUnit) -> ScaledSVD:
            w = weight_of(model, u.group.linear).detach()[u.group.rows]  # [out, in]
            return scaled_svd(w, self.input_scale(w, stats.get(u.group.linear)), self.factorization, u.max_dim)

        device = weight_of(model, units[0].group.linear).device if units else "cpu"
        with tqdm(total=len(units), desc=f"{self.name}: factorizing", unit="weight", disable=not progress) as bar:
            for u, svd in zip(
                units,
                map_over_ranks(
                    factorize,
                    units,
                    cost=lambda u: u.factorization_work,
                    label=lambda u: u.name,
                    on_done=bar.update,
                    device=device,
                ),
            ):
                u.svd = svd

    def cut_state(self, model: nn.Module, units: list[LowRankUnit]) -> dict[str, torch.Tensor]:
        """The factors A [max_dim, in] and B [out, max_dim] of every unit, which `cut` slices at any rank, in the
        weight's dtype: surgery casts them to it, and a cast commutes with slicing."""
        state = {}
        for u in units:
            dtype = weight_of(model, u.group.linear).dtype
            A, B = max_rank_factors(u.spectrum, u.max_dim)
            state[f"{u.name}.A"], state[f"{u.name}.B"] = A.to(dtype), B.to(dtype)
        return state

    def cut_state_bytes(self, shapes: LayerShapes, value_bytes: int) -> int:
        """A and B of every linear at the largest rank selection may ask for (break-even)."""
        return sum(value_bytes * max_useful_rank(i, o) * (o + i) for o, i in shapes.factorized())

    def load_cut_state(self, units: list[LowRankUnit], tensors: dict[str, torch.Tensor]) -> None:
        for u in units:
            u.factors = (tensors[f"{u.name}.A"], tensors[f"{u.name}.B"])

    def release_factors(self, units: list[LowRankUnit]) -> None:
        """Keep the singular values only (selection reads the spectrum), not U, Vh, the input transform or the
        loaded factors."""
        for u in units:
            if u.svd is not None:
                u.svd = ScaledSVD(None, u.svd.S, None, None)
            u.factors = None

    def allocate(self, units: list[LowRankUnit], budget: int) -> dict[str, int | None]:
        """The compressor's own (unconstrained) ranks under the budget; None keeps a weight dense."""
        if all(u.curve is not None for u in units):
            return allocate_by_loss_model(units, budget)
        ranks = allocate_ranks(
            [u.spectrum.energy_fraction.cpu().numpy() for u in units],
            [u.score for u in units],
            [(u.out_features, u.in_features) for u in units],
            budget,
            allow_dense=units[0].group.allows_dense if units else True,
        )
        return {u.name: r for u, r in zip(units, ranks)}

    def cut(self, unit: LowRankUnit, dim: int) -> Factors:
        """The first `dim` rows of A and columns of B of the factors at max_dim (loaded, or from the SVD), so that
        cached and recomputed factors cut alike: a whitening solve (svd_llm, palu) at rank `dim` would differ from
        the one at max_dim in the last bits."""
        A, B = unit.factors or max_rank_factors(unit.spectrum, max(dim, unit.max_dim))
        if dim > A.shape[0]:
            raise GacError(
                f"{unit.name}: rank {dim} is above the {A.shape[0]} its factors were cached at (the "
                "largest rank that saves parameters): keep the weight dense instead"
            )
        # copies: a view would keep every weight's max-rank factors alive until the whole model is cut
        return Factors(A[:dim].clone(), B[:, :dim].clone())


def max_rank_factors(svd: ScaledSVD, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [rank, in], B [out, rank]) in float32: the factors `cut` slices (whitened ones are float64 until here)."""
    A, B = factorize_from_svd(svd, rank)
    return A.float(), B.float()


def add_loss_curves(
    model: nn.Module, units: Sequence[LowRankUnit], stats: Stats, windows: torch.Tensor | None, progress: bool
) -> None:
    """Each unit's loss-model curve, from calibration statistics: X^T X / tokens of its input and the
    output-gradient Fisher of the rows it covers (one gradient pass, unless a caller cached it in stats)."""
    names = linears_of([u.group for u in units])
    cached = {n: f for n in names if (f := stats[n].out_fisher) is not None}
    if len(cached) == len(names):
        fishers = cached
    elif windows is None:
        raise GacError("importance 'output' needs the calibration windows for its output-gradient pass")
    else:
        fishers = output_fisher(model, windows, names, progress=progress)
    start = time.perf_counter()
    grams = {n: g for n in names if (g := stats[n].xtx) is not None}
    if len(grams) < len(names):
        raise GacError("importance 'output' needs X^T X from calibration: calibrate with xtx=compressor.needs_xtx")

    def curve(u: LowRankUnit) -> np.ndarray:
        g, svd, linear_stats = u.group, u.spectrum, stats[u.group.linear]
        U, Vh = svd.vectors()
        # C = X^T X / tokens, applied to Q [k, k] instead of to X^T X [in, in]: no second [in, in] float64 copy
        # (1.6 GiB for a 14336-wide input)
        s, P, Q = truncation_factors(U, svd.S, Vh, svd.scale, grams[g.linear], fishers[g.linear][g.rows].to(U.device))
        return lowrank_loss_curve(s, P, Q / max(linear_stats.tokens, 1), u.max_dim)

    device = units[0].spectrum.vectors()[0].device if units else "cpu"
    curves = map_over_ranks(
        curve, units, cost=lambda u: u.factorization_work, label=lambda u: u.name, what="loss_curves", device=device
    )
    for u, c in zip(units, curves):
        u.curve = c
    log.info("loss model: %d curves in %.1f s", len(units), time.perf_counter() - start)


def allocate_by_loss_model(units: list[LowRankUnit], budget: int) -> dict[str, int | None]:
    """Ranks (or DENSE) minimizing the summed predicted loss of the units' curves under the budget; every unit
    keeps at least rank 1."""
    options = [u.options() for u in units]
    floor = sum(u.params_per_dim for u in units)
    if floor > budget:
        raise ConfigError(
            f"budget of {budget} parameters cannot give every weight rank 1 ({floor} needed): lower {{ratio}}"
        )
    picks = allocate_by_curves([o[0] for o in options], [o[1] for o in options], budget, start=[1] * len(units))
    return {u.name: (DENSE if j > u.max_dim else int(j)) for u, j in zip(units, picks)}


__all__ = [
    "DENSE",
    "Compressor",
    "LayerShapes",
    "LowRankCompressor",
    "LowRankUnit",
    "Unit",
    "add_loss_curves",
    "allocate_by_loss_model",
    "max_rank_factors",
    "normalize_scores",
]
