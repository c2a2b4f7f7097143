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
