"""Module surgery: swap a linear for its low-rank replacement. Thin on purpose; the maths lives in gac.linalg."""

from __future__ import annotations

import torch
from torch import nn

from gac.models.modeling_gac import LowRankLinear


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


def replace_with_grouped_lowrank(model: nn.Module, name: str, factors: list[tuple[torch.Tensor, torch.Tensor]]):
    """Replace linear `name` by a GroupedLowRankLinear: factors[g] = (A_g [r_g, in], B_g [out/G, r_g])."""
    from gac.models.modeling_gac import GroupedLowRankLinear

    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    old: nn.Linear = getattr(parent, child)
    w = old.weight
    ranks = [A.shape[0] for A, _ in factors]
    new = GroupedLowRankLinear(old.in_features, old.out_features, ranks, old.bias is not None, w.device, w.dtype)
    with torch.no_grad():
        new.a.weight.copy_(torch.cat([A for A, _ in factors], dim=0))
        rows = old.out_features // len(factors)
        for g, (_, B) in enumerate(factors):
            new.b[g].weight.copy_(B)
            if old.bias is not None:
                new.b[g].bias.copy_(old.bias[g * rows:(g + 1) * rows])
    setattr(parent, child, new)
    return new
