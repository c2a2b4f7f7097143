"""Multiple-choice knapsack by dynamic programming: one candidate per item, maximum value, integer budget.

Pure numpy. The table is sized by how much the candidates can vary, counted in their common cost step.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gac.errors import GacError

_MAX_CANDIDATES = np.iinfo(np.int16).max  # the backtracking table stores candidate indices as int16


@dataclass(frozen=True)
class KnapsackSolution:
    """The chosen candidate per item, its exact total cost and value, and how the table was quantized."""

    choice: list[int]  # candidate index per item
    cost: int  # exact integer total cost, always <= budget
    value: float  # total value of the choice
    exact: bool  # False when the cost unit was coarsened to fit max_cells (still within budget)
    unit: int  # cost of one DP column


def solve_mckp(
    costs: list[list[int]],
    values: list[list[float]],
    budget: int,
    max_cells: int = 60_000_000,
) -> KnapsackSolution:
    """Pick one candidate j per item i maximizing sum values[i][j] with sum costs[i][j] <= budget.

    Exact unless items * columns would exceed `max_cells`; then costs are rounded up to a coarser unit
    (the remaining budget down), so the answer stays within budget but may miss the optimum (exact=False).
    Ties go to the cheaper candidate, then the lower index, so the answer is deterministic.
    """
    cost_rows, value_rows, budget = _validate(costs, values, budget)
    mins = [min(row) for row in cost_rows]
    base = sum(mins)
    if base > budget:
        raise GacError(
            f"budget {budget} is infeasible: the cheapest choice costs {base}, so the smallest feasible "
            f"budget is {base}; raise the budget to at least {base} or allow cheaper candidates"
        )
    # Only the extra cost above each item's cheapest candidate competes for the budget.
    extras = [[c - m for c in row] for row, m in zip(cost_rows, mins)]
    slack = budget - base

    if sum(max(row) for row in extras) <= slack:
        # The budget binds nothing: every item takes its best candidate on its own.
        choice = [_best_index(v, e) for v, e in zip(value_rows, extras)]
        return _finish(choice, cost_rows, value_rows, budget, exact=True, unit=1)

    unit = math.gcd(*(e for row in extras for e in row)) or 1
    capacity = slack // unit  # < sum of max extras here, so it is the binding bound
    n = len(cost_rows)
    allowed = max(max_cells // n, 1) - 1  # columns the cell limit leaves per item, minus column 0
    exact = capacity <= allowed
    if not exact:
        factor = -(-capacity // allowed) if allowed > 0 else capacity + 1
        unit *= factor
        capacity = slack // unit
    steps = [[-(-e // unit) for e in row] for row in extras]  # rounded up: never under-counts a cost

    choice = _dp(steps, value_rows, capacity)
    if not exact:
        choice = _spend_leftover(choice, cost_rows, value_rows, budget)
    return _finish(choice, cost_rows, value_rows, budget, exact=exact, unit=unit)


def _dp(steps: list[list[int]], values: list[list[float]], capacity: int) -> list[int]:
    """Classic MCKP table over `capacity + 1` columns; returns the backtracked choice per item."""
    n = len(steps)
    best = np.zeros(capacity + 1)  # best value of the items so far using at most c units
    arg = np.zeros((n, capacity + 1), dtype=np.int16)  # [items, columns] winning candidate per cell
    for i, (row_steps, row_values) in enumerate(zip(steps, values)):
        new = np.full(capacity + 1, -np.inf)
        # Cheaper candidates first with a strict comparison: ties keep the cheaper one.
        for j in sorted(range(len(row_steps)), key=lambda j: (row_steps[j], j)):
            s = row_steps[j]
            if s > capacity:
                continue
            shifted = best[: capacity + 1 - s] + row_values[j]
            better = shifted > new[s:]
            np.copyto(new[s:], shifted, where=better)
            np.copyto(arg[i, s:], j, where=better)
        best = new  # finite everywhere: each item has a zero-step candidate
    choice = [0] * n
    c = capacity
    for i in range(n - 1, -1, -1):
        j = int(arg[i, c])
        choice[i] = j
        c -= steps[i][j]
    return choice


def _spend_leftover(choice: list[int], costs: list[list[int]], values: list[list[float]], budget: int) -> list[int]:
    """Greedy upgrades into the budget that rounding left unused (coarse path only)."""
    n, m = len(costs), max(len(row) for row in costs)
    cost = np.zeros((n, m), dtype=np.int64)  # [items, candidates], padded
    value = np.full((n, m), -np.inf)  # padding can never be a gain
    for i, (row_c, row_v) in enumerate(zip(costs, values)):
        cost[i, : len(row_c)] = row_c
        value[i, : len(row_v)] = row_v
    rows = np.arange(n)
    pick = np.asarray(choice)
    spent = int(cost[rows, pick].sum())
    for _ in range(4 * n * m):  # each move strictly raises the value; the cap only bounds the time
        gain = value - value[rows, pick][:, None]
        fits = cost - cost[rows, pick][:, None] <= budget - spent
        gain = np.where(fits & (gain > 0), gain, -np.inf)
        flat = int(np.argmax(gain))  # first maximum: lowest item, then lowest index (deterministic)
        if gain.flat[flat] == -np.inf:
            break
        i, j = divmod(flat, m)
        spent += int(cost[i, j] - cost[i, pick[i]])
        pick[i] = j
    return [int(j) for j in pick]


def _best_index(row_values: list[float], row_extras: list[int]) -> int:
    return min(range(len(row_values)), key=lambda j: (-row_values[j], row_extras[j], j))


def _finish(
    choice: list[int], costs: list[list[int]], values: list[list[float]], budget: int, *, exact: bool, unit: int
) -> KnapsackSolution:
    cost = sum(row[j] for row, j in zip(costs, choice))
    if cost > budget:  # the quantization argument says this cannot happen; check on exact integers anyway
        raise RuntimeError(f"internal error: knapsack choice costs {cost} > budget {budget}")
    value = math.fsum(row[j] for row, j in zip(values, choice))
    return KnapsackSolution(choice=choice, cost=cost, value=value, exact=exact, unit=unit)


def _validate(
    costs: Sequence[Sequence[int]], values: Sequence[Sequence[float]], budget: int
) -> tuple[list[list[int]], list[list[float]], int]:
    try:
        budget = operator.index(budget)
    except TypeError:
        raise GacError(f"knapsack budget must be an integer, got {budget!r}") from None
    if len(costs) != len(values):
        raise GacError(f"knapsack got {len(costs)} cost rows but {len(values)} value rows; give one per item")
    cost_rows, value_rows = [], []
    for i, (row_c, row_v) in enumerate(zip(costs, values)):
        if len(row_c) == 0 or len(row_c) != len(row_v):
            raise GacError(
                f"knapsack item {i} has {len(row_c)} costs and {len(row_v)} values; give the same non-zero count"
            )
        if len(row_c) > _MAX_CANDIDATES:
            raise GacError(f"knapsack item {i} has {len(row_c)} candidates; at most {_MAX_CANDIDATES} are supported")
        try:
            row_c = [operator.index(c) for c in row_c]
        except TypeError:
            raise GacError(f"knapsack item {i}: costs must be integers, got {list(row_c)!r}") from None
        row_v = [float(v) for v in row_v]
        if not all(math.isfinite(v) for v in row_v):
            raise GacError(f"knapsack item {i}: values must be finite, got {row_v!r}")
        cost_rows.append(row_c)
        value_rows.append(row_v)
    return cost_rows, value_rows, budget
