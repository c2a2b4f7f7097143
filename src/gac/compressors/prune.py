"""Structured pruning (LLM-Pruner style), GQA-aware: MLP channels with gate, up and down cut together, and attention
heads removed only as the architecture can represent them (whole KV groups, or the same number of query heads in
every group); in a mixture-of-experts layer, one expert width for all its experts, each keeping its own channels.
Units are one MLP (or experts) and one attention block per pruned layer; their dims are kept widths."""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TypeVar, cast

import numpy as np
import torch
from torch import nn

from gac.calibration.importance import ChannelScores, check_proxy, measure
from gac.compressors.allocation import greedy_steps
from gac.compressors.base import Compressor, Stats, Unit, normalize_scores
from gac.compressors.config import CompressorConfig
from gac.compressors.quality import pruned_quality
from gac.errors import ConfigError, GacError, literal
from gac.models.adapters import adapter_for, config_of
from gac.models.cuts import Keep, KeepExperts, KeepHeads
from gac.models.groups import (
    DimGroup,
    ExpertWidthGroup,
    HeadGroup,
    WidthGroup,
    check_heads_prunable,
    groups_of,
    linears_of,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)

HEAD_MODES = ("group", "uniform", "none")  # none: MLP channels only


def parse_layers(spec: str | Sequence[int] | None) -> tuple[int, ...] | str | None:
    """None (every layer but the first and the last), "all", "2-5,9" or a sequence of layer indices."""
    if spec is None or spec == "all":
        return spec
    if isinstance(spec, str):
        out: list[int] = []
        try:
            for part in filter(None, (p.strip() for p in spec.split(","))):
                lo, _, hi = part.partition("-")
                out += range(int(lo), int(hi or lo) + 1)
        except ValueError:
            raise GacError(f"prune layers {spec!r} is not a layer list: use e.g. 1-28, 2,4,6 or all") from None
        spec = out
    try:
        layers = tuple(sorted({int(i) for i in spec}))
    except (TypeError, ValueError):
        raise GacError(f"prune layers {spec!r} is not a list of layer indices: use e.g. 1-28 or all") from None
    if not layers or layers[0] < 0:
        raise GacError(f"prune layers {spec!r} must name at least one layer, indices >= 0")
    return layers


@dataclass(frozen=True)
class PruneConfig(CompressorConfig):
    name: ClassVar[str] = "prune"
    importance: str = "taylor"  # which proxy ranks channels and heads (gac.calibration.importance.PROXIES)
    layers: tuple[int, ...] | str | None = None  # None: all but the first and last layer (as LLM-Pruner); "all"
    head_mode: str = "group"  # group: whole KV groups; uniform: same number of query heads per group; none
    drop_experts: float = 0.0  # share of each MoE layer's experts to drop whole, in [0, 1) (--drop-experts)

    def __post_init__(self) -> None:
        check_proxy(self.importance)
        if self.head_mode not in HEAD_MODES:
            raise GacError(f"unknown head mode {self.head_mode!r}: choose one of {', '.join(HEAD_MODES)}")
        object.__setattr__(self, "layers", parse_layers(self.layers))
        f = self.drop_experts
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f < 1.0:
            raise ConfigError(
                f"{{drop_experts}} {literal(repr(f))} is outside [0, 1): pass the share of each MoE layer's experts "
                "to drop, e.g. {drop_experts:0.25}"
            )


def experts_dropped(fraction: float, num_experts: int) -> int:
    """K = round(fraction x E), halves rounded up: the experts every MoE layer drops."""
    return math.floor(fraction * num_experts + 0.5)


# --- units: a group and how important each step of it is --------------------------------------------------
def _vec(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


Scores = dict[str, ChannelScores]  # the proxy's per-linear scores (gac.calibration.importance.measure)
P = TypeVar("P", bound="PrunedUnit")


@dataclass
class PrunedUnit(Unit, ABC):
    """A group cut in steps (channels, heads) whose importances are known: its quality at a dim is minus the
    importance of the steps pruned away."""

    @classmethod
    @abstractmethod
    def scored(cls: type[P], group: DimGroup, scores: Scores) -> P:
        """The unit of `group`, its steps scored from the proxy's per-linear scores
        (gac.calibration.importance.measure)."""

    @property
    @abstractmethod
    def total_importance(self) -> float: ...

    @abstractmethod
    def step_gains(self) -> np.ndarray:
        """Importance of each successive step kept (non-increasing)."""

    @abstractmethod
    def cut(self, dim: int) -> Keep | KeepHeads | KeepExperts:
        """What surgery keeps at `dim` (gac.models.surgery.Keep, KeepHeads or KeepExperts)."""

    def quality_values(self, candidates: Sequence[int | None]) -> list[float]:
        return pruned_quality(scaled_step_gains(self), self.dim_step, candidates)


@dataclass
class MLPUnit(PrunedUnit):
    """A layer's MLP width group; dim = kept intermediate channels (producer rows, consumer columns)."""

    group: WidthGroup
    channel_importance: np.ndarray = field(kw_only=True)  # [intermediate] float64

    @classmethod
    def scored(cls, group: DimGroup, scores: Scores) -> MLPUnit:
        g = cast(WidthGroup, group)  # UNITS maps the kind "mlp" to this unit
        parts = g.parts  # a fused gate_up: each channel's gate row and up row
        imp = sum(_vec(scores[n].out).reshape(parts, -1).sum(0) for n in g.producers) + sum(
            _vec(scores[n].inp) for n in g.consumers
        )
        return cls(g, channel_importance=imp)  # [intermediate]

    @property
    def total_importance(self) -> float:
        return float(self.channel_importance.sum())

    def step_gains(self) -> np.ndarray:
        return np.sort(self.channel_importance)[::-1]

    def kept_channels(self, dim: int) -> torch.Tensor:
        return _top(self.channel_importance, dim)

    def cut(self, dim: int) -> Keep:
        return Keep(self.kept_channels(dim))


@dataclass
class AttentionUnit(PrunedUnit):
    """A layer's attention head group (gac.models.groups.HeadGroup: whole KV groups, or query heads per group)."""

    group: HeadGroup
    head_importance: np.ndarray = field(kw_only=True)  # [num_heads] q rows + o columns of each query head
    kv_importance: np.ndarray = field(kw_only=True)  # [num_kv_heads] k and v rows of each KV head

    @classmethod
    def scored(cls, group: DimGroup, scores: Scores) -> AttentionUnit:
        g = cast(HeadGroup, group)  # UNITS maps the kind "heads" to this unit
        per_head = (_vec(scores[g.q].out) + _vec(scores[g.o].inp)).reshape(g.num_heads, g.head_dim).sum(1)
        per_kv = (_vec(scores[g.k].out) + _vec(scores[g.v].out)).reshape(g.num_kv_heads, g.head_dim).sum(1)
        return cls(g, head_importance=per_head, kv_importance=per_kv)

    @property
    def total_importance(self) -> float:
        return float(self.head_importance.sum() + self.kv_importance.sum())

    def _by_group(self) -> np.ndarray:
        g = self.group
        return self.head_importance.reshape(g.num_kv_heads, g.group_size)  # [kv, gs]

    def step_gains(self) -> np.ndarray:
        if self.group.mode == "group":
            return np.sort(self._by_group().sum(1) + self.kv_importance)[::-1]
        return (-np.sort(-self._by_group(), axis=1)).sum(0)  # k-th step: the k-th best head of every group

    def kept_heads(self, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(query heads, KV heads) to keep at `dim`, ascending, each group's query heads contiguous."""
        g = self.group
        steps, gs = dim // g.step, g.group_size
        if g.mode == "group":
            kv = _top(self._by_group().sum(1) + self.kv_importance, steps)
            q = (kv[:, None] * gs + torch.arange(gs)).reshape(-1)
        else:
            kv = torch.arange(g.num_kv_heads)
            q = torch.cat([k * gs + _top(self._by_group()[k], steps) for k in range(g.num_kv_heads)])
        return q, kv

    def cut(self, dim: int) -> KeepHeads:
        return KeepHeads(*self.kept_heads(dim))


@dataclass
class ExpertsUnit(PrunedUnit):
    """An MoE layer's expert width (gac.models.groups.ExpertWidthGroup): dim = channels every expert keeps, each
    expert its own best ones. A group dropping experts (--drop-experts) keeps its most important ones: the width's
    steps and the cut are over those alone."""

    group: ExpertWidthGroup
    channel_importance: np.ndarray = field(kw_only=True)  # [E, intermediate] float64
    experts: torch.Tensor | None = None  # the experts kept, ascending (None: every one)

    @classmethod
    def scored(cls, group: DimGroup, scores: Scores) -> ExpertsUnit:
        g = cast(ExpertWidthGroup, group)  # UNITS maps the kind "experts" to this unit
        gate_up, down = scores[g.gate_up], scores[g.down]  # sums per row (out) and per column (inp)
        imp = g.per_channel((_vec(gate_up.out), _vec(gate_up.inp)), (_vec(down.out), _vec(down.inp)))  # [E, w]
        # An expert's importance is the sum of its channels' scores under the run's proxy (taylor by default: |g w|
        # summed over the calibration tokens routed to it, each weighted by its router probability), not its routed
        # share alone: it is the first-order loss change of removing all its weights, so routing frequency, router
        # weight and the size of the expert's contribution are all in it, a never-routed expert scores 0, it is on
        # the same scale as the channels the knapsack weighs (one objective for which experts go and which widths
        # stay), and both pipelines (whole model, layer by layer) have it with no hook of their own.
        experts = _top(imp.sum(1), g.kept_experts) if g.dropped else None
        return cls(g, channel_importance=imp, experts=experts)

    @property
    def kept_importance(self) -> np.ndarray:
        """[kept experts, intermediate]: the channel importance of the experts the cut keeps."""
        return self.channel_importance if self.experts is None else self.channel_importance[self.experts.numpy()]

    @property
    def total_importance(self) -> float:
        return float(self.kept_importance.sum())

    def step_gains(self) -> np.ndarray:
        return (-np.sort(-self.kept_importance, axis=1)).sum(0)  # k-th step: every kept expert's k-th best channel

    def cut(self, dim: int) -> KeepExperts:
        channels = torch.stack([_top(row, dim) for row in self.kept_importance])  # [kept experts, dim]
        return KeepExperts(channels, self.experts)


UNITS: dict[str, type[PrunedUnit]] = {"mlp": MLPUnit, "heads": AttentionUnit, "experts": ExpertsUnit}  # kind -> unit


def _top(importance: np.ndarray, k: int) -> torch.Tensor:
    """Indices of the k largest entries, ascending (stable: ties keep the lower index)."""
    order = np.argsort(-importance, kind="stable")[:k]
    return torch.as_tensor(np.sort(order), dtype=torch.long)


# --- how much to keep: pure numpy --------------------------------------------------------------------------
def allocate_steps(
    gains: list[np.ndarray], step_costs: list[int], min_steps: list[int], fixed: list[int], budget: int
) -> list[int]:
    """Greedy global allocation of steps (channels, heads, groups) by importance per parameter
    (gac.compressors.allocation.greedy_steps).

    gains[i]: importance of unit i's successive steps (non-increasing); step_costs[i]: parameters of one step;
    every unit keeps at least min_steps[i] steps; fixed[i]: parameters kept whatever the steps.
    Returns the number of kept steps per unit.
    """
    used = sum(f + m * c for f, m, c in zip(fixed, min_steps, step_costs))
    if used > budget:
        raise ConfigError(
            f"a budget of {budget} parameters cannot keep one head group per attention and one channel per MLP "
            f"({used} needed): this ratio would remove every head of a layer; lower {{ratio}} or prune fewer layers"
        )
    further = [np.asarray(g[m:], dtype=np.float64) for g, m in zip(gains, min_steps)]
    taken = greedy_steps(further, [np.full(len(g), c) for g, c in zip(further, step_costs)], used, budget)
    return [m + t for m, t in zip(min_steps, taken)]


def scaled_step_gains(u: PrunedUnit) -> np.ndarray:
    """The unit's step importance, scaled so that the unit's total is score x numel."""
    total = u.total_importance
    return u.step_gains() * (u.score * u.numel / total if total > 0 else 0.0)


class PruneCompressor(Compressor[PruneConfig, DimGroup, PrunedUnit]):
    """Structured pruning of MLP channels and attention heads in the chosen layers."""

    name = "prune"

    def _layers(self, config: PretrainedConfig) -> list[int]:
        n = adapter_for(config).layer_count(config)
        layers = self.config.layers
        if layers is None:
            if n < 3:
                raise ConfigError(
                    f"the model has {n} layers and the first and last are kept by default: "
                    "choose the layers to prune, e.g. {layers:all}"
                )
            return list(range(1, n - 1))
        if isinstance(layers, str):  # "all" (parse_layers leaves no other string)
            return list(range(n))
        if layers[-1] >= n:
            raise GacError(f"prune layer {layers[-1]} does not exist: the model has layers 0-{n - 1}")
        return list(layers)

    def groups(self, model: nn.Module) -> list[DimGroup]:
        """Per pruned layer its MLP width group (an MoE layer: its expert width), then (unless head_mode none) its
        attention head group."""
        out: list[DimGroup] = []
        for i in self._layers(config_of(model)):
            out += groups_of(model, "mlp", layers=[i])
            out += groups_of(model, "experts", layers=[i])
            if self.config.head_mode != "none":
                heads = groups_of(model, "heads", layers=[i], mode=self.config.head_mode)
                check_heads_prunable(model, heads[0])
                out += heads
        if self.config.drop_experts:
            out = self._dropping_experts(config_of(model), out)
        return out

    def _dropping_experts(self, config: PretrainedConfig, groups: list[DimGroup]) -> list[DimGroup]:
        """The groups with every MoE layer's expert group dropping K = round(F x E) experts (the same K everywhere:
        transformers, vLLM's FusedMoE and llama.cpp hold one expert count per model). Refused in one line, before
        any work, where that cannot be: no experts, MoE layers left out of the pruned ones, or fewer experts left
        than each token is routed to."""
        adapter, f = adapter_for(config), self.config.drop_experts
        moe = [i for i in range(adapter.layer_count(config)) if adapter.is_moe_layer(config, i)]
        if not moe:
            raise ConfigError(
                f"{{drop_experts}} drops experts of mixture-of-experts layers, and this "
                f"{literal(adapter.model_type)} model has none: drop {{drop_experts}}, or pass a mixture-of-experts "
                "model"
            )
        pruned = set(self._layers(config))
        missing = [i for i in moe if i not in pruned]
        if missing:
            raise ConfigError(
                f"{{drop_experts}} drops experts in every MoE layer (a model holds one expert count), but "
                f"the pruned layers leave out MoE layer{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(str, missing))}: pass {{layers:all}}, or name every MoE layer"
            )
        num_experts, _, top_k = adapter.expert_geometry(config)
        k = experts_dropped(f, num_experts)
        if num_experts - k < top_k:
            most = num_experts - top_k
            fix = f"pass {{drop_experts:{most / num_experts:g}}} or lower" if most else "drop {drop_experts}"
            raise ConfigError(
                f"{{drop_experts:{f:g}}} drops {k} of the {num_experts} experts of each MoE layer, leaving "
                f"fewer than the {top_k} each token is routed to (num_experts_per_tok): {fix}"
            )
        if k == 0:
            log.warning(
                "--drop-experts %g drops round(%g x %d) = 0 experts per MoE layer: nothing dropped", f, f, num_experts
            )
            return groups
        # KIND_TYPES["experts"] is ExpertWidthGroup
        return [cast(ExpertWidthGroup, g).dropping(k) if g.kind == "experts" else g for g in groups]

    def analyze(
        self,
        model: nn.Module,
        groups: Sequence[DimGroup],
        stats: Stats,
        *,
        probe: torch.Tensor | None = None,
        keep: float = 0.85,
        progress: bool = True,
        windows: torch.Tensor | None = None,
    ) -> list[PrunedUnit]:
        """An MLP or attention unit per group, its channels and heads scored by the proxy."""
        scores = measure(
            self.config.importance, model, linears_of(groups), stats=stats, windows=windows, progress=progress
        )

        units = [UNITS[g.kind].scored(g, scores) for g in groups]
        return normalize_scores(units, [u.total_importance / u.numel for u in units])

    def allocate(self, units: list[PrunedUnit], budget: int) -> dict[str, int | None]:
        """Kept widths under the budget (None: the unit keeps everything), steps handed out by importance."""
        gains = [scaled_step_gains(u) for u in units]
        steps = allocate_steps(
            gains,
            [u.dim_step * u.params_per_dim for u in units],
            [u.min_dim // u.dim_step for u in units],
            [u.fixed_params for u in units],
            budget,
        )
        dims: dict[str, int | None] = {}
        floored: list[PrunedUnit] = []
        for u, s in zip(units, steps):
            dim = s * u.dim_step
            dims[u.name] = None if dim >= u.max_dim else dim
            if u.group.removes_heads and dim == u.min_dim < u.max_dim:
                floored.append(u)
        if floored:  # one line for all of them: a deep cut floors most layers at once
            log.warning(
                "%d attention layer%s keep%s the minimum (%s): no ratio can remove more heads there (%s)",
                len(floored),
                "s" if len(floored) > 1 else "",
                "" if len(floored) > 1 else "s",
                # a group that removes heads is a HeadGroup
                "one KV group" if cast(HeadGroup, floored[0].group).mode == "group" else "one query head per group",
                ", ".join(u.name for u in floored[:3]) + (", ..." if len(floored) > 3 else ""),
            )
        return dims

    def cut(self, unit: PrunedUnit, dim: int) -> Keep | KeepHeads | KeepExperts:
        return unit.cut(dim)
