"""Several processes under torchrun: the process group read off torchrun's environment and the few collectives a run
needs. Without torchrun (WORLD_SIZE unset or 1) every helper is a no-op and the one-process path is unchanged."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import heapq
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from gac.errors import GacError

DEFAULT_TIMEOUT_S = 300.0  # how long a rank waits at a collective for the others (GAC_DIST_TIMEOUT, --dist-timeout)
BEAT_S = 2.0  # rank 0's heartbeat while the others wait for work it does alone (run_on_main)
T = TypeVar("T")


@dataclass
class World:
    """This process's place among torchrun's: rank, world size, local rank and the backend (None: one process)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    device: str = "cpu"  # the run's device, set to this rank's CUDA device under torchrun
    ledger: dict = field(default_factory=dict)  # {what: {rank: [item, ...]}}: what each rank computed (report.json)
    local_size: int = 1  # ranks on this node (torchrun's LOCAL_WORLD_SIZE)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.size > 1

    def record(self, what: str, by_rank: dict[int, list]) -> None:
        """Note what each rank computed of `what` (extended, in order, across calls)."""
        for r, items in by_rank.items():
            self.ledger.setdefault(what, {}).setdefault(r, []).extend(items)

    def record_shares(self, what: str, n: int) -> None:
        """Note which of n windows each rank took (share()'s split), once per kind of window."""
        self.ledger[what] = {r: list(range(r, n, self.size)) for r in range(self.size)}

    def record_batches(self, what: str, n: int, batch_size: int) -> None:
        """Note which of n windows each rank took in batches of batch_size (batches_share()'s split)."""
        self.ledger[what] = {r: self.batch_windows(n, batch_size, r) for r in range(self.size)}

    def batch_windows(self, n: int, batch_size: int, rank: int | None = None) -> list[int]:
        """The indices of the n windows that `rank` (default this one) takes in batches of batch_size: batches r,
        r + N, ..., back to back (batches_share()'s split)."""
        r = self.rank if rank is None else rank
        starts = range(0, n, batch_size)
        return [i for k, b in enumerate(starts) if k % self.size == r for i in range(b, min(b + batch_size, n))]

    def summary(self) -> dict:
        """report.json's "distributed": world size, backend, timeout and what each rank computed."""
        whats = sorted(self.ledger)
        ranks = [{"rank": r, **{w: self.ledger[w].get(r, []) for w in whats}} for r in range(self.size)]
        return {"world_size": self.size, "backend": self.backend, "timeout_s": self.timeout_s, "ranks": ranks}


_WORLD = World()
_BROKEN = False  # a collective of this process failed: its process group cannot be torn down reliably


def broken() -> bool:
    """Whether a collective of this process failed (a peer gone or past the timeout): gac's CLI then leaves at once
    after its error line, as tearing a broken group down can wait on a peer that never answers, and torchrun stops
    the other ranks only once this one has ended."""
    return _BROKEN


def world() -> World:
    """The current world (one process unless a session() under torchrun is open)."""
    return _WORLD


def from_env(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's RANK, WORLD_SIZE and LOCAL_RANK; (0, 1, 0) without them."""
    given: Mapping[str, str] = os.environ if env is None else env
    size = int(given.get("WORLD_SIZE", "1"))
    rank = int(given.get("RANK", "0"))
    return rank, size, int(given.get("LOCAL_RANK", str(rank)))


def timeout_from_env(given: float | None = None) -> float:
    """The collective timeout in seconds: `given`, else GAC_DIST_TIMEOUT, else DEFAULT_TIMEOUT_S."""
    if given is not None:
        return float(given)
    raw = os.environ.get("GAC_DIST_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise GacError(f"GAC_DIST_TIMEOUT={raw!r} is not a positive number of seconds: set e.g. GAC_DIST_TIMEOUT=300")
    return value


@contextlib.contextmanager
def session(device: str, timeout_s: float | None = None) -> Iterator[World]:
    """The process group of a torchrun launch for the block (gloo on CPU, nccl on CUDA, each rank on its local
    CUDA device), destroyed on exit; without torchrun a world of one and nothing initialized."""
    global _WORLD
    rank, size, local_rank = from_env()
    timeout = timeout_from_env(timeout_s)
    if size <= 1:
        yield _WORLD
        return
    cuda = str(device).startswith("cuda")
    if cuda:
        present = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if local_rank >= present:
            fix = f"start at most {present} per node (--nproc-per-node {present})" if present else "this node has none"
            raise GacError(
                f"rank {rank}: local rank {local_rank} has no CUDA device of its own ({fix}): use one process per "
                "device, or --device cpu"
            )
        torch.cuda.set_device(local_rank)
    backend = "nccl" if cuda else "gloo"
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    except (RuntimeError, ValueError) as e:
        raise _failed(rank, size, timeout, "joining the process group", e) from None
    device = f"cuda:{local_rank}" if cuda else str(device)
    _WORLD = World(
        rank, size, local_rank, backend, timeout, device, local_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    )
    try:
        yield _WORLD
    finally:
        _WORLD = World()
        if not _BROKEN:  # a broken group's teardown may block: the process leaves without it (broken())
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _failed(rank: int, size: int, timeout: float, what: str, e: Exception) -> GacError:
    global _BROKEN
    _BROKEN = True
    first = re.sub(r"^\[[^\]]*\]\s*", "", (str(e).strip().splitlines() or [type(e).__name__])[0])[:160]
    return GacError(
        f"rank {rank} of {size}: {what} failed ({first}): another rank stopped or did not reach it within "
        f"{timeout:g} s; nothing was written (set the wait with --dist-timeout)"
    )


@contextlib.contextmanager
def collective(what: str) -> Iterator[None]:
    """A collective's failure (a peer gone, a timeout) as one line naming this rank: around anything that waits on
    the other ranks, a DistributedDataParallel backward included."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise  # this rank's own failure, not its peers': gac's handler words it
    except RuntimeError as e:
        w = _WORLD
        if not w.active:
            raise
        raise _failed(w.rank, w.size, w.timeout_s, what, e) from None


def share(n: int) -> list[int]:
    """The indices of n items this rank takes: r, r + N, r + 2N, ... (all of them in one process)."""
    w = _WORLD
    return list(range(w.rank, n, w.size))


def batches_share(windows: torch.Tensor, batch_size: int) -> torch.Tensor:
    """This rank's batches of windows [n, seq] cut into batches of batch_size: batches r, r + N, ..., back to back,
    so a pass over them in batches of batch_size forms the batches one process forms (a gradient pass folds
    |g w| per batch: its sums depend on which windows share a batch). The same tensor in one process."""
    w = _WORLD
    return windows if not w.active else windows[w.batch_windows(len(windows), batch_size)]


def windows_share(windows: torch.Tensor) -> torch.Tensor:
    """This rank's windows of windows [n, seq]: the same tensor in one process."""
    w = _WORLD
    return windows if not w.active else windows[w.rank :: w.size]


def all_reduce_sum(tensor: torch.Tensor, what: str = "a reduction") -> torch.Tensor:
    """Sum `tensor` over the ranks, in place and in its own dtype (on the backend's device and back for nccl)."""
    w = _WORLD
    if not w.active:
        return tensor
    import torch.distributed as dist

    with collective(what):
        if w.backend == "nccl" and tensor.device.type != "cuda":
            moved = tensor.to(w.device)
            dist.all_reduce(moved)
            tensor.copy_(moved.to(tensor.device))
        else:
            dist.all_reduce(tensor)
    return tensor


def sum_numbers(values: Sequence[float], what: str = "a reduction") -> list[float]:
    """Each value summed over the ranks (float64)."""
    if not _WORLD.active:
        return list(values)
    t = torch.tensor(list(values), dtype=torch.float64)
    return all_reduce_sum(t, what).tolist()


def all_gather_rows(rows: torch.Tensor, what: str = "a gather") -> list[torch.Tensor]:
    """Every rank's rows [t_r, ...] (t_r may differ), in rank order."""
    w = _WORLD
    if not w.active:
        return [rows]
    counts = torch.zeros(w.size, dtype=torch.float64)
    counts[w.rank] = rows.shape[0]
    counts_list = [int(c) for c in all_reduce_sum(counts, what).tolist()]
    padded = torch.zeros((max(counts_list), *rows.shape[1:]), dtype=rows.dtype)
    padded[: rows.shape[0]] = rows.cpu()
    import torch.distributed as dist

    device = w.device if w.backend == "nccl" else "cpu"
    gathered = [torch.empty_like(padded, device=device) for _ in range(w.size)]
    with collective(what):
        dist.all_gather(gathered, padded.to(device))
    return [g[:c].to(rows.device) for g, c in zip(gathered, counts_list)]


def broadcast_object(obj: T | None, src: int = 0, what: str = "a broadcast") -> T:
    """`obj` as rank `src` holds it, on every rank (pickled: its tensors travel on the CPU)."""
    w = _WORLD
    if not w.active:
        return obj  # type: ignore[return-value]
    import torch.distributed as dist

    box = [map_tensors(obj, lambda t: t.cpu()) if w.rank == src else None]
    with collective(what):
        dist.broadcast_object_list(box, src=src, device=_object_device())
    return box[0]  # type: ignore[return-value]


def all_gather_object(obj: Any, what: str = "a gather") -> list:
    """Every rank's `obj`, in rank order (pickled: tensors travel on the CPU)."""
    w = _WORLD
    if not w.active:
        return [obj]
    import torch.distributed as dist

    out: list = [None] * w.size
    with collective(what):
        dist.all_gather_object(out, map_tensors(obj, lambda t: t.cpu()))
    return out


def on_main(fn: Callable[[], T], what: str) -> T:
    """fn() computed on rank 0 alone and its result on every rank; a GacError it raises is raised on every rank
    (the others would otherwise wait for a result that never comes). fn() itself in one process."""
    w = _WORLD
    if not w.active:
        return fn()
    return _shared(_outcome(fn) if w.is_main else None, what)


def _outcome(fn: Callable[[], T]) -> tuple[bool, Any]:
    """(True, fn()), or (False, the GacError it raised): what rank 0 sends the others."""
    try:
        return True, fn()
    except GacError as e:
        return False, e


def _shared(outcome: tuple[bool, Any] | None, what: str) -> Any:
    """Rank 0's outcome on every rank: its result, or its error raised."""
    ok, value = broadcast_object(outcome, what=what)
    if not ok:
        raise value
    return value


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """This rank as a world of one for the block (work rank 0 does by itself: its passes take every window and
    reduce nothing); the world restored on exit."""
    global _WORLD
    saved = _WORLD
    _WORLD = World(device=saved.device, timeout_s=saved.timeout_s)
    try:
        yield
    finally:
        _WORLD = saved


def timing_threads() -> int:
    """The intra-op threads rank 0 times with (node_threads): on a CPU its own and those of the node's other ranks,
    which wait idle meanwhile (a gloo wait takes no CPU), so its figures are those of one process on the node."""
    w = _WORLD
    n = torch.get_num_threads()
    return n * w.local_size if w.active and w.backend == "gloo" else n


@contextlib.contextmanager
def node_threads() -> Iterator[None]:
    """torch's intra-op threads at timing_threads() for the block (work rank 0 does while the others wait)."""
    saved, n = torch.get_num_threads(), timing_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def run_on_main(fn: Callable[[], T], what: str) -> T:
    """fn() run by rank 0 alone (as a world of one: alone()), however long it takes, its result on every rank; a
    GacError it raises is raised on every rank. The others wait without a collective's deadline while rank 0's
    heartbeat goes on (torchrun's store), and stop with one error line when it has been silent for the timeout: a
    rank 0 that died or hangs outside fn. fn() itself in one process."""
    w = _WORLD
    if not w.active:
        return fn()
    import torch.distributed as dist

    # the rendezvous store every rank already reaches: no port of its own to open
    store = dist.distributed_c10d._get_default_store()
    beat_key, done_key = f"gac/{what}/beat", f"gac/{what}/done"
    outcome = None
    if w.is_main:
        stop = threading.Event()

        def beat() -> None:
            n = 0
            while not stop.wait(BEAT_S):
                n += 1
                store.set(beat_key, str(n))

        beating = threading.Thread(target=beat, daemon=True)
        beating.start()
        try:
            with node_threads(), alone():
                outcome = _outcome(fn)
        finally:
            stop.set()
            beating.join()
        store.set(done_key, "1")
    else:
        _wait_for(store, beat_key, done_key, w, what)
    return _shared(outcome, what)


def _wait_for(store: Any, beat_key: str, done_key: str, w: World, what: str) -> None:
    """Until rank 0 sets done_key; an error once its heartbeat (beat_key) has not moved for w.timeout_s."""
    last, since = None, time.monotonic()
    while True:
        try:
            if store.check([done_key]):
                return
            beat = store.get(beat_key) if store.check([beat_key]) else None
        except RuntimeError as e:  # the store's host gone
            raise _failed(w.rank, w.size, w.timeout_s, what, e) from None
        if beat != last:
            last, since = beat, time.monotonic()
        elif time.monotonic() - since > w.timeout_s:
            raise _failed(w.rank, w.size, w.timeout_s, what, TimeoutError("rank 0's heartbeat stopped"))
        time.sleep(min(BEAT_S / 4, 0.5))


def barrier(what: str = "the final barrier") -> None:
    w = _WORLD
    if not w.active:
        return
    import torch.distributed as dist

    with collective(what):
        if w.backend == "nccl":
            dist.barrier(device_ids=[w.local_rank])
        else:
            dist.barrier()


def _object_device() -> torch.device | None:
    w = _WORLD
    return torch.device(w.device) if w.backend == "nccl" else None


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`obj` with fn applied to every tensor inside (tuples, lists, dicts, dataclasses)."""
    return _map_leaves(obj, lambda x: isinstance(x, torch.Tensor), fn)


def _map_leaves(obj: Any, leaf: Callable[[Any], bool], fn: Callable[[Any], Any]) -> Any:
    if leaf(obj):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_leaves(x, leaf, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_leaves(v, leaf, fn) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changed = {f.name: _map_leaves(getattr(obj, f.name), leaf, fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changed)
    return obj


@dataclass(frozen=True)
class _Slot:
    """Where one tensor of a gathered object lies in its rank's flat buffer of that dtype."""

    dtype: torch.dtype
    start: int
    shape: tuple[int, ...]


def _view(buffers: dict[torch.dtype, torch.Tensor], s: _Slot) -> torch.Tensor:
    return buffers[s.dtype][s.start : s.start + math.prod(s.shape)].view(s.shape)


def all_gather_tensors(obj: Any, what: str = "a gather") -> list:
    """Every rank's `obj`, in rank order, as all_gather_object gives them, but its tensors sent as tensors: each
    rank's tensors of one dtype in one flat buffer broadcast from it, only the rest pickled (pickling large tensors
    copies them several times over, the slowest part of sharing factorizations). [obj] in one process."""
    w = _WORLD
    if not w.active:
        return [obj]
    import torch.distributed as dist

    flat: dict[torch.dtype, list[torch.Tensor]] = {}
    sizes: dict[torch.dtype, int] = {}

    def slot(t: torch.Tensor) -> _Slot:
        t = t.detach().cpu().contiguous()
        start = sizes.get(t.dtype, 0)
        flat.setdefault(t.dtype, []).append(t.reshape(-1))
        sizes[t.dtype] = start + t.numel()
        return _Slot(t.dtype, start, tuple(t.shape))

    skeletons = all_gather_object((map_tensors(obj, slot), sizes), what)
    device = w.device if w.backend == "nccl" else "cpu"
    out = []
    for src, (skeleton, src_sizes) in enumerate(skeletons):
        buffers = {}
        for dtype, n in src_sizes.items():  # the same order on every rank: src's, gathered
            mine = src == w.rank
            buf = torch.cat(flat[dtype]).to(device) if mine else torch.empty(n, dtype=dtype, device=device)
            with collective(what):
                dist.broadcast(buf, src)
            buffers[dtype] = buf.cpu()
        out.append(_map_leaves(skeleton, lambda x: isinstance(x, _Slot), functools.partial(_view, buffers)))
    return out


def assign_by_cost(costs: Sequence[float], ranks: int) -> list[int]:
    """The rank of each item: the costliest first, each to the least loaded rank (ties to the lower rank)."""
    owners = [0] * len(costs)
    loads = [(0.0, r) for r in range(ranks)]
    heapq.heapify(loads)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, r = heapq.heappop(loads)
        owners[i] = r
        heapq.heappush(loads, (load + costs[i], r))
    return owners
