"""Zero padding for each structure (a low-rank pair, a linear and its consumer, a gated MLP) computes the same
function: exactly in exact arithmetic, and within fp32 reassociation error in floating point.

Why not bit-exact: every padded product is an exact zero, but a wider inner dim changes how the BLAS blocks
and orders its sums (AVX-512 on one CPU, AVX2 on another, a different split on a GPU), so the same non-zero
terms are added in another order. Two orders of a length-n dot product differ by at most ~2 n eps sum|x_i w_i|,
so the tolerance here scales with the magnitude of the terms, not with a fixed 1e-6. With integer-valued
inputs every partial sum is exactly representable, the order does not matter, and the outputs are
bit-identical on any BLAS: that is the exact-arithmetic statement, tested as such.
"""

import pytest
import torch
import torch.nn.functional as F

from gac.models.padding import next_multiple, pad_cols, pad_lowrank, pad_rows


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def _ints(*shape, seed=0):
    """Small integers stored as fp32: every sum of their products is exact, whatever the summation order."""
    return torch.randint(-3, 4, shape, generator=torch.Generator().manual_seed(seed)).to(torch.float32)


EPS = torch.finfo(torch.float32).eps


def assert_reassoc_close(actual, expected, bound):
    """|actual - expected| <= 2 * bound elementwise, where `bound` is the first-order error bound of one fp32
    evaluation (float64, from |inputs|): each result is within `bound` of the exact value."""
    err = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    tol = 2 * bound + torch.finfo(torch.float32).tiny
    assert bool((err <= tol).all()), f"max error {err.max():.3g} exceeds the reassociation bound {tol.max():.3g}"


def _dot_bound(a_abs, b_abs_t, n):
    """Rounding bound of the products a @ b with n-term sums in any order: n * eps * (|a| @ |b|)."""
    return n * EPS * (a_abs @ b_abs_t)


def _abs64(t):
    return None if t is None else t.abs().to(torch.float64)


@pytest.mark.parametrize(("d", "n", "expected"), [(0, 8, 0), (1, 8, 8), (8, 8, 8), (13, 8, 16), (27, 16, 32),
                                                  (150, 8, 152), (7, 1, 7)])
def test_next_multiple(d, n, expected):
    assert next_multiple(d, n) == expected


@pytest.mark.parametrize(("d", "n"), [(5, 0), (-1, 8)])
def test_next_multiple_rejects(d, n):
    with pytest.raises(ValueError):
        next_multiple(d, n)


@pytest.mark.parametrize("rank", [13, 16, 40])
def test_lowrank_pair_exact(rank):
    a, b, x = _randn(13, 24, seed=1), _randn(20, 13, seed=2), _randn(5, 24, seed=3)  # A [r, in], B [out, r], x [N, in]
    a2, b2 = pad_lowrank(a, b, rank)
    assert a2.shape == (rank, 24) and b2.shape == (20, rank)
    assert torch.count_nonzero(a2[13:]) == 0 and torch.count_nonzero(b2[:, 13:]) == 0
    ax, aa, ab = _abs64(x), _abs64(a), _abs64(b)
    e_t = _dot_bound(ax, aa.T, 24)  # t = x A^T, then y = t B^T, with t's own error carried through B
    bound = _dot_bound((x.double() @ a.double().T).abs() + e_t, ab.T, rank) + e_t @ ab.T
    assert_reassoc_close(x @ a2.T @ b2.T, x @ a.T @ b.T, bound)
    assert_reassoc_close(b2 @ a2, b @ a, _dot_bound(ab, aa, rank))


@pytest.mark.parametrize("rank", [13, 16, 40])
def test_lowrank_pair_bit_identical_on_integers(rank):
    a, b, x = _ints(13, 24, seed=1), _ints(20, 13, seed=2), _ints(5, 24, seed=3)
    a2, b2 = pad_lowrank(a, b, rank)
    assert torch.equal(x @ a2.T @ b2.T, x @ a.T @ b.T) and torch.equal(b2 @ a2, b @ a)


def _pad_producer_consumer(w1, b1, w2, width):
    """What surgery does to an MLP width group: zero rows on each producer (and its bias), zero columns on each
    consumer. Exact for any elementwise f between them: a new channel is f(0), read through a zero column."""
    w1p, b1p = pad_rows(w1, width, b1)
    return w1p, b1p, pad_cols(w2, width)


def _pad_mlp(gate, up, down, width):
    """A gated MLP's width group: gate and up are producers, down the consumer (silu(0) * 0 = 0)."""
    return pad_rows(gate, width)[0], pad_rows(up, width)[0], pad_cols(down, width)


@pytest.mark.parametrize("act", [F.silu, F.relu, F.gelu, torch.sigmoid, lambda t: t], ids=["silu", "relu", "gelu",
                                                                                           "sigmoid", "identity"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_and_consumer_exact(act, bias):
    w1, w2, x = _randn(13, 24, seed=4), _randn(10, 13, seed=5), _randn(6, 24, seed=6)
    b1 = _randn(13, seed=7) if bias else None
    w1p, b1p, w2p = _pad_producer_consumer(w1, b1, w2, 16)
    assert w1p.shape == (16, 24) and w2p.shape == (10, 16) and (b1p is None) == (b1 is None)
    if bias:
        assert b1p.shape == (16,) and torch.count_nonzero(b1p[13:]) == 0
    h = F.linear(x.double(), w1.double(), None if b1 is None else b1.double())
    e_h = _dot_bound(_abs64(x), _abs64(w1).T, 25) + (0 if b1 is None else 2 * EPS * _abs64(b1))
    e_a = 1.2 * e_h + EPS * act(h).abs()  # these activations are at most 1.2-Lipschitz, plus their own rounding
    bound = _dot_bound(act(h).abs() + e_a, _abs64(w2).T, 16) + e_a @ _abs64(w2).T
    assert_reassoc_close(F.linear(act(F.linear(x, w1p, b1p)), w2p), F.linear(act(F.linear(x, w1, b1)), w2), bound)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_and_consumer_bit_identical_on_integers(bias):
    w1, w2, x = _ints(13, 24, seed=4), _ints(10, 13, seed=5), _ints(6, 24, seed=6)
    b1 = _ints(13, seed=7) if bias else None
    w1p, b1p, w2p = _pad_producer_consumer(w1, b1, w2, 16)
    for act in (F.relu, lambda t: t):  # integer in, integer out
        assert torch.equal(F.linear(act(F.linear(x, w1p, b1p)), w2p), F.linear(act(F.linear(x, w1, b1)), w2))


def test_mlp_width_exact():
    gate, up, down, x = _randn(150, 64, seed=8), _randn(150, 64, seed=9), _randn(64, 150, seed=10), _randn(7, 64)

    def mlp(g, u, d):
        return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)  # [N, 64]

    g2, u2, d2 = _pad_mlp(gate, up, down, 160)
    assert g2.shape == u2.shape == (160, 64) and d2.shape == (64, 160)
    inner = F.silu(F.linear(x, g2)) * F.linear(x, u2)
    assert torch.count_nonzero(inner[:, 150:]) == 0  # silu(0) * 0 = 0: the new channels carry nothing
    g, u = x.double() @ gate.double().T, x.double() @ up.double().T
    e_g, e_u = _dot_bound(_abs64(x), _abs64(gate).T, 64), _abs64(x) @ _abs64(up).T * 64 * EPS
    inner = F.silu(g) * u
    e_in = 1.2 * e_g * u.abs() + (F.silu(g).abs() + 1.2 * e_g) * e_u + 3 * EPS * inner.abs()
    bound = _dot_bound(inner.abs() + e_in, _abs64(down).T, 160) + e_in @ _abs64(down).T
    assert_reassoc_close(mlp(g2, u2, d2), mlp(gate, up, down), bound)


def test_mlp_width_bit_identical_on_integers():
    gate, up, down, x = _ints(150, 64, seed=8), _ints(150, 64, seed=9), _ints(64, 150, seed=10), _ints(7, 64)

    def mlp(g, u, d):  # relu-gated: integer in, integer out, so summation order cannot matter
        return F.linear(F.relu(F.linear(x, g)) * F.linear(x, u), d)

    g2, u2, d2 = _pad_mlp(gate, up, down, 160)
    assert torch.equal(mlp(g2, u2, d2), mlp(gate, up, down))


def test_rows_and_cols_keep_dtype_and_values():
    w = _randn(3, 5).to(torch.bfloat16)
    rows, bias = pad_rows(w, 8, torch.ones(3, dtype=torch.bfloat16))
    cols = pad_cols(w, 8)
    assert rows.dtype == cols.dtype == bias.dtype == torch.bfloat16
    assert torch.equal(rows[:3], w) and torch.equal(cols[:, :5], w)
    assert torch.equal(bias, torch.tensor([1, 1, 1, 0, 0, 0, 0, 0], dtype=torch.bfloat16))


def test_shape_errors():
    with pytest.raises(ValueError, match="down"):
        pad_rows(_randn(5, 3), 4)
    with pytest.raises(ValueError, match="inner rank"):
        pad_lowrank(_randn(4, 6), _randn(5, 3), 8)
