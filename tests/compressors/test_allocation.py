"""Greedy rank allocation: never over budget, importance respected, irregular ranks, dense at break-even."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gac.compressors.allocation import DENSE, allocate_ranks
from gac.errors import GacError
from gac.models.kinds.rank import max_useful_rank


def _params(shapes, ranks):
    return sum(o * i if r is DENSE else r * (i + o) for (o, i), r in zip(shapes, ranks))


def _spectrum(rng, k, decay):
    """Energy fractions of k directions, descending, sum to 1."""
    e = np.sort(rng.random(k) * np.exp(-decay * np.arange(k)))[::-1]
    return e / e.sum()


def _next_cost(shape, rank):
    """Parameters one more allocation step would cost (a rank unit, or the jump to dense)."""
    o, i = shape
    if rank < max_useful_rank(i, o):
        return o + i
    return o * i - rank * (i + o)


@st.composite
def problems(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    n = draw(st.integers(1, 6))
    rng = np.random.default_rng(seed)
    shapes = [(int(rng.integers(2, 40)), int(rng.integers(2, 40))) for _ in range(n)]
    energies = [_spectrum(rng, min(s), float(rng.uniform(0, 1))) for s in shapes]
    scores = [float(rng.uniform(0.05, 5.0)) for _ in range(n)]
    floor = sum(o + i for o, i in shapes)
    top = sum(o * i for o, i in shapes)
    budget = draw(st.integers(floor, top + 10))
    return energies, scores, shapes, budget


@settings(max_examples=60, deadline=None)
@given(problems())
def test_budget_respected_and_nothing_left_that_fits(problem):
    energies, scores, shapes, budget = problem
    ranks = allocate_ranks(energies, scores, shapes, budget)
    assert len(ranks) == len(shapes)
    assert _params(shapes, ranks) <= budget
    left = budget - _params(shapes, ranks)
    for shape, r in zip(shapes, ranks):
        if r is DENSE:
            continue
        assert 1 <= r <= max_useful_rank(shape[1], shape[0])
        assert _next_cost(shape, r) > left  # greedy stops only when no weight can grow within the budget


def test_higher_score_gets_at_least_as_large_a_share():
    rng = np.random.default_rng(0)
    for _ in range(20):
        shape = (int(rng.integers(8, 48)), int(rng.integers(8, 48)))
        e = _spectrum(rng, min(shape), float(rng.uniform(0, 0.5)))
        unit = sum(shape)
        budget = int(rng.integers(2 * unit, shape[0] * shape[1]))
        hi, lo = allocate_ranks([e, e], [10.0, 1.0], [shape, shape], budget)
        # identical weights and spectra: the ten-times more important one is never smaller
        assert _params([shape], [hi]) >= _params([shape], [lo])
    shape = (32, 32)
    e = _spectrum(rng, 32, 0.1)
    hi, lo = allocate_ranks([e, e], [10.0, 1.0], [shape, shape], 6 * 64)
    assert hi is DENSE or (lo is not DENSE and hi > lo)  # a clear gap, not a tie, at a tight budget


def test_ranks_are_irregular_for_random_spectra():
    rng = np.random.default_rng(1)
    shapes = [(64, 64)] * 4 + [(160, 64)] * 3
    energies = [_spectrum(rng, min(s), float(rng.uniform(0.0, 0.3))) for s in shapes]
    scores = list(rng.uniform(0.5, 2.0, len(shapes)))
    budget = int(0.5 * sum(o * i for o, i in shapes))
    ranks = allocate_ranks(energies, scores, shapes, budget)
    assert len(set(ranks)) >= 3, ranks
    assert any(r is not DENSE and r % 8 != 0 for r in ranks)


def test_budget_too_small_for_rank_one_raises():
    shapes = [(16, 8), (8, 16)]
    energies = [np.full(8, 1 / 8)] * 2
    need = sum(o + i for o, i in shapes)
    with pytest.raises(GacError, match=str(need)):
        allocate_ranks(energies, [1.0, 1.0], shapes, need - 1)
    assert allocate_ranks(energies, [1.0, 1.0], shapes, need) == [1, 1]  # exactly enough is fine


def test_generous_budget_makes_every_weight_dense():
    rng = np.random.default_rng(2)
    shapes = [(24, 16), (16, 40), (8, 8)]
    energies = [_spectrum(rng, min(s), 0.2) for s in shapes]
    budget = sum(o * i for o, i in shapes)
    assert allocate_ranks(energies, [1.0, 0.1, 3.0], shapes, budget) == [DENSE] * 3
    # one parameter short of all-dense: at least one weight must stay factorized
    short = allocate_ranks(energies, [1.0, 0.1, 3.0], shapes, budget - 1)
    assert any(r is not DENSE for r in short)
    assert _params(shapes, short) <= budget - 1


def test_greedy_steps_takes_best_ratio_first_and_stops_items_that_no_longer_fit():
    from gac.compressors.allocation import greedy_steps

    gains = [np.array([10.0, 1.0]), np.array([6.0, 5.0, 4.0])]
    costs = [np.array([2, 2]), np.array([3, 3, 3])]
    # ratios: a 5.0, 0.5; b 2.0, 1.67, 1.33 -> a0, b0, b1, b2, a1 while the budget lasts
    assert greedy_steps(gains, costs, used=0, budget=2) == [1, 0]
    assert greedy_steps(gains, costs, used=0, budget=7) == [2, 1]  # b1 no longer fits: b stops, a1 still does
    assert greedy_steps(gains, costs, used=0, budget=11) == [1, 3]
    assert greedy_steps(gains, costs, used=0, budget=13) == [2, 3]
    assert greedy_steps(gains, costs, used=5, budget=10) == [1, 1]  # spent parameters count
    assert greedy_steps([np.array([])], [np.array([], dtype=int)], used=0, budget=5) == [0]
