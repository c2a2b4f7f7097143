"""The loss model (predicted loss per rank) and the allocator over loss curves, on synthetic tables."""

import itertools

import numpy as np
import pytest
import torch

from gac.compressors.loss_model import (
    allocate_by_curves,
    lower_hull,
    lowrank_loss_curve,
    lowrank_options,
    slope_at,
    truncation_factors,
)
from gac.calibration.gram import Gram
from gac.compressors.linalg import FACTORIZATIONS, factorize_from_svd, scaled_svd, whiten


def _data(seed, out=12, inp=10, tokens=200):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(out, inp, generator=g, dtype=torch.float64)
    X = torch.randn(tokens, inp, generator=g, dtype=torch.float64) * torch.linspace(0.2, 3.0, inp, dtype=torch.float64)
    f = torch.rand(out, generator=g, dtype=torch.float64) + 0.1
    return W, X, f


@pytest.mark.parametrize("method", FACTORIZATIONS)
@pytest.mark.parametrize("kind", ["plain", "diag", "whiten"])
def test_curve_is_the_fisher_weighted_output_error_of_the_materialized_factorization(kind, method):
    """Whatever the factorization (an exact SVD, or eigh of the Gram matrix: U = W S V / s need not be orthonormal)."""
    W, X, f = _data(0)
    C = X.T @ X / X.shape[0]
    scale = {"plain": None, "diag": X.abs().mean(0).sqrt(), "whiten": whiten(X.T @ X)}[kind]
    svd = scaled_svd(W, scale, method)
    curve = lowrank_loss_curve(*truncation_factors(svd.U, svd.S, svd.Vh, svd.scale, Gram.of_matrix(C), f))
    assert curve.shape == (min(W.shape) + 1,)
    for r in range(1, min(W.shape)):
        A, B = factorize_from_svd(svd, r)
        dY = X @ (W - (B @ A).double()).T  # [tokens, out]
        direct = 0.5 * float((dY.square() * f).sum(1).mean())
        assert curve[r] == pytest.approx(direct, rel=1e-4, abs=1e-6 * curve[0])
    assert curve[-1] == 0.0
    assert np.all(np.diff(curve) <= 0)


def test_curve_without_fisher_or_gram_is_the_tail_energy():
    W, _, _ = _data(1)
    svd = scaled_svd(W)
    s, P, Q = truncation_factors(svd.U, svd.S, svd.Vh, None, Gram.of_matrix(torch.eye(W.shape[1], dtype=torch.float64)))
    curve = lowrank_loss_curve(s, P, Q)
    tail = 0.5 * np.cumsum((svd.S.double() ** 2).numpy()[::-1])[::-1]
    np.testing.assert_allclose(curve[:-1], tail, rtol=1e-5)


def test_cap_truncates_the_curve():
    W, X, f = _data(2)
    svd = scaled_svd(W)
    C = Gram.of_matrix(X.T @ X)
    full = lowrank_loss_curve(*truncation_factors(svd.U, svd.S, svd.Vh, None, C, f))
    assert np.array_equal(lowrank_loss_curve(*truncation_factors(svd.U, svd.S, svd.Vh, None, C, f), cap=4), full[:5])


@pytest.mark.parametrize("kind", ["diag", "whiten"])
def test_curve_from_the_input_rows_equals_the_curve_from_their_gram_matrix(kind):
    """Fewer tokens than input channels: the Gram kept as the rows X gives the curve of its matrix X^T X, up to the
    order of float64 sums."""
    W, X, f = _data(3, out=16, inp=24, tokens=20)
    scale = X.abs().mean(0).sqrt() if kind == "diag" else whiten(X.T @ X + torch.eye(24, dtype=torch.float64))
    svd = scaled_svd(W, scale)
    rows = Gram(X.shape[1])
    for part in X.split(7):
        rows.add(part)
    assert rows.sum is None  # 20 rows of 24 columns: kept as rows
    from_rows = lowrank_loss_curve(*truncation_factors(svd.U, svd.S, svd.Vh, svd.scale, rows, f))
    from_matrix = lowrank_loss_curve(*truncation_factors(svd.U, svd.S, svd.Vh, svd.scale, Gram.of_matrix(X.T @ X), f))
    np.testing.assert_allclose(from_rows, from_matrix, rtol=1e-10, atol=1e-12 * from_matrix[0])


def test_lower_hull_drops_points_above_the_chords():
    costs = np.array([0, 1, 2, 3, 4, 5.0])
    losses = np.array([10, 9.5, 5, 4.9, 1, 1.0])  # 1 lies above chord 0->2, 3 above chord 2->4, 5 no gain
    assert lower_hull(costs, losses) == [0, 2, 4]
    assert lower_hull(costs, losses, start=1) == [1, 2, 4]


def _brute(curves, costs, budget, start):
    best = np.inf
    for choice in itertools.product(*[range(s, len(c)) for s, c in zip(start, curves)]):
        if sum(c[j] for c, j in zip(costs, choice)) <= budget:
            best = min(best, sum(l[j] for l, j in zip(curves, choice)))
    return best


def _problem(rng, convex):
    n = int(rng.integers(1, 4))
    curves, costs = [], []
    for _ in range(n):
        m = int(rng.integers(2, 6))
        step = float(rng.integers(1, 5))
        drops = rng.random(m) * (np.sort(rng.random(m))[::-1] if convex else 1.0)
        curves.append(np.concatenate([[0], np.cumsum(drops)])[::-1].copy() + rng.random() * 0.1)
        costs.append(np.arange(m + 1) * step)
    return curves, costs


@pytest.mark.parametrize("convex", [True, False])
def test_allocator_never_exceeds_the_budget_and_is_near_brute_force(convex):
    rng = np.random.default_rng(0)
    for _ in range(300):
        curves, costs = _problem(rng, convex)
        start = [int(rng.integers(0, 2)) for _ in curves]
        floor = sum(c[s] for c, s in zip(costs, start))
        budget = floor + float(rng.integers(0, int(sum(c[-1] for c in costs)) + 2))
        pos = allocate_by_curves(curves, costs, budget, start)
        used = sum(c[j] for c, j in zip(costs, pos))
        assert used <= budget
        assert all(j >= s for j, s in zip(pos, start))
        got = sum(l[j] for l, j in zip(curves, pos))
        assert got >= _brute(curves, costs, budget, start) - 1e-9
        # greedy on hulls takes every hull step of the LP prefix that fits in budget - largest step: never worse
        # than the optimum with that much less budget
        biggest = max(float(np.max(np.diff(c))) for c in costs) * max(len(c) for c in costs)
        assert got <= _brute(curves, costs, max(budget - biggest, floor), start) + 1e-9


def test_allocator_is_optimal_on_convex_curves_at_a_breakpoint():
    rng = np.random.default_rng(1)
    for _ in range(200):
        curves, costs = _problem(rng, convex=True)
        lam = float(rng.uniform(0.01, 1.0))  # price per parameter: each unit stops where its slope drops below it
        pick = [int(np.argmin(l + lam * c)) for l, c in zip(curves, costs)]
        budget = float(sum(c[j] for c, j in zip(costs, pick)))
        pos = allocate_by_curves(curves, costs, budget)
        got = sum(l[j] for l, j in zip(curves, pos))
        assert got == pytest.approx(_brute(curves, costs, budget, [0] * len(curves)), abs=1e-9)


def test_allocator_rejects_an_impossible_start():
    with pytest.raises(ValueError):
        allocate_by_curves([np.array([1.0, 0.0])], [np.array([5.0, 9.0])], 4.0)


def test_lowrank_options_and_slope():
    curve = np.array([8.0, 4.0, 2.0, 1.0])
    losses, costs = lowrank_options(curve, 10, 10)  # ranks 0..3 (20 parameters each), then dense (100)
    assert list(costs) == [0.0, 20.0, 40.0, 60.0, 100.0]
    assert list(losses) == [8.0, 4.0, 2.0, 1.0, 0.0]
    losses, costs = lowrank_options(curve, 10, 10, allow_dense=False)
    assert len(losses) == 4
    assert slope_at(losses, costs, 1) == pytest.approx((8.0 - 2.0) / 40.0)
    assert slope_at(losses, costs, 3) == pytest.approx((2.0 - 1.0) / 20.0)
