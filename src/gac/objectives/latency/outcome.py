"""What `--speedup`'s closed loop records and hands on: each stream's rounds and kept model (Stream), and the
outcome (LatencyOutcome: the kept model, its dims, and report.json's latency_objective)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gac.objectives.latency.config import SpeedupConfig
from gac.objectives.latency.model import LatencyModel
from gac.objectives.latency.rounds import Round

if TYPE_CHECKING:
    from torch import nn

# LatencyModel.fitted's figures, and calibrated's table_scale (below 1 when the fitted groups outgrew the baseline)
FIT_KEYS = ("saving_scale", "fit_scale", "reference_ms", "reference_predicted_saving_ms", "table_scale")


def ranked(loss: float | None) -> float:
    """A held-back loss to compare by: one not measured (no guard) or not finite ranks last."""
    return loss if loss is not None and math.isfinite(loss) else math.inf


@dataclass
class Stream:
    """One way of choosing dims under the closed loop's latency budget: "latency" (the knapsack over predicted ms,
    the objective itself) or "parameter" (the parameter objective's allocation at the ratio predicted within the
    budget: the guard). Each keeps its own budget, tightened by its own measured shortfall, down to floor_ms (its
    fastest dims)."""

    name: str
    budget: float
    floor_ms: float
    rows: list[Round] = field(default_factory=list)  # one per round it was built and timed in
    kept: Round | None = None  # the reaching round of lowest held-back loss, else the fastest
    model: nn.Module | None = None  # the kept round's model, built and timed by the loop
    loss: float | None = None  # mean next-token loss of the kept reaching model on the guard's held-back windows
    done: bool = False
    loosened: bool = False  # a reaching round far past the target was followed by one with a looser budget
    reach_ms: float | None = None  # the loosest budget whose round reached the aim
    short_ms: float | None = None  # the tightest budget whose round fell short
    # the dims of every round built: a halved bracket never times them again
    tried: list[dict[str, int | None]] = field(default_factory=list)

    @property
    def reached(self) -> bool:
        return self.kept is not None and self.kept.reached

    @property
    def kept_round(self) -> Round:
        """`kept`, which the chosen stream of an outcome always has."""
        if self.kept is None:
            raise ValueError(f"the {self.name} stream kept no round")
        return self.kept

    def bettered_by(self, loss: float | None) -> bool:
        """Whether a reaching round of this held-back loss is kept over the stream's kept round: when none reached
        yet, when no loss is measured (unguarded: the later), or when it is the lower."""
        return not self.reached or loss is None or ranked(loss) < ranked(self.loss)

    @property
    def bracketed(self) -> bool:
        """A budget that reached and a looser one that fell short are known: the next round halves them."""
        return self.reach_ms is not None and self.short_ms is not None

    def summary(self) -> dict[str, Any]:
        """report.json's latency_objective.guard entry: the kept round by its number, not its figures again."""
        return {
            "reached": self.reached,
            "loss": self.loss,
            "rounds": len(self.rows),
            "round": self.kept.solved.round if self.kept else None,
            "dims": dict(self.kept.dims) if self.kept else None,
        }


@dataclass
class LatencyOutcome:
    """What the closed loop chose, built and measured; `selection` of gac.objectives.base.Selected under --speedup."""

    config: SpeedupConfig
    latency_model: LatencyModel  # its constant at the rounds' median baseline
    streams: list[Stream]  # "latency" first, then the guard's "parameter" where it ran
    chosen: Stream  # the stream whose kept model is the outcome

    @property
    def dims(self) -> dict[str, int | None]:
        """{group: dim or None} of the kept model."""
        return dict(self.kept.dims)

    @property
    def model(self) -> nn.Module:
        """The kept model as the loop built and timed it (gac.pipelines.run saves and evaluates it: never cut again)."""
        if self.chosen.model is None:
            raise ValueError(f"the {self.chosen.name} stream kept no model")
        return self.chosen.model

    @property
    def rounds(self) -> list[Round]:
        """The knapsack's rounds."""
        return self.streams[0].rows

    @property
    def kept(self) -> Round:
        """The kept round (of the chosen stream)."""
        return self.chosen.kept_round

    def final(self) -> dict[str, Any]:
        """The kept round's row and its stream, as report.json's latency_objective holds them."""
        return {**self.kept.to_dict(), "stream": self.chosen.name}

    def guard(self) -> dict[str, Any]:
        """{stream: Stream.summary(), with every round of a stream other than the knapsack's under "history"} and
        "kept": the stream kept. The knapsack's rounds are `rounds`: each round is written once."""
        guard: dict[str, Any] = {
            s.name: {**s.summary(), **({"history": [r.to_dict() for r in s.rows]} if s is not self.streams[0] else {})}
            for s in self.streams
        }
        guard["kept"] = self.chosen.name
        return guard

    def report(self) -> dict[str, Any]:
        """report.json's latency_objective: the knapsack's rounds, the kept round's figures and stream, the constant,
        the fit, the guard and the timing journal (how many timings were replayed)."""
        meta, journal = self.latency_model.meta, self.config.instruments.journal
        return {
            "rounds": [r.to_dict() for r in self.rounds],
            **self.final(),
            "constant_ms": self.latency_model.constant_ms,
            "fit": {k: meta.get(k) for k in FIT_KEYS},
            "guard": self.guard(),
            "journal": journal.summary() if journal is not None else None,
        }

    def variant_figures(self) -> dict[str, dict[str, float]]:
        """{variant: predicted and measured ms at the objective's shape, and the prediction's error} for the
        baseline and the kept ("gac") model, from the kept round's timing."""
        solved, timed = self.kept.solved, self.kept.timed
        figures = {}
        for variant, predicted, measured in (
            ("baseline", solved.baseline_predicted_ms, timed.baseline_measured_ms),
            ("gac", solved.gac_predicted_ms, timed.gac_measured_ms),
        ):
            figures[variant] = {
                "predicted_ms": predicted,
                "measured_ms": measured,
                "prediction_error_pct": 100.0 * (predicted / measured - 1.0),
            }
        return figures
