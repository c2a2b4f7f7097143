"""One run's analysis and selection: calibrate -> analyze (the compressor's units) -> select (the dims of the run's
objective) -> materialize the variants. gac.api orchestrates a run around them; gac.auto runs them once per
compressor."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from gac.align.select import parameter_budget
from gac.errors import GacError

log = logging.getLogger(__name__)


def reduced_dims(dims: dict) -> dict:
    """{group: dim} for the groups a variant reduced (whole groups left out), as report.json lists them."""
    return {name: int(d) for name, d in dims.items() if d is not None}


@dataclass
class Analyzed:
    """The compressor's calibrated units: what every objective and ratio selects from."""

    compressor: object
    units: list  # the compressor's units, one per dimension group (gac.compressors.base.Unit)
    names: list[str]  # the linears the units cover: params and alignment are measured over these
    compressible: int
    windows: object  # held-back calibration windows [n, seq] the --speedup guard compares on (None: no guard)


@dataclass
class Selected(Analyzed):
    """What the compressor found and GAC chose; models are cut later, except those the selection built itself."""

    budget: int
    dims: dict  # variant ("unaligned", "gac") -> {unit name: dim or None}
    selection: object  # gac.align.plan.SelectionResult, or gac.closed_loop.LatencyOutcome under --speedup
    profile_excluded: dict | None = None  # {unit name: {dim: reason}}: aligned dims the profile ruled out
    target: dict | None = None  # report.json's "target": which dims the deployment target constrained, and why
    built: dict = field(default_factory=dict)  # {variant: model} already cut at its dims (the closed loop's kept one)


def analyze(model, calib, cfg, compressor=None, source=None, held_back=None) -> Analyzed:
    """Calibrate on `calib` [n, seq] and let the compressor analyze every group (spectra, loss model, importance) at
    keep = 1 - cfg.analysis_ratio. The model is not changed. source: a gac.models.lazy weight source for the
    layer-by-layer pipeline (None: the whole model at once); held_back: the windows the --speedup guard compares
    models on (gac.data.held_back_windows; None: no guard)."""
    from gac.calibrate import calibrate
    from gac.compressors import make_compressor
    from gac.models.groups import linears_of

    compressor = compressor or make_compressor(cfg.compressor, **cfg.compressor_options)
    compressor.factorization = cfg.factorization_method
    groups = compressor.groups(model)
    if cfg.speedup is None:
        check_feasible(groups, cfg)
    if source is None:
        stats = calibrate(model, calib, linears_of(groups), xtx=compressor.needs_xtx, progress=cfg.progress)
        return analyze_with(model, calib, cfg, compressor, groups, stats, held_back)
    from gac.pipeline.analyze import analyze_layerwise

    units = analyze_layerwise(model, source, compressor, groups, calib, keep=1.0 - cfg.analysis_ratio,
                              progress=cfg.progress)
    return Analyzed(compressor, units, linears_of(groups), sum(u.group.numel for u in units), held_back)


def analyze_with(model, calib, cfg, compressor, groups, stats: dict, held_back=None) -> Analyzed:
    """The compressor's analysis of `groups` from calibration statistics already collected on `calib` (`stats`:
    gac.calibrate.calibrate's, over at least the groups' linears; shared by `--compressor auto`), the whole model in
    memory."""
    from gac.compressors.sensitivity import PROBE_TOKENS
    from gac.models.groups import linears_of

    probe = calib[:1, :PROBE_TOKENS]  # one short window: the loss probe for measured importance
    grads = {"windows": calib} if compressor.needs_windows else {}  # gradient-based importance
    units = compressor.analyze(model, groups, stats, probe=probe, keep=1.0 - cfg.analysis_ratio,
                               progress=cfg.progress, **grads)
    return Analyzed(compressor, units, linears_of(groups), sum(u.group.numel for u in units), held_back)


def latency_loop(model, analyzed: Analyzed, cfg):
    """The --speedup closed loop (gac.closed_loop.ClosedLoop) over an analysis, not yet run."""
    from gac.closed_loop import ClosedLoop

    return ClosedLoop(model, analyzed.compressor, analyzed.units, cfg.speedup, alignment=cfg.alignment,
                      device=cfg.device, dtype=cfg.dtype, windows=analyzed.windows, progress=cfg.progress)


def select_dims(model, analyzed: Analyzed, cfg, loop=None) -> Selected:
    """The dims of cfg's objective from analyzed units: under --speedup the latency closed loop (`loop`, one already
    fitted, else latency_loop's; it builds and times `model`'s variants and hands its kept model on), else the
    compressor's d* under the ratio's budget, then aligned dims by the knapsack (candidates from the static rule, a
    deployment target or a hardware profile). The model is not changed."""
    from gac.align.select import select_within_budget

    compressor, units, compressible = analyzed.compressor, analyzed.units, analyzed.compressible
    if cfg.speedup is not None:  # latency as the objective: no parameter budget
        outcome = (loop or latency_loop(model, analyzed, cfg)).run()
        return Selected(**vars(analyzed), budget=compressible, dims={"gac": outcome.dims}, selection=outcome,
                        built={"gac": outcome.model})
    budget = parameter_budget(cfg.ratio, compressible)
    unaligned = compressor.allocate(units, budget)

    candidates_for = None
    if cfg.target:
        from gac.align.targets import get_target

        candidates_for = get_target(cfg.target).candidates_for(cfg.alignment)
    if cfg.profile:
        from gac.align.profiled import profile_candidates_for

        candidates_for = profile_candidates_for(cfg.profile, units, unaligned, device=cfg.device, dtype=cfg.dtype,
                                                m=cfg.latency.prefill_tokens, alignment=cfg.alignment,
                                                window=cfg.window, progress=cfg.progress)
    selection = select_within_budget(units, unaligned, budget, alignment=cfg.alignment, window=cfg.window,
                                     candidates_for=candidates_for)
    excluded = candidates_for.excluded_dims() if cfg.profile and candidates_for is not None else None
    gac_dims = {**unaligned, **selection.dims}
    target = None
    if cfg.target:
        from gac.align.targets import get_target

        spec = get_target(cfg.target)
        target = spec.report(units, gac_dims)
        target["unaligned_met"] = spec.report(units, unaligned)["met"]
    return Selected(**vars(analyzed), budget=budget, dims={"unaligned": unaligned, "gac": gac_dims},
                    selection=selection, profile_excluded=excluded, target=target)


def analyze_and_select(model, calib, cfg, compressor=None, source=None, held_back=None) -> Selected:
    """analyze, then select_dims: calibrate, analyze and choose the dims of cfg's objective."""
    return select_dims(model, analyze(model, calib, cfg, compressor, source, held_back), cfg)


def materialize_variants(model, selected: Selected) -> dict:
    """{variant: model} for "unaligned" and "gac": each a deep copy of `model`, cut through surgery; a variant the
    selection built already (the closed loop's kept model) is taken as it was built and timed."""
    models = {}
    for variant, dims in selected.dims.items():
        if variant in selected.built:
            models[variant] = selected.built[variant].eval()
            continue
        models[variant] = selected.compressor.built(model, selected.units, dims)
    return models


def check_feasible(groups, cfg) -> None:
    """From the shapes alone, before any calibration: can every group keep its smallest (aligned) dim?"""
    compressible = sum(g.numel for g in groups)
    budget = parameter_budget(cfg.ratio, compressible)
    smallest = sum(g.params(max(g.min_dim, min(cfg.alignment, g.max_dim))) for g in groups)
    if smallest > budget:
        largest = math.floor((1.0 - smallest / compressible) * 1000) / 1000
        raise GacError(f"ratio {cfg.ratio} leaves {budget:,} parameters but the {cfg.compressor} compressor's smallest "
                       f"aligned dims need {smallest:,}: use --ratio {largest} or lower")
