"""Candidates from a hardware profile: measured latency around each d* (low-rank pair or GEMM N), cliffs excluded;
and the sweep specs that measure what a plan or a model needs (align depends on hw, never the reverse)."""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from gac.align.candidates import WINDOW, GroupUnit, aligned_candidates
from gac.align.plan import Plan
from gac.errors import GacError
from gac.hw.cliffs import latency_table
from gac.hw.device import ALIGNMENT
from gac.hw.profile import FixedSizes, SweepSpec, cached_sweep, load_profile
from gac.models.adapters import adapter_for, config_of
from gac.models.dims import linear_dims

log = logging.getLogger(__name__)


def profile_for_model(
    profile_arg: str,
    analyses: Iterable[GroupUnit],
    ranks: dict[str, int | None],
    *,
    device: str,
    dtype: str,
    m: int,
    alignment: int,
    window: int,
    progress: bool = True,
) -> dict:
    """Load the profile JSON at `profile_arg`, or with "auto" measure on this device each op and shape the units
    need (low-rank in -> r -> out, GEMM N over K, an MoE layer's experts), around the dims the compressor chose.
    Units on a grid (dim_step > 1: whole heads) take their candidates from the grid, not the profile, so are not
    measured.

    Auto keeps its own cache, one file per sweep spec (gac.hw.profile.cached_sweep), apart from the one-per-device
    cache of `gac profile`, so a second compression of the same model on the same device measures nothing."""
    if profile_arg != "auto":
        return load_profile(profile_arg)
    by_shape: defaultdict[tuple[str, tuple[tuple[str, int], ...]], list[int]] = defaultdict(list)  # (op, sorted
    # shape items) -> the dims chosen for units of that shape
    for u in analyses:
        if (rank := ranks[u.name]) is not None and u.group.step == 1:
            by_shape[(u.profile_op, tuple(sorted(u.profile_shape.items())))].append(rank)
    merged = None
    for (op, shape), dims in sorted(by_shape.items()):
        sizes = FixedSizes.of(op, dict(shape))
        if sizes is None:
            log.warning("cannot measure %s units automatically: their candidates follow the static rule", op)
            continue
        log.info("profiling %s %s on %s at M=%d", op, dict(shape), device, m)
        spec = SweepSpec(
            ops=(op,), dims=dims_around(dims, alignment=alignment, window=window), m_values=(m,), sizes=sizes
        )
        p = cached_sweep(spec, device=device, dtype=dtype, progress=progress)
        if merged is None:
            merged = p
        else:
            merged["ops"] += p["ops"]
    return merged or {}


def profile_candidates_for(
    profile_arg: str,
    units: Iterable[GroupUnit],
    dims: dict[str, int | None],
    *,
    device: str,
    dtype: str,
    m: int,
    alignment: int,
    window: int,
    progress: bool = True,
) -> ProfileCandidates | None:
    """candidates_for(unit, d*, window) from the profile at `profile_arg` (or "auto"), or None when auto found
    nothing to measure (only head-grid units: the static rule applies)."""
    profile = profile_for_model(
        profile_arg, units, dims, device=device, dtype=dtype, m=m, alignment=alignment, window=window, progress=progress
    )
    return candidates_from_profile(profile, m=m, alignment=alignment, window=window) if profile else None


def candidates_from_profile(profile: dict, *, m: int, alignment: int, window: int) -> ProfileCandidates:
    """A function (analysis, d*) -> candidate dims, from the profile's sweep of the unit's op (low-rank pair, GEMM N
    for pruned widths, an MoE layer's experts) nearest its shape (the N sweep of a plain GEMM over the unit's input
    size when the profile lacks the op).
    Its `excluded` attribute maps each unit asked about to {dim: why the profile dropped it}."""
    ops = {e["op"] for e in profile.get("ops", [])}
    if not ops & {"lowrank", "gemm_n", "experts"}:
        raise GacError(
            "the profile has no lowrank, gemm_n or experts sweep: measure one with `gac profile` (default ops)"
        )
    return ProfileCandidates(profile, ops, m=m, alignment=alignment, window=window)


class ProfileCandidates:
    """candidates_for(unit, d*, window) from a profile's sweeps, remembering what it ruled out: `excluded` maps each
    unit asked about to {dim: reason}, from the last (widest) window asked for."""

    def __init__(self, profile: dict, ops: set[str], *, m: int, alignment: int, window: int) -> None:
        self.profile, self.ops, self.m, self.alignment, self.window = profile, ops, m, alignment, window
        self.excluded: dict[str, dict] = {}  # for the report: which dims the profile ruled out, and why

    def __call__(self, u: GroupUnit, dim: float, window: int | None = None) -> list[int]:
        window = self.window if window is None else window
        profile, m, alignment = self.profile, self.m, self.alignment
        if u.profile_op in self.ops:
            table = latency_table(profile, u.profile_op, m=m, shape=u.profile_shape)
        else:  # e.g. a profile without the low-rank sweep: the N sweep of a GEMM over the unit's input size (a
            # pair's "in", the experts' "hidden")
            k = u.profile_shape.get("in", u.profile_shape.get("hidden", 0))
            table = latency_table(profile, "gemm_n", m=m, shape={"k": k})
        cs = profile_candidates(
            table,
            dim,
            alignment=alignment,
            window=window,
            min_dim=max(u.min_dim, min(alignment, u.max_dim)),
            max_dim=u.max_dim,
        )
        self.excluded[u.name] = cs.excluded
        return cs.candidates

    def excluded_dims(self) -> dict:
        """{unit: {dim: why}} for the units where the profile ruled dims out (report.json: profile_excluded)."""
        ruled_out = {name: why for name, why in self.excluded.items() if why}
        log.info(
            "the profile ruled out %d aligned dim(s) in %d of %d weight(s) (report.json: profile_excluded)",
            sum(map(len, ruled_out.values())),
            len(ruled_out),
            len(self.excluded),
        )
        return ruled_out


@dataclass(frozen=True)
class CandidateSet:
    """Aligned dims kept near d*, and the reason each dropped dim was dropped."""

    candidates: list[int]
    excluded: dict[int, str] = field(default_factory=dict)
    note: str = ""  # set when the profile could not be used as is (no coverage, fallback)


def profile_candidates(
    table: Mapping[int, float],
    dim: float,
    *,
    alignment: int = ALIGNMENT,
    window: int = WINDOW,
    min_dim: int | None = None,
    max_dim: int | None = None,
    tolerance: float = 0.02,
) -> CandidateSet:
    """Aligned dims near `dim` (the static rule) that the measured table shows are not on a cliff; never empty.

    A dim is dropped when a larger measured dim is faster by more than `tolerance` (relative), or when the table
    measures some candidates but not this one. With no candidate measured, the static candidates are kept.
    Bounds that leave no aligned dim raise GacError, as the static rule does.
    """
    start = aligned_candidates(dim, alignment, window=window, min_dim=min_dim, max_dim=max_dim)  # static rule
    measured = [d for d in start if d in table]
    if not measured:
        return CandidateSet(start, {}, f"the profile has no dims near {dim:g}; static candidates kept")

    excluded: dict[int, str] = {}
    for d in start:
        if d not in table:
            excluded[d] = f"not measured: the profile covers {len(measured)} of {len(start)} dims near {dim:g}"
            continue
        beaters = [b for b in table if b > d and table[b] * (1 + tolerance) < table[d]]
        if beaters:
            b = min(beaters, key=table.__getitem__)
            excluded[d] = f"cliff: {table[d]:.4g} ms is slower than {b} at {table[b]:.4g} ms"
    kept = [d for d in start if d not in excluded]
    if kept:
        return CandidateSet(kept, excluded)

    best = min(measured, key=table.__getitem__)
    excluded.pop(best)
    note = f"every dim near {dim:g} is beaten by a larger dim; kept the fastest measured one, {best}"
    return CandidateSet([best], excluded, note)


def dims_around(centers: Iterable[float], *, alignment: int = ALIGNMENT, window: int = WINDOW) -> tuple[int, ...]:
    """Every d* (rounded) plus the aligned dims the candidate rule may consider around it, one multiple wider."""
    dims = set()
    for c in centers:
        dims.add(max(1, round(c)))
        dims.update(aligned_candidates(c, alignment, window=window + 1))
    return tuple(sorted(dims))


def spec_from_plan(plan: Plan | Mapping[str, Any] | str | Path, base: SweepSpec | None = None) -> SweepSpec:
    """`base` with dims swept around each weight's "dim" (and its explicit candidates) in a selection plan.

    `plan` is a gac.align.plan.Plan, its JSON object or a JSON path; its alignment and window set the windows.
    """
    if not isinstance(plan, Plan):
        plan = Plan.from_dict(plan) if isinstance(plan, Mapping) else Plan.from_json(plan)
    dims = set(dims_around([w.dim for w in plan.weights], alignment=plan.alignment, window=plan.window))
    for w in plan.weights:
        dims.update(d for d in (w.candidates or ()) if d >= 1)
    return dataclasses.replace(base or SweepSpec(), dims=tuple(sorted(dims)))


def spec_from_model(
    model: nn.Module, base: SweepSpec | None = None, *, alignment: int = ALIGNMENT, window: int = WINDOW
) -> SweepSpec:
    """`base` with dims swept around every compressible dim of a loaded model (ranks, PaLU group ranks, widths,
    head_dim), GEMMs sized by its hidden size; a mixture of experts also sweeps the experts op at its expert count
    and experts a token (the op its MoE layers' widths are timed by)."""
    config = config_of(model)
    adapter = adapter_for(config)
    dims = linear_dims(model, adapter.linear_names(config))
    centers = {r for d in dims for r in d.compressed_dims} | {x for d in dims for x in (d.in_features, d.out_features)}
    centers |= {sum(d.group_ranks) for d in dims if d.group_ranks}  # N of PaLU's shared down-projection GEMM
    head_dim = adapter.geometry(config).head_dim
    base = base or SweepSpec()
    hidden = adapter.hidden_size(config)
    sizes = dataclasses.replace(base.sizes, hidden=hidden, lowrank_in=hidden, lowrank_out=hidden)
    ops = base.ops
    if any(adapter.is_moe_layer(config, i) for i in range(adapter.layer_count(config))):
        experts, _, top_k = adapter.expert_geometry(config)
        sizes = dataclasses.replace(sizes, experts=experts, top_k=top_k)
        ops = ops if "experts" in ops else (*ops, "experts")
    return dataclasses.replace(
        base,
        dims=dims_around(sorted(centers), alignment=alignment, window=window),
        head_dims=dims_around([head_dim], alignment=alignment, window=window),
        sizes=sizes,
        ops=ops,
    )
