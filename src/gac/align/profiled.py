"""Candidates from a hardware profile: measured low-rank latency around each d*, cliffs excluded."""

from __future__ import annotations

import logging
from collections import defaultdict

from gac.errors import GacError

log = logging.getLogger(__name__)


def profile_for_model(profile_arg: str, analyses, ranks: dict, *, device: str, dtype: str, m: int,
                      alignment: int, window: int, progress: bool = True) -> dict:
    """Load the profile JSON at `profile_arg`, or with "auto" measure the low-rank op on this device for
    every (in, out) shape the model needs, around the dims the compressor chose."""
    from gac.hw.profile import FixedSizes, SweepSpec, dims_around, load_profile, run_profile

    if profile_arg != "auto":
        return load_profile(profile_arg)
    by_shape = defaultdict(list)
    for u in analyses:
        if ranks[u.name] is not None and u.profile_op == "lowrank":
            by_shape[(u.profile_shape["in"], u.profile_shape["out"])].append(ranks[u.name])
    merged = None
    for (fan_in, fan_out), dims in sorted(by_shape.items()):
        log.info("profiling low-rank %d -> r -> %d on %s at M=%d", fan_in, fan_out, device, m)
        spec = SweepSpec(ops=("lowrank",), dims=dims_around(dims, alignment=alignment, window=window),
                         m_values=(m,), sizes=FixedSizes(lowrank_in=fan_in, lowrank_out=fan_out))
        p = run_profile(spec, device=device, dtype=dtype, progress=progress)
        if merged is None:
            merged = p
        else:
            merged["ops"] += p["ops"]
    return merged or {}


def candidates_from_profile(profile: dict, *, m: int, alignment: int, window: int):
    """A function (analysis, d*) -> candidate dims, from the profile's low-rank sweep nearest the weight's shape
    (the N sweep of a plain GEMM when the profile has no low-rank op)."""
    from gac.hw.cliffs import latency_table, profile_candidates

    ops = {e["op"] for e in profile.get("ops", [])}
    if not ops & {"lowrank", "gemm_n"}:
        raise GacError("the profile has no lowrank or gemm_n sweep: measure one with `gac profile` (default ops)")
    excluded_total = []

    def candidates_for(u, dim, window=window):
        if u.profile_op in ops:
            table = latency_table(profile, u.profile_op, m=m, shape=u.profile_shape)
        else:  # e.g. a profile without the low-rank sweep: the N sweep of a GEMM over the unit's input size
            table = latency_table(profile, "gemm_n", m=m, shape={"k": u.profile_shape.get("in", 0)})
        cs = profile_candidates(table, dim, alignment=alignment, window=window,
                                min_dim=max(u.min_dim, min(alignment, u.max_dim)), max_dim=u.max_dim)
        excluded_total.append(len(cs.excluded))
        return cs.candidates

    candidates_for.excluded = excluded_total  # for the report: how many dims the profile ruled out
    return candidates_for

