"""Module surgery: swap a linear for its low-rank replacement. Thin on purpose; the maths lives in gac.linalg."""

from __future__ import annotations

import torch
from torch import nn

from gac.models.modeling_gac import GroupedLowRankLinear, LowRankLinear


def replace_with_lowrank(model: nn.Module, name: str, A: torch.Tensor, B: torch.Tensor) -> LowRankLinear:
    """Replace linear `name` by b(a(x)) with a.weight = A [r, in] and b.weight = B [out, r]; bias kept."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    old: nn.Linear = getattr(parent, child)
    w = old.weight
    new = LowRankLinear(old.in_features, old.out_features, A.shape[0], old.bias is not None, w.device, w.dtype)
    with torch.no_grad():
        new.a.weight.copy_(A)
        new.b.weight.copy_(B)
        if old.bias is not None:
            new.b.bias.copy_(old.bias)
    setattr(parent, child, new)
    return new


def grouped_lowrank(a: torch.Tensor, bs: list[torch.Tensor], biases: list[torch.Tensor | None]):
    """A GroupedLowRankLinear holding a [sum r_g, in], b_g [out/G, r_g] and each group's bias (or None)."""
    out_features = sum(b.shape[0] for b in bs)
    new = GroupedLowRankLinear(a.shape[1], out_features, [b.shape[1] for b in bs], biases[0] is not None,
                               a.device, a.dtype)
    with torch.no_grad():
        new.a.weight.copy_(a)
        for layer, b, bias in zip(new.b, bs, biases):
            layer.weight.copy_(b)
            if bias is not None:
                layer.bias.copy_(bias)
    return new


def replace_with_grouped_lowrank(model: nn.Module, name: str, factors: list[tuple[torch.Tensor, torch.Tensor]]):
    """Replace linear `name` by a GroupedLowRankLinear: factors[g] = (A_g [r_g, in], B_g [out/G, r_g])."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    old: nn.Linear = getattr(parent, child)
    w = old.weight
    biases = [None] * len(factors) if old.bias is None else list(old.bias.detach().chunk(len(factors)))
    new = grouped_lowrank(torch.cat([A for A, _ in factors], dim=0).to(w.device, w.dtype),
                          [B.to(w.device, w.dtype) for _, B in factors], biases)
    setattr(parent, child, new)
    return new
