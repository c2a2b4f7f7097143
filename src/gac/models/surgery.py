"""The one module surgery: the primitives that cut, factorize or zero-pad linears of a live model, in place, and
the two entry points that hand each group to its kind (gac.models.kinds), which calls them.

Thin on purpose: the maths (factors, kept indices, padding) is computed elsewhere as plain tensors; this module
only builds modules of the new shapes and swaps them in. Compressors, repair and loading all come through here
(modeling_gac.py, which travels with every saved model, builds empty modules with its own copy of the classes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import nn

from gac.models.cuts import Cut
from gac.models.cuts import Factors as Factors  # the cuts, re-exported where they are cut
from gac.models.cuts import Keep as Keep
from gac.models.cuts import KeepExperts as KeepExperts
from gac.models.cuts import KeepHeads as KeepHeads
from gac.models.kinds.base import DimGroup, by_kind, is_lowrank
from gac.models.modeling_gac import GroupedLowRankLinear, LowRankLinear, fit_experts_implementation, set_module
from gac.models.padding import pad_cols, pad_grouped_lowrank, pad_lowrank, pad_rows


def apply(model: nn.Module, cuts: list[tuple[DimGroup, Cut]]) -> None:
    """Cut every (group, Factors | Keep | KeepHeads) pair into `model`: each kind cuts its own groups
    (DimGroup.cut_all: head-rank groups of one linear together, one shared down-projection)."""
    for kind, pairs in by_kind(cuts).items():
        kind.cut_all(model, pairs)


def pad(model: nn.Module, targets: list[tuple[DimGroup, int]]) -> None:
    """Zero-pad each group to its target dim (>= its live dim): the model computes the same function."""
    for kind, pairs in by_kind([(g, dim) for g, dim in targets if dim != g.dim]).items():
        kind.pad_all(model, pairs)


# --- factorize ---------------------------------------------------------------------------------------------
@torch.no_grad()
def lowrank(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> LowRankLinear:
    """A LowRankLinear b(a(x)) holding a [r, in], b [out, r] and the bias (or None)."""
    new = LowRankLinear(a.shape[1], b.shape[0], a.shape[0], bias is not None, a.device, a.dtype)
    new.a.weight.copy_(a)
    new.b.weight.copy_(b)
    if bias is not None:
        new.b.bias.copy_(bias)
    return new


@torch.no_grad()
def grouped_lowrank(a: torch.Tensor, bs: list[torch.Tensor], biases: list) -> GroupedLowRankLinear:
    """A GroupedLowRankLinear holding a [sum r_g, in], b_g [out/G, r_g] and each group's bias (or None)."""
    out_features = sum(b.shape[0] for b in bs)
    new = GroupedLowRankLinear(
        a.shape[1], out_features, [b.shape[1] for b in bs], biases[0] is not None, a.device, a.dtype
    )
    new.a.weight.copy_(a)
    for layer, b, bias in zip(up_projections(new), bs, biases):
        layer.weight.copy_(b)
        if bias is not None:
            layer.bias.copy_(bias)
    return new


def up_projections(m: GroupedLowRankLinear) -> list[nn.Linear]:
    """A GroupedLowRankLinear's per-group up-projections b_g, in group order."""
    return cast("list[nn.Linear]", list(m.b))


def linear_at(model: nn.Module, name: str) -> nn.Linear:
    """The dense linear at `name` (an nn.Linear, or a module with its weight, bias and feature counts)."""
    return cast(nn.Linear, model.get_submodule(name))


def factorize(model: nn.Module, name: str, A: torch.Tensor, B: torch.Tensor) -> LowRankLinear:
    """Replace linear `name` by b(a(x)) with a.weight = A [r, in] and b.weight = B [out, r]; bias kept."""
    old = linear_at(model, name)
    w = old.weight
    new = lowrank(A.to(w.device, w.dtype), B.to(w.device, w.dtype), old.bias)
    set_module(model, name, new)
    return new


def factorize_head_groups(
    model: nn.Module, name: str, factors: list[tuple[torch.Tensor, torch.Tensor]]
) -> GroupedLowRankLinear:
    """Replace linear `name` by a GroupedLowRankLinear: factors[g] = (A_g [r_g, in], B_g [out/G, r_g])."""
    old = linear_at(model, name)
    w = old.weight
    biases = [None] * len(factors) if old.bias is None else list(old.bias.detach().chunk(len(factors)))
    new = grouped_lowrank(
        torch.cat([A for A, _ in factors], dim=0).to(w.device, w.dtype),
        [B.to(w.device, w.dtype) for _, B in factors],
        biases,
    )
    set_module(model, name, new)
    return new


# --- slice -------------------------------------------------------------------------------------------------
@torch.no_grad()
def sliced_linear(linear: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> nn.Linear:
    """A new linear keeping output features `rows` and input features `cols` of `linear` (bias follows rows)."""
    w = linear.weight.detach()  # [out, in]
    if rows is not None:
        w = w[rows.to(w.device)]
    if cols is not None:
        w = w[:, cols.to(w.device)]
    new = nn.Linear(w.shape[1], w.shape[0], bias=linear.bias is not None, device=w.device, dtype=w.dtype)
    new.weight.copy_(w)
    if linear.bias is not None:
        b = linear.bias.detach()
        new.bias.copy_(b if rows is None else b[rows.to(b.device)])
    return new


def channels_of(heads: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Channel indices of whole heads: head h covers [h * head_dim, (h + 1) * head_dim)."""
    return (heads[:, None] * head_dim + torch.arange(head_dim)).reshape(-1)


def keep_rows(model: nn.Module, names: Iterable[str], rows: torch.Tensor) -> None:
    """Keep output features `rows` of each linear in `names` (bias rows follow)."""
    for name in names:
        set_module(model, name, sliced_linear(linear_at(model, name), rows=rows))


def keep_columns(model: nn.Module, names: Iterable[str], cols: torch.Tensor) -> None:
    """Keep input features `cols` of each linear in `names`."""
    for name in names:
        set_module(model, name, sliced_linear(linear_at(model, name), cols=cols))


def set_parameter(model: nn.Module, name: str, value: torch.Tensor, *, expert_rows: bool = True) -> None:
    """Put `value` at the parameter path `name` (requires_grad as the parameter it replaces). expert_rows: `value` is a
    fused expert weight, whose row length the experts implementation must run (fit_experts_implementation)."""
    parent, _, attr = name.rpartition(".")
    module = model.get_submodule(parent)
    setattr(module, attr, nn.Parameter(value.contiguous(), requires_grad=getattr(module, attr).requires_grad))
    if expert_rows:
        fit_experts_implementation(model, value.shape, module)


@torch.no_grad()
def keep_entries(model: nn.Module, name: str, dim: int, index: torch.Tensor) -> None:
    """Keep entries `index` [k] along `dim` of the parameter `name` (e.g. the sinks [heads] of kept heads)."""
    w = model.get_parameter(name).detach()
    set_parameter(model, name, w.index_select(dim, index.to(w.device)))


@torch.no_grad()
def keep_expert_entries(model: nn.Module, name: str, dim: int, index: torch.Tensor) -> None:
    """Keep, in each expert e of the fused expert weight `name` [E, rows, cols] (or bias [E, n]), entries index[e]
    along `dim` (1: rows, 2: columns); index [E, k]."""
    w = model.get_parameter(name).detach()
    idx = index.to(w.device).reshape([len(index) if a == 0 else -1 if a == dim else 1 for a in range(w.dim())])
    set_parameter(model, name, torch.take_along_dim(w, idx, dim=dim))


@torch.no_grad()
def keep_experts(model: nn.Module, fused: tuple[str, ...], router: str, experts: torch.Tensor) -> None:
    """Keep experts `experts` (ascending indices) of an MoE layer, renumbered 0..len-1 in that order: their slices of
    each fused expert weight in `fused` [E, rows, cols] and their rows of the router module's weight [E, H] (and of
    its bias, if any); the `num_experts` the experts and router modules keep follows."""
    count = len(experts)
    for name in fused:
        w = model.get_parameter(name).detach()
        set_parameter(model, name, w.index_select(0, experts.to(w.device)))
    gate = model.get_submodule(router)
    for attr in ("weight", "bias"):
        p = getattr(gate, attr, None)
        if isinstance(p, torch.Tensor):
            set_parameter(
                model, f"{router}.{attr}", p.detach().index_select(0, experts.to(p.device)), expert_rows=False
            )
    for module in {model.get_submodule(name.rpartition(".")[0]) for name in fused} | {gate}:
        if hasattr(module, "num_experts"):
            setattr(module, "num_experts", count)  # noqa: B010 - a plain attribute of the family's module


@torch.no_grad()
def widen_expert_entries(model: nn.Module, name: str, dim: int, size: int, parts: int = 1) -> None:
    """The fused expert weight (or bias) `name` zero-padded along `dim` to `size`, each of its `parts` equal blocks
    padded at its own end (a fused gate_up weight is two: gate rows, then up rows)."""
    w = model.get_parameter(name).detach()
    blocks = []
    for block in w.chunk(parts, dim=dim):
        missing = list(block.shape)
        missing[dim] = size // parts - block.shape[dim]
        blocks += [block, block.new_zeros(missing)]
    set_parameter(model, name, torch.cat(blocks, dim=dim))


def set_head_counts(attention: Any, heads: int, kv_heads: int) -> None:
    """The attention module's head bookkeeping, as modeling_gac.apply_gac_structure sets it on load."""
    attention.num_heads = heads  # informational; forward infers heads from q's width
    attention.num_key_value_groups = heads // kv_heads


# --- zero-pad ----------------------------------------------------------------------------------------------
def pad_lowrank_linear(model: nn.Module, name: str, rank: int) -> None:
    """The LowRankLinear `name` at inner rank `rank` (>= its own): zero rows of a, zero columns of b."""
    m = cast(LowRankLinear, model.get_submodule(name))
    a, b = pad_lowrank(m.a.weight, m.b.weight, rank)
    set_module(model, name, lowrank(a, b, m.b.bias))


def pad_grouped_lowrank_linear(model: nn.Module, name: str, ranks: dict[int, int]) -> None:
    """The GroupedLowRankLinear `name` with group g at rank ranks[g] (>= its own); groups not named keep theirs."""
    m = cast(GroupedLowRankLinear, model.get_submodule(name))
    ups = up_projections(m)
    new = [ranks.get(g, r) for g, r in enumerate(m.ranks)]
    a, bs = pad_grouped_lowrank(m.a.weight, [b.weight for b in ups], new)
    set_module(model, name, grouped_lowrank(a, bs, [b.bias for b in ups]))


def widen_rows(model: nn.Module, names: Iterable[str], width: int, parts: int = 1) -> None:
    """Each linear in `names` (dense or a low-rank pair) with `width` output features per part, the new ones zero
    (parts: equal row blocks each padded at its own end, e.g. a fused gate_up's gate and up halves)."""
    for name in names:
        set_module(model, name, _widen_out(model.get_submodule(name), width, parts))


def widen_columns(model: nn.Module, names: Iterable[str], width: int) -> None:
    """Each linear in `names` (dense or a low-rank pair) reading `width` input features, the new ones ignored."""
    for name in names:
        set_module(model, name, _widen_in(model.get_submodule(name), width))


@torch.no_grad()
def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    new.weight.copy_(weight)
    if bias is not None:
        new.bias.copy_(bias)
    return new


def _pad_row_parts(
    weight: torch.Tensor, bias: torch.Tensor | None, width: int, parts: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) with each of `parts` row blocks zero-padded to `width` rows."""
    biases = [None] * parts if bias is None else bias.chunk(parts)
    padded = [pad_rows(w, width, b) for w, b in zip(weight.chunk(parts), biases)]
    padded_biases = [b for _, b in padded if b is not None]  # every part's, or none
    return torch.cat([w for w, _ in padded]), None if bias is None else torch.cat(padded_biases)


def _widen_out(m: nn.Module, width: int, parts: int = 1) -> nn.Module:
    if is_lowrank(m):
        b, bias = _pad_row_parts(m.b.weight, m.b.bias, width, parts)
        return lowrank(m.a.weight, b, bias)
    dense = cast(nn.Linear, m)
    return _linear(*_pad_row_parts(dense.weight, dense.bias, width, parts))


def _widen_in(m: nn.Module, width: int) -> nn.Module:
    if is_lowrank(m):
        return lowrank(pad_cols(m.a.weight, width), m.b.weight, m.b.bias)
    dense = cast(nn.Linear, m)
    return _linear(pad_cols(dense.weight, width), dense.bias)
