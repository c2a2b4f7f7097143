"""The MCKP solver: optimal against brute force, never over budget, clear infeasibility errors."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gac.align.knapsack import solve_mckp
from gac.errors import GacError


@st.composite
def problems(draw, max_items=5, max_candidates=4):
    """Random small MCKPs; costs share a random step so the gcd quantization is exercised."""
    n = draw(st.integers(1, max_items))
    step = draw(st.sampled_from([1, 3, 8, 1000]))
    costs, values = [], []
    for _ in range(n):
        m = draw(st.integers(1, max_candidates))
        offset = draw(st.integers(0, 5))  # a per-item offset the gcd must not depend on
        costs.append([offset + step * draw(st.integers(0, 40)) for _ in range(m)])
        values.append([draw(st.floats(-1e6, 1e6, allow_nan=False)) for _ in range(m)])
    base = sum(min(r) for r in costs)
    top = sum(max(r) for r in costs)
    budget = draw(st.integers(base - step - 3, top + step))  # some budgets are infeasible
    return costs, values, budget


def brute_force(costs, values, budget):
    """Best value over every combination within budget, or None when nothing fits."""
    best = None
    for choice in itertools.product(*(range(len(r)) for r in costs)):
        if sum(r[j] for r, j in zip(costs, choice)) <= budget:
            v = math.fsum(r[j] for r, j in zip(values, choice))
            best = v if best is None else max(best, v)
    return best


def _close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@settings(max_examples=300, deadline=None)
@given(problems())
def test_dp_matches_brute_force_and_respects_budget(problem):
    costs, values, budget = problem
    expected = brute_force(costs, values, budget)
    if expected is None:
        with pytest.raises(GacError, match=f"smallest feasible budget is {sum(min(r) for r in costs)}"):
            solve_mckp(costs, values, budget)
        return
    sol = solve_mckp(costs, values, budget)
    assert sol.exact
    assert sol.cost == sum(r[j] for r, j in zip(costs, sol.choice)) <= budget
    assert _close(sol.value, math.fsum(r[j] for r, j in zip(values, sol.choice)))
    assert _close(sol.value, expected)


@settings(max_examples=200, deadline=None)
@given(problems(), st.integers(1, 12))
def test_coarsened_table_never_exceeds_budget(problem, max_cells):
    costs, values, budget = problem
    expected = brute_force(costs, values, budget)
    if expected is None:
        return
    sol = solve_mckp(costs, values, budget, max_cells=max_cells)
    assert sol.cost == sum(r[j] for r, j in zip(costs, sol.choice)) <= budget
    assert sol.value <= expected + 1e-9 * max(1.0, abs(expected))
    if sol.exact:  # a table that fit must still be optimal
        assert _close(sol.value, expected)


def test_coarsened_path_is_flagged_and_close():
    # 20 items, 3 candidates each, extras in units of 1: the exact table needs 20 * 301 cells.
    costs = [[0, 10 + i, 20 + i] for i in range(20)]
    values = [[0.0, 1.0 + i, 1.9 + 2 * i] for i in range(20)]
    budget = 300
    exact = solve_mckp(costs, values, budget)
    coarse = solve_mckp(costs, values, budget, max_cells=20 * 16)
    assert exact.exact and exact.unit == 1
    assert not coarse.exact and coarse.unit > 1
    assert coarse.cost <= budget
    assert coarse.value <= exact.value
    assert coarse.value >= 0.9 * exact.value  # the leftover pass recovers most of the rounding loss


def test_infeasible_names_the_smallest_budget():
    with pytest.raises(GacError) as err:
        solve_mckp([[5, 7], [10, 12]], [[0.0, 1.0], [0.0, 1.0]], 14)
    message = str(err.value)
    assert "smallest feasible budget is 15" in message
    assert "\n" not in message


def test_table_sized_by_variation_not_budget():
    # Costs in the billions but only three choices: the unit is the gcd of the extras.
    costs = [[7_000_000_000, 7_000_000_000 + 8192 * k] for k in (1, 2, 3)]
    values = [[0.0, 1.0], [0.0, 1.5], [0.0, 2.5]]
    sol = solve_mckp(costs, values, 21_000_000_000 + 8192 * 4, max_cells=100)
    assert sol.exact and sol.unit == 8192
    assert sol.choice == [1, 0, 1]


def test_unconstrained_budget_takes_each_best():
    sol = solve_mckp([[1, 2, 3], [4, 5]], [[3.0, 1.0, 2.0], [0.0, 9.0]], 100)
    assert sol.choice == [0, 1] and sol.cost == 6 and sol.exact


def test_ties_are_deterministic_and_prefer_cheaper():
    costs = [[4, 2, 8], [6, 3]]
    values = [[1.0, 1.0, 1.0], [2.0, 2.0]]
    first = solve_mckp(costs, values, 100)
    assert first == solve_mckp(costs, values, 100)
    assert first.choice == [1, 1]
    binding = solve_mckp(costs + [[0, 9]], values + [[0.0, 5.0]], 14)
    assert binding == solve_mckp(costs + [[0, 9]], values + [[0.0, 5.0]], 14)
    assert binding.choice == [1, 1, 1]


@pytest.mark.parametrize(
    ("costs", "values", "budget", "match"),
    [
        ([[1, 2]], [[1.0]], 5, "same non-zero count"),
        ([[]], [[]], 5, "same non-zero count"),
        ([[1.5]], [[1.0]], 5, "integers"),
        ([[1]], [[float("nan")]], 5, "finite"),
        ([[1]], [[1.0], [2.0]], 5, "one per item"),
        ([[1]], [[1.0]], 5.5, "budget must be an integer"),
    ],
)
def test_bad_input_is_a_gac_error(costs, values, budget, match):
    with pytest.raises(GacError, match=match):
        solve_mckp(costs, values, budget)


def test_no_items_costs_nothing():
    sol = solve_mckp([], [], 0)
    assert sol.choice == [] and sol.cost == 0 and sol.value == 0.0
