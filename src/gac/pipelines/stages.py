"""The wall time of each stage of a run (report.json's stages_s): what the Amdahl estimate of a run over N ranks
reads, the split stages against those rank 0 does alone."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

# what torchrun's ranks share (gac.distributed): calibration, factorizations and held-out evaluation. The rest is
# rank 0's alone (select, timing, the write) or every rank's whole (the process's start, open, and materialize: each
# rank cuts every weight; layer by layer it also carries the split evaluation, counted here as unsplit)
SPLIT = ("analyze", "perplexity")


@dataclass
class StageClock:
    """Seconds per stage, summed over the stage's entries."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.seconds.items()}


def amdahl(stages_s: dict[str, float], wall_s: float, ranks: int) -> float:
    """The predicted speed-up on `ranks` ranks of a one-process run that took wall_s seconds in all: its SPLIT
    stages divided by the ranks, the rest of the wall time as it is."""
    split = sum(v for k, v in stages_s.items() if k in SPLIT)
    return wall_s / (wall_s - split + split / ranks)
