"""Latency as the objective: one candidate per group maximizing the retained quality (the compressor's loss model)
with the predicted latency within a budget, by the multiple-choice knapsack over latency quantized into buckets;
an optional parameter cap is met by a Lagrangian penalty on parameters.

Pure Python/numpy: the caller supplies, per group, its candidates, their predicted ms and their quality values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gac.align.knapsack import solve_mckp
from gac.errors import ConfigError, GacError, literal

BUCKETS = 20_000  # latency columns of the DP: rounding each item up costs at most items / BUCKETS of the slack


@dataclass(frozen=True)
class LatencyItem:
    """One group: candidate dims (None: as the original), their predicted ms, values (higher is better) and params."""

    name: str
    candidates: tuple[int | None, ...]
    ms: tuple[float, ...]
    values: tuple[float, ...]
    params: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.candidates)
        if n == 0 or len(self.ms) != n or len(self.values) != n or (self.params is not None and len(self.params) != n):
            raise GacError(f"{self.name}: give as many predicted ms, values (and params) as candidates ({n})")
        if not all(math.isfinite(x) for x in (*self.ms, *self.values)):
            raise GacError(f"{self.name}: predicted ms and values must be finite")


@dataclass(frozen=True)
class LatencyChoice:
    dims: dict[str, int | None]  # {group: chosen dim or None}
    predicted_ms: float  # sum of the chosen candidates' ms (the groups' part of the model)
    value: float
    params: int | None
    exact: bool  # False: a parameter cap was met through a penalty (optimal for the penalized problem only)


def fastest_ms(items: list[LatencyItem]) -> float:
    """The groups' predicted ms at their fastest candidates: no budget below this is reachable."""
    return math.fsum(min(it.ms) for it in items)


def solve_latency(
    items: list[LatencyItem], budget_ms: float, *, param_cap: int | None = None, buckets: int = BUCKETS
) -> LatencyChoice:
    """Maximize sum values with sum ms <= budget_ms (and sum params <= param_cap when given).

    Latency above each item's fastest candidate is rounded up to buckets of (slack / buckets) ms, so the choice never
    exceeds the budget. Raises GacError when even the fastest candidates exceed it."""
    if not items:
        raise GacError("no groups to choose dims for")
    floor = fastest_ms(items)
    if floor > budget_ms:
        raise GacError(f"latency budget {budget_ms:.4g} ms is out of reach: the fastest candidates need {floor:.4g} ms")
    if param_cap is None:
        return _solve(items, budget_ms, [list(it.values) for it in items], buckets, exact=True)
    params = [it.params for it in items if it.params is not None]
    if len(params) < len(items):
        raise GacError("a parameter cap needs every group's params per candidate")
    return _capped(items, params, budget_ms, param_cap, buckets)


def _solve(
    items: list[LatencyItem], budget_ms: float, values: list[list[float]], buckets: int, *, exact: bool
) -> LatencyChoice:
    mins = [min(it.ms) for it in items]
    slack = budget_ms - math.fsum(mins)
    unit = max(slack, 1e-12) / buckets
    # integer cost of each candidate: its ms above the item's fastest, in buckets rounded up (never under-counted)
    costs = [[math.ceil((ms - m) / unit - 1e-9) for ms in it.ms] for it, m in zip(items, mins)]
    solution = solve_mckp(costs, values, buckets)
    pick = solution.choice
    params = [it.params[j] for it, j in zip(items, pick) if it.params is not None]
    return LatencyChoice(
        dims={it.name: it.candidates[j] for it, j in zip(items, pick)},
        predicted_ms=math.fsum(it.ms[j] for it, j in zip(items, pick)),
        value=math.fsum(it.values[j] for it, j in zip(items, pick)),
        params=sum(params) if len(params) == len(items) else None,
        exact=exact,
    )


def _params(choice: LatencyChoice) -> int:
    """The parameters of a choice among items that all give theirs (a parameter cap's)."""
    if choice.params is None:
        raise GacError("a parameter cap needs every group's params per candidate")
    return choice.params


def _capped(
    items: list[LatencyItem], params: list[tuple[int, ...]], budget_ms: float, cap: int, buckets: int
) -> LatencyChoice:
    """The latency-budgeted choice with the least parameter penalty lam * params (`params`: the items' per
    candidate) that meets the cap (bisection on lam): the best of the penalized problems, not always the constrained
    optimum."""
    smallest = sum(min(p) for p in params)
    if smallest > cap:
        raise GacError(f"parameter cap {cap:,} is out of reach: the smallest candidates keep {smallest:,}")

    def at(lam: float) -> LatencyChoice:
        vals = [[v - lam * n for v, n in zip(it.values, p)] for it, p in zip(items, params)]
        return _solve(items, budget_ms, vals, buckets, exact=lam == 0.0)  # value: of it.values, not the penalized

    best = at(0.0)
    if _params(best) <= cap:
        return best
    span = max(abs(v) for it in items for v in it.values) or 1.0
    lo, hi = 0.0, span  # a penalty of `span` per parameter makes any extra parameter a loss
    hi_choice = at(hi)
    for _ in range(12):  # the budget may force candidates with more parameters than the least-parameter ones
        if _params(hi_choice) <= cap:
            break
        hi *= 10
        hi_choice = at(hi)
    else:
        raise GacError(
            f"parameter cap {cap:,} and latency budget {budget_ms:.4g} ms exclude each other: the fewest "
            f"parameters found within the budget are {_params(hi_choice):,}; raise the cap or lower the "
            "speedup"
        )
    for _ in range(40):
        mid = (lo + hi) / 2
        c = at(mid)
        if _params(c) <= cap:
            hi, hi_choice = mid, c
        else:
            lo = mid
    return hi_choice


def select_for_speedup(
    items: list[LatencyItem],
    *,
    baseline_ms: float,
    constant_ms: float,
    speedup: float,
    where: str = "",
    param_cap: int | None = None,
    budget_ms: float | None = None,
) -> LatencyChoice:
    """The best choice whose predicted whole-model time, constant_ms + groups, is at most baseline_ms / speedup
    (`budget_ms` overrides the groups' budget: the closed loop tightens it). One-line GacError naming the best
    reachable speedup when the target cannot be met."""
    if not speedup > 0:
        raise ConfigError(f"speedup {speedup} must be a positive number, e.g. {{speedup:1.2}}")
    groups_budget = baseline_ms / speedup - constant_ms if budget_ms is None else budget_ms
    floor = fastest_ms(items)
    if floor > groups_budget:
        best = math.floor(baseline_ms / (constant_ms + floor) * 100) / 100  # rounded down: reachable as printed
        advice = f"ask for {{speedup:{best:.2f}}} or less" if best > 1.0 else "no choice of dims is predicted faster"
        raise ConfigError(
            f"speedup {speedup:g}x is out of reach{literal(where)}: the ops these dims shape take "
            f"{baseline_ms - constant_ms:.4g} of the original's {baseline_ms:.4g} ms and, at the fastest "
            f"dims, the model is predicted at {constant_ms + floor:.4g} ms, a best reachable speedup of "
            f"{best:.2f}x; {advice}"
        )
    return solve_latency(items, groups_budget, param_cap=param_cap)
