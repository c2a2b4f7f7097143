"""Dimension groups: one typed object for "whatever must resize together", read off a live model.

A group names its member linears, its live dim, its parameters as a function of the dim, its grid (step, bounds)
and the profile sweep that times it. `groups_of(model, kind)` is the one place that reads a model's geometry
(through the family adapter, the one place projection names are spelled); compressors, selection, surgery,
repair, inspection and the saved structure all ask it.

Kinds:
  rank        one linear [out, in] as a low-rank pair b(a(x)); dim = the inner rank (None while dense)
  head_rank   one group of KV heads of a K or V projection (PaLU): rows [row0, row0 + rows); dim = its rank
  mlp         a layer's MLP width: producer rows and consumer columns together (gate/up/down, or fc1/fc2)
  heads       a layer's attention heads, whole: KV groups (mode "group") or query heads per group ("uniform")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gac.errors import GacError
from gac.models.adapters import Adapter, LayerModules, adapter_for

KINDS = ("rank", "head_rank", "mlp", "heads")
HEAD_MODES = ("group", "uniform")


def is_lowrank(module) -> bool:
    """A factorized pair, gac's own class or the copy a trust_remote_code load brings."""
    return type(module).__name__ == "LowRankLinear"


def is_grouped_lowrank(module) -> bool:
    return type(module).__name__ == "GroupedLowRankLinear"


@dataclass(frozen=True)
class DimGroup:
    """The common protocol: |W(d)| = fixed_params + d * params_per_dim; d on range(min_dim, max_dim + 1, step)."""

    name: str
    dim: int | None  # live dim; None: whole (a dense linear of a rank group)

    kind: ClassVar[str] = ""
    fixed_params: ClassVar[int] = 0
    step: ClassVar[int] = 1
    min_dim: ClassVar[int] = 1

    @property
    def linears(self) -> tuple[str, ...]:
        """Every linear the group resizes (what calibration hooks and parameter counts cover)."""
        raise NotImplementedError

    @property
    def numel(self) -> int:
        """Parameters of the members at full size: the unit of the budget."""
        raise NotImplementedError

    @property
    def params_per_dim(self) -> int:
        raise NotImplementedError

    @property
    def max_dim(self) -> int:
        raise NotImplementedError

    @property
    def full_dim(self) -> int | None:
        """The dim of the uncompressed model (None for a rank group: a dense weight has no rank)."""
        return self.max_dim

    profile_op: ClassVar[str] = "gemm_n"  # the profile sweep whose latency depends on this dim

    @property
    def profile_shape(self) -> dict:
        raise NotImplementedError

    def params(self, dim: int | None) -> int:
        return self.numel if dim is None else self.fixed_params + dim * self.params_per_dim

    def grid(self) -> range:
        return range(self.min_dim, self.max_dim + 1, self.step)

    def check(self, dim: int) -> None:
        if dim % self.step or not self.min_dim <= dim <= self.max_dim:
            raise GacError(f"{self.name}: dim {dim} is not valid (multiples of {self.step} in "
                           f"[{self.min_dim}, {self.max_dim}])")

    def compressed_dims(self) -> list[int]:
        """The dims this group has changed from the original model, judged for alignment."""
        return [] if self.dim is None or self.dim == self.full_dim else [self.dim]

    def row_lengths(self, dim: int) -> list[int]:
        """The input widths (a weight row's length: what a serving engine packs in blocks, e.g. llama.cpp's
        32 or 256) of the member linears that `dim` sets: a width's consumers, a low-rank pair's second half."""
        return [dim]

    def shard_row_lengths(self, dim: int, tp: int) -> list[int] | None:
        """The row lengths each rank of a degree-`tp` tensor-parallel engine reads at `dim` (gac.serve.layout's
        sharding plan), or None where `tp` cannot split the group evenly. A low-rank pair's inner rank is never
        split: every tensor-parallel rank reads all of it."""
        return self.row_lengths(dim)


@dataclass(frozen=True)
class RankGroup(DimGroup):
    linear: str = ""
    in_features: int = 0
    out_features: int = 0
    kind: ClassVar[str] = "rank"
    profile_op: ClassVar[str] = "lowrank"

    allows_dense: ClassVar[bool] = True  # keeping the weight whole is one of its options

    @property
    def linears(self):
        return (self.linear,)

    @property
    def rows(self) -> slice:
        """The rows of `linear` this group factorizes: all of them (a head group: its heads' rows)."""
        return slice(0, self.out_features)

    @property
    def numel(self):
        return self.in_features * self.out_features

    @property
    def params_per_dim(self):
        return self.in_features + self.out_features

    @property
    def max_dim(self):  # the largest rank that still saves parameters
        return (self.numel - 1) // self.params_per_dim

    @property
    def full_dim(self):
        return None

    @property
    def profile_shape(self):
        return {"in": self.in_features, "out": self.out_features}

    def check(self, dim: int) -> None:  # any rank up to full is a valid factorization, if not a saving one
        if not 1 <= dim <= min(self.in_features, self.out_features):
            raise GacError(f"{self.name}: rank {dim} is outside [1, {min(self.in_features, self.out_features)}]")


@dataclass(frozen=True)
class HeadRankGroup(RankGroup):
    """Rows [row0, row0 + out_features) of a K or V projection: one PaLU group of KV heads."""

    group: int = 0
    row0: int = 0
    kind: ClassVar[str] = "head_rank"
    allows_dense: ClassVar[bool] = False  # the grouped factorization has no dense member

    @property
    def rows(self) -> slice:
        return slice(self.row0, self.row0 + self.out_features)

    @property
    def max_dim(self):
        """Up to full rank, past break-even: a group cannot stay dense, but rank = its rows (whole heads, an
        aligned dim) reconstructs it exactly; capping at break-even (57 of 64 rows on SmolLM2) left GAC only 56
        for every group the allocation wanted whole."""
        return min(self.out_features, self.in_features)


@dataclass(frozen=True)
class WidthGroup(DimGroup):
    """A layer's MLP width: producers' rows and consumers' columns are the same channels."""

    block: str = ""
    producers: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()
    hidden: int = 0
    full: int = 0
    kind: ClassVar[str] = "mlp"

    @property
    def linears(self):
        return (*self.producers, *self.consumers)

    @property
    def numel(self):
        return self.full * self.params_per_dim

    @property
    def params_per_dim(self):
        return self.hidden * len(self.linears)

    @property
    def max_dim(self):
        return self.full

    @property
    def profile_shape(self):
        return {"k": self.hidden}

    def shard_row_lengths(self, dim: int, tp: int) -> list[int] | None:
        """Channels are split over the ranks: producers column-parallel, the consumer row-parallel."""
        return None if dim % tp else [dim // tp]


@dataclass(frozen=True)
class HeadGroup(DimGroup):
    """A layer's attention heads. dim is a width in channels, always whole heads:
    group mode: kept KV width (kept KV groups x head_dim), each KV group with all its query heads;
    uniform mode: kept query width (num_kv_heads x kept heads per group x head_dim), k and v whole."""

    kind: ClassVar[str] = "heads"

    block: str = ""
    q: str = ""
    k: str = ""
    v: str = ""
    o: str = ""
    hidden: int = 0
    num_heads: int = 0  # of the original model
    num_kv_heads: int = 0
    head_dim: int = 0
    mode: str = "group"
    live_heads: int = 0  # query and KV heads of the live module
    live_kv_heads: int = 0

    @property
    def linears(self):
        return (self.q, self.k, self.v, self.o)

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def numel(self):
        return 2 * self.hidden * self.head_dim * (self.num_heads + self.num_kv_heads)

    @property
    def params_per_dim(self):  # per KV channel: gs q rows, one k and one v row, gs o columns
        return (2 * self.group_size + 2) * self.hidden if self.mode == "group" else 2 * self.hidden

    @property
    def fixed_params(self):
        return 0 if self.mode == "group" else 2 * self.hidden * self.num_kv_heads * self.head_dim

    @property
    def step(self):
        return self.head_dim if self.mode == "group" else self.num_kv_heads * self.head_dim

    @property
    def min_dim(self):  # at least one KV group, or one query head per group
        return self.step

    @property
    def max_dim(self):
        return (self.num_kv_heads if self.mode == "group" else self.num_heads) * self.head_dim

    @property
    def profile_shape(self):
        return {"k": self.hidden}

    def row_lengths(self, dim: int) -> list[int]:
        """The o projection reads the kept query heads: KV width x group size (group mode), or the width."""
        return [dim * self.group_size if self.mode == "group" else dim]

    def shard_row_lengths(self, dim: int, tp: int) -> list[int] | None:
        """Heads are split over the ranks: every rank needs whole query heads and whole KV heads (or, with fewer
        KV heads than ranks, a share of a replicated one, as vLLM does)."""
        q = dim * self.group_size if self.mode == "group" else dim
        kv = dim // self.head_dim if self.mode == "group" else self.num_kv_heads
        return [q // tp] if heads_split(q // self.head_dim, kv, tp) else None

    def compressed_dims(self) -> list[int]:
        """The query and KV widths where they differ from the original's."""
        widths = ((self.live_heads, self.num_heads), (self.live_kv_heads, self.num_kv_heads))
        return [live * self.head_dim for live, full in widths if live != full]


def heads_split(num_heads: int, num_kv_heads: int, tp: int, *, kv_replicable: bool = True) -> bool:
    """Whether `tp` tensor-parallel ranks split a layer's heads: whole query heads per rank, and whole KV heads per
    rank or (kv_replicable: dense K/V, as vLLM does) fewer KV heads than ranks, each replicated."""
    kv_ok = num_kv_heads % tp == 0 or (kv_replicable and tp % num_kv_heads == 0)
    return num_heads % tp == 0 and kv_ok


# --- reading a model ---------------------------------------------------------------------------------------


def groups_of(model, kind: str, *, layers: list[int] | None = None, mode: str = "group",
              heads_per_group: int = 1) -> list[DimGroup]:
    """The dimension groups of `kind` in `model` as it is now, in layer order.

    layers: restrict to these decoder layers (default: all); mode: for "heads"; heads_per_group: for
    "head_rank" (KV heads sharing one PaLU down-projection).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown group kind {kind!r}; one of {KINDS}")
    adapter = adapter_for(model.config)
    n = adapter.layer_count(model.config)
    layers = list(range(n)) if layers is None else list(layers)
    if layers and (min(layers) < 0 or max(layers) >= n):
        raise GacError(f"layer {max(layers)} does not exist: the model has layers 0-{n - 1}")
    read = {"rank": _rank_groups, "head_rank": _head_rank_groups, "mlp": _width_group, "heads": _head_group}[kind]
    out = []
    for i in layers:
        out += read(model, adapter, adapter.layer(model.config, i), mode=mode, heads_per_group=heads_per_group)
    return out


def compressed_dims_of(model) -> list[int]:
    """Every dim of `model` that differs from its original: ranks, PaLU group ranks, pruned widths."""
    dims = [g.dim for g in groups_of(model, "rank") if g.dim is not None]
    dims += [r for name, m in model.named_modules() if is_grouped_lowrank(m) for r in m.ranks]
    for kind in ("mlp", "heads"):
        dims += [d for g in groups_of(model, kind) for d in g.compressed_dims()]
    return dims


def _rank_groups(model, adapter: Adapter, layer: LayerModules, **_) -> list[DimGroup]:
    groups = []
    for name in layer.linears:
        m = model.get_submodule(name)
        if is_grouped_lowrank(m):
            continue  # its ranks are head_rank groups
        rank = int(m.rank) if is_lowrank(m) else None
        groups.append(RankGroup(name, rank, linear=name, in_features=m.in_features, out_features=m.out_features))
    return groups


def _head_rank_groups(model, adapter: Adapter, layer: LayerModules, *, heads_per_group: int, **_):
    geo = adapter.geometry(model.config)
    if heads_per_group < 1 or geo.num_kv_heads % heads_per_group:
        raise GacError(f"palu group size {heads_per_group} does not divide the {geo.num_kv_heads} KV heads: "
                       "choose a divisor")
    rows = heads_per_group * geo.head_dim
    groups = []
    for name in (layer.k, layer.v):
        m = model.get_submodule(name)
        ranks = list(m.ranks) if is_grouped_lowrank(m) else [None] * (m.out_features // rows)
        if len(ranks) * rows != m.out_features:
            raise GacError(f"{name}: {m.out_features} rows do not split into groups of {rows}")
        for g, rank in enumerate(ranks):
            groups.append(HeadRankGroup(f"{name}#g{g}", rank, linear=name, in_features=m.in_features,
                                        out_features=rows, group=g, row0=g * rows))
    return groups


def _width_group(model, adapter: Adapter, layer: LayerModules, **_) -> list[DimGroup]:
    producers = [model.get_submodule(n) for n in layer.producers]
    consumers = [model.get_submodule(n) for n in layer.consumers]
    widths = {m.out_features for m in producers} | {m.in_features for m in consumers}
    if len(widths) != 1:
        raise GacError(f"{layer.mlp}: its projections disagree on the MLP width ({sorted(widths)}); "
                       "this is not a model gac can resize")
    return [WidthGroup(layer.mlp, widths.pop(), block=layer.mlp, producers=layer.producers,
                       consumers=layer.consumers, hidden=model.config.hidden_size,
                       full=adapter.intermediate_size(model.config))]


def _head_group(model, adapter: Adapter, layer: LayerModules, *, mode: str, **_) -> list[DimGroup]:
    if mode not in HEAD_MODES:
        raise GacError(f"unknown head mode {mode!r}: choose one of {', '.join(HEAD_MODES)}")
    geo = adapter.geometry(model.config)
    heads = model.get_submodule(layer.q).out_features // geo.head_dim
    kv = model.get_submodule(layer.k).out_features // geo.head_dim
    live = kv * geo.head_dim if mode == "group" else heads * geo.head_dim
    return [HeadGroup(layer.attention, live, block=layer.attention, q=layer.q, k=layer.k, v=layer.v, o=layer.o,
                      hidden=model.config.hidden_size, num_heads=geo.num_heads, num_kv_heads=geo.num_kv_heads,
                      head_dim=geo.head_dim, mode=mode, live_heads=heads, live_kv_heads=kv)]


def check_heads_prunable(model, group: HeadGroup) -> None:
    """Heads can be removed only where the family's per-head norms and GQA split allow it."""
    adapter = adapter_for(model.config)
    norm = adapter.per_head_norm(model.get_submodule(group.block))
    if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.numel() != group.head_dim:
        raise GacError(f"{model.config.model_type}'s query norm spans all heads, so its heads cannot be pruned: "
                       "prune MLP channels only with --head-mode none")
    if group.num_heads % group.num_kv_heads:
        raise GacError(f"{group.num_heads} query heads do not split into {group.num_kv_heads} KV groups")


def linears_of(groups) -> list[str]:
    """The linears the groups cover, in first-seen order, each once."""
    return list(dict.fromkeys(n for g in groups for n in g.linears))
