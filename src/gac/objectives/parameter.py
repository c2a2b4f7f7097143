"""The parameter objective (`ratio`: ParameterObjective): the compressor's d* under the budget
B = floor((1 - ratio) |W|), then aligned dims by the knapsack. Its selection policy: the plan built from a
compressor's units, the candidate window that is widened only when the budget cannot be met, and the fallback from
profile candidates to the static rule.

A unit is what a compressor returns per dimension group: `unit.group` (gac.models.groups.DimGroup: params per
dim, grid, bounds), `unit.marginal_score(d)` (importance per parameter at d) and `unit.loss_gains(d, candidates)`
(the predicted loss saved at each candidate, from the compressor's loss model; None without one).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gac.align.candidates import aligned_candidates
from gac.align.plan import SelectionResult, select
from gac.align.profiled import ProfileCandidates, profile_candidates_for
from gac.align.targets import get_target
from gac.errors import ConfigError, InfeasibleBudget
from gac.objectives.base import Analyzed, C, Objective, Prediction, RunConfig, Selected

if TYPE_CHECKING:
    from torch import nn

    from gac.compressors.base import Unit
    from gac.models.groups import DimGroup

# candidates_for(unit, d*, window) -> the dims a unit may take (a profile's or a deployment target's)
# candidates_for(unit, d*, window): a target's or a profile's aligned dims near d* (None: keep the group whole)
CandidatesFor = Callable[..., Sequence[int | None]]

log = logging.getLogger(__name__)
DEFAULT_RATIO = 0.15  # the parameter objective's ratio when neither a ratio nor a speedup is given
MAX_EXTRA_WINDOW = 3  # the window grows by at most this many alignment steps
# `gac compress`'s re-selection: aligned candidates one step each side of the compressor's d* (an external plan,
# whose d* may be far from any aligned dim, searches candidates.WINDOW steps)
COMPRESS_WINDOW = 1


def parameter_budget(ratio: float, compressible: int) -> int:
    """B = floor((1 - ratio) |W|): the parameters the compressible weights may keep (report.json's budget_params)."""
    return math.floor((1.0 - ratio) * compressible)


def build_plan(
    units: Sequence[Unit],
    dims: dict[str, int | None],
    budget: int,
    *,
    alignment: int,
    window: int,
    candidates_for: CandidatesFor | None = None,
) -> dict[str, Any]:
    """The selection plan (a contract, docs/DESIGN.md) for the units the compressor reduced (dim None: left whole).

    candidates_for(unit, d*, window) -> dims, from a hardware profile or a deployment target (gac.align.targets,
    which also covers head-grid groups); None: the static rule of the plan.
    Groups on a coarse grid (whole heads) offer their grid points within `window` alignment steps of d*."""
    # a whole group: its numel, or less where its cut changes it even whole (experts dropped)
    untouched = sum(u.group.params(None) for u in units if dims[u.name] is None)
    weights = []
    for u in units:
        d, g = dims[u.name], u.group
        if d is None:
            continue
        w: dict[str, Any] = {
            "name": u.name,
            "dim": float(d),
            "score": u.marginal_score(d),
            "params_per_dim": g.params_per_dim,
            "fixed_params": g.fixed_params,
            "min_dim": max(g.min_dim, min(alignment, g.max_dim)),
            "max_dim": g.max_dim,
        }
        if candidates_for is not None and getattr(candidates_for, "covers_grid", False):  # a target (targets.py)
            w["candidates"] = candidates_for(u, d, window)
        elif g.step > 1:
            w["candidates"] = [x for x in g.grid() if abs(x - d) <= window * alignment]
        elif candidates_for is not None:
            w["candidates"] = candidates_for(u, d, window)
        else:
            w["candidates"] = aligned_candidates(
                d, alignment, window=window, min_dim=w["min_dim"], max_dim=w["max_dim"]
            )
        gains = u.loss_gains(d, w["candidates"])  # a loss model: the knapsack weighs its predicted loss exactly
        if gains is not None:
            w["values"] = gains
        weights.append(w)
    return {"budget": budget - untouched, "alignment": alignment, "window": window, "weights": weights}


def select_within_budget(
    units: Sequence[Unit],
    dims: dict[str, int | None],
    budget: int,
    *,
    alignment: int,
    window: int,
    candidates_for: CandidatesFor | None = None,
) -> SelectionResult:
    """Select with the narrowest candidate window that fits the budget: a small d* rounded up to the first
    aligned dim can need room taken from other weights, further than one alignment step away.

    A profile measured around d* (e.g. --profile auto) cannot offer the widened dims it never swept: when its
    candidates cannot fit the budget at any window, the static rule gets the same chance, with a warning."""
    if all(dims[u.name] is None for u in units):  # nothing reduced (e.g. dropped experts alone meet the budget)
        untouched = sum(u.group.params(None) for u in units)
        if untouched > budget:
            raise InfeasibleBudget(
                f"budget {budget} params is infeasible: the whole groups need {untouched}; raise "
                "the budget or let the compressor reduce a group",
                untouched,
            )
        return SelectionResult(
            dims={}, params=0, budget=budget - untouched, objective=0.0, aligned_fraction=1.0, exact=True, solver_ms=0.0
        )
    try:
        return _widening(units, dims, budget, alignment, window, candidates_for)
    except InfeasibleBudget:
        if candidates_for is None:
            raise
    log.warning(
        "the %s's candidates cannot fit the budget: using the static alignment rule",
        "target" if getattr(candidates_for, "covers_grid", False) else "profile",
    )
    return _widening(units, dims, budget, alignment, window, None)


def _widening(
    units: Sequence[Unit],
    dims: dict[str, int | None],
    budget: int,
    alignment: int,
    window: int,
    candidates_for: CandidatesFor | None,
) -> SelectionResult:
    """select() at windows window .. window + MAX_EXTRA_WINDOW, the first that is feasible."""
    for w in range(window, window + MAX_EXTRA_WINDOW + 1):
        try:
            return select(build_plan(units, dims, budget, alignment=alignment, window=w, candidates_for=candidates_for))
        except InfeasibleBudget:
            if w == window + MAX_EXTRA_WINDOW:
                raise
            log.info("no aligned choice fits the budget within %d step(s) of d*: widening", w)
    raise AssertionError("unreachable")


def ratio_of(cfg: RunConfig) -> float:
    """The run's ratio: the parameter objective's field, which its settle() gave a default where none was given."""
    if cfg.ratio is None:
        raise ValueError("the parameter objective needs a ratio in the run's config")
    return cfg.ratio


def check_feasible(groups: Sequence[DimGroup], cfg: RunConfig) -> None:
    """From the shapes alone, before any calibration: can every group keep its smallest (aligned) dim?"""
    compressible = sum(g.numel for g in groups)
    budget = parameter_budget(ratio_of(cfg), compressible)
    smallest = sum(g.params(max(g.min_dim, min(cfg.alignment, g.max_dim))) for g in groups)
    if smallest > budget:
        largest = math.floor((1.0 - smallest / compressible) * 1000) / 1000
        raise ConfigError(
            f"ratio {cfg.ratio} leaves {budget:,} parameters but the {cfg.compressor.name} compressor's "
            f"smallest aligned dims need {smallest:,}: use {{ratio:{largest}}} or lower"
        )


def removed_params(ratio: float, common: int) -> int:
    """The parameters `ratio` removes of `common` (--compressor auto's one target for every candidate)."""
    return common - parameter_budget(ratio, common)


class ParameterObjective(Objective[SelectionResult]):
    """`ratio`: a parameter budget and the knapsack over aligned candidates; its selection is the knapsack's
    SelectionResult."""

    name = "parameter"
    ranking = "lowest loss on the held-back calibration windows"

    def settle(self, cfg: RunConfig) -> dict[str, Any]:
        ratio = DEFAULT_RATIO if cfg.ratio is None else cfg.ratio
        if not (isinstance(ratio, (int, float)) and 0.0 < ratio < 1.0):
            raise ConfigError(
                f"ratio {ratio} is outside (0, 1): pass the share of parameters to remove, e.g. {{ratio:0.15}}"
            )
        return {"ratio": ratio}

    def check_groups(self, groups: Sequence[DimGroup], cfg: RunConfig) -> None:
        check_feasible(groups, cfg)

    def select_dims(self, model: nn.Module, analyzed: Analyzed, cfg: RunConfig) -> Selected[SelectionResult]:
        """The dims from analyzed units: the compressor's d* under the ratio's budget, then aligned dims by the
        knapsack (candidates from the static rule, a deployment target or a hardware profile). The model is not
        changed."""
        compressor, units = analyzed.compressor, analyzed.units
        budget = parameter_budget(ratio_of(cfg), analyzed.compressible)
        unaligned = compressor.allocate(units, budget)

        candidates_for: CandidatesFor | None = None
        profiled: ProfileCandidates | None = None  # the profile's candidates, which remember what they ruled out
        if cfg.target:
            candidates_for = get_target(cfg.target).candidates_for(cfg.alignment)
        if cfg.profile:
            candidates_for = profiled = profile_candidates_for(
                cfg.profile,
                units,
                unaligned,
                device=cfg.device,
                dtype=cfg.dtype,
                m=cfg.latency.prefill_tokens,
                alignment=cfg.alignment,
                window=cfg.window,
                progress=cfg.progress,
            )
        selection = select_within_budget(
            units, unaligned, budget, alignment=cfg.alignment, window=cfg.window, candidates_for=candidates_for
        )
        excluded = profiled.excluded_dims() if profiled is not None else None
        gac_dims = {**unaligned, **selection.dims}
        target = None
        if cfg.target:
            spec = get_target(cfg.target)
            target = spec.report(units, gac_dims)
            target["unaligned_met"] = spec.report(units, unaligned)["met"]
        return Selected(
            **vars(analyzed),
            budget=budget,
            dims={"unaligned": unaligned, "gac": gac_dims},
            selection=selection,
            profile_excluded=excluded,
            target=target,
        )

    def report_sections(self, selected: Selected[SelectionResult], cfg: RunConfig) -> dict[str, Any]:
        return {"selection": selected.selection}

    def candidate_config(self, cfg: C, groups: Sequence[DimGroup], common: int) -> C:
        """`cfg` at the candidate's own ratio removing what cfg.ratio removes of the `common` parameters: one
        parameter target for all (a ConfigError where that is more than it can remove)."""
        own, removed = sum(g.numel for g in groups), removed_params(ratio_of(cfg), common)
        if removed >= own:
            raise ConfigError(
                f"removing {removed:,} parameters needs more than its {own:,} compressible ones: use a lower {{ratio}}"
            )
        # the asked ratio itself where the compressor may touch every weight: its run is then the single one's
        ratio = cfg.ratio if own == common else round(removed / own, 6)
        cfg = dataclasses.replace(cfg, ratio=ratio)
        check_feasible(groups, cfg)
        return cfg

    def predict(self, model: nn.Module, analyzed: Analyzed, cfg: RunConfig) -> Prediction[SelectionResult]:
        """The selection itself (the knapsack is cheap); building cuts the saved variant at its dims."""
        selected, variant = self.select_dims(model, analyzed, cfg), cfg.saved_variant

        def build() -> Selected[SelectionResult]:
            selected.built[variant] = analyzed.compressor.built(model, analyzed.units, selected.dims[variant])
            return selected

        return Prediction(selected.dims[variant], {}, build)

    def auto_report(self, cfg: RunConfig, common: int) -> dict[str, Any]:
        return {"ratio": cfg.ratio, "removed_params": removed_params(ratio_of(cfg), common)}


PARAMETER = ParameterObjective()
