"""Latency as the objective (`speedup`: LatencyObjective): the closed loop (loop.py) solves the knapsack over the
latency tables (knapsack.py, model.py) beside the guard's parameter choice (guard.py), builds and times the models
(config.py's Instruments, journal.py) and keeps the best that reaches the target (outcome.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gac.errors import ConfigError
from gac.objectives.base import Analyzed, Objective, Prediction, RunConfig, Selected
from gac.objectives.latency.config import SpeedupConfig, objective_config
from gac.objectives.latency.loop import ClosedLoop
from gac.objectives.latency.outcome import LatencyOutcome

if TYPE_CHECKING:
    from torch import nn

    from gac.evaluate.latency import LatencyConfig


def speedup_of(cfg: RunConfig) -> SpeedupConfig:
    """The run's SpeedupConfig: a run's objective is latency only where its config gives one (objective_for)."""
    if cfg.speedup is None:
        raise ValueError("the latency objective needs a speedup in the run's config")
    return cfg.speedup


def latency_loop(model: nn.Module, analyzed: Analyzed, cfg: RunConfig) -> ClosedLoop:
    """The closed loop over an analysis, not yet run."""
    return ClosedLoop(
        model,
        analyzed.compressor,
        analyzed.units,
        speedup_of(cfg),
        alignment=cfg.alignment,
        device=cfg.device,
        dtype=cfg.dtype,
        windows=analyzed.windows,
        progress=cfg.progress,
    )


class LatencyObjective(Objective[LatencyOutcome]):
    """`speedup`: a measured latency and its closed loop, timed with the whole model on the device; its selection is
    the loop's LatencyOutcome."""

    name = "latency"
    forces_whole_model = "--speedup"
    times_candidates = True
    ranking = "lowest loss on the held-back calibration windows of those that reached the target"

    def check(self, cfg: RunConfig) -> dict[str, Any]:
        """A speedup measures its own tables and saves its own dims, with the whole model on the device; its config
        resolved for the compressor (gac.objectives.latency.config.objective_config)."""
        excluded = (
            (cfg.profile, "profile", "parameter candidates; {speedup} measures its own tables"),
            (not cfg.align, "align:False", "the compressor's own dims under a ratio"),
            (cfg.target, "target", "the parameter objective's candidates"),
        )
        for given, name, why in excluded:
            if given:
                raise ConfigError(
                    f"{{speedup}} and {{{name}}} exclude each other ({{{name}}} is for {why}): give one of them"
                )
        if cfg.compressor_options.get("drop_experts"):
            raise ConfigError(
                "{drop_experts} removes parameters under a ratio's budget, and {speedup} has none: drop "
                "{drop_experts}, or use {ratio}"
            )
        if off_whole := cfg.off_whole_model():
            raise ConfigError(
                "{speedup} times the whole model on the device, so it cannot run layer by layer: drop "
                f"{off_whole}, or use {{ratio}}"
            )
        return {"speedup": objective_config(cfg.compressor.name, cfg.compressor_options, speedup_of(cfg))}

    def evaluation_latency(self, cfg: RunConfig) -> LatencyConfig:
        """cfg.latency at the objective's phase shape."""
        return speedup_of(cfg).latency_config(cfg.latency)

    def needs_held_back(self, cfg: RunConfig) -> bool:
        """The guard compares its two streams' models there."""
        return speedup_of(cfg).guard

    def select_dims(
        self, model: nn.Module, analyzed: Analyzed, cfg: RunConfig, loop: ClosedLoop | None = None
    ) -> Selected[LatencyOutcome]:
        """The latency objective's dims: the closed loop (`loop`, one already fitted, else latency_loop's) builds and
        times `model`'s variants and hands its kept model on; no parameter budget."""
        outcome = (loop or latency_loop(model, analyzed, cfg)).run()
        return Selected(
            **vars(analyzed),
            budget=analyzed.compressible,
            dims={"gac": outcome.dims},
            selection=outcome,
            built={"gac": outcome.model},
        )

    def report_sections(self, selected: Selected[LatencyOutcome], cfg: RunConfig) -> dict[str, Any]:
        return {"objective": speedup_of(cfg).objective(), "latency_objective": selected.selection.report()}

    def variant_figures(self, selected: Selected[LatencyOutcome]) -> dict[str, dict[str, float]]:
        return selected.selection.variant_figures()

    def predict(self, model: nn.Module, analyzed: Analyzed, cfg: RunConfig) -> Prediction[LatencyOutcome]:
        """The latency tables fitted and solved once: no round built or timed; building runs the closed loop on that
        fit, as the single run's."""
        loop = latency_loop(model, analyzed, cfg)
        choice, ms, baseline_ms = loop.predict()
        return Prediction(
            choice.dims,
            {"ms": ms, "speedup": baseline_ms / ms},
            lambda: self.select_dims(model, analyzed, cfg, loop=loop),
        )

    def measured(self, selected: Selected[LatencyOutcome], baseline_loss: float) -> tuple[dict[str, Any], float | None]:
        """The closed loop's measured speedup, whether it reached, and each stream's held-back loss (the guard
        measured its reaching models there); the kept one's loss, None where no guard measured it (--no-guard, or
        none reached)."""
        outcome = selected.selection
        streams = {s.name: s.loss - baseline_loss for s in outcome.streams if s.loss is not None}
        speedup = outcome.kept.timed.measured_speedup
        figures = {"speedup": speedup, "reached": outcome.chosen.reached, "streams": streams}
        return figures, streams.get(outcome.chosen.name)

    def rank(self, measured: dict[str, Any]) -> tuple[Any, ...]:
        """First whether the closed loop reached; of models that did, the lower loss; of those that did not, the
        faster."""
        return (not measured["reached"], measured["loss"] if measured["reached"] else -measured["speedup"])

    def why_kept(self, measured: dict[str, Any], figures: str) -> str:
        if not measured["reached"]:
            return f"no built compressor reached the target: the fastest measured ({measured['speedup']:.3f}x)"
        return super().why_kept(measured, figures)


LATENCY = LatencyObjective()
