"""Dimension groups: one typed object for "whatever must resize together", read off a live model.

A group names its member linears, its live dim, its parameters as a function of the dim, its grid (step, bounds)
and everything else that depends on its kind (gac.models.kinds: one handler per kind). `groups_of(model, kind)` is
the one place that reads a model's geometry (through the family adapter, the one place projection names are
spelled); compressors, selection, surgery, repair, inspection and the saved structure all ask it.

Kinds (KIND_TYPES, the registry):
  rank        one linear [out, in] as a low-rank pair b(a(x)); dim = the inner rank (None while dense)
  head_rank   one group of KV heads of a K or V projection (PaLU): rows [row0, row0 + rows); dim = its rank
  mlp         a layer's MLP width: producer rows and consumer columns together (gate/up/down, or fc1/fc2)
  heads       a layer's attention heads, whole: KV groups (mode "group") or query heads per group ("uniform")
  experts     an MoE layer's expert width: one width for all its experts, each expert its own channels
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, overload

from torch import nn

from gac.errors import GacError
from gac.models.adapters import adapter_for, config_of
from gac.models.kinds import KINDS
from gac.models.kinds.base import DimGroup, is_grouped_lowrank, is_lowrank
from gac.models.kinds.experts import ExpertWidthGroup
from gac.models.kinds.heads import MODES as HEAD_MODES
from gac.models.kinds.heads import HeadGroup, check_heads_prunable, heads_split
from gac.models.kinds.rank import HeadRankGroup, RankGroup
from gac.models.kinds.width import WidthGroup

KIND_TYPES: dict[str, type[DimGroup]] = {
    k.kind: k for k in (RankGroup, HeadRankGroup, WidthGroup, HeadGroup, ExpertWidthGroup)
}  # in KINDS' order

__all__ = [
    "HEAD_MODES",
    "KINDS",
    "KIND_TYPES",
    "DimGroup",
    "ExpertWidthGroup",
    "HeadGroup",
    "HeadRankGroup",
    "RankGroup",
    "WidthGroup",
    "check_heads_prunable",
    "compressed_dims_of",
    "groups_of",
    "heads_split",
    "is_grouped_lowrank",
    "is_lowrank",
    "linears_of",
]


# groups_of's type per kind (KIND_TYPES, spelled for type checkers)
@overload
def groups_of(
    model: nn.Module,
    kind: Literal["rank"],
    *,
    layers: list[int] | None = None,
    mode: str = "group",
    heads_per_group: int = 1,
) -> list[RankGroup]: ...
@overload
def groups_of(
    model: nn.Module,
    kind: Literal["head_rank"],
    *,
    layers: list[int] | None = None,
    mode: str = "group",
    heads_per_group: int = 1,
) -> list[HeadRankGroup]: ...
@overload
def groups_of(
    model: nn.Module,
    kind: Literal["mlp"],
    *,
    layers: list[int] | None = None,
    mode: str = "group",
    heads_per_group: int = 1,
) -> list[WidthGroup]: ...
@overload
def groups_of(
    model: nn.Module,
    kind: Literal["heads"],
    *,
    layers: list[int] | None = None,
    mode: str = "group",
    heads_per_group: int = 1,
) -> list[HeadGroup]: ...
@overload
def groups_of(
    model: nn.Module,
    kind: Literal["experts"],
    *,
    layers: list[int] | None = None,
    mode: str = "group",
    heads_per_group: int = 1,
) -> list[ExpertWidthGroup]: ...
@overload
def groups_of(
    model: nn.Module, kind: str, *, layers: list[int] | None = None, mode: str = "group", heads_per_group: int = 1
) -> list[DimGroup]: ...
def groups_of(
    model: nn.Module, kind: str, *, layers: list[int] | None = None, mode: str = "group", heads_per_group: int = 1
) -> list:
    """The dimension groups of `kind` in `model` as it is now, in layer order.

    layers: restrict to these decoder layers (default: all); mode: for "heads"; heads_per_group: for
    "head_rank" (KV heads sharing one PaLU down-projection).
    """
    if kind not in KIND_TYPES:
        raise ValueError(f"unknown group kind {kind!r}; one of {KINDS}")
    config = config_of(model)
    adapter = adapter_for(config)
    n = adapter.layer_count(config)
    layers = list(range(n)) if layers is None else list(layers)
    if layers and (min(layers) < 0 or max(layers) >= n):
        raise GacError(f"layer {max(layers)} does not exist: the model has layers 0-{n - 1}")
    out: list[DimGroup] = []
    for i in layers:
        out += KIND_TYPES[kind].read(
            model, adapter, adapter.layer(config, i), mode=mode, heads_per_group=heads_per_group
        )
    return out


def compressed_dims_of(model: nn.Module) -> list[int]:
    """Every dim of `model` that differs from its original: ranks, PaLU group ranks, pruned widths."""
    dims = [g.dim for g in groups_of(model, "rank") if g.dim is not None]
    dims += [r for name, m in model.named_modules() if is_grouped_lowrank(m) for r in m.ranks]
    for kind in ("mlp", "experts", "heads"):
        dims += [d for g in groups_of(model, kind) for d in g.compressed_dims()]
    return dims


def linears_of(groups: Iterable[DimGroup]) -> list[str]:
    """The weights the groups cover (linears, and the fused expert weights by parameter name), in first-seen order,
    each once."""
    return list(dict.fromkeys(n for g in groups for n in g.linears))
