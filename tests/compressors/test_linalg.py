"""Scaled SVD and factorization on small random matrices: error falls with rank, scaled optimality, shapes."""

import itertools

import pytest
import torch

from gac.calibration.gram import Gram
from gac.compressors.linalg import factorize_from_svd, gram32_holds, scaled_svd, tall_svd, whiten
from gac.models.kinds.rank import max_useful_rank

SHAPES = [(8, 6), (6, 8), (24, 16)]  # [out, in]: tall, wide, and the one used with a scale


def _matrix(out_f, in_f, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_f, in_f, generator=g, dtype=torch.float64).float()  # [out, in]


def factorize(W, rank, scale=None):
    """The compressors' path: the (optionally input-scaled) SVD, then its rank-r factors (A, B)."""
    return factorize_from_svd(scaled_svd(W, scale), rank)


def _scale(in_f, seed=1):
    """Positive, strongly uneven per-input-channel factors (like ASVD's activation scales)."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(in_f, generator=g).mul(9.0).add(0.1)  # [in] in [0.1, 9.1)


def _err(weight, A, B, scale=None):
    """||(W - B A) diag(scale)||_F in float64."""
    diff = weight.double() - B.double() @ A.double()  # [out, in]
    if scale is not None:
        diff = diff * scale.double()
    return float(torch.linalg.matrix_norm(diff))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scaled", [False, True])
def test_error_strictly_decreases_with_rank_and_vanishes_at_full_rank(shape, scaled):
    out_f, in_f = shape
    W = _matrix(out_f, in_f)
    s = _scale(in_f) if scaled else None
    full = min(out_f, in_f)
    errs = [_err(W, *factorize(W, r, s), s) for r in range(1, full + 1)]
    assert all(a > b for a, b in zip(errs, errs[1:])), errs
    ref = float(torch.linalg.matrix_norm(W.double() * (s.double() if scaled else 1.0)))
    assert errs[-1] <= 1e-5 * ref
    assert errs[0] > 1e-2 * ref  # rank 1 of a random matrix is far from exact


@pytest.mark.parametrize("shape", SHAPES)
def test_factor_shapes(shape):
    out_f, in_f = shape
    W = _matrix(out_f, in_f)
    for r in (1, min(shape) // 2, min(shape)):
        for s in (None, _scale(in_f)):
            A, B = factorize(W, r, s)
            assert A.shape == (r, in_f)
            assert B.shape == (out_f, r)
            assert A.dtype == B.dtype == torch.float32


@pytest.mark.parametrize("shape", SHAPES)
def test_scaled_factorization_minimizes_scaled_error(shape):
    """Eckart-Young in the scaled norm: no other rank-r factorization (here: plain SVD's) does better."""
    out_f, in_f = shape
    W = _matrix(out_f, in_f, seed=3)
    s = _scale(in_f, seed=4)
    strictly_better = 0
    for r in range(1, min(shape)):
        scaled_err = _err(W, *factorize(W, r, s), s)
        plain_err = _err(W, *factorize(W, r), s)
        assert scaled_err <= plain_err * (1 + 1e-5) + 1e-6
        strictly_better += scaled_err < plain_err * (1 - 1e-3)
    assert strictly_better > 0  # the scale actually changed the solution


def test_scaled_error_equals_discarded_singular_values():
    """The scaled residual at rank r is the root of the discarded squared singular values of W diag(s)."""
    W, s = _matrix(24, 16, seed=5), _scale(16, seed=6)
    svd = scaled_svd(W, s)
    for r in range(1, 16):
        expected = float(svd.S[r:].double().pow(2).sum().sqrt())
        assert _err(W, *factorize_from_svd(svd, r), s) == pytest.approx(expected, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scaled", [False, True])
def test_energy_fractions_descend_sum_to_one_and_match_residual(shape, scaled):
    out_f, in_f = shape
    W = _matrix(out_f, in_f, seed=7)
    s = _scale(in_f) if scaled else None
    svd = scaled_svd(W, s)
    e = svd.energy_fraction
    assert e.numel() == min(shape)
    assert bool((e > 0).all())
    assert bool((e[:-1] >= e[1:]).all())
    assert float(e.sum()) == pytest.approx(1.0, abs=1e-12)
    total = float(torch.linalg.matrix_norm(W.double() * (s.double() if scaled else 1.0))) ** 2
    for r in range(1, min(shape)):  # lost energy share == relative squared residual
        lost = 1.0 - float(e[:r].sum())
        assert _err(W, *factorize_from_svd(svd, r), s) ** 2 / total == pytest.approx(lost, rel=1e-3, abs=1e-6)


def test_max_useful_rank_brute_force():
    for in_f, out_f in itertools.product(range(1, 25), range(1, 25)):
        saving = [r for r in range(0, min(in_f, out_f) + 1) if r * (in_f + out_f) < in_f * out_f]
        assert max_useful_rank(in_f, out_f) == max(saving), (in_f, out_f)


@pytest.mark.parametrize("rank", [0, -1, 7, 100])
def test_invalid_rank_raises(rank):
    W = _matrix(8, 6)
    with pytest.raises(ValueError, match="rank"):
        factorize(W, rank)
    with pytest.raises(ValueError, match="rank"):
        factorize_from_svd(scaled_svd(W, _scale(6)), rank)


@pytest.mark.parametrize("shape", [(24, 16), (16, 24), (20, 20)])
@pytest.mark.parametrize("scaled", ["none", "diag", "whiten"])
def test_gram_factorization_matches_svd(shape, scaled):
    """The Gram path gives the same spectrum and the same rank-r approximations as the exact SVD."""
    g = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(*shape, generator=g)
    scale = None
    if scaled == "diag":
        scale = torch.rand(shape[1], generator=g) + 0.1
    elif scaled == "whiten":
        x = torch.randn(4 * shape[1], shape[1], generator=g)
        scale = whiten(x.T @ x)
    exact, gram = scaled_svd(w, scale, "svd"), scaled_svd(w, scale, "gram")
    assert gram.S.shape == exact.S.shape and gram.U.shape == exact.U.shape and gram.Vh.shape == exact.Vh.shape
    assert torch.allclose(gram.S.double(), exact.S.double(), rtol=1e-4, atol=1e-5 * float(exact.S[0]))
    for rank in (1, min(shape) // 2, min(shape)):
        a1, b1 = factorize_from_svd(exact, rank)
        a2, b2 = factorize_from_svd(gram, rank)
        ref = (b1 @ a1).double()
        assert float(((b2 @ a2).double() - ref).norm() / ref.norm()) < 1e-4


@pytest.mark.parametrize("shape", [(40, 24), (24, 40)])
def test_gram32_is_the_projection_onto_its_eigenvectors_and_near_the_svds_error(shape):
    """gram32 in float32: S descending, Vh orthonormal rows, U diag(S) Vh = W S V V^T at every rank (so the factors
    are what the loss model evaluates), and the truncation error within 1e-4 of the exact SVD's (a well-conditioned
    weight: the float32 path runs, not the fallback)."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(*shape, generator=g)
    scale = torch.rand(shape[1], generator=g) + 0.5
    fast, exact = scaled_svd(w, scale, "gram32"), scaled_svd(w, scale, "svd")
    assert fast.S.dtype == torch.float32 and bool((fast.S[:-1] >= fast.S[1:]).all())
    assert gram32_holds(fast.S)
    eye = torch.eye(fast.Vh.shape[0])
    assert torch.allclose(fast.Vh @ fast.Vh.T, eye, atol=1e-5)
    a = (w * scale).double()
    for rank in (1, min(shape) // 2, min(shape) - 1):
        approx = {m: (f.U[:, :rank] * f.S[:rank]).double() @ f.Vh[:rank].double() for m, f in
                  (("fast", fast), ("exact", exact))}
        V = fast.Vh[:rank].double().T
        assert torch.allclose(approx["fast"], a @ V @ V.T, atol=1e-5 * float(a.norm()))
        err = {m: float((a - x).norm()) for m, x in approx.items()}
        assert err["fast"] == pytest.approx(err["exact"], rel=1e-4)
    assert not torch.equal(fast.U, exact.U)  # it did not fall back


def test_gram32_falls_back_to_the_exact_svd_where_float32_eigh_is_too_coarse():
    """A weight whose s_1 / s_k at the break-even rank (11 of 20) is ~3e3 (eps32 * 9e6 ~ 1 > GRAM32_TOLERANCE), and a
    whitened one (float64): both get the exact SVD, to the bit."""
    g = torch.Generator().manual_seed(8)
    q1, _ = torch.linalg.qr(torch.randn(30, 30, generator=g))
    q2, _ = torch.linalg.qr(torch.randn(20, 20, generator=g))
    s = torch.logspace(0, -6, 20)
    w = (q1[:, :20] * s) @ q2.T  # [30, 20]
    k = max_useful_rank(20, 30)
    assert gram32_holds(scaled_svd(w, None, "gram").S, 2) and not gram32_holds(scaled_svd(w, None, "gram").S, k)
    assert torch.equal(scaled_svd(w, None, "gram32", k).U, scaled_svd(w, None, "svd").U)
    assert not torch.equal(scaled_svd(w, None, "gram32", 2).U, scaled_svd(w, None, "svd").U)  # precise to rank 2
    x = torch.randn(80, 20, generator=g, dtype=torch.float64)
    white = whiten(x.T @ x)
    assert torch.equal(scaled_svd(w, white, "gram32").S, scaled_svd(w, white, "svd").S)


def test_gram_factorization_of_rank_deficient_matrix_has_no_nans():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(12, 3, generator=g) @ torch.randn(3, 10, generator=g)  # rank 3
    svd = scaled_svd(w, None, "gram")
    assert torch.isfinite(svd.U).all() and torch.isfinite(svd.Vh).all()
    a, b = factorize_from_svd(svd, 3)
    assert float((b @ a - w).norm() / w.norm()) < 1e-4


def test_unknown_factorization_is_refused():
    with pytest.raises(ValueError, match="unknown factorization"):
        scaled_svd(torch.ones(3, 2), None, "qr")


def test_gram_keeps_rows_while_fewer_than_columns_then_sums_them_in_order():
    """Rows while they are fewer than the columns; then the matrix is the per-batch sum of x^T x in the order the
    batches came, to the bit."""
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(3, 8, generator=g) for _ in range(4)]  # float32 in, float64 sums
    gram = Gram(8)
    gram.add(batches[0])
    gram.add(batches[1])
    assert gram.sum is None and gram.row_count == 6
    X = torch.cat(batches[:2]).double()
    torch.testing.assert_close(gram.matrix(), X.T @ X, rtol=1e-12, atol=1e-12)
    A = torch.randn(5, 8, generator=g, dtype=torch.float64)
    torch.testing.assert_close(gram.sandwich(A), A @ X.T @ X @ A.T, rtol=1e-12, atol=1e-12)
    gram.add(batches[2])  # 9 rows > 8 columns: summed from here on
    gram.add(batches[3])
    assert gram.rows == []
    expected = torch.zeros(8, 8, dtype=torch.float64)
    for b in batches:
        expected += b.double().T @ b.double()
    assert torch.equal(gram.matrix(), expected)
    assert torch.equal(gram.sandwich(A), (A @ expected) @ A.T)


def test_gram_rows_are_copies():
    x = torch.ones(2, 4)
    gram = Gram(4)
    gram.add(x)
    x.zero_()  # the activation's memory reused
    assert torch.equal(gram.matrix(), torch.full((4, 4), 2.0, dtype=torch.float64))


@pytest.mark.parametrize("shape", SHAPES)
def test_tall_svd_is_the_svd_of_either_orientation(shape):
    """Taken on the transpose when the matrix is wide: still a thin SVD of the matrix itself."""
    W = _matrix(*shape).double()
    U, S, Vh = tall_svd(W)
    k = min(shape)
    assert U.shape == (shape[0], k) and S.shape == (k,) and Vh.shape == (k, shape[1])
    torch.testing.assert_close((U * S) @ Vh, W, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(U.T @ U, torch.eye(k, dtype=W.dtype), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(Vh @ Vh.T, torch.eye(k, dtype=W.dtype), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, torch.linalg.svdvals(W), rtol=1e-10, atol=1e-10)
