"""Candidates from a hardware profile: measured latency around each d* (low-rank pair or GEMM N), cliffs excluded."""

from __future__ import annotations

import logging
from collections import defaultdict

from gac.errors import GacError

log = logging.getLogger(__name__)


def _fixed_sizes(op: str, shape: dict):
    """The FixedSizes that make the `op` sweep measure a unit of this profile_shape (None: an op auto cannot size)."""
    from gac.hw.profile import FixedSizes

    if op == "lowrank":
        return FixedSizes(lowrank_in=shape["in"], lowrank_out=shape["out"])
    if op == "gemm_n":
        return FixedSizes(hidden=shape["k"])
    return None


def profile_for_model(profile_arg: str, analyses, ranks: dict, *, device: str, dtype: str, m: int,
                      alignment: int, window: int, progress: bool = True) -> dict:
    """Load the profile JSON at `profile_arg`, or with "auto" measure on this device each op and shape the units
    need (low-rank in -> r -> out, GEMM N over K), around the dims the compressor chose. Units on a grid
    (dim_step > 1: whole heads) take their candidates from the grid, not the profile, so are not measured.

    Auto keeps its own cache, one file per sweep spec (auto_cache_path), apart from the one-per-device cache of
    `gac profile`, so a second compression of the same model on the same device measures nothing."""
    from gac.hw.profile import SweepSpec, dims_around, load_profile

    if profile_arg != "auto":
        return load_profile(profile_arg)
    by_shape = defaultdict(list)  # (op, sorted shape items) -> the dims chosen for units of that shape
    for u in analyses:
        if ranks[u.name] is not None and getattr(u, "dim_step", 1) == 1:
            by_shape[(u.profile_op, tuple(sorted(u.profile_shape.items())))].append(ranks[u.name])
    merged = None
    for (op, shape), dims in sorted(by_shape.items()):
        sizes = _fixed_sizes(op, dict(shape))
        if sizes is None:
            log.warning("cannot measure %s units automatically: their candidates follow the static rule", op)
            continue
        log.info("profiling %s %s on %s at M=%d", op, dict(shape), device, m)
        spec = SweepSpec(ops=(op,), dims=dims_around(dims, alignment=alignment, window=window), m_values=(m,),
                         sizes=sizes)
        p = _cached_sweep(spec, device=device, dtype=dtype, progress=progress)
        if merged is None:
            merged = p
        else:
            merged["ops"] += p["ops"]
    return merged or {}


def auto_cache_path(spec, *, device: str, dtype: str):
    """Cache file of one auto sweep: the device/dtype/torch cache name plus a hash of the resolved spec."""
    import hashlib
    import json

    from gac.hw.profile import cache_dir, cached_profile_path, resolve_spec

    key = hashlib.sha1(json.dumps(resolve_spec(spec).to_json(), sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "auto" / f"{cached_profile_path(device, dtype).stem}-{key}.json"


def _cached_sweep(spec, *, device: str, dtype: str, progress: bool) -> dict:
    """The auto sweep for `spec`, measured once per device, dtype, torch version and spec, then read back."""
    from gac.hw.profile import load_profile, run_profile, save_profile

    path = auto_cache_path(spec, device=device, dtype=dtype)
    if path.is_file():
        try:
            log.info("reusing the cached sweep %s", path)
            return load_profile(path)
        except GacError as e:
            log.warning("measuring again: %s", e)
    result = run_profile(spec, device=device, dtype=dtype, progress=progress)
    try:
        save_profile(result, path)
    except OSError as e:
        log.warning("could not cache the sweep: %s", e)
    return result


def candidates_from_profile(profile: dict, *, m: int, alignment: int, window: int):
    """A function (analysis, d*) -> candidate dims, from the profile's sweep of the unit's op (low-rank pair, or
    GEMM N for pruned widths) nearest its shape (the N sweep of a plain GEMM when the profile lacks the op).
    Its `excluded` attribute maps each unit asked about to {dim: why the profile dropped it}."""
    from gac.hw.cliffs import latency_table, profile_candidates

    ops = {e["op"] for e in profile.get("ops", [])}
    if not ops & {"lowrank", "gemm_n"}:
        raise GacError("the profile has no lowrank or gemm_n sweep: measure one with `gac profile` (default ops)")
    excluded = {}  # unit name -> {dim: reason}, from the last (widest) window asked for

    def candidates_for(u, dim, window=window):
        if u.profile_op in ops:
            table = latency_table(profile, u.profile_op, m=m, shape=u.profile_shape)
        else:  # e.g. a profile without the low-rank sweep: the N sweep of a GEMM over the unit's input size
            table = latency_table(profile, "gemm_n", m=m, shape={"k": u.profile_shape.get("in", 0)})
        cs = profile_candidates(table, dim, alignment=alignment, window=window,
                                min_dim=max(u.min_dim, min(alignment, u.max_dim)), max_dim=u.max_dim)
        excluded[u.name] = cs.excluded
        return cs.candidates

    candidates_for.excluded = excluded  # for the report: which dims the profile ruled out, and why
    return candidates_for

