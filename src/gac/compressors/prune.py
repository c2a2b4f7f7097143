"""Structured pruning (LLM-Pruner style), GQA-aware: MLP channels with gate, up and down cut together, and attention
heads removed only as the architecture can represent them (whole KV groups, or the same number of query heads in
every group). Units are one MLP and one attention block per pruned layer; their dims are kept widths."""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from gac.errors import GacError
from gac.importance import GRADIENT_PROXIES, check_proxy, measure

log = logging.getLogger(__name__)

HEAD_MODES = ("group", "uniform", "none")  # none: MLP channels only


def parse_layers(spec) -> tuple[int, ...] | str | None:
    """None (every layer but the first and the last), "all", "2-5,9" or a sequence of layer indices."""
    if spec is None or spec == "all":
        return spec
    if isinstance(spec, str):
        out = []
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
class PruneConfig:
    importance: str = "taylor"  # which proxy ranks channels and heads (gac.importance.PROXIES)
    layers: tuple[int, ...] | str | None = None  # None: all but the first and last layer (as LLM-Pruner); "all"
    head_mode: str = "group"  # group: whole KV groups; uniform: same number of query heads per group; none

    def __post_init__(self):
        check_proxy(self.importance)
        if self.head_mode not in HEAD_MODES:
            raise GacError(f"unknown head mode {self.head_mode!r}: choose one of {', '.join(HEAD_MODES)}")
        object.__setattr__(self, "layers", parse_layers(self.layers))


# --- units: what must change together, and how important each step of it is --------------------------------
@dataclass
class MLPUnit:
    """The gated MLP of one layer; dim = kept intermediate channels (gate and up rows, down columns)."""

    name: str  # e.g. "model.layers.3.mlp"
    hidden: int
    intermediate: int
    channel_importance: np.ndarray  # [intermediate] float64
    score: float = 0.0  # importance per parameter, mean 1 over the units of a model
    fixed_params = 0
    min_dim = 1
    dim_step = 1
    profile_op = "gemm_n"  # gate/up: X[M, hidden] -> [M, dim]

    @property
    def numel(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def params_per_dim(self) -> int:
        return 3 * self.hidden

    @property
    def max_dim(self) -> int:
        return self.intermediate

    @property
    def profile_shape(self) -> dict:
        return {"k": self.hidden}

    @property
    def total_importance(self) -> float:
        return float(self.channel_importance.sum())

    def step_gains(self) -> np.ndarray:
        return np.sort(self.channel_importance)[::-1]

    def params(self, dim: int | None) -> int:
        return self.numel if dim is None else self.fixed_params + dim * self.params_per_dim

    def kept_channels(self, dim: int) -> torch.Tensor:
        return _top(self.channel_importance, dim)


@dataclass
class AttentionUnit:
    """The attention block of one layer. dim is a width in channels, always whole heads:
    group mode: kept KV width (kept groups x head_dim), each group with its query heads;
    uniform mode: kept query width (num_kv_heads x kept heads per group x head_dim), k and v whole."""

    name: str  # e.g. "model.layers.3.self_attn"
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mode: str  # "group" or "uniform"
    head_importance: np.ndarray  # [num_heads] q rows + o columns of each query head
    kv_importance: np.ndarray  # [num_kv_heads] k and v rows of each KV head
    score: float = 0.0
    profile_op = "gemm_n"

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def numel(self) -> int:
        return 2 * self.hidden * self.head_dim * (self.num_heads + self.num_kv_heads)

    @property
    def params_per_dim(self) -> int:  # per KV channel: gs q rows, one k and one v row, gs o columns
        return (2 * self.group_size + 2) * self.hidden if self.mode == "group" else 2 * self.hidden

    @property
    def fixed_params(self) -> int:
        return 0 if self.mode == "group" else 2 * self.hidden * self.num_kv_heads * self.head_dim

    @property
    def dim_step(self) -> int:
        return self.head_dim if self.mode == "group" else self.num_kv_heads * self.head_dim

    @property
    def min_dim(self) -> int:  # at least one KV group, or one query head per group
        return self.dim_step

    @property
    def max_dim(self) -> int:
        return (self.num_kv_heads if self.mode == "group" else self.num_heads) * self.head_dim

    @property
    def profile_shape(self) -> dict:
        return {"k": self.hidden}

    @property
    def total_importance(self) -> float:
        return float(self.head_importance.sum() + self.kv_importance.sum())

    def _by_group(self) -> np.ndarray:
        return self.head_importance.reshape(self.num_kv_heads, self.group_size)  # [kv, gs]

    def step_gains(self) -> np.ndarray:
        if self.mode == "group":
            return np.sort(self._by_group().sum(1) + self.kv_importance)[::-1]
        return (-np.sort(-self._by_group(), axis=1)).sum(0)  # k-th step: the k-th best head of every group

    def params(self, dim: int | None) -> int:
        return self.numel if dim is None else self.fixed_params + dim * self.params_per_dim

    def kept_heads(self, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(query heads, KV heads) to keep at `dim`, ascending, each group's query heads contiguous."""
        steps = dim // self.dim_step
        gs = self.group_size
        if self.mode == "group":
            kv = _top(self._by_group().sum(1) + self.kv_importance, steps)
            q = (kv[:, None] * gs + torch.arange(gs)).reshape(-1)
        else:
            kv = torch.arange(self.num_kv_heads)
            q = torch.cat([g * gs + _top(self._by_group()[g], steps) for g in range(self.num_kv_heads)])
        return q, kv


def _top(importance: np.ndarray, k: int) -> torch.Tensor:
    """Indices of the k largest entries, ascending (stable: ties keep the lower index)."""
    order = np.argsort(-importance, kind="stable")[:k]
    return torch.as_tensor(np.sort(order), dtype=torch.long)


# --- how much to keep: pure numpy --------------------------------------------------------------------------
def allocate_steps(gains: list[np.ndarray], step_costs: list[int], min_steps: list[int], fixed: list[int],
                   budget: int) -> list[int]:
    """Greedy global allocation of steps (channels, heads, groups) by importance per parameter.

    gains[i]: importance of unit i's successive steps (non-increasing); step_costs[i]: parameters of one step;
    every unit keeps at least min_steps[i] steps; fixed[i]: parameters kept whatever the steps. Since each
    unit's gains do not increase, taking the best gain per parameter first is optimal for the continuous
    relaxation. Returns the number of kept steps per unit.
    """
    n = len(gains)
    steps = list(min_steps)
    used = sum(fixed[i] + steps[i] * step_costs[i] for i in range(n))
    if used > budget:
        raise GacError(
            f"a budget of {budget} parameters cannot keep one head group per attention and one channel per MLP "
            f"({used} needed): this ratio would remove every head of a layer; lower --ratio or prune fewer layers"
        )
    heap = [(-gains[i][steps[i]] / step_costs[i], i) for i in range(n) if steps[i] < len(gains[i])]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        if used + step_costs[i] > budget:
            continue  # this unit cannot grow within the budget; smaller steps elsewhere may still fit
        used += step_costs[i]
        steps[i] += 1
        if steps[i] < len(gains[i]):
            heapq.heappush(heap, (-gains[i][steps[i]] / step_costs[i], i))
    return steps


# --- how to cut: thin surgery ------------------------------------------------------------------------------
def sliced_linear(linear: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> nn.Linear:
    """A new linear keeping output features `rows` and input features `cols` of `linear` (bias follows rows)."""
    w = linear.weight.detach()  # [out, in]
    if rows is not None:
        w = w[rows.to(w.device)]
    if cols is not None:
        w = w[:, cols.to(w.device)]
    new = nn.Linear(w.shape[1], w.shape[0], bias=linear.bias is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        new.weight.copy_(w)
        if linear.bias is not None:
            b = linear.bias.detach()
            new.bias.copy_(b if rows is None else b[rows.to(b.device)])
    return new


def channels_of(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Channel indices of whole heads: head h covers [h * head_dim, (h + 1) * head_dim)."""
    return (heads[:, None] * head_dim + torch.arange(head_dim)).reshape(-1)


class PruneCompressor:
    """Structured pruning of MLP channels and attention heads in the chosen layers."""

    name = "prune"
    needs_xtx = False

    def __init__(self, config: PruneConfig):
        self.config = config

    @property
    def needs_windows(self) -> bool:
        return self.config.importance in GRADIENT_PROXIES

    def _layers(self, config) -> list[int]:
        n = config.num_hidden_layers
        layers = self.config.layers
        if layers is None:
            if n < 3:
                raise GacError(f"the model has {n} layers and the first and last are kept by default: "
                               "choose the layers to prune, e.g. --prune-layers all")
            return list(range(1, n - 1))
        if layers == "all":
            return list(range(n))
        if layers[-1] >= n:
            raise GacError(f"prune layer {layers[-1]} does not exist: the model has layers 0-{n - 1}")
        return list(layers)

    def analyze(self, model, names: list[str], stats: dict, *, probe=None, keep: float = 0.85, progress: bool = True,
                windows=None) -> list:
        """Per pruned layer an MLP unit and (unless head_mode none) an attention unit, scored by the proxy."""
        from gac.models.adapters import adapter_for

        adapter = adapter_for(model.config)
        geo = adapter.geometry(model.config)
        hidden = model.config.hidden_size
        prefixes = [f"{adapter.layers_path}.{i}" for i in self._layers(model.config)]
        with_attn = self.config.head_mode != "none"
        if with_attn:
            _check_attention_prunable(model, prefixes[0], geo)
        attn = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj") if with_attn else ()
        linears = [f"{p}.{m}" for p in prefixes for m in (*attn, "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
        missing = sorted(set(linears) - set(names))
        if missing:
            raise GacError(f"{missing[0]} is not a compressible linear of this model")
        scores = measure(self.config.importance, model, linears, stats=stats, windows=windows, progress=progress)

        def vec(t):
            return t.detach().double().cpu().numpy()

        units = []
        for p in prefixes:
            gate, up, down = (scores[f"{p}.mlp.{m}"] for m in ("gate_proj", "up_proj", "down_proj"))
            imp = vec(gate.out) + vec(up.out) + vec(down.inp)  # [intermediate]
            units.append(MLPUnit(f"{p}.mlp", hidden, imp.shape[0], imp))
            if with_attn:
                q, k, v, o = (scores[f"{p}.self_attn.{m}"] for m in ("q_proj", "k_proj", "v_proj", "o_proj"))
                per_head = (vec(q.out) + vec(o.inp)).reshape(geo.num_heads, geo.head_dim).sum(1)
                per_kv = (vec(k.out) + vec(v.out)).reshape(geo.num_kv_heads, geo.head_dim).sum(1)
                units.append(AttentionUnit(f"{p}.self_attn", hidden, geo.num_heads, geo.num_kv_heads, geo.head_dim,
                                           self.config.head_mode, per_head, per_kv))
        per_param = [u.total_importance / u.numel for u in units]
        mean = float(np.mean(per_param)) or 1.0
        for u, s in zip(units, per_param):
            u.score = s / mean
        return units

    def allocate(self, units: list, budget: int) -> dict[str, int | None]:
        """Kept widths under the budget (None: the unit keeps everything), steps handed out by importance."""
        gains = []
        for u in units:  # each unit's step importance, scaled so that the unit's total is score x numel
            total = u.total_importance
            gains.append(u.step_gains() * (u.score * u.numel / total if total > 0 else 0.0))
        steps = allocate_steps(gains, [u.dim_step * u.params_per_dim for u in units],
                               [u.min_dim // u.dim_step for u in units], [u.fixed_params for u in units], budget)
        dims = {}
        for u, s in zip(units, steps):
            dim = s * u.dim_step
            dims[u.name] = None if dim >= u.max_dim else dim
            if isinstance(u, AttentionUnit) and dim == u.min_dim < u.max_dim:
                log.warning("%s keeps its minimum (%s): no ratio can remove more heads there", u.name,
                            "one KV group" if u.mode == "group" else "one query head per group")
        return dims

    def materialize(self, model, units: list, dims: dict[str, int | None]) -> dict:
        """Slice the kept channels and heads in place; returns {"linear": ..., "attention": ...} for gac_structure."""
        linear, attention = {}, {}
        for u in units:
            dim = dims[u.name]
            if dim is None:
                continue
            if dim % u.dim_step or not u.min_dim <= dim <= u.max_dim:
                raise GacError(f"{u.name}: dim {dim} is not a valid width (multiples of {u.dim_step} "
                               f"in [{u.min_dim}, {u.max_dim}])")
            block = model.get_submodule(u.name)
            if isinstance(u, MLPUnit):
                keep = u.kept_channels(dim)
                block.gate_proj = sliced_linear(block.gate_proj, rows=keep)
                block.up_proj = sliced_linear(block.up_proj, rows=keep)
                block.down_proj = sliced_linear(block.down_proj, cols=keep)
                for m in ("gate_proj", "up_proj"):
                    linear[f"{u.name}.{m}"] = [dim, u.hidden]
                linear[f"{u.name}.down_proj"] = [u.hidden, dim]
            else:
                q_heads, kv_heads = u.kept_heads(dim)
                q_ch, kv_ch = channels_of(q_heads, u.head_dim), channels_of(kv_heads, u.head_dim)
                block.q_proj = sliced_linear(block.q_proj, rows=q_ch)
                block.k_proj = sliced_linear(block.k_proj, rows=kv_ch)
                block.v_proj = sliced_linear(block.v_proj, rows=kv_ch)
                block.o_proj = sliced_linear(block.o_proj, cols=q_ch)
                heads, kv = len(q_heads), len(kv_heads)
                block.num_heads = heads  # as modeling_gac.apply_gac_structure sets them on load
                block.num_key_value_groups = heads // kv
                for m, out_features in (("q_proj", heads), ("k_proj", kv), ("v_proj", kv)):
                    linear[f"{u.name}.{m}"] = [out_features * u.head_dim, u.hidden]
                linear[f"{u.name}.o_proj"] = [u.hidden, heads * u.head_dim]
                attention[u.name] = {"num_heads": heads, "num_kv_heads": kv}
        return {"linear": linear, "attention": attention}


def _check_attention_prunable(model, prefix: str, geo) -> None:
    attn = model.get_submodule(f"{prefix}.self_attn")
    norm = getattr(attn, "q_norm", None)
    if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.numel() != geo.head_dim:
        raise GacError(f"{model.config.model_type}'s q_norm spans all heads, so its heads cannot be pruned: "
                       "prune MLP channels only with --head-mode none")
    if geo.num_heads % geo.num_kv_heads:
        raise GacError(f"{geo.num_heads} query heads do not split into {geo.num_kv_heads} KV groups")


CONFIG, COMPRESSOR = PruneConfig, PruneCompressor
