"""The one timing implementation of gac: warm-up, synchronize, device events on GPU, median of many runs.

Used by the hardware profile, `gac bench` and the compress report; ratios are measured side by side. On CUDA a
callable can be captured in a CUDA graph (`graph_calls` calls per replay) so the CPU's launch cost is amortized
and the events time the GPU; where capture fails (a host sync inside), it is timed eagerly and the host's
enqueue time is kept beside the GPU time, so a launch-bound figure can be told apart. On CPU, glibc's heap serves
the activations while callables are timed, whatever gac set for memory's sake (gac.hw.heap.timing_heap).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from gac.hw.heap import timing_heap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """Summary of repeated runs of one callable, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    n: int
    method: str = "wall"  # wall (CPU clock), events (CUDA events around eager calls), graph (CUDA graph replays)
    host_ms: float | None = None  # eager CUDA: median host time to enqueue one call

    @property
    def launch_bound(self) -> bool:
        """Eager CUDA timing where the GPU waited on the host: the figure measures Python, not the kernels."""
        return self.method == "events" and self.host_ms is not None and self.host_ms >= 0.8 * self.median_ms

    @property
    def spread_pct(self) -> float:
        """Width of the 10-90 percentile band relative to the median, in percent."""
        return (self.p90_ms - self.p10_ms) / self.median_ms * 100.0 if self.median_ms > 0 else 0.0

    @classmethod
    def from_samples(cls, samples_ms: list[float], method: str = "wall", host_ms: list[float] | None = None) -> Timing:
        if not samples_ms:
            raise ValueError("no timing samples")
        a = np.asarray(samples_ms, dtype=np.float64)
        p10, med, p90 = np.percentile(a, [10, 50, 90])
        host = float(np.median(host_ms)) if host_ms else None
        return cls(float(med), float(p10), float(p90), float(a.min()), int(a.size), method, host)


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


class _Clock:
    """Times one call: perf_counter on CPU, a pair of CUDA events on GPU (read after one synchronize); on GPU
    the host's enqueue time is kept too."""

    def __init__(self, device: str | torch.device):
        self.cuda = _is_cuda(device)
        self._pending: list[tuple[list[float], torch.cuda.Event, torch.cuda.Event, int]] = []

    def run(self, fn: Callable[[], object], sink: list[float], host: list[float], per: int = 1) -> None:
        t0 = time.perf_counter()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            host.append((time.perf_counter() - t0) * 1e3 / per)
            self._pending.append((sink, start, end, per))
        else:
            fn()
            sink.append((time.perf_counter() - t0) * 1e3 / per)

    def flush(self) -> None:
        """Synchronize once and read every pending event pair (reading events earlier would stall the queue)."""
        if self.cuda:
            torch.cuda.synchronize()
            for sink, start, end, per in self._pending:
                sink.append(start.elapsed_time(end) / per)
            self._pending.clear()


def capture_graph(fn: Callable[[], object], calls: int) -> Callable[[], object]:
    """`calls` back-to-back calls of `fn` captured in one CUDA graph; returns its replay. Raises RuntimeError when
    `fn` cannot be captured (a host synchronization or a CPU tensor inside). After a failed capture torch 2.11
    refuses the default CUDA generator in this process ("Offset increment outside graph capture"): draw random
    inputs before timing, as gac's benches do."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def _graphed(fns: Mapping[str, Callable[[], object]], calls: int) -> dict[str, tuple[Callable[[], object], int, str]]:
    """{name: (callable, calls per invocation, method)}: a graph replay where capture works, else eager calls."""
    out = {}
    for name, fn in fns.items():
        try:
            out[name] = (capture_graph(fn, calls), calls, "graph")
        except Exception as e:  # noqa: BLE001 - any capture failure means: time it eagerly
            log.warning("%s: CUDA graph capture failed (%s); timing it eagerly", name, str(e).splitlines()[0][:160])
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            out[name] = (fn, 1, "events")
    return out


def _sync(device: str | torch.device) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize()


def time_callable(
    fn: Callable[[], object],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 3,
    repeats: int = 20,
    graph_calls: int = 0,
) -> Timing:
    """Median (and spread) of `repeats` calls of `fn` after `warmup` untimed calls, under inference_mode."""
    return time_interleaved({"fn": fn}, device=device, warmup=warmup, rounds=repeats, graph_calls=graph_calls)["fn"]


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 3,
    rounds: int = 20,
    graph_calls: int = 0,
) -> dict[str, Timing]:
    """Time several callables round-robin (one call of each per round) so all see the same machine state.

    graph_calls > 0 on CUDA: each callable is captured `graph_calls` times over in one CUDA graph and a sample is
    one replay divided by `graph_calls` (launch cost amortized); ignored on CPU."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    clock = _Clock(device)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    host: dict[str, list[float]] = {name: [] for name in fns}
    with torch.inference_mode(), timing_heap():  # activations from the heap, not mapped anew each call
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        _sync(device)
        if clock.cuda and graph_calls > 0:
            timed = _graphed(fns, graph_calls)
            for fn, _, _ in timed.values():  # one untimed replay each: first replays upload the graph
                fn()
            _sync(device)
        else:
            timed = {name: (fn, 1, "events" if clock.cuda else "wall") for name, fn in fns.items()}
        for _ in range(rounds):
            for name, (fn, per, _) in timed.items():
                clock.run(fn, samples[name], host[name], per)
        clock.flush()
    return {
        name: Timing.from_samples(samples[name], timed[name][2], host[name] if timed[name][2] == "events" else None)
        for name in fns
    }


@contextlib.contextmanager
def cpu_threads(n: int | None) -> Iterator[int]:
    """Fix torch's intra-op thread count to `n` (None keeps the current one) and restore it on exit."""
    before = torch.get_num_threads()
    if n is not None:
        if n < 1:
            raise ValueError(f"thread count must be >= 1, got {n}")
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
