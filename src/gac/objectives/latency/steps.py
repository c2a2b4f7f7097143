"""The steps of `--speedup`'s closed loop that do not depend on its state: the original timed beside built models,
the knapsack's items from the latency tables, the tables fitted on a reference model, the first budget."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from gac.evaluate.bench import AA_SUFFIX
from gac.objectives.latency.config import SpeedupConfig
from gac.objectives.latency.knapsack import LatencyItem
from gac.objectives.latency.model import FULL, LatencyModel, reference_dims

if TYPE_CHECKING:
    from torch import nn

    from gac.compressors.base import Compressor, Unit
    from gac.hw.timing import Timing

log = logging.getLogger(__name__)


def time_beside(
    model: nn.Module, built: dict[str, nn.Module], cfg: SpeedupConfig
) -> tuple[float, float, dict[str, Timing]]:
    """(baseline median ms, A/A floor as a fraction, {name: Timing}): the original, its A/A twin and every built model
    ({name: model}) timed round-robin in one run at the objective's phase and shape (cfg.instruments' timer)."""
    t = cfg.instruments.time({"baseline": model, **built}, cfg, aa=True)
    base = t["baseline"].median_ms
    return base, abs(t["baseline" + AA_SUFFIX].median_ms / base - 1.0), t


def latency_items(
    units: Sequence[Unit], latency_model: LatencyModel, *, held: Collection[str] = frozenset()
) -> list[LatencyItem]:
    """One knapsack item per unit: its candidates, their predicted ms, retained quality and parameters; a unit
    named in `held` has the original (FULL) as its only candidate."""
    items = []
    for u in units:
        table = latency_model.tables[u.name]
        cands = [FULL] if u.name in held else list(table)
        items.append(
            LatencyItem(
                u.name,
                tuple(cands),
                tuple(table[d] for d in cands),
                tuple(u.quality_values(cands)),
                tuple(u.params(d) for d in cands),
            )
        )
    return items


def fit_latency(
    model: nn.Module,
    compressor: Compressor,
    units: list[Unit],
    lm: LatencyModel,
    cfg: SpeedupConfig,
    *,
    groups: Sequence[str] | None = None,
) -> LatencyModel:
    """`lm` fitted (LatencyModel.fitted) on the original and a reference model built with `groups` (default: every
    unit's) at reference_dims, timed side by side at the objective's phase and shape (cfg.instruments' timer)."""
    dims = reference_dims(lm, [u.name for u in units] if groups is None else groups)
    calibration = dataclasses.replace(cfg, timing_rounds=max(cfg.timing_rounds, 5))  # a median robust to a spike
    time = cfg.instruments.time
    if not dims:  # nothing the objective may cut: the constant alone
        return lm.calibrated(time({"baseline": model}, calibration, aa=False)["baseline"].median_ms)
    reference = compressor.built(model, units, {u.name: dims.get(u.name) for u in units})
    t = time({"baseline": model, "reference": reference}, calibration, aa=False)
    del reference
    fitted = lm.fitted(t["baseline"].median_ms, dims, t["reference"].median_ms)
    log.info(
        "latency tables%s fitted on a reference model: it measured %.2f ms against the original's %.2f ms, "
        "the sweeps' predicted saving scaled by %.3f",
        cfg.where,
        t["reference"].median_ms,
        t["baseline"].median_ms,
        fitted.meta["saving_scale"],
    )
    return fitted


def start_budget(
    baseline_ms: float, constant_ms: float, floor_ms: float, cfg: SpeedupConfig, *, warn: bool = True
) -> float:
    """The groups' first latency budget: at the target and its margin, or, where only the margin is out of reach, at
    the fastest dims (the target itself out of reach: its budget, which the solver refuses in one line)."""
    at_target = baseline_ms / cfg.speedup - constant_ms
    at_aim = baseline_ms / cfg.aim - constant_ms
    if warn and at_aim < floor_ms <= at_target:
        log.warning(
            "speedup %gx%s is predicted within reach but not its %g%% margin: aiming at the fastest dims, "
            "predicted %.3fx",
            cfg.speedup,
            cfg.where,
            100 * cfg.margin,
            baseline_ms / (constant_ms + floor_ms),
        )
    return max(at_aim, min(floor_ms, at_target))
