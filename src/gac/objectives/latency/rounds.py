"""The records of `--speedup`'s closed loop: a round's choice as solved (Solved), each timing of it (Timed), and the
round as timed and judged (Round). Typed in the loop, made JSON only for report.json (to_dict), in the keys it has
always written: a round's row is its solved, timed and judged figures in one flat object."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gac.objectives.latency.knapsack import LatencyChoice


@dataclass(frozen=True)
class Solved:
    """A round's choice before it is built: its number, the stream's budget, the choice (dims, the groups' predicted
    ms, parameters and value) and what the latency tables predicted of the whole model at that round."""

    round: int
    budget_ms: float
    choice: LatencyChoice
    baseline_predicted_ms: float  # the original, at the round's constant
    gac_predicted_ms: float  # the built model: the constant and the groups' predicted ms
    ratio: float | None = None  # the guard's stream: the parameter objective's ratio
    line: bool = False  # a line round (ClosedLoop._line_round)

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "round": self.round,
            "budget_ms": self.budget_ms,
            "baseline_predicted_ms": self.baseline_predicted_ms,
            "gac_predicted_ms": self.gac_predicted_ms,
            "groups_predicted_ms": self.choice.predicted_ms,
            "params": self.choice.params,
            "value": self.choice.value,
        }
        if self.ratio is not None:
            row["ratio"] = self.ratio
        if self.line:
            row["line"] = True
        return row


@dataclass(frozen=True)
class Timed:
    """One side-by-side timing of a built model, or two pooled: the baseline's and the model's ms, the A/A floor (a
    percentage), the speedup, and the time the model must beat to count as reaching the aim beyond the floor."""

    baseline_measured_ms: float
    gac_measured_ms: float
    aa_floor_pct: float
    measured_speedup: float
    target_ms: float
    retimed: int  # timings taken again because the A/A twin was disturbed
    timings: int  # timings pooled into these figures

    @classmethod
    def of(cls, base: float, ms: float, floor: float, aim: float, *, retimed: int, timings: int) -> Timed:
        """The figures of a timing of the baseline at `base` ms and the model at `ms`, its A/A floor a fraction."""
        return cls(base, ms, 100.0 * floor, base / ms, base / (aim * (1.0 + floor)), retimed, timings)

    def pooled(self, other: Timed, aim: float) -> Timed:
        """Two timings' figures as one: the baseline's and the model's ms averaged, the speedup their ratio, the A/A
        floor the two floors' mean, the target at that floor; `retimed` and `timings` summed."""
        return Timed.of(
            0.5 * (self.baseline_measured_ms + other.baseline_measured_ms),
            0.5 * (self.gac_measured_ms + other.gac_measured_ms),
            0.5 * (self.aa_floor_pct + other.aa_floor_pct) / 100.0,
            aim,
            retimed=self.retimed + other.retimed,
            timings=self.timings + other.timings,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Round:
    """One round of a stream, built and timed: its choice as solved, the timing that judged it, whether it reached,
    and what the loop measured besides."""

    solved: Solved
    timed: Timed
    reached: bool
    screen: Timed | None = None  # the first timing, where a second, independent one confirmed it
    line_speedup: float | None = None  # a line round: the speedup the line refitted with it puts it at
    held_back_loss: float | None = None  # the guard's loss of a reaching round's model

    @property
    def dims(self) -> dict[str, int | None]:
        return self.solved.choice.dims

    @property
    def point(self) -> tuple[float, float]:
        """(the groups' predicted ms, the measured share of the baseline): the round on its stream's timing line
        (gac.objectives.latency.loop.timing_line)."""
        return self.solved.choice.predicted_ms, self.timed.gac_measured_ms / self.timed.baseline_measured_ms

    def to_dict(self) -> dict[str, Any]:
        """The round's row of report.json: the solved figures, the timed ones, then the judgement."""
        row = {**self.solved.to_dict(), **self.timed.to_dict()}
        if self.line_speedup is not None:
            row["line_speedup"] = self.line_speedup
        row["reached"] = self.reached
        if self.screen is not None:
            row["screen"] = self.screen.to_dict()
        if self.held_back_loss is not None:
            row["held_back_loss"] = self.held_back_loss
        return row
