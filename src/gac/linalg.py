"""Pure tensor maths for low-rank compression: scaled SVD and factorization. No modules, no hooks."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScaledSVD:
    """SVD of W @ diag(scale): W [out, in] = U diag(S) Vh diag(scale)^-1."""

    U: torch.Tensor  # [out, k]
    S: torch.Tensor  # [k], descending
    Vh: torch.Tensor  # [k, in]
    scale: torch.Tensor | None  # [in] or None

    @property
    def energy_fraction(self) -> torch.Tensor:
        """Share of ||W diag(scale)||_F^2 carried by each singular direction, descending, sums to 1."""
        e = self.S.double() ** 2
        return e / e.sum().clamp_min(torch.finfo(torch.float64).tiny)


def scaled_svd(weight: torch.Tensor, scale: torch.Tensor | None = None) -> ScaledSVD:
    """SVD of weight @ diag(scale) in float32 (scale: positive per-input-channel factors, e.g. ASVD's)."""
    w = weight.detach().float()  # [out, in]
    s = None
    if scale is not None:
        s = scale.detach().float().clamp_min(1e-8)  # [in]
        w = w * s  # broadcast over columns
    U, S, Vh = torch.linalg.svd(w, full_matrices=False)
    return ScaledSVD(U, S, Vh, s)


def factorize_from_svd(svd: ScaledSVD, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-r factors (A [r, in], B [out, r]) with W ~= B @ A; sqrt(S) is split between both sides."""
    if not 1 <= rank <= svd.S.numel():
        raise ValueError(f"rank {rank} outside [1, {svd.S.numel()}]")
    root = svd.S[:rank].sqrt()  # [r]
    B = svd.U[:, :rank] * root  # [out, r]
    A = root[:, None] * svd.Vh[:rank]  # [r, in]
    if svd.scale is not None:
        A = A / svd.scale  # undo the input scaling: W S = B A'  =>  W = B (A' S^-1)
    return A, B


def factorize(weight: torch.Tensor, rank: int, scale: torch.Tensor | None = None):
    """Best rank-r approximation of weight in the (optionally input-scaled) Frobenius norm, as (A, B)."""
    return factorize_from_svd(scaled_svd(weight, scale), rank)


def lowrank_params(in_features: int, out_features: int, rank: int) -> int:
    return rank * (in_features + out_features)


def max_useful_rank(in_features: int, out_features: int) -> int:
    """Largest rank whose factorization has fewer parameters than the dense weight."""
    return (in_features * out_features - 1) // (in_features + out_features)
