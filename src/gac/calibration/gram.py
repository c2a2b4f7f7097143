"""The inputs' Gram matrix X^T X of one linear, collected on calibration windows batch by batch: pure tensor maths,
no modules, no hooks."""

from __future__ import annotations

import torch


class Gram:
    """X^T X [in, in] (float64) of a linear's inputs X [t, in], added batch by batch. While the rows are fewer than
    the columns they are kept as they come (in their own dtype, exact in float64) instead of summed: cheaper to
    collect (no [in, in] product per batch), to hold, and to apply, since A X^T X A^T = (A X^T)(A X^T)^T costs t/in
    of the product with the [in, in] matrix (at Llama-3-8B's MLP width, 1024 tokens against 14336 columns). Once
    they would outnumber the columns, the matrix is summed batch by batch in the order they came, the same sums
    as adding every batch's product at once."""

    def __init__(self, width: int):
        self.width = width
        self.rows: list[torch.Tensor] = []  # [t_b, in] per batch, while sum(t_b) <= width
        self.sum: torch.Tensor | None = None  # [in, in] float64 once summed

    @classmethod
    def of_matrix(cls, matrix: torch.Tensor) -> Gram:
        """A Gram given as its matrix C [in, in]."""
        gram = cls(matrix.shape[0])
        gram.sum = matrix.double()
        return gram

    @property
    def row_count(self) -> int:
        return sum(r.shape[0] for r in self.rows)

    def add(self, x: torch.Tensor) -> None:
        """Add the inputs x [t, in] of one batch."""
        if self.sum is None and self.row_count + x.shape[0] <= self.width:
            self.rows.append(x.detach().clone())  # a copy: the model may reuse the activation's memory
            return
        if self.sum is None:
            self.sum = torch.zeros(self.width, self.width, dtype=torch.float64, device=x.device)
            for r in self.rows:
                _accumulate(self.sum, r)
            self.rows = []
        _accumulate(self.sum, x)

    def matrix(self) -> torch.Tensor:
        """X^T X [in, in] float64."""
        if self.sum is not None:
            return self.sum
        x = self._stacked()
        return x.T @ x

    def sandwich(self, A: torch.Tensor) -> torch.Tensor:
        """A X^T X A^T [k, k] float64 for A [k, in], on A's device."""
        A = A.double()
        if self.sum is not None:
            return (A @ self.sum.to(A.device)) @ A.T
        y = A @ self._stacked().to(A.device).T  # [k, t]
        return y @ y.T

    def _stacked(self) -> torch.Tensor:
        if not self.rows:
            return torch.zeros(0, self.width, dtype=torch.float64)
        return torch.cat([r.double() for r in self.rows])  # [t, in]


def _accumulate(total: torch.Tensor, x: torch.Tensor) -> None:
    """total [in, in] += x^T x in float64, in place."""
    xd = x.double()
    total += xd.T @ xd  # [in, in]
