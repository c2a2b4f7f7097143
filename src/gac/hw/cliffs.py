"""Pure functions on measured latency tables: look up a 1-D table in a profile, find cliffs, filter candidates.

A cliff is a dim that is slower than some larger measured dim: "smaller is slower", so it is never worth keeping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gac.align.candidates import aligned_candidates
from gac.errors import GacError


@dataclass(frozen=True)
class CandidateSet:
    """Aligned dims kept near d*, and the reason each dropped dim was dropped."""

    candidates: list[int]
    excluded: dict[int, str] = field(default_factory=dict)
    note: str = ""  # set when the profile could not be used as is (no coverage, fallback)


def _log_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Sum of |log(a_k / b_k)| over the sizes both shapes name; sizes named by one side only are ignored."""
    return sum(abs(math.log(max(a[k], 1) / max(b[k], 1))) for k in a.keys() & b.keys())


def latency_table(
    profile: Mapping, op: str, *, m: int | None = None, shape: Mapping[str, int] | None = None
) -> dict[int, float]:
    """{dim: median ms} for `op`; the entry nearest to (m, shape) by log-distance when no exact match exists."""
    entries = [e for e in profile.get("ops", []) if e.get("op") == op]
    if not entries:
        ops = sorted({e.get("op") for e in profile.get("ops", [])})
        raise GacError(f"the profile has no {op!r} sweep (it has: {', '.join(ops) or 'none'}); re-run `gac profile`")

    def distance(entry: Mapping) -> float:
        d = _log_distance(shape or {}, entry.get("shape", {}))
        if m is not None:
            d += _log_distance({"m": m}, {"m": entry["m"]})
        return d

    best = min(entries, key=distance)  # min keeps the first of equally near entries
    return {int(d): float(ms) for d, ms in zip(best["dims"], best["ms"])}


def entry_label(entry: Mapping) -> str:
    """Short name of a profile op entry, e.g. 'gemm_n m=512 k=1024'."""
    sizes = " ".join(f"{k}={v}" for k, v in entry.get("shape", {}).items())
    return f"{entry['op']} m={entry['m']} {sizes}".strip()


def find_cliffs(table: Mapping[int, float], tolerance: float = 0.02) -> dict[int, int]:
    """{slow dim: larger dim that beats it by more than `tolerance`} (the fastest such larger dim)."""
    cliffs: dict[int, int] = {}
    fastest_above: int | None = None  # fastest dim strictly larger than the current one
    for d in sorted(table, reverse=True):
        if fastest_above is not None and table[fastest_above] * (1 + tolerance) < table[d]:
            cliffs[d] = fastest_above
        if fastest_above is None or table[d] <= table[fastest_above]:
            fastest_above = d
    return dict(sorted(cliffs.items()))


def profile_candidates(
    table: Mapping[int, float],
    dim: float,
    *,
    alignment: int = 8,
    window: int = 4,
    min_dim: int | None = None,
    max_dim: int | None = None,
    tolerance: float = 0.02,
) -> CandidateSet:
    """Aligned dims near `dim` (the static rule) that the measured table shows are not on a cliff; never empty.

    A dim is dropped when a larger measured dim is faster by more than `tolerance` (relative), or when the table
    measures some candidates but not this one. With no candidate measured, the static candidates are kept.
    Bounds that leave no aligned dim raise GacError, as the static rule does.
    """
    start = aligned_candidates(dim, alignment, window=window, min_dim=min_dim, max_dim=max_dim)  # static rule
    measured = [d for d in start if d in table]
    if not measured:
        return CandidateSet(start, {}, f"the profile has no dims near {dim:g}; static candidates kept")

    excluded: dict[int, str] = {}
    for d in start:
        if d not in table:
            excluded[d] = f"not measured: the profile covers {len(measured)} of {len(start)} dims near {dim:g}"
            continue
        beaters = [b for b in table if b > d and table[b] * (1 + tolerance) < table[d]]
        if beaters:
            b = min(beaters, key=table.__getitem__)
            excluded[d] = f"cliff: {table[d]:.4g} ms is slower than {b} at {table[b]:.4g} ms"
    kept = [d for d in start if d not in excluded]
    if kept:
        return CandidateSet(kept, excluded)

    best = min(measured, key=table.__getitem__)
    excluded.pop(best)
    note = f"every dim near {dim:g} is beaten by a larger dim; kept the fastest measured one, {best}"
    return CandidateSet([best], excluded, note)
