"""Latency as the objective (`speedup`): the closed loop (loop.py) solves the knapsack over the latency tables
(knapsack.py, model.py) beside the guard's parameter choice (guard.py), builds and times the models (config.py's
Instruments, journal.py) and keeps the best that reaches the target (outcome.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gac.objectives.base import Analyzed, Selected
    from gac.objectives.latency.loop import ClosedLoop


def latency_loop(model, analyzed: Analyzed, cfg) -> ClosedLoop:
    """The closed loop over an analysis, not yet run."""
    from gac.objectives.latency.loop import ClosedLoop

    return ClosedLoop(
        model,
        analyzed.compressor,
        analyzed.units,
        cfg.speedup,
        alignment=cfg.alignment,
        device=cfg.device,
        dtype=cfg.dtype,
        windows=analyzed.windows,
        progress=cfg.progress,
    )


def select_dims(model, analyzed: Analyzed, cfg, loop: ClosedLoop | None = None) -> Selected:
    """The latency objective's dims: the closed loop (`loop`, one already fitted, else latency_loop's) builds and
    times `model`'s variants and hands its kept model on; no parameter budget."""
    from gac.objectives.base import Selected

    outcome = (loop or latency_loop(model, analyzed, cfg)).run()
    return Selected(
        **vars(analyzed),
        budget=analyzed.compressible,
        dims={"gac": outcome.dims},
        selection=outcome,
        built={"gac": outcome.model},
    )
