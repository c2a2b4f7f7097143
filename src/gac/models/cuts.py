"""What a compressor hands over per group for surgery to cut (Cut: Factors, Keep, KeepExperts or KeepHeads): plain
tensors, below both the kinds that cut by them and gac.models.surgery, which re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch


@dataclass(frozen=True)
class Factors:
    """A rank-r factorization: A [r, in], B [out, r] (for a head_rank group: its rows only)."""

    A: torch.Tensor
    B: torch.Tensor


@dataclass(frozen=True)
class Keep:
    """Channels to keep of an MLP width (ascending indices)."""

    channels: torch.Tensor


@dataclass(frozen=True)
class KeepExperts:
    """Channels to keep in every expert of an MoE layer: [E, w], each row ascending (one width, own channels); with
    `experts` (ascending indices into the layer's experts, E of them), only those experts are kept, renumbered in
    that order, and channels[j] is kept expert j's."""

    channels: torch.Tensor
    experts: torch.Tensor | None = None


@dataclass(frozen=True)
class KeepHeads:
    """Query heads and KV heads to keep (ascending; each KV head's query heads kept together or per group)."""

    q_heads: torch.Tensor
    kv_heads: torch.Tensor


Cut = Factors | Keep | KeepExperts | KeepHeads  # what a compressor hands over for one group
C = TypeVar("C", Factors, Keep, KeepExperts, KeepHeads)


def cut_as(cut: Cut, expected: type[C], group: str) -> C:
    """`cut` as the one kind of cut `group` takes (a compressor handing another is a bug, not a user error)."""
    if not isinstance(cut, expected):
        raise TypeError(f"{group} is cut by {expected.__name__}, not {type(cut).__name__}")
    return cut
