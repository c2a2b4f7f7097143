"""Healing on several ranks under torchrun: data parallel through torch's DistributedDataParallel. Each rank takes its
share of every step's windows (its teacher runs on those alone) and DDP averages the gradients, each rank's loss
weighted by its share, so that every step updates the student as one process does, up to the order of the sums
(docs/decisions/distributed-heal.md). In one process every helper here leaves things as they are."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from gac.distributed import collective, sum_numbers, world
from gac.errors import ConfigError


def check_ranks(batch: int, size: int) -> None:
    """Refuse more ranks than windows a step: a rank without a window would compute nothing and hold a model."""
    if size > batch:
        raise ConfigError(
            f"healing takes {batch} windows a step, fewer than the {size} ranks: run at most {batch} ranks "
            f"(e.g. --nproc-per-node {batch} on one node), or take {size} windows a step (--heal-batch {size})"
        )


def step_share(ids: list[int]) -> tuple[list[int], float]:
    """(this rank's windows of a step's `ids`, the weight of its mean loss). Rank r takes ids r, r + N, ...; its
    weight, N times its share of the step's windows, makes DDP's mean of the ranks' gradients the gradient of the
    step's mean loss when the shares differ. (ids, 1.0) in one process."""
    w = world()
    if not w.active:
        return ids, 1.0
    mine = ids[w.rank :: w.size]
    return mine, w.size * len(mine) / len(ids)


def taken_by_rank(ids: list[int]) -> dict[int, list[int]]:
    """{rank: the windows of `ids` it takes} (step_share's split), for report's ledger."""
    w = world()
    return {r: ids[r :: w.size] for r in range(w.size)}


@contextlib.contextmanager
def data_parallel(student: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`student` wrapped in DistributedDataParallel for the block (its tensors as rank 0 holds them on every rank,
    each backward's gradients averaged over the ranks); `student` itself in one process."""
    w = world()
    if not w.active:
        yield student
        return
    from torch.nn.parallel import DistributedDataParallel

    device = next(student.parameters()).device
    # buffers (rotary frequencies) are the same on every rank and never trained: no broadcast each forward (newer
    # torch names the flag forward_sync_buffers and warns on the old name)
    flag = "forward_sync_buffers"
    if flag not in inspect.signature(DistributedDataParallel).parameters:
        flag = "broadcast_buffers"
    no_sync: dict[str, Any] = {flag: False}
    with collective("sharing the student's tensors"):
        wrapped = DistributedDataParallel(
            student, device_ids=[device.index] if device.type == "cuda" else None, **no_sync
        )
    try:
        yield wrapped
    finally:
        del wrapped


def step_losses(losses: list[tuple[int, float]], weight: float) -> list[tuple[int, float]]:
    """[(step, the step's mean loss over every rank's windows)] from this rank's [(step, mean loss over its
    windows)] and its step_share weight; `losses` as they are in one process."""
    w = world()
    if not w.active:
        return losses
    summed = sum_numbers([loss * weight / w.size for _, loss in losses], "summing the training losses")
    return [(step, value) for (step, _), value in zip(losses, summed)]
