"""The latency objective's solver: optimal against brute force on small tables (non-monotone ones included), never
over the latency budget, a parameter cap respected, and an unreachable speedup named in one line."""

import itertools
import math

import numpy as np
import pytest

from gac.errors import GacError
from gac.objectives.latency.knapsack import LatencyItem, select_for_speedup, solve_latency


def _items(rng, n, k, monotone=True):
    items = []
    for i in range(n):
        dims = list(range(8, 8 * k + 1, 8))
        ms = np.sort(rng.uniform(0.1, 2.0, k)) if monotone else rng.uniform(0.1, 2.0, k)  # cliffs: larger can be faster
        values = np.sort(rng.uniform(-5, 0, k))  # quality grows with the dim
        params = [d * 100 for d in dims]
        items.append(LatencyItem(f"g{i}", tuple(dims), tuple(ms), tuple(values), tuple(params)))
    return items


def _brute(items, budget, cap=None):
    best = None
    for pick in itertools.product(*(range(len(it.candidates)) for it in items)):
        ms = math.fsum(it.ms[j] for it, j in zip(items, pick))
        params = sum(it.params[j] for it, j in zip(items, pick))
        if ms > budget or (cap is not None and params > cap):
            continue
        value = math.fsum(it.values[j] for it, j in zip(items, pick))
        best = value if best is None else max(best, value)
    return best


@pytest.mark.parametrize("monotone", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_optimal_against_brute_force_and_within_budget(seed, monotone):
    rng = np.random.default_rng(seed)
    items = _items(rng, n=4, k=5, monotone=monotone)
    floor = sum(min(it.ms) for it in items)
    for frac in (0.0, 0.3, 0.7):
        budget = floor + frac * (sum(max(it.ms) for it in items) - floor)
        choice = solve_latency(items, budget)
        assert choice.predicted_ms <= budget + 1e-12
        # rounding each item's ms up to a bucket can cost at most items x bucket of slack; with 20000 buckets the
        # DP finds the brute-force optimum on these tables
        assert choice.value == pytest.approx(_brute(items, budget), abs=1e-9)


def test_non_monotone_table_takes_the_faster_larger_dim():
    # dim 16 is a cliff: slower than 24, which is also better quality: the solver must never pick 16
    item = LatencyItem("g", (8, 16, 24, None), (1.0, 3.0, 1.5, 4.0), (-3.0, -2.0, -1.0, 0.0))
    for budget in (1.5, 2.0, 3.0, 3.9):
        assert solve_latency([item], budget).dims["g"] == 24
    assert solve_latency([item], 4.0).dims["g"] is None  # the dense original when it fits


def test_parameter_cap_is_respected():
    rng = np.random.default_rng(7)
    items = _items(rng, n=4, k=4)
    budget = sum(max(it.ms) for it in items)  # latency binds nothing: the cap decides
    cap = sum(min(it.params) for it in items) + 600
    choice = solve_latency(items, budget, param_cap=cap)
    assert choice.params <= cap
    assert choice.value <= _brute(items, budget, cap) + 1e-9
    assert choice.value >= _brute(items, budget, cap) - 2.0  # the penalized optimum is near the constrained one


@pytest.mark.parametrize("seed", range(4))
def test_binding_cap_changes_the_choice_within_budget_and_cap(seed):
    rng = np.random.default_rng(seed)
    items = _items(rng, n=4, k=5, monotone=False)
    floor = sum(min(it.ms) for it in items)
    budget = floor + 0.6 * (sum(max(it.ms) for it in items) - floor)
    free = solve_latency(items, budget)
    cap = free.params - 800  # binding: the unconstrained choice is over it
    capped = solve_latency(items, budget, param_cap=cap)
    assert capped.params <= cap < free.params and capped.predicted_ms <= budget + 1e-12
    assert capped.dims != free.dims and not capped.exact
    best = _brute(items, budget, cap)
    assert best is not None and capped.value <= best + 1e-9  # a feasible choice, so never above the optimum


def test_cap_the_budget_rules_out_is_one_line():
    # the fastest candidate has the most parameters: a tight budget and a tight cap cannot both hold
    item = LatencyItem("g", (8, 16), (2.0, 1.0), (-1.0, 0.0), (800, 1600))
    with pytest.raises(GacError, match="exclude each other"):
        solve_latency([item], 1.5, param_cap=1000)


def test_unreachable_speedup_names_the_best_reachable_one():
    item = LatencyItem("g", (8, None), (2.0, 10.0), (-1.0, 0.0))
    with pytest.raises(GacError) as e:
        select_for_speedup([item], baseline_ms=20.0, constant_ms=10.0, speedup=2.0, where=" at prefill 1x512")
    msg = str(e.value)
    assert "\n" not in msg and "prefill 1x512" in msg
    assert "1.66x" in msg  # 20 / (10 + 2) = 1.667, rounded down so the suggestion is reachable
    assert "take 10 of the original's 20 ms" in msg  # why: the ops the dims shape are half the time
    choice = select_for_speedup([item], baseline_ms=20.0, constant_ms=10.0, speedup=1.66)
    assert choice.dims["g"] == 8 and 10.0 + choice.predicted_ms <= 20.0 / 1.66


def test_mismatched_lengths_are_one_line_errors():
    with pytest.raises(GacError, match="as many"):
        LatencyItem("g", (8, 16), (1.0,), (0.0, 1.0))
