"""`--compressor auto`: every candidate compressor (gac.compressors.AUTO_CANDIDATES) analyzed at its defaults on one
shared calibration pass, its best dims at the run's objective predicted, the best AUTO_BUILT of them (by predicted loss)
built and measured on held-back calibration windows, and the best measured kept. The evaluation text is never read
here: it judges the kept model afterwards, as it would any single compressor's.

Each built candidate goes through the single run's own selection (its objective's, gac.objectives.base.Objective:
predict, then build; under --speedup its closed loop, whose guard compares its two streams by the same held-back loss
on the same windows), so given the same timings it is the model `--compressor <name>` keeps, and the kept one is the
best on those windows of every stream of every compressor built. What differs with the objective (one parameter
target for all, which figures rank the candidates, the wording of why) is the objective's.

Predicted loss is the increase of the mean next-token loss over the original, in nats per token. A unit whose
quality is the loss model's (Unit.loss_in_nats: the low-rank compressors with importance "output") predicts it;
another (prune: taylor importances, relative and unitless) cannot, so its loss at the predicted dims is measured on
the held-back windows instead, a cut being cheap. The ranking is then in one unit throughout."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from gac.calibration.importance import OUTPUT, output_fisher
from gac.calibration.stats import calibrate, weight_of
from gac.compressors import AUTO_BUILT, AUTO_CANDIDATES, compressor_for, config_for
from gac.compressors.base import Compressor, Stats, Unit
from gac.config import CompressConfig
from gac.errors import ConfigError, GacError, literal
from gac.evaluate.latency import prefill_timings
from gac.evaluate.perplexity import mean_loss  # the held-back loss, the --speedup guard's too
from gac.hw.heap import map_large_allocations
from gac.models.groups import DimGroup, linears_of
from gac.objectives.base import Analyzed, Prediction, Selected
from gac.pipelines.whole_model import analyze_with

log = logging.getLogger(__name__)
T = TypeVar("T")


def _set(value: T | None, what: str) -> T:
    """A candidate's `what`, set by an earlier stage (a skipped candidate goes no further)."""
    if value is None:
        raise RuntimeError(f"auto: a candidate's {what} is used before it was set")
    return value


LOSS_MODEL, MEASURED_AT_PREDICTED = "loss model", "held-back windows at the predicted dims"


def predicted_loss(units: Sequence[Unit], dims: dict[str, int | None]) -> float | None:
    """The loss model's predicted increase at `dims` summed over the units (nats per token), or None where a unit's
    quality is not a loss in nats."""
    if not all(u.loss_in_nats for u in units):
        return None
    return -math.fsum(u.quality_values([dims.get(u.name)])[0] for u in units)


@dataclass
class Predicted:
    """What a candidate predicts at the objective before it is built: its loss (nats per token over the original)
    and where that came from, its parameters, and under --speedup its time."""

    loss: float
    loss_from: str  # LOSS_MODEL or MEASURED_AT_PREDICTED
    params: int
    ms: float | None = None  # --speedup: the latency tables' prediction
    speedup: float | None = None

    @classmethod
    def of(cls, loss: float, loss_from: str, params: int, figures: dict[str, float]) -> Predicted:
        """With the objective's own figures (gac.objectives.base.Prediction.figures: "ms", "speedup", or none)."""
        return cls(loss, loss_from, params, **figures)

    def to_dict(self) -> dict[str, Any]:
        """report.json's "predicted" of a candidate."""
        timed = {} if self.ms is None else {"ms": self.ms, "speedup": self.speedup}
        return {"loss": self.loss, "loss_from": self.loss_from, "params": self.params, **timed}


@dataclass
class Measured:
    """What a built candidate measured: its held-back loss over the original's and its parameters; its speedup
    (under --ratio timed beside the original where the run evaluates); under --speedup whether its closed loop
    reached the target and each stream's held-back loss."""

    loss: float
    params: int
    speedup: float | None = None
    reached: bool | None = None
    streams: dict[str, float] | None = None

    @classmethod
    def of(cls, loss: float, params: int, figures: dict[str, Any]) -> Measured:
        """With the objective's own figures (gac.objectives.base.Objective.measured)."""
        return cls(loss, params, **figures)

    def to_dict(self) -> dict[str, Any]:
        """report.json's "measured" of a candidate, and what the objective ranks by (Objective.rank)."""
        figures = {"speedup": self.speedup, "reached": self.reached, "streams": self.streams}
        return {"loss": self.loss, "params": self.params, **{k: v for k, v in figures.items() if v is not None}}


@dataclass
class Candidate:
    """One compressor under auto: its run's config, its analysis, what it predicts and, once built, measures."""

    name: str
    config: CompressConfig  # naming this compressor (the objective's options resolved for it)
    compressor: Compressor | None = None
    groups: Sequence[DimGroup] | None = None
    analyzed: Analyzed | None = None  # its heavy factors released once predicted
    prediction: Prediction | None = None  # its objective's (--speedup: its closed loop fitted), which builds it
    selected: Selected | None = None  # once built
    predicted: Predicted | None = None
    measured: Measured | None = None
    error: GacError | None = None  # why this compressor cannot run here
    status: str = "predicted"
    common: int = 0  # parameters of the weights any candidate may touch

    def params(self, dims: dict[str, int | None]) -> int:
        """Parameters at `dims` of the weights any candidate may touch (those this one leaves at full size)."""
        units = _set(self.analyzed, "analysis").units
        return self.common - sum(u.numel for u in units) + sum(u.params(dims[u.name]) for u in units)

    @property
    def skipped(self) -> str | None:
        """Why this compressor cannot run here (its one-line error), or None."""
        return None if self.error is None else str(self.error)

    def skip(self, error: GacError) -> None:
        self.error = error
        log.info("auto: %s skipped: %s", self.name, error)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": "skipped" if self.skipped else self.status,
            "ratio": None if self.skipped else self.config.ratio,
        }
        if self.skipped:
            out["why"] = self.skipped
        out["predicted"] = None if self.predicted is None else self.predicted.to_dict()
        out["measured"] = None if self.measured is None else self.measured.to_dict()
        return out


def choose(
    model: nn.Module, calib: torch.Tensor, held_back: torch.Tensor | None, cfg: CompressConfig
) -> tuple[CompressConfig, Selected, dict[str, Any]]:
    """(the kept compressor's run config, its gac.objectives.base.Selected, report.json's "auto" section) for cfg
    (compressor "auto"; under --ratio, a share of the parameters of every weight any candidate may touch) on `model`:
    calibration statistics once on `calib` over every candidate's linears (and the loss model's output gradients once),
    each candidate analyzed in turn and its factors dropped after its prediction, the best AUTO_BUILT predicted built
    and measured on `held_back` windows, the lowest measured loss kept (under --speedup: of those whose closed loop
    reached the target; of none, the fastest)."""
    if held_back is None:
        raise ValueError("--compressor auto measures its candidates on held-back windows: the run must load them")
    # Each analysis frees GiBs of factors and whitened weights before the next begins; from glibc's heap those would
    # stay resident and add up across the candidates.
    map_large_allocations()
    objective = cfg.objective
    candidates = [_candidate(name, model, cfg) for name in AUTO_CANDIDATES]
    common = _compressible(model, [c for c in candidates if not c.skipped])
    for c in candidates:
        c.common = common
        if not c.skipped:  # under --ratio one parameter target for all: the same parameters removed
            try:
                c.config = objective.candidate_config(c.config, _set(c.groups, "groups"), common)
            except GacError as e:
                c.skip(e)
    live = [c for c in candidates if not c.skipped]
    if not live:
        raise ConfigError(
            f"no compressor can run on this model at this target ({_reasons(candidates)}): name one "
            "compressor to see why"
        )
    stats = shared_statistics(model, calib, live, cfg)
    baseline = mean_loss(model, held_back)
    for c in live:
        _predict(c, model, calib, stats, held_back, baseline, cfg)
    ranked = sorted((c for c in live if not c.skipped), key=lambda c: _set(c.predicted, "prediction").loss)
    if not ranked:
        raise ConfigError(
            f"no compressor reaches this target ({_reasons(candidates)}): use a smaller {{ratio}} or {{speedup}}"
        )
    built = []
    for c in ranked[:AUTO_BUILT]:
        try:
            _build(c, model, stats, held_back, baseline, cfg)
            built.append(c)
        except GacError as e:  # e.g. a closed loop that finds no choice within its budget
            c.skip(e)
            _set(c.compressor, "compressor").release_factors(_set(c.analyzed, "analysis").units)
    del stats
    if not built:
        raise ConfigError(
            f"no compressor built reaches this target ({_reasons(ranked[:AUTO_BUILT])}): use a smaller "
            "{ratio} or {speedup}"
        )
    if cfg.evaluate and not objective.times_candidates:
        _time_beside(model, built, cfg)
    kept = min(built, key=lambda c: objective.rank(_set(c.measured, "measurement").to_dict()))
    for c in built:
        if c is not kept:
            _release(c)
    kept.status = "kept"
    why = _why(kept, built, cfg)
    log.info("auto: kept %s (%s)", kept.name, why)
    report = {
        "candidates": {c.name: c.to_dict() for c in candidates},
        "kept": kept.name,
        "why": why,
        "built": [c.name for c in ranked[:AUTO_BUILT]],
        "held_back_windows": len(held_back),
        "baseline_loss": baseline,
    }
    report["compressible_params"] = common
    report.update(objective.auto_report(cfg, common))
    return kept.config, _set(kept.selected, "selection"), report


def _candidate(name: str, model: nn.Module, cfg: CompressConfig) -> Candidate:
    """The candidate `name` with its groups, or skipped with the one-line reason it cannot run here."""
    config = config_for(name)  # at its defaults
    c = Candidate(name, dataclasses.replace(cfg, compressor=config))
    try:
        c.compressor = compressor = compressor_for(config)
        compressor.factorization = cfg.factorization_method
        c.groups = compressor.groups(model)
    except GacError as e:
        c.skip(e)
    return c


def _compressible(model: nn.Module, live: list[Candidate]) -> int:
    """Parameters of the weights any candidate may touch (each weight once): what --ratio is a share of under auto.
    Each compressor's own compressible weights differ (palu: K and V; prune: all but the first and last layer), so
    the same ratio of its own would compare models of different sizes."""
    return sum(
        weight_of(model, n).numel()
        for n in dict.fromkeys(n for c in live for n in linears_of(_set(c.groups, "groups")))
    )


def _reasons(candidates: list[Candidate]) -> str:
    """Why each skipped candidate cannot run, as a ConfigError's words (their own fields named as they were)."""
    return "; ".join(
        f"{c.name}: {c.error.template if isinstance(c.error, ConfigError) else literal(c.error)}"
        for c in candidates
        if c.error is not None
    )


def shared_statistics(model: nn.Module, calib: torch.Tensor, live: list[Candidate], cfg: CompressConfig) -> Stats:
    """gac.calibration.stats's statistics over the union of the candidates' linears (X^T X when any needs it), with the
    loss model's output-gradient Fisher cached for every linear a candidate scores by it: the calibration pass and that
    gradient pass run once for all. A linear's figures do not depend on which others are collected beside it."""
    parts = [(_set(c.compressor, "compressor"), linears_of(_set(c.groups, "groups"))) for c in live]
    names = list(dict.fromkeys(n for _, linears in parts for n in linears))
    stats = calibrate(model, calib, names, xtx=any(c.needs_xtx for c, _ in parts), progress=cfg.progress)
    scored = list(dict.fromkeys(n for c, linears in parts if c.proxy == OUTPUT for n in linears))
    if scored:
        for n, fisher in output_fisher(model, calib, scored, progress=cfg.progress).items():
            stats[n].out_fisher = fisher  # gac.compressors.base.add_loss_curves reads it instead of a pass
    return stats


def _predict(
    c: Candidate,
    model: nn.Module,
    calib: torch.Tensor,
    stats: Stats,
    held_back: torch.Tensor,
    baseline: float,
    cfg: CompressConfig,
) -> None:
    """Analyze `c` and predict its loss, parameters (and, under --speedup, time) at the objective, from its loss model
    (or measured at the predicted dims where it has none in nats) and the latency tables; then drop its factors."""
    compressor = _set(c.compressor, "compressor")
    try:
        c.analyzed = analyze_with(model, calib, c.config, compressor, _set(c.groups, "groups"), stats, held_back)
        units = c.analyzed.units
        # --ratio: the selection itself; --speedup: the latency tables fitted and solved once, no round built or timed
        c.prediction = cfg.objective.predict(model, c.analyzed, c.config)
        dims, timing = c.prediction.dims, c.prediction.figures
        loss, source = predicted_loss(units, dims), LOSS_MODEL
        if loss is None:
            cut = compressor.built(model, units, dims)
            loss, source = mean_loss(cut, held_back) - baseline, MEASURED_AT_PREDICTED
            del cut
        c.predicted = predicted = Predicted.of(loss, source, c.params(dims), timing)
    except GacError as e:  # e.g. a speedup out of this compressor's reach
        c.skip(e)
        return
    finally:
        if c.analyzed is not None:
            compressor.release_factors(c.analyzed.units)
    log.info(
        "auto: %s analyzed: predicted loss %+.4f nats/token (%s), %s params%s",
        c.name,
        predicted.loss,
        predicted.loss_from,
        f"{predicted.params:,}",
        f", {predicted.ms:.2f} ms ({predicted.speedup:.3f}x)" if predicted.ms is not None else "",
    )


def _build(
    c: Candidate,
    model: nn.Module,
    stats: Stats,
    held_back: torch.Tensor,
    baseline: float,
    cfg: CompressConfig,
) -> None:
    """Factorize `c` again, build its model at the objective (under --speedup: its closed loop, built and timed, as
    the single run's) and measure it on the held-back windows (under --speedup the guard measured its streams' models
    there already: each reaching stream's loss is reported); the model waits in c.selected.built for the run to keep or
    drop it."""
    compressor, analyzed = _set(c.compressor, "compressor"), _set(c.analyzed, "analysis")
    compressor.factorize_units(model, analyzed.units, stats)  # the factors released after prediction
    # --ratio: its saved variant cut; --speedup: the single run's closed loop, its fit already measured by the
    # prediction
    c.selected = selected = _set(c.prediction, "prediction").build()
    timing, loss = cfg.objective.measured(selected, baseline)  # --speedup: the guard's loss, None where none measured
    variant = cfg.saved_variant  # under --speedup "gac" (it excludes align:False)
    built, dims = selected.built[variant], selected.dims[variant]
    if loss is None:
        loss = mean_loss(built, held_back) - baseline
    c.measured = measured = Measured.of(loss, c.params(dims), timing)
    c.status = "built"
    log.info(
        "auto: %s built: measured loss %+.4f nats/token on %d held-back windows%s",
        c.name,
        measured.loss,
        len(held_back),
        f", {timing['speedup']:.3f}x measured" if timing else "",
    )


def _time_beside(model: nn.Module, built: list[Candidate], cfg: CompressConfig) -> None:
    """--ratio: each built model's prefill speedup, timed round-robin beside the original at the evaluation's shape
    (reported, not chosen by: at equal parameters the loss decides)."""
    lat = cfg.evaluation_latency
    models = {"baseline": model, **{c.name: _set(c.selected, "selection").built[cfg.saved_variant] for c in built}}
    t = prefill_timings(models, lat.batch, lat.prefill_tokens, lat)
    for c in built:
        _set(c.measured, "measurement").speedup = t["baseline"].median_ms / t[c.name].median_ms


def _release(c: Candidate) -> None:
    """Let a built candidate that was not kept go: its model and factors."""
    _set(c.compressor, "compressor").release_factors(_set(c.analyzed, "analysis").units)
    _set(c.selected, "selection").built.clear()
    c.selected = c.prediction = None  # under --speedup its closed loop's outcome holds the model too


def _why(kept: Candidate, built: list[Candidate], cfg: CompressConfig) -> str:
    figures = ", ".join(f"{c.name} {_set(c.measured, 'measurement').loss:+.4f}" for c in built)
    return cfg.objective.why_kept(_set(kept.measured, "measurement").to_dict(), figures)
