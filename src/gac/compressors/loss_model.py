"""The loss model behind allocation: predicted calibration-loss increase of each weight at each dim, and a generic
allocator over such curves. Pure tensor maths (numpy / torch): no modules, no names, no model access.

Loss model (one linear y = W x, any rank-r factorization W_r = W - dW):
    dL(r) ~= 1/2 * E_t[ sum_j f_j (dW x_t)_j^2 ] = 1/2 * tr(diag(f) dW C dW^T)
with C = E_t[x x^T] (calibration inputs) and f_j = E_t[(dl_t/dy_tj)^2], the Fisher on the layer's output channel j of
the model's own predictive distribution (l_t the cross-entropy against a label drawn from the model's softmax at t:
gac.calibration.importance.output_fisher), i.e. a diagonal Gauss-Newton model of the KL divergence from the original in
the layer's outputs, with the output-gradient scale taken independent of the output error. For a factorization from
the SVD of W S (S an input transform: diag(scale) for ASVD, a whitening matrix for SVD-LLM, identity for plain SVD),
W S = U diag(s) V^T, dW = U_tail diag(s_tail) V_tail^T S^-1 and
    dL(r) = 1/2 * sum_{i,k >= r} s_i s_k P_ik Q_ik,   P = U^T diag(f) U,   Q = (V^T S^-1) C (V^T S^-1)^T,
exact for the factorization the compressor materializes, whatever its input transform: that is why the same model
holds for asvd, svd_llm and palu (and would for any other factorization given its dW).
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import torch

from gac.calibration.gram import Gram
from gac.compressors.allocation import greedy_steps


def truncation_factors(
    U: torch.Tensor,
    S: torch.Tensor,
    Vh: torch.Tensor,
    scale: torch.Tensor | None,
    gram: Gram,
    out_fisher: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(s [k], P [k, k], Q [k, k]) in float64 for the curve of the factorization W S = U diag(S) Vh.

    scale: None, [in] (W S = W diag(scale)) or [in, in] lower-triangular (W S = W @ scale).
    gram: C = E[x x^T] (or a multiple of it: Q scales alike), as the inputs' rows or their [in, in] sum.
    out_fisher: f [out] (None: every output channel counts 1, i.e. the plain output error)."""
    # float64 throughout: a whitening transform is ill-conditioned and its Q ~ I comes from cancellation (float32
    # would do for a diagonal transform on an accelerator).
    dtype = torch.float64
    if scale is None:
        A = Vh.to(dtype)
    elif scale.dim() == 1:
        A = Vh.to(dtype) / scale.to(dtype)
    else:
        A = torch.linalg.solve_triangular(scale.double(), Vh.double(), upper=False, left=False)  # Vh S^-1
    Q = gram.sandwich(A)
    U = U.to(dtype)
    P = U.T @ U if out_fisher is None else (U.T * out_fisher.to(dtype)) @ U
    return S.double(), P.double(), Q.double()


def lowrank_loss_curve(
    s: torch.Tensor | np.ndarray, P: torch.Tensor | np.ndarray, Q: torch.Tensor | np.ndarray, cap: int | None = None
) -> np.ndarray:
    """Predicted loss increase at rank r = 0..cap (float64 [cap + 1]) from truncation_factors' output:
    1/2 * sum_{i,k >= r} s_i s_k P_ik Q_ik. Non-negative and 0 at full rank when P and Q are PSD."""
    s, P, Q = (torch.as_tensor(t, dtype=torch.float64) for t in (s, P, Q))  # a tensor's own values, cast
    k = s.numel()
    cap = k if cap is None else min(cap, k)
    M = 0.5 * (s[:, None] * s[None, :]) * P * Q  # [k, k]
    tail = M.flip(0).cumsum(0).flip(0)  # tail[i, j] = sum_{i' >= i} M[i', j]
    rows = tail.flip(1).cumsum(1).flip(1)  # rows[i, j] = sum_{i' >= i, j' >= j} M
    curve = rows.diagonal().clamp_min(0.0).cpu().numpy()  # [k]: r = 0..k-1
    curve = np.concatenate([curve, [0.0]])  # r = k: nothing truncated
    return np.minimum.accumulate(curve)[: cap + 1]  # more rank never predicts more loss


def lower_hull(costs: np.ndarray, losses: np.ndarray, start: int = 0) -> list[int]:
    """Indices (from `start`, increasing cost) of the lower convex hull of the points (costs[i], losses[i]) that
    still decrease the loss: the only points a greedy by loss decrease per cost should stop at."""
    hull: list[int] = []
    for i in range(start, len(costs)):
        if hull and losses[i] >= losses[hull[-1]]:
            continue  # costs more, loses no less: never worth it
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is above (or on) the chord a -> i: drop it
            if (losses[b] - losses[a]) * (costs[i] - costs[a]) >= (losses[i] - losses[a]) * (costs[b] - costs[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    return hull


def allocate_by_curves(
    curves: list[np.ndarray], costs: list[np.ndarray], budget: float, start: list[int] | None = None
) -> list[int]:
    """Choose one option per unit minimizing the summed predicted loss under a parameter budget.

    curves[i][j]: predicted loss of unit i at option j; costs[i][j]: its parameters (increasing in j).
    start[i]: the smallest option allowed (default 0). Greedy over each unit's lower convex hull by loss
    decrease per parameter (optimal at every budget the greedy lands on exactly; non-convex curves are handled by
    the hull), then the leftover budget is filled point by point. Returns the option index per unit; the chosen
    costs never exceed the budget (ValueError if the start options alone do)."""
    n = len(curves)
    start = [0] * n if start is None else list(start)
    pos = list(start)
    used = float(sum(costs[i][pos[i]] for i in range(n)))
    if used > budget:
        raise ValueError(f"the smallest options cost {used:.0f} > budget {budget:.0f}")
    hulls = [lower_hull(np.asarray(costs[i], float), np.asarray(curves[i], float), start[i]) for i in range(n)]
    # the hull's segments are steps with non-increasing loss decrease per parameter: the one greedy allocator
    gains = [np.array([float(curves[i][a] - curves[i][b]) for a, b in pairwise(h)]) for i, h in enumerate(hulls)]
    steps = [np.array([costs[i][b] - costs[i][a] for a, b in pairwise(h)]) for i, h in enumerate(hulls)]
    taken = greedy_steps(gains, steps, used, budget)
    pos = [h[t] for h, t in zip(hulls, taken)]
    used = float(sum(costs[i][pos[i]] for i in range(n)))
    # fill: single points past the current option, best loss decrease per parameter first, while any fits
    while True:
        best = None
        for i in range(n):
            c, loss = costs[i], curves[i]
            for j in range(pos[i] + 1, len(c)):
                dc = float(c[j] - c[pos[i]])
                if used + dc > budget:
                    break
                gain = float(loss[pos[i]] - loss[j])
                if gain > 0 and (best is None or gain / max(dc, 1e-12) > best[0]):
                    best = (gain / max(dc, 1e-12), i, j, dc)
        if best is None:
            return pos
        _, i, j, dc = best
        used += dc
        pos[i] = j


def slope_at(curve: np.ndarray, costs: np.ndarray, j: int, halfwidth: int = 1) -> float:
    """Predicted loss decrease per parameter around option j (secant over j +- halfwidth, clipped to the curve):
    the knapsack's score, a first-order model of quality around the compressor's own dim."""
    lo, hi = max(0, j - halfwidth), min(len(curve) - 1, j + halfwidth)
    if hi == lo:
        return 0.0
    return max(float(curve[lo] - curve[hi]) / float(costs[hi] - costs[lo]), 0.0)


def lowrank_options(
    curve: np.ndarray, in_features: int, out_features: int, allow_dense: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(losses, costs) of a low-rank weight's options: ranks 0..cap from `curve` (cap = curve's last rank), then
    dense (loss 0, in*out parameters) when allowed."""
    cap = len(curve) - 1
    costs = np.arange(cap + 1, dtype=np.float64) * (in_features + out_features)
    losses = np.asarray(curve, dtype=np.float64)
    if allow_dense:
        costs = np.append(costs, float(in_features * out_features))
        losses = np.append(losses, 0.0)
    return losses, costs
