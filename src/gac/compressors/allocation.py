"""How much to keep: split a parameter budget into per-weight ranks by importance. Pure numpy."""

from __future__ import annotations

import heapq

import numpy as np

from gac.errors import ConfigError
from gac.models.kinds.rank import max_useful_rank

DENSE = None  # a weight whose allocation reaches the break-even rank stays dense


def greedy_steps(gains: list[np.ndarray], costs: list[np.ndarray], used: float, budget: float) -> list[int]:
    """The one greedy allocator: hand out each item's successive steps, best gain per parameter first.

    gains[i][j], costs[i][j]: the importance and the parameters of item i's j-th further step (taken in order);
    used: parameters already spent. An item whose next step does not fit stops growing; the others go on. With
    gains per parameter non-increasing along each item this is optimal for the continuous relaxation.
    Returns the number of steps taken per item.
    """
    taken = [0] * len(gains)
    heap = [(-float(g[0]) / max(float(c[0]), 1.0), i) for i, (g, c) in enumerate(zip(gains, costs)) if len(g)]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        cost = int(costs[i][taken[i]])
        if used + cost > budget:
            continue  # this item cannot grow further within the budget; others may still
        used += cost
        taken[i] += 1
        if taken[i] < len(gains[i]):
            heapq.heappush(heap, (-float(gains[i][taken[i]]) / max(float(costs[i][taken[i]]), 1.0), i))
    return taken


def allocate_ranks(
    energies: list[np.ndarray],
    scores: list[float],
    shapes: list[tuple[int, int]],
    budget: int,
    *,
    allow_dense: bool = True,
) -> list[int | None]:
    """Greedy global allocation of rank units by importance gained per parameter.

    energies[i]: energy fraction per singular direction of weight i (descending, sums to 1).
    scores[i]: importance per parameter of weight i; weight i's importance is scores[i] * numel_i.
    shapes[i]: (out_features, in_features).
    Adding direction j to weight i gains scores[i] * numel_i * energies[i][j] for (in + out) parameters;
    past the break-even rank the weight becomes dense (its last step). Since energies descend, taking the
    best ratio first is optimal for the continuous relaxation, and the ranks come out naturally irregular.
    Returns one rank per weight, or DENSE (never with allow_dense=False: ranks stop at break-even).
    """
    unit = [o + i for o, i in shapes]
    used = sum(unit)  # every weight starts at rank 1
    if used > budget:
        raise ConfigError(
            f"budget of {budget} parameters cannot give every weight rank 1 ({used} needed): lower {{ratio}}"
        )
    gains, costs = [], []
    for e, score, (o, i) in zip(energies, scores, shapes):
        numel, total = o * i, float(score) * o * i
        cap = max_useful_rank(i, o)
        e = np.asarray(e)
        g = total * np.asarray(e[1:cap], dtype=np.float64)  # ranks 2..cap: direction r at rank r
        c = np.full(len(g), o + i, dtype=np.int64)
        if allow_dense:
            last = max(cap, 1)  # a weight too small to save anything goes dense from rank 1
            cum = np.concatenate([[0.0], np.cumsum(e)])
            g = np.append(g, total * float(1.0 - cum[last]))  # dense: everything past the cap at once
            c = np.append(c, max(numel - last * (o + i), 0))
        gains.append(g)
        costs.append(c)
    taken = greedy_steps(gains, costs, used, budget)
    return [DENSE if allow_dense and t == len(g) else 1 + t for t, g in zip(taken, gains)]  # all taken: dense
