"""Independent per-weight kernels (SVDs, loss-model products) run side by side, one core each.

LAPACK's SVD and eigendecomposition spend about half their time in memory-bound matrix-vector steps that gain little
from a second core, and their multi-threaded steps synchronize often: on a machine whose cores are shared, two
threads waiting on each other lose most of their time slices. One weight per worker thread, each kernel
single-threaded, keeps every core busy either way; on more cores each worker gets its share of the intra-op
threads."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from gac.distributed import all_gather_tensors, assign_by_cost, map_tensors, world

WORKERS = 2  # weights at once: each holds its own SVD or loss-model work (pipelines/memory.py counts them)


def workers(items: int | None = None, device: str | torch.device = "cpu") -> int:
    """How many weights map_side_by_side works on at once: WORKERS, fewer with fewer intra-op threads or items; one
    on a GPU, which spreads each kernel over all its cores already. There, host threads side by side also race CUDA's
    lazily loaded linear-algebra library: the second thread's first `eigh` fails with "lazy wrapper should be called
    at most once"."""
    if torch.device(device).type != "cpu":
        return 1
    n = min(WORKERS, torch.get_num_threads())
    return max(1, n if items is None else min(n, items))


@contextlib.contextmanager
def kernel_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads (and MKL's) set to n while the block runs, restored on exit."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def map_side_by_side(
    fn: Callable,
    items: Iterable,
    *,
    cost: Callable | None = None,
    on_done: Callable[[], None] | None = None,
    device: str | torch.device = "cpu",
) -> list:
    """[fn(item) for item in items], computed by `workers()` threads that share torch's intra-op threads between
    them (one each on a 2-core machine); results in the items' order, the first exception raised. on_done is
    called after each item (a progress bar's update). device: where fn's kernels run (see workers()).

    cost(item): its work, relative to the others'. The costliest start first (longest processing time first), so
    the last to start is a small one and the workers finish together (in the layer's own order the largest SVD, down's,
    would start last and leave one worker alone with it)."""
    items = list(items)
    n = workers(len(items), device)
    if n == 1:
        results = []
        for item in items:
            results.append(fn(item))
            if on_done:
                on_done()
        return results
    with kernel_threads(torch.get_num_threads() // n), ThreadPoolExecutor(max_workers=n) as pool:
        order = sorted(range(len(items)), key=lambda i: -cost(items[i])) if cost else range(len(items))
        futures = {i: pool.submit(fn, items[i]) for i in order}
        if on_done:
            for f in futures.values():
                f.add_done_callback(lambda _f: on_done())
        return [futures[i].result() for i in range(len(items))]


def map_over_ranks(
    fn: Callable,
    items: Sequence,
    *,
    cost: Callable,
    label: Callable | None = None,
    what: str = "factorized",
    on_done: Callable[[], None] | None = None,
    device: str | torch.device = "cpu",
) -> list:
    """map_side_by_side's results, the items spread over torchrun's ranks by cost (the costliest first, each to the
    least loaded rank) and every result sent to every rank; label(item) names what each rank computed in
    report.json. In one process, map_side_by_side itself."""
    w = world()
    if not w.active:
        return map_side_by_side(fn, items, cost=cost, on_done=on_done, device=device)
    owners = assign_by_cost([float(cost(item)) for item in items], w.size)
    mine = [i for i, r in enumerate(owners) if r == w.rank]
    done = map_side_by_side(fn, [items[i] for i in mine], cost=cost, on_done=on_done, device=device)
    results: list = [None] * len(items)
    for part in all_gather_tensors(dict(zip(mine, done)), what=f"sharing what was {what}"):
        for i, result in part.items():
            results[i] = map_tensors(result, lambda t: t.to(device))
    if label is not None:
        w.record(what, {r: [label(items[i]) for i, o in enumerate(owners) if o == r] for r in range(w.size)})
    return results
