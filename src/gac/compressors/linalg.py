"""Pure tensor maths for the low-rank compressors: scaled SVD, whitening and factorization. No modules, no hooks
(the inputs' Gram matrix they read is gac.calibration.gram's)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScaledSVD:
    """SVD of W @ S for an input transform S: W [out, in] = U diag(sigma) Vh S^-1.

    S is diag(scale) for a per-channel scale [in] (ASVD), or a lower-triangular whitening matrix [in, in]
    (SVD-LLM), or None (plain SVD)."""

    U: torch.Tensor | None  # [out, k]; None once released (gac.compressors.base: the spectrum kept alone)
    S: torch.Tensor  # [k], descending
    Vh: torch.Tensor | None  # [k, in]; None once released
    scale: torch.Tensor | None  # [in] (diagonal), [in, in] (lower-triangular) or None

    def vectors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(U, Vh), which a released SVD (the spectrum alone) no longer has."""
        if self.U is None or self.Vh is None:
            raise ValueError("this SVD's singular vectors were released: only its spectrum is left")
        return self.U, self.Vh

    @property
    def energy_fraction(self) -> torch.Tensor:
        """Share of ||W S||_F^2 carried by each singular direction, descending, sums to 1."""
        e = self.S.double() ** 2
        return e / e.sum().clamp_min(torch.finfo(torch.float64).tiny)


# How a low-rank compressor takes a weight's spectrum (scaled_svd): exact SVD, or eigh of the smaller Gram matrix in
# float64 or float32; `--factorization auto` picks by device (gac.config.CompressConfig.factorization_method).
FACTORIZATIONS = ("svd", "gram", "gram32")

# gram32 takes a weight's spectrum from a float32 eigendecomposition where that leaves the smallest eigenvalue the
# loss curve reads (at the unit's largest rank, the break-even one) within 1% of its value: eps32 * (s_1 / s_k)^2
# <= 1e-2, i.e. s_1 / s_k up to ~400. Real weights stay well inside it; beyond it the exact SVD runs (after the Gram
# path's cost: rare, so not avoided).
GRAM32_TOLERANCE = 1e-2


def gram_svd(a: torch.Tensor, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD (U, S, Vh) of a [m, n] from the eigendecomposition of its smaller Gram matrix, computed in dtype.

    The Gram matrix's eigenvectors V are orthonormal to working precision; S are the norms of a V's columns (sorted
    descending) and U = a V / S, so U[:, :r] diag(S[:r]) Vh[:r] = a V_r V_r^T is the projection of a onto V_r's span
    at every rank r: the factors cut from it are exactly what the loss model evaluates (its P and Q hold for any
    orthonormal V), and eigh's rounding only moves V_r's span from the optimal one (relative error
    ~ eps * (s_1 / s_r)^2 in the r-th eigenvalue). eigh of the [k, k] Gram matrix (k = min(m, n)) is much faster
    than cuSOLVER's SVD on a GPU, and in float32 faster than LAPACK's SVD on a CPU at Llama-3-8B's shapes. Returned
    in a's dtype."""
    x = a.to(dtype)
    tall = x.shape[0] >= x.shape[1]
    y = x if tall else x.T  # [max(m, n), k]
    _, V = torch.linalg.eigh(y.T @ y)  # [k, k], orthonormal columns
    B = y @ V  # [max(m, n), k]
    S, order = B.norm(dim=0).sort(descending=True)
    V, B = V[:, order], B[:, order]
    inv = torch.where(S > S[0] * 1e-12, 1.0 / S, torch.zeros_like(S))  # null directions get zero vectors
    B = B * inv
    U, V = (B, V) if tall else (V, B)  # U [m, k], V [n, k]
    return U.to(a.dtype), S.to(a.dtype), V.T.contiguous().to(a.dtype)


def gram32_holds(S: torch.Tensor, rank: int | None = None) -> bool:
    """Whether a float32 eigendecomposition is precise enough for a weight of this spectrum S (descending):
    eps32 * (s_1 / s_k)^2 <= GRAM32_TOLERANCE at k = `rank`, the last rank the loss curve reads (None: the last)."""
    k = S.numel() - 1 if rank is None else min(rank, S.numel() - 1)
    if float(S[k]) <= 0:
        return False
    return torch.finfo(torch.float32).eps * float(S[0] / S[k]) ** 2 <= GRAM32_TOLERANCE


def scaled_svd(
    weight: torch.Tensor, scale: torch.Tensor | None = None, method: str = "svd", max_rank: int | None = None
) -> ScaledSVD:
    """SVD of weight @ S in float32: S = diag(scale) for a positive per-input-channel scale [in] (ASVD), or a
    lower-triangular whitening matrix [in, in] (SVD-LLM, from `whiten`). method "svd": torch.linalg.svd (LAPACK);
    "gram": from the eigendecomposition of the smaller Gram matrix in float64 (`gram_svd`); "gram32": the same in
    float32 where `gram32_holds` up to `max_rank` (the largest rank anything reads; None: all), else "svd" (a
    whitened weight, ill-conditioned and kept in float64, always "svd")."""
    if method not in FACTORIZATIONS:
        raise ValueError(f"unknown factorization {method!r}: choose one of {', '.join(FACTORIZATIONS)}")
    w = weight.detach().float()  # [out, in]
    s = None
    if scale is not None and scale.dim() == 1:
        s = scale.detach().float().clamp_min(1e-8)  # [in]
        w = w * s  # broadcast over columns
    elif scale is not None:
        # Whitening matrices can be ill-conditioned: keep this path in float64 (the factors are cast on copy).
        s = scale.detach().double()  # [in, in]
        w = w.double() @ s
    if method == "gram":
        return ScaledSVD(*gram_svd(w), s)
    if method == "gram32" and w.dtype == torch.float32:
        U, S, Vh = gram_svd(w, torch.float32)
        if gram32_holds(S, max_rank):
            return ScaledSVD(U, S, Vh, s)
        log.debug("a %s weight too ill-conditioned for float32 eigh: the exact SVD", tuple(w.shape))
    return ScaledSVD(*tall_svd(w), s)


def tall_svd(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD (U, S, Vh) of a [m, n], taken on the tall one of a and a^T: on a CPU LAPACK's SVD of a wide matrix
    costs several times what its transpose's does (Llama's k, v and down projections are wide)."""
    if a.shape[0] >= a.shape[1]:
        return torch.linalg.svd(a, full_matrices=False)
    V, S, Uh = torch.linalg.svd(a.T, full_matrices=False)  # a^T = V S U^T
    return Uh.T, S, V.T


def factorize_from_svd(svd: ScaledSVD, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-r factors (A [r, in], B [out, r]) with W ~= B @ A; sqrt(S) is split between both sides."""
    if not 1 <= rank <= svd.S.numel():
        raise ValueError(f"rank {rank} outside [1, {svd.S.numel()}]")
    U, Vh = svd.vectors()
    root = svd.S[:rank].sqrt()  # [r]
    B = U[:, :rank] * root  # [out, r]
    A = root[:, None] * Vh[:rank]  # [r, in]
    if svd.scale is not None and svd.scale.dim() == 1:
        A = A / svd.scale  # undo the input scaling: W S = B A'  =>  W = B (A' S^-1)
    elif svd.scale is not None:
        A = torch.linalg.solve_triangular(svd.scale, A, upper=False, left=False)  # A' S^-1, S lower-triangular
    return A, B


def whiten(xtx: torch.Tensor, *, max_tries: int = 8) -> torch.Tensor:
    """Lower-triangular S with S S^T = X^T X (Cholesky, float64), so ||W X^T||_F = ||W S||_F.

    X^T X from few tokens or dead channels is only semi-definite: add a growing ridge (relative to its mean
    diagonal) until the factorization succeeds."""
    xtx = xtx.double()
    ridge = 0.0
    eye = torch.eye(xtx.shape[0], dtype=xtx.dtype, device=xtx.device)
    mean_diag = float(xtx.diagonal().mean().clamp_min(1e-12))
    for attempt in range(max_tries):
        S, info = torch.linalg.cholesky_ex(xtx + ridge * eye)
        if int(info) == 0:
            return S
        ridge = mean_diag * (1e-6 * 10**attempt)
    raise ValueError("X^T X is not positive definite even with a ridge; calibrate on more tokens")
