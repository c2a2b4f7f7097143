"""How much to keep: split a parameter budget into per-weight ranks by importance. Pure numpy."""

from __future__ import annotations

import heapq

import numpy as np

from gac.errors import GacError

DENSE = None  # a weight whose allocation reaches the break-even rank stays dense


def allocate_ranks(energies: list[np.ndarray], scores: list[float], shapes: list[tuple[int, int]],
                   budget: int, *, allow_dense: bool = True) -> list[int | None]:
    """Greedy global allocation of rank units by importance gained per parameter.

    energies[i]: energy fraction per singular direction of weight i (descending, sums to 1).
    scores[i]: importance per parameter of weight i; weight i's importance is scores[i] * numel_i.
    shapes[i]: (out_features, in_features).
    Adding direction j to weight i gains scores[i] * numel_i * energies[i][j] for (in + out) parameters;
    past the break-even rank the weight becomes dense (its last "unit"). Since energies descend, taking the
    best ratio first is optimal for the continuous relaxation, and the ranks come out naturally irregular.
    Returns one rank per weight, or DENSE (never with allow_dense=False: ranks stop at break-even).
    """
    n = len(shapes)
    unit = [o + i for o, i in shapes]
    numel = [o * i for o, i in shapes]
    cap = [(numel[k] - 1) // unit[k] for k in range(n)]  # largest rank that still saves parameters
    used = sum(unit)  # every weight starts at rank 1
    if used > budget:
        raise GacError(f"budget of {budget} parameters cannot give every weight rank 1 ({used} needed): lower --ratio")
    rank = [1] * n
    total = [float(scores[k]) * numel[k] for k in range(n)]
    cum = [np.concatenate([[0.0], np.cumsum(e)]) for e in energies]

    def next_unit(k):
        r = rank[k]
        if r is DENSE:
            return None
        if r < cap[k]:
            return total[k] * float(energies[k][r]) / unit[k], unit[k]
        if not allow_dense:
            return None
        extra = numel[k] - r * unit[k]  # dense costs this much more than rank r
        return total[k] * float(1.0 - cum[k][r]) / max(extra, 1), extra

    heap = []
    for k in range(n):
        nxt = next_unit(k)
        if nxt:
            heapq.heappush(heap, (-nxt[0], k, nxt[1]))
    while heap:
        _, k, cost = heapq.heappop(heap)
        if used + cost > budget:
            continue  # this weight cannot grow further within the budget; others may still
        used += cost
        rank[k] = rank[k] + 1 if rank[k] < cap[k] else DENSE
        nxt = next_unit(k)
        if nxt:
            heapq.heappush(heap, (-nxt[0], k, nxt[1]))
    return rank
