"""Pure tensor functions that widen a dim with zeros so that the padded network computes exactly the same outputs.

Every padded entry multiplies a zero, so results are unchanged in exact arithmetic; in floating point the padded
products are exact zeros too, and only a kernel's summation order can differ (fp32 differences ~1e-7 relative).
"""

from __future__ import annotations

import torch


def next_multiple(d: int, n: int) -> int:
    """Smallest multiple of `n` that is >= `d` (d >= 0, n >= 1)."""
    if n < 1:
        raise ValueError(f"alignment must be >= 1, got {n}")
    if d < 0:
        raise ValueError(f"dim must be >= 0, got {d}")
    return -(-d // n) * n


def _check_target(current: int, target: int, what: str) -> None:
    if target < current:
        raise ValueError(f"cannot pad {what} from {current} down to {target}")


def pad_rows(
    weight: torch.Tensor, rows: int, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Output features out -> rows: `weight` [out, in] gets zero rows, `bias` [out] zeros. Returns (weight, bias).

    The new outputs are exactly 0; pair with `pad_cols` on the consumer so they are never read.
    """
    out, _ = weight.shape
    _check_target(out, rows, "output features")
    w = torch.cat([weight, weight.new_zeros(rows - out, weight.shape[1])], dim=0)  # [rows, in]
    b = None if bias is None else torch.cat([bias, bias.new_zeros(rows - out)])  # [rows]
    return w, b


def pad_cols(weight: torch.Tensor, cols: int) -> torch.Tensor:
    """Input features in -> cols: `weight` [out, in] gets zero columns, so extra inputs are ignored exactly."""
    _, inp = weight.shape
    _check_target(inp, cols, "input features")
    return torch.cat([weight, weight.new_zeros(weight.shape[0], cols - inp)], dim=1)  # [out, cols]


def pad_lowrank(a: torch.Tensor, b: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inner rank r -> rank of y = B (A x): A [r, in] gets zero rows, B [out, r] zero columns; B'A' == BA exactly."""
    if a.shape[0] != b.shape[1]:
        raise ValueError(f"A {tuple(a.shape)} and B {tuple(b.shape)} do not share an inner rank")
    a2, _ = pad_rows(a, rank)
    return a2, pad_cols(b, rank)


def pad_grouped_lowrank(
    a: torch.Tensor, bs: list[torch.Tensor], ranks: list[int]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Pad each head group's rank of a grouped factorization: a [sum r_g, in] gets zero rows at the end of every
    group's segment, each b_g [out_g, r_g] zero columns. Every group's b_g(a_g x) is unchanged."""
    segments = a.split([b.shape[1] for b in bs], dim=0)  # G x [r_g, in]
    padded = [pad_lowrank(seg, b, r) for seg, b, r in zip(segments, bs, ranks)]
    return torch.cat([p[0] for p in padded], dim=0), [p[1] for p in padded]
