"""Hardware-aligned candidate dims near a compressor's unconstrained dim, and alignment checks."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from gac.errors import GacError
from gac.hw.device import ALIGNMENT

if TYPE_CHECKING:
    from gac.models.kinds.base import DimGroup

WINDOW = 4  # aligned candidates each side of d* for an external plan (`gac select`) and a profile's sweep


class GroupUnit(Protocol):
    """A dimension group as selection sees it (a compressor's unit, gac.compressors.base.Unit): its name, its group
    and the profile sweep that times it."""

    @property
    def name(self) -> str: ...
    @property
    def group(self) -> DimGroup: ...
    @property
    def profile_op(self) -> str: ...
    @property
    def profile_shape(self) -> dict[str, int]: ...
    @property
    def min_dim(self) -> int: ...
    @property
    def max_dim(self) -> int: ...


def aligned_candidates(
    dim: float,
    alignment: int = ALIGNMENT,
    *,
    window: int = WINDOW,
    min_dim: int | None = None,
    max_dim: int | None = None,
) -> list[int]:
    """The `window` multiples of `alignment` at or below `dim` and the `window` strictly above it.

    Kept only within [min_dim, max_dim] (min_dim defaults to `alignment`, so a weight never vanishes);
    sorted and unique. Raises GacError when the bounds leave no candidate.
    """
    alignment = _positive_int(alignment, "alignment")
    window = _positive_int(window, "window")
    if isinstance(dim, bool) or not isinstance(dim, numbers.Real) or not math.isfinite(dim) or dim < 0:
        raise GacError(f"dim must be a finite number >= 0, got {dim!r}")
    low = alignment if min_dim is None else min_dim
    floor_multiple = math.floor(dim / alignment) * alignment
    below = [floor_multiple - k * alignment for k in range(window)]
    above = [floor_multiple + (k + 1) * alignment for k in range(window)]
    dims = sorted({d for d in below + above if d >= low and (max_dim is None or d <= max_dim)})
    if not dims:
        bounds = f"[{low}, {'inf' if max_dim is None else max_dim}]"
        raise GacError(
            f"no multiple of {alignment} within {bounds} lies near dim {dim:g} (window {window}); "
            "widen min_dim/max_dim, raise the window, or give candidates explicitly"
        )
    return dims


def is_aligned(dim: int | float, alignment: int = ALIGNMENT) -> bool:
    """True when `dim` is a whole number divisible by `alignment`."""
    return float(dim).is_integer() and int(dim) % alignment == 0


def aligned_fraction(dims: Iterable[int | float], alignment: int = ALIGNMENT) -> float:
    """Share of `dims` divisible by `alignment`; 1.0 for no dims (nothing is misaligned)."""
    dims = list(dims)
    if not dims:
        return 1.0
    return sum(is_aligned(d, alignment) for d in dims) / len(dims)


def _positive_int(value: int, what: str) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise GacError(f"{what} must be a positive integer, got {value!r}") from None
    if value < 1:
        raise GacError(f"{what} must be a positive integer, got {value}")
    return value
