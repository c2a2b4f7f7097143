"""The closed loop of `--speedup S` (gac.objectives.latency.config holds its options): the best model (by the
compressor's loss model) predicted to run S times faster than the original at one phase and shape, then built and timed
side by side with the original; the loop aims at S and a margin against the drift between timings (a second, independent
timing confirms a round that reaches it; a timing near its gate is timed once more and judged with it). When a round
measures short, the latency budget is tightened by the measured residual (and one noise floor more) and the choice
solved again (a few rounds at most), and loosened once when it reaches far past the aim; once a stream has a budget that
reached and a looser one that fell short, each further round halves that bracket. The guard runs the parameter
objective's choice through the same loop beside it and keeps the reaching model with the lower loss on held-back
calibration windows (as --compressor auto compares compressors: gac.pipelines.auto)."""

from __future__ import annotations

import dataclasses
import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gac.errors import ConfigError, GacError, literal
from gac.objectives.latency.config import SpeedupConfig, held_whole
from gac.objectives.latency.guard import parameter_choice
from gac.objectives.latency.knapsack import LatencyChoice, LatencyItem, fastest_ms, select_for_speedup
from gac.objectives.latency.model import LatencyModel, Phase
from gac.objectives.latency.outcome import LatencyOutcome, Stream, ranked
from gac.objectives.latency.rounds import Round, Solved, Timed
from gac.objectives.latency.steps import fit_latency, latency_items, start_budget, time_beside

if TYPE_CHECKING:
    import torch
    from torch import nn

    from gac.compressors.base import Compressor, Unit

log = logging.getLogger(__name__)
# a reaching model this much past the aim gets one looser round, aimed half that far past the aim: about one scatter
# of a timing, so that a loop does not keep a model cut deeper than the aim needs. A noisy timing's A/A floor does not
# widen it: counted as the scatter, two floors let a disturbed loop keep a far deeper cut
OVERSHOOT = 0.01
# a timing whose A/A twin differs from the original by more than this was disturbed (the machine's load changed under
# it): it is timed again, up to NOISY_RETIMES more times, and the quietest timing judges the round
NOISY_FLOOR = 0.05
NOISY_RETIMES = 2


@dataclass
class _Fit:
    """The fitted latency tables and what the loop reads off them, fitted once (predict or run)."""

    lm: LatencyModel  # the fitted latency model, its constant recentred after every round
    baseline_ms: float  # the fit's timing of the original: the knapsack's speedup is against it
    items: list[LatencyItem]  # the knapsack's items, from the fitted tables (recentring leaves them as they are)


# the line round's slope (measured share of the baseline per predicted ms of the groups) is fitted through a stream's
# rounds and held within this share of the tables' own (1 / the baseline's ms): two or three rounds close together
# give a noisy slope, and one disturbed timing can even turn it over
LINE_SLOPE = (0.5, 2.0)


def timing_line(points: Sequence[tuple[float, float]], prior_slope: float) -> tuple[float, float]:
    """(intercept, slope) of the line through a stream's timed rounds (Round.point): each round's measured share of
    its baseline against its groups' predicted ms, by least squares; the slope held within LINE_SLOPE times
    `prior_slope` (the tables' own), which it is where the rounds' predicted ms do not spread. The intercept is the
    mean of every round's residual: one timing's scatter averaged over all of them."""
    x = [p[0] for p in points]
    y = [p[1] for p in points]
    slope = prior_slope
    if len(points) > 1 and max(x) > min(x):
        fitted = statistics.linear_regression(x, y).slope
        slope = min(max(fitted, LINE_SLOPE[0] * prior_slope), LINE_SLOPE[1] * prior_slope)
    return statistics.fmean(yi - slope * xi for xi, yi in zip(x, y)), slope


class ClosedLoop:
    """The closed loop of `--speedup` over one analysis (`units` of `compressor` on `model`): measure the latency
    tables and fit them on the original and a reference model (fit_latency), then solve, build and time up to
    `cfg.rounds` times (`cfg.halvings` more for a bracketed stream), tightening each stream's budget by its measured
    shortfall. How it measures (the timer, the latency tables, the guard's loss) is cfg.instruments.

    With `windows` (held-back calibration windows: gac.calibration.texts.held_back_windows, text the analysis never
    saw) and cfg.guard, the parameter objective's choice at the same budget is built and timed beside the knapsack's in
    every round, under its own closed loop; of the two streams' models that reach the target, the one with the lower
    loss on those windows is kept: the latency objective is then never worse than the parameter objective at the
    measured target on calibration text, whatever the latency model's errors between the two choices. --compressor
    auto compares compressors by the same loss on the same windows, so its kept model is the best of every stream of
    every compressor it built."""

    def __init__(
        self,
        model: nn.Module,
        compressor: Compressor,
        units: list[Unit],
        cfg: SpeedupConfig,
        *,
        alignment: int,
        device: str,
        dtype: str,
        windows: torch.Tensor | None = None,
        progress: bool = True,
    ) -> None:
        # its own view of the timing journal (gac.objectives.latency.journal): the n-th timing of the same models
        # replays the n-th recorded on this machine, so the loop repeats an earlier run's decisions rather than a
        # timing's scatter
        cfg = dataclasses.replace(cfg, instruments=cfg.instruments.for_loop())
        self.model, self.compressor, self.units, self.cfg = model, compressor, units, cfg
        self.alignment, self.device, self.dtype, self.progress = alignment, device, dtype, progress
        self.windows = windows
        self.held = frozenset(u.name for u in units if held_whole(u, cfg))  # groups the knapsack leaves whole
        self.cap = cfg.cap_params(sum(u.group.numel for u in units))
        self._tables: _Fit | None = None  # the fitted tables, once predict or run asked for them
        self.guarded = False  # two streams: each reaching model's held-back loss is measured
        # the baseline timed beside the models in every round: from round 1 on, their median is the reference that
        # the constant is calibrated on and residuals are rescaled to. The calibration timing alone, before the loop,
        # can fall into a slow stretch of a shared machine and skew the constant and every step of the loop with it
        self.baselines: list[float] = []

    def predict(self) -> tuple[LatencyChoice, float, float]:
        """(the knapsack's first choice, its predicted whole-model ms, the original's ms) from the fitted tables
        alone: no round built or timed (the fit times one reference model). What `--compressor auto` compares the
        compressors by; run() then reuses the fit."""
        self._fit()
        choice = self._knapsack(self._stream("latency", fastest_ms(self.items)))
        return choice, self.lm.constant_ms + choice.predicted_ms, self.baseline_ms

    def _fit(self) -> _Fit:
        """The fitted latency tables, the original's ms and the knapsack's items, once."""
        if self._tables is None:
            lm = self._fitted_tables()
            self._tables = _Fit(lm, lm.meta["baseline_ms"], latency_items(self.units, lm, held=self.held))
        return self._tables

    @property
    def lm(self) -> LatencyModel:
        return self._fit().lm

    @property
    def baseline_ms(self) -> float:
        return self._fit().baseline_ms

    @property
    def items(self) -> list[LatencyItem]:
        return self._fit().items

    def run(self) -> LatencyOutcome:
        self._fit()
        # below these groups' ms no budget is reachable: the parameter stream may cut held heads, the knapsack not
        streams = [self._stream("latency", fastest_ms(self.items))]
        if self.cfg.guard and self.windows is not None:
            streams.append(self._stream("parameter", self.lm.fastest_ms(), warn=False))
        elif self.cfg.guard:
            log.info("--speedup without held-back windows: no parameter-objective guard")
        self.guarded = len(streams) > 1
        for k in range(1, self.cfg.rounds + self.cfg.halvings + 1):  # the last `halvings` only for a bracket
            active = [s for s in streams if not s.done]
            if not active or not self._round(k, active):
                break
        for _ in range(self.cfg.line_rounds):
            if not self._line_round(max(len(s.rows) for s in streams) + 1, streams):
                break
        journal = self.cfg.instruments.journal
        if journal is not None and journal.replayed:
            log.info(
                "%d of %d timings%s replayed as this machine recorded them (%s): --retime times afresh",
                journal.replayed,
                journal.replayed + journal.measured,
                self.cfg.where,
                journal.path,
            )
        return self._outcome(streams)

    def _fitted_tables(self) -> LatencyModel:
        """The latency tables of every unit's group at the objective's phase, fitted on the original and a reference
        model (the knapsack's groups: held heads stay as the original has them)."""
        cfg = self.cfg
        lm = cfg.instruments.tables(
            [u.group for u in self.units],
            Phase(cfg.phase, cfg.batch, cfg.seq),
            alignment=self.alignment,
            device=self.device,
            dtype=self.dtype,
            repeats=cfg.profile_repeats,
            progress=self.progress,
        )
        lm = fit_latency(
            self.model,
            self.compressor,
            self.units,
            lm,
            cfg,
            groups=[u.name for u in self.units if u.name not in self.held],
        )
        log.info(
            "latency model%s: baseline %.2f ms measured, groups %.2f ms predicted, constant %.2f ms",
            cfg.where,
            lm.meta["baseline_ms"],
            lm.full_ms(),
            lm.constant_ms,
        )
        return lm

    def _stream(self, name: str, floor_ms: float, *, warn: bool = True) -> Stream:
        return Stream(
            name, start_budget(self.baseline_ms, self.lm.constant_ms, floor_ms, self.cfg, warn=warn), floor_ms
        )

    def _solve(self, s: Stream) -> tuple[LatencyChoice | None, float | None]:
        """(choice, the guard's ratio) of stream `s` at its budget; (None, None) where the guard has no ratio within
        it, the ratio None for the knapsack's."""
        if s.name == "latency":
            return self._knapsack(s), None
        cfg = self.cfg
        got = parameter_choice(
            self.compressor,
            self.units,
            self.lm,
            s.budget,
            alignment=self.alignment,
            value=lambda u, d: u.quality_values([d])[0],
            min_ratio=0.0 if cfg.param_cap is None else 1.0 - cfg.param_cap,
        )
        if got is None:
            log.info("guard: no ratio of the parameter objective is predicted within %.2f ms", s.budget)
            return None, None
        return got[1], got[0]

    def _knapsack(self, s: Stream) -> LatencyChoice:
        """The knapsack's choice at stream `s`'s budget."""
        cfg = self.cfg
        try:
            return select_for_speedup(
                self.items,
                baseline_ms=self.baseline_ms,
                constant_ms=self.lm.constant_ms,
                speedup=cfg.speedup,
                where=cfg.where,
                budget_ms=s.budget,
                param_cap=self.cap,
            )
        except GacError as e:
            if not self.held:
                raise
            said = e.template if isinstance(e, ConfigError) else literal(e)
            raise ConfigError(
                f"{said} (with attention heads whole: {{head_mode:group}} lets the knapsack cut them)"
            ) from None

    def _timed(self, built: dict[str, nn.Module]) -> dict[str, Timed]:
        """{name: figures}: one side-by-side timing of the original and the built models ({name: model}) with an A/A
        twin (timed again while the twin is off by more than NOISY_FLOOR; the quietest timing counts), and the time
        each built model must beat to count as reaching the target and margin beyond this timing's noise floor."""
        cfg = self.cfg
        base, floor, t = time_beside(self.model, built, cfg)
        retimed = 0
        while floor > NOISY_FLOOR and retimed < NOISY_RETIMES:
            retimed += 1
            log.info(
                "a timing%s was disturbed (A/A floor %.1f%%, above %.0f%%): timing again",
                cfg.where,
                100.0 * floor,
                100.0 * NOISY_FLOOR,
            )
            again = time_beside(self.model, built, cfg)
            if again[1] < floor:
                base, floor, t = again
        self.baselines.append(base)
        return {name: Timed.of(base, t[name].median_ms, floor, cfg.aim, retimed=retimed, timings=1) for name in built}

    def _judged(self, built: dict[str, nn.Module], gate: Callable[[Timed], float]) -> dict[str, Timed]:
        """{name: figures} of one side-by-side timing of `built` ({name: model}), where a model lands within
        cfg.gate_band of its gate (gate(figures): the speedup it must reach), either side, timed once more and its
        figures the two timings pooled (Timed.pooled): the gate judged on more than one timing where one would decide
        it."""
        band = self.cfg.gate_band
        figures = self._timed(built)
        near = {name: built[name] for name, f in figures.items() if abs(f.measured_speedup / gate(f) - 1.0) < band}
        if near:
            log.info(
                "%s within %g%% of the gate%s: timing again, judged on both timings",
                ", ".join(near),
                100 * band,
                self.cfg.where,
            )
            for name, again in self._timed(near).items():
                figures[name] = figures[name].pooled(again, self.cfg.aim)
        return figures

    def _round(self, k: int, active: list[Stream]) -> bool:
        """Round k of the active streams: each one's choice solved, built and timed beside the baseline (a passing
        one timed again), then settled; False when no stream had a choice to build."""
        solved: dict[str, Solved] = {}
        built: dict[str, nn.Module] = {}
        for s in active:
            choice, ratio = self._solve(s)
            if choice is None or (s.bracketed and choice.dims in s.tried):  # a halved bracket that solves as before
                s.done = True
                continue
            s.tried.append(choice.dims)
            solved[s.name] = self._solved(k, s, choice, ratio)
            built[s.name] = self.compressor.built(self.model, self.units, choice.dims)
        if not built:
            return False
        rounds: dict[str, Round] = {}
        for name, timed in self._judged(built, lambda t: t.baseline_measured_ms / t.target_ms).items():
            # a round passes its timing only beyond that timing's own noise floor; then a second, independent
            # timing must confirm it: of many rounds, those that happened to time fast would otherwise be kept more
            # often than the rest, and a kept model would measure short when timed again
            rounds[name] = Round(solved[name], timed, reached=timed.gac_measured_ms <= timed.target_ms)
        passed = {name: built[name] for name, row in rounds.items() if row.reached}
        if passed:
            for name, timed in self._judged(passed, lambda t: self.cfg.aim).items():
                row = rounds[name]
                row.screen, row.timed, row.reached = row.timed, timed, timed.measured_speedup >= self.cfg.aim
        reference_ms = statistics.median(self.baselines)
        for s in active:
            if s.name in rounds:
                self._settle(s, rounds[s.name], built.pop(s.name), reference_ms)
        self._fit().lm = self.lm.recentred(reference_ms)  # the next round's predictions
        return True

    def _solved(self, k: int, s: Stream, choice: LatencyChoice, ratio: float | None, *, line: bool = False) -> Solved:
        """Round k's choice for stream `s` before it is timed: its budget and the tables' predictions."""
        return Solved(
            k,
            s.budget,
            choice,
            baseline_predicted_ms=self.lm.predict({}),
            gac_predicted_ms=self.lm.constant_ms + choice.predicted_ms,
            ratio=ratio,
            line=line,
        )

    def _line_round(self, k: int, streams: list[Stream]) -> bool:
        """One more round for every stream of two rounds or more, at the budget where the line through all of its
        timings (timing_line) crosses the aim: where a stream's rounds stepped around the aim, a model that reached on
        its own timings was kept only if it happened to time fast, most often cut deeper than the aim needs; a line
        through all of a stream's timings says more steadily where the aim lies. The round is aimed half OVERSHOOT past
        the aim (one more timing moves the refitted line by a fraction of that), solved, built and timed (again near the
        aim, as every round), and kept when the line, refitted with it, puts it at or past the aim, its own timing at or
        past the target itself, and (guarded) its held-back loss below the stream's kept model's. Skipped where that
        budget solves to dims already built, or to dims of no more value than the kept model's (cut as deep), and after
        a line round of the stream's that reached (one that fell short moves the line: the next is solved on it). False
        when no stream had a round to build."""
        cfg, reference_ms = self.cfg, statistics.median(self.baselines)
        solved: dict[str, Solved] = {}
        built: dict[str, nn.Module] = {}
        for s in streams:
            if len(s.rows) < 2 or (s.rows[-1].solved.line and s.rows[-1].reached):
                continue
            intercept, slope = timing_line([r.point for r in s.rows], 1.0 / reference_ms)
            budget = (1.0 / (cfg.aim * (1.0 + OVERSHOOT / 2)) - intercept) / slope
            if budget < s.floor_ms:
                continue
            s.budget = budget
            choice, ratio = self._solve(s)
            if choice is None or choice.dims in s.tried:
                continue
            if s.reached and choice.value <= s.kept_round.solved.choice.value:  # cut as deep as the kept model
                continue
            s.tried.append(choice.dims)
            solved[s.name] = self._solved(k, s, choice, ratio, line=True)
            built[s.name] = self.compressor.built(self.model, self.units, choice.dims)
        if not built:
            return False
        judged = self._judged(built, lambda t: cfg.aim)
        for s in streams:
            if s.name not in judged:
                continue
            row, model = Round(solved[s.name], judged[s.name], reached=False), built.pop(s.name)
            intercept, slope = timing_line([*(r.point for r in s.rows), row.point], 1.0 / reference_ms)
            row.line_speedup = line_speedup = 1.0 / (intercept + slope * row.solved.choice.predicted_ms)
            row.reached = line_speedup >= cfg.aim and row.timed.measured_speedup >= cfg.speedup
            s.rows.append(row)
            loss = self._held_back_loss(model) if row.reached else None
            row.held_back_loss = loss
            keep = row.reached and s.bettered_by(loss)
            log.info(
                "%sline round %d%s: the line through %d timings puts %.2f ms at %.3fx (measured %.3fx, aim %.4gx)%s",
                "" if s.name == "latency" else "guard ",
                k,
                cfg.where,
                len(s.rows),
                row.solved.gac_predicted_ms,
                line_speedup,
                row.timed.measured_speedup,
                cfg.aim,
                ": kept" if keep else "",
            )
            if keep:
                s.kept, s.model, s.loss = row, model, loss
        return True

    def _held_back_loss(self, model: nn.Module) -> float | None:
        """The guard's held-back loss of a reaching model; None unguarded (one stream: nothing to compare)."""
        if not self.guarded or self.windows is None:
            return None
        return self.cfg.instruments.held_back_loss(model, self.windows)

    def _settle(self, s: Stream, row: Round, built: nn.Module, reference_ms: float) -> None:
        """Record a stream's round: keep it (and its model) when it reached the aim, the target and its margin, at a
        held-back loss below the stream's kept reaching round's (measured for the guard; unguarded, every reaching
        round), or when none reached and it is the fastest yet; then set the stream's budget for its next round (the
        measured residual, or the bracket's midpoint) or end it."""
        cfg, timed, k = self.cfg, row.timed, row.solved.round
        s.rows.append(row)
        log.info(
            "%sround %d%s: predicted %.2f ms, measured %.2f ms against %.2f ms baseline (%.3fx; aim %.4gx, "
            "A/A floor %.1f%%)%s",
            "" if s.name == "latency" else "guard ",
            k,
            cfg.where,
            row.solved.gac_predicted_ms,
            timed.gac_measured_ms,
            timed.baseline_measured_ms,
            timed.measured_speedup,
            cfg.aim,
            timed.aa_floor_pct,
            f", confirming a first timing of {row.screen.measured_speedup:.3f}x" if row.screen is not None else "",
        )
        loss = row.held_back_loss = self._held_back_loss(built) if row.reached else None
        if row.reached:
            # of a stream's reaching rounds, the one with the lowest held-back loss, the loss the guard and auto keep
            # by (unguarded: the last, the least cut of a halved bracket)
            better = s.bettered_by(loss)
        else:  # of none that reached yet, the fastest measured
            better = s.kept is None or (not s.reached and timed.measured_speedup > s.kept.timed.measured_speedup)
        if better:
            s.kept, s.model, s.loss = row, built, loss
        # a model far past the target gives away quality: one more round, the budget loosened by its excess (below),
        # kept only if it reaches the target too. Both streams are loosened alike, so the guard compares models
        # brought to the target, not one cut deeper than needed
        # a short round tightens by the measured residual, rescaled to the median of the loop's baseline timings: the
        # shortfall from the gate plus one more A/A floor, so that the next round aims beyond the gate rather than at
        # it (aimed at the gate, a model passes a noisy timing about half the time)
        aim_ms = timed.target_ms * (1.0 - timed.aa_floor_pct / 100.0)
        # more than OVERSHOOT past the aim, whatever this timing's floor, a round is loosened to half OVERSHOOT past
        # it (kept only if that reaches beyond its own timing's floor)
        overshoot = timed.measured_speedup / cfg.aim - 1.0 > OVERSHOOT
        loose_ms = timed.baseline_measured_ms / (cfg.aim * (1.0 + OVERSHOOT / 2))
        budget_ms = row.solved.budget_ms
        if row.reached:
            s.reach_ms = budget_ms if s.reach_ms is None else max(s.reach_ms, budget_ms)
        else:
            s.short_ms = budget_ms if s.short_ms is None else min(s.short_ms, budget_ms)
        # a bracketed stream may halve its bracket `halvings` rounds past the residual steps' `rounds`
        if k >= cfg.rounds + (cfg.halvings if s.bracketed else 0) or (row.reached and not overshoot):
            s.done = True
            return
        if s.reach_ms is not None and s.short_ms is not None:  # s.bracketed
            # bracketed between a budget that reached (far past the aim) and a looser one that fell short: the next
            # round halves the bracket. A step by the residual would follow one timing's noise, back and forth past
            # the aim, and could keep a model cut deeper than needed
            s.budget = 0.5 * (s.reach_ms + s.short_ms)
            log.info(
                "%s: between a budget that reached (%.2f ms) and one that fell short (%.2f ms): next at %.2f ms",
                s.name,
                s.reach_ms,
                s.short_ms,
                s.budget,
            )
            return
        if s.loosened:  # the looser round reached too, still far past the aim: it stays kept
            s.done = True
            return
        s.loosened = row.reached
        step_to = loose_ms if row.reached else aim_ms
        s.budget -= (timed.gac_measured_ms - step_to) * reference_ms / timed.baseline_measured_ms
        if s.budget < s.floor_ms:
            log.warning("%s: the tightened budget is below the fastest dims: stopping after round %d", s.name, k)
            s.done = True

    def _outcome(self, streams: list[Stream]) -> LatencyOutcome:
        """Of the streams that reached the target, the lower held-back loss (the knapsack's on a tie); of none, the
        fastest measured. The other streams' models are let go."""
        cfg = self.cfg
        kept = [s for s in streams if s.kept is not None]
        reached = [s for s in kept if s.reached]
        if reached:
            best = min(reached, key=lambda s: (ranked(s.loss), s.name != "latency"))
        else:
            best = max(kept, key=lambda s: s.kept_round.timed.measured_speedup)
            log.warning(
                "no round reached %.4gx%s%s: kept the fastest measured (%.3fx, A/A floor %.1f%%)",
                cfg.aim,
                cfg.where,
                f" (the {cfg.speedup:g}x target and its {100 * cfg.margin:g}% margin)" if cfg.margin else "",
                best.kept_round.timed.measured_speedup,
                best.kept_round.timed.aa_floor_pct,
            )
        for s in streams:
            if s is not best:
                s.model = None
        if len(streams) > 1:
            log.info(
                "guard%s: kept the %s stream's model (%s)",
                cfg.where,
                best.name,
                ", ".join(
                    f"{s.name}: {'reached' if s.reached else 'short'}"
                    + (f", held-back loss {s.loss:.4f}" if s.loss is not None else "")
                    for s in streams
                ),
            )
        return LatencyOutcome(cfg, self.lm, streams, best)
