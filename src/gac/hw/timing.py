"""The one timing implementation of gac: warm-up, synchronize, device events on GPU, median of many runs.

Used by the hardware profile, `gac bench` and the compress report; ratios are measured side by side.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Timing:
    """Summary of repeated runs of one callable, in milliseconds."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    n: int

    @property
    def spread_pct(self) -> float:
        """Width of the 10-90 percentile band relative to the median, in percent."""
        return (self.p90_ms - self.p10_ms) / self.median_ms * 100.0 if self.median_ms > 0 else 0.0

    @classmethod
    def from_samples(cls, samples_ms: list[float]) -> Timing:
        if not samples_ms:
            raise ValueError("no timing samples")
        a = np.asarray(samples_ms, dtype=np.float64)
        p10, med, p90 = np.percentile(a, [10, 50, 90])
        return cls(float(med), float(p10), float(p90), float(a.min()), int(a.size))


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


class _Clock:
    """Times one call: perf_counter on CPU, a pair of CUDA events on GPU (read after one synchronize)."""

    def __init__(self, device: str | torch.device):
        self.cuda = _is_cuda(device)
        self._pending: list[tuple[list[float], object, object]] = []

    def run(self, fn: Callable[[], object], sink: list[float]) -> None:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            self._pending.append((sink, start, end))
        else:
            t0 = time.perf_counter()
            fn()
            sink.append((time.perf_counter() - t0) * 1e3)

    def flush(self) -> None:
        """Synchronize once and read every pending event pair (reading events earlier would stall the queue)."""
        if self.cuda:
            torch.cuda.synchronize()
            for sink, start, end in self._pending:
                sink.append(start.elapsed_time(end))
            self._pending.clear()


def _sync(device: str | torch.device) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize()


def time_callable(
    fn: Callable[[], object], *, device: str | torch.device = "cpu", warmup: int = 3, repeats: int = 20
) -> Timing:
    """Median (and spread) of `repeats` calls of `fn` after `warmup` untimed calls, under inference_mode."""
    return time_interleaved({"fn": fn}, device=device, warmup=warmup, rounds=repeats)["fn"]


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 3,
    rounds: int = 20,
) -> dict[str, Timing]:
    """Time several callables round-robin (one call of each per round) so all see the same machine state."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    clock = _Clock(device)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    with torch.inference_mode():
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        _sync(device)
        for _ in range(rounds):
            for name, fn in fns.items():
                clock.run(fn, samples[name])
        clock.flush()
    return {name: Timing.from_samples(s) for name, s in samples.items()}


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
