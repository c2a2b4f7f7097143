"""Zero padding is exact for each structure: a low-rank pair, a linear and its consumer, a gated MLP."""

import pytest
import torch
import torch.nn.functional as F

from gac.padding import next_multiple, pad_cols, pad_lowrank, pad_mlp, pad_producer_consumer, pad_rows


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


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
    torch.testing.assert_close(x @ a2.T @ b2.T, x @ a.T @ b.T, atol=1e-6, rtol=0)
    torch.testing.assert_close(b2 @ a2, b @ a, atol=1e-6, rtol=0)


@pytest.mark.parametrize("act", [F.silu, F.relu, F.gelu, torch.sigmoid, lambda t: t], ids=["silu", "relu", "gelu",
                                                                                           "sigmoid", "identity"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_and_consumer_exact(act, bias):
    w1, w2, x = _randn(13, 24, seed=4), _randn(10, 13, seed=5), _randn(6, 24, seed=6)
    b1 = _randn(13, seed=7) if bias else None
    w1p, b1p, w2p = pad_producer_consumer(w1, b1, w2, 16)
    assert w1p.shape == (16, 24) and w2p.shape == (10, 16) and (b1p is None) == (b1 is None)
    if bias:
        assert b1p.shape == (16,) and torch.count_nonzero(b1p[13:]) == 0
    torch.testing.assert_close(F.linear(act(F.linear(x, w1p, b1p)), w2p), F.linear(act(F.linear(x, w1, b1)), w2),
                               atol=1e-6, rtol=0)


def test_mlp_width_exact():
    gate, up, down, x = _randn(150, 64, seed=8), _randn(150, 64, seed=9), _randn(64, 150, seed=10), _randn(7, 64)

    def mlp(g, u, d):
        return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)  # [N, 64]

    g2, u2, d2 = pad_mlp(gate, up, down, 160)
    assert g2.shape == u2.shape == (160, 64) and d2.shape == (64, 160)
    inner = F.silu(F.linear(x, g2)) * F.linear(x, u2)
    assert torch.count_nonzero(inner[:, 150:]) == 0  # silu(0) * 0 = 0: the new channels carry nothing
    torch.testing.assert_close(mlp(g2, u2, d2), mlp(gate, up, down), atol=1e-6, rtol=0)


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
    with pytest.raises(ValueError, match="width"):
        pad_producer_consumer(_randn(4, 6), None, _randn(5, 3), 8)
    with pytest.raises(ValueError, match="one MLP"):
        pad_mlp(_randn(4, 6), _randn(4, 6), _randn(6, 5), 8)
