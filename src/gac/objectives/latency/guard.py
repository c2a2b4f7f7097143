"""The parameter objective's choice at a latency budget: the ratio bisected until the compressor's own allocation
under that parameter budget, aligned as `gac compress --ratio` aligns it, is predicted within the budget. The
`--speedup` closed loop builds it beside the latency knapsack's choice (gac.objectives.latency.config: the guard)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gac.errors import GacError
from gac.objectives.latency.knapsack import LatencyChoice
from gac.objectives.latency.model import LatencyModel
from gac.objectives.parameter import COMPRESS_WINDOW, parameter_budget, select_within_budget

if TYPE_CHECKING:
    from gac.compressors.base import Compressor, Unit

MAX_RATIO = 0.95  # the bisection's upper end: a ratio the compressors' smallest dims cannot meet is skipped


def dims_at_ratio(compressor: Compressor, units: list[Unit], ratio: float, *, alignment: int) -> dict[str, int | None]:
    """{group: dim or None}: what `gac compress --ratio` selects from analyzed units (the compressor's allocation,
    then aligned dims by the knapsack within one alignment step)."""
    budget = parameter_budget(ratio, sum(u.group.numel for u in units))
    unaligned = compressor.allocate(units, budget)
    dims = select_within_budget(units, unaligned, budget, alignment=alignment, window=COMPRESS_WINDOW).dims
    return {**unaligned, **dims}


@contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """The compressor's warnings off while the bisection probes ratios the user never asked for (prune warns at
    deep ratios that heads reach their minimum)."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def parameter_choice(
    compressor: Compressor,
    units: list[Unit],
    latency_model: LatencyModel,
    budget_ms: float,
    *,
    value: Callable[[Unit, int | None], float],
    alignment: int,
    min_ratio: float = 0.0,
    steps: int = 14,
) -> tuple[float, LatencyChoice] | None:
    """(ratio, choice): the parameter objective at the smallest ratio from `min_ratio` (a parameter cap) whose
    groups are predicted at most `budget_ms`, within 0.95 / 2**steps; None when no ratio up to MAX_RATIO is. The
    choice's value sums `value(unit, dim)`: the retained quality the latency knapsack maximizes, given by the caller
    (the compressors' quality model sits above this layer), so the two choices compare on one scale."""

    def at(ratio: float) -> tuple[dict[str, int | None], float] | None:
        try:
            with _quiet(logging.getLogger(type(compressor).__module__)):
                dims = dims_at_ratio(compressor, units, ratio, alignment=alignment)
            return dims, math.fsum(latency_model.ms(u.name, dims.get(u.name)) for u in units)
        except GacError:  # the compressor's smallest dims cannot meet this parameter budget, or a dim is no candidate
            return None

    lo, hi = min_ratio, MAX_RATIO
    first = at(hi)
    while first is None and hi - 0.05 > lo:  # the largest ratio the compressor can meet
        hi = round(hi - 0.05, 2)
        first = at(hi)
    if first is None or first[1] > budget_ms:
        return None
    ratio, (dims, ms) = hi, first
    for _ in range(steps):
        mid = (lo + hi) / 2
        got = at(mid)
        if got is not None and got[1] <= budget_ms:
            hi = ratio = mid
            dims, ms = got
        else:
            lo = mid
    total = math.fsum(value(u, dims.get(u.name)) for u in units)
    return ratio, LatencyChoice(
        dims=dims, predicted_ms=ms, value=total, params=sum(u.params(dims.get(u.name)) for u in units), exact=False
    )
