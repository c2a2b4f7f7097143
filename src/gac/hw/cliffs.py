"""Pure functions on measured latency tables: look up a 1-D table in a profile, find cliffs.

A cliff is a dim that is slower than some larger measured dim: "smaller is slower", so it is never worth keeping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gac.errors import GacError


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
