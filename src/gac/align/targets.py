"""Deployment targets: what alignment each kind of dimension group needs for a format or engine, as a table.

A target row maps a group kind ("mlp", "heads", "rank", "head_rank") to a multiple that every input width the
group's dim sets must meet (`multiples`, K: `DimGroup.row_lengths`, the MLP width for the down projection, kept query
heads x head_dim for the o projection, the rank for a low-rank pair's second half) and, where the engine asks it, a
multiple for every output width (`out_multiples`, N: `DimGroup.out_lengths`, the MLP width for gate and up, the kept
query and KV widths for q, k and v, the rank for a pair's first half). A tensor-parallel target (`tp`) asks both of
each rank's shard, and that the group split evenly (`DimGroup.shard_row_lengths`, `shard_out_lengths`). `gac compress
--target NAME` offers the knapsack only candidates that meet it, under the same parameter budget, and the report
says which dims were constrained and why. A GPU's tile sizes or an engine's head sizes are further rows of the
same table: the groups answer the widths, the row states the rules.

Targets combine: `--target vllm:w4a16,vllm:tp2` asks of each kind, on each side, the least common multiple of the
rows' multiples, for each rank of the one tensor-parallel degree among them (`combine`); a kind one row holds whole
(`whole`: DeciLM's heads) stays whole, and a row without low-rank projections (`low_rank`) refuses low-rank compressors.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from gac.align.candidates import GroupUnit
from gac.errors import GacError
from gac.models.kinds import KINDS

if TYPE_CHECKING:
    from gac.models.kinds.base import DimGroup

_Q32 = (
    "llama.cpp packs each weight row in blocks of 32 values for {t}; a row whose length (the down "
    "projection's input, the MLP width; the o projection's, heads x head_dim) is not a multiple falls back "
    "to f16"
)
_K256 = (
    "llama.cpp's K-quants ({t}) pack each row in super-blocks of 256; a row whose length (the MLP width for "
    "the down projection, heads x head_dim for the o projection) is not a multiple falls back to a 32-block "
    "type (q5_0/q8_0), or to f16 when it is not a multiple of 32 either"
)


@dataclass(frozen=True)
class Target:
    name: str
    multiples: dict = field(default_factory=dict)  # group kind -> multiple its input widths (row lengths, K) meet
    why: str = ""
    tp: int = 1  # tensor-parallel degree: the multiples hold for each rank's shard (DimGroup.shard_row_lengths)
    out_multiples: dict = field(default_factory=dict)  # group kind -> multiple its output widths (N) meet
    whole: frozenset = frozenset()  # group kinds the format holds only whole (no reduced dim is allowed)
    low_rank: bool = True  # whether the format holds low-rank (factorized) projections at all

    def multiple(self, kind: str) -> int | None:
        return self.multiples.get(kind)

    def out_multiple(self, kind: str) -> int | None:
        return self.out_multiples.get(kind)

    def constrains(self, kind: str) -> bool:
        return self.multiple(kind) is not None or self.out_multiple(kind) is not None or kind in self.whole

    def allows(self, group: DimGroup, dim: int) -> bool:
        """Input and output widths (each rank's, under tensor parallelism) that meet their multiples, or the group
        left whole: the unmodified model's own shape is not the compression's to fix (e.g. whole heads whose query
        width can never be a multiple of 256). A group the target's ranks cannot split is refused even whole: no
        engine of that degree can serve it. A kind the target holds whole allows its full dim alone."""
        rows = group.shard_row_lengths(dim, self.tp)
        if rows is None:  # the engine cannot split it over its ranks at all, whole or not
            return False
        if dim == group.full_dim:
            return True
        if group.kind in self.whole:
            return False
        return _meet(rows, self.multiple(group.kind)) and _meet(
            group.shard_out_lengths(dim, self.tp), self.out_multiple(group.kind)
        )

    def allowed_dims(self, group: DimGroup) -> list[int]:
        """The group's grid points the target allows (at least its full dim, where it has one)."""
        return [d for d in group.grid() if self.allows(group, d)]

    def candidates_for(self, alignment: int) -> _TargetCandidates:
        """A `candidates_for(unit, d*, window)` for gac.objectives.parameter.build_plan: the `window` allowed dims at or
        below d* and the `window` above (also multiples of `alignment` where the group's grid is fine-grained);
        a group no dim of which can meet the target keeps the static rule (and the report says so)."""
        return _TargetCandidates(self, alignment)

    def report(self, units: Iterable[GroupUnit], chosen: dict[str, int | None]) -> dict[str, Any]:
        """report.json's "target": the rule, and for every group the target constrained its multiple, the row
        lengths of the chosen dim and whether they meet it (or why no dim of that group could)."""
        groups: dict[str, dict[str, Any]] = {}
        for u in units:
            g, d = u.group, chosen.get(u.name)
            if not self.constrains(g.kind) or d is None:
                continue
            m, n = self.multiple(g.kind), self.out_multiple(g.kind)
            entry: dict[str, Any] = {
                "kind": g.kind,
                "multiple": m,
                "dim": int(d),
                "row_lengths": g.row_lengths(int(d)),
                "met": self.allows(g, int(d)),
            }
            if n is not None:
                entry.update(out_multiple=n, out_lengths=g.out_lengths(int(d)))
            if g.kind in self.whole:
                entry["whole"] = True
            elif not any(x != g.full_dim for x in self.allowed_dims(g)):
                sides = (("row lengths", m), ("output widths", n))
                rule = " and ".join(f"{side} that are multiples of {x}" for side, x in sides if x is not None)
                entry["unattainable"] = (
                    f"no reduced {g.kind} dim on this group's grid (step {g.step}) gives {rule}: "
                    "only the whole group meets it"
                )
            groups[u.name] = entry
        out = {
            "name": self.name,
            "multiples": dict(self.multiples),
            "why": self.why,
            "groups": groups,
            "met": sum(e["met"] for e in groups.values()),
            "constrained": len(groups),
        }
        return {**out, "out_multiples": dict(self.out_multiples)} if self.out_multiples else out


def _meet(lengths: list[int] | None, multiple: int | None) -> bool:
    """Every length a multiple of `multiple` (None: no rule); no lengths (None: not split evenly) meet none."""
    return multiple is None or (lengths is not None and all(x % multiple == 0 for x in lengths))


class _TargetCandidates:
    """Candidates that meet a target; opts into head-grid groups too (covers_grid)."""

    covers_grid = True

    def __init__(self, target: Target, alignment: int) -> None:
        self.target, self.alignment = target, alignment

    def __call__(self, unit: GroupUnit, d: float, window: int) -> Sequence[int | None]:
        g = unit.group
        if g.kind in self.target.whole:  # the whole group, even where the target's ranks cannot split it
            return [g.full_dim]
        fine = g.step == 1
        step = self.alignment if fine else 1
        allowed = [x for x in self.target.allowed_dims(g) if x % step == 0 and x >= min(self.alignment, g.max_dim)]
        if not allowed:  # a rank group (no full dim) whose grid has no multiple: the static rule
            allowed = [x for x in g.grid() if not fine or x % self.alignment == 0]
        i = bisect.bisect_right(allowed, d)
        return sorted(set(allowed[max(0, i - window) : i] + allowed[i : i + window])) or allowed[-1:]


_TP = (
    "vLLM at tensor parallel size {n} splits every layer's query and KV heads and MLP channels over {n} ranks "
    "(low-rank pairs: a replicated or row-parallel, b column-parallel or replicated; ranks never split): each "
    "must divide by {n}, and each rank's row length (MLP width / {n}, kept heads x head_dim / {n}, a rank) must "
    "stay a multiple of 8 for the GPU's aligned kernels"
)
_MARLIN = (
    "vLLM's Marlin kernels (GPTQ and AWQ 4- and 8-bit weights) run in tiles of 128 input by 64 output "
    "channels (min_thread_k, min_thread_n in vLLM's marlin_utils), and zero-pad a weight whose input width K "
    "or output width N is not a multiple, so its misaligned part is wasted work: K is the MLP width for the "
    "down projection, kept heads x head_dim for the o projection, a rank for a low-rank pair's second half; N "
    "the MLP width for gate and up, the kept query and KV widths for q, k and v, a rank for a pair's first "
    "half"
)
_W4A16 = (
    "vLLM's CPU int4 kernel (CPUWNA16, W4A16 checkpoints: compressed-tensors, GPTQ, AWQ) takes a linear only "
    "when its input width K and its output width N (per tensor-parallel rank, fused shards summed) are "
    "multiples of 32, and its group (32) divides K, and no other kernel takes it: K is the MLP width for the "
    "down projection, kept heads x head_dim for the o projection, a rank for a low-rank pair's second half; N "
    "the MLP width for gate and up, the kept query and KV widths for q, k and v, a rank for a pair's first "
    "half"
)


_DECI = (
    "DeciLM (Nemotron-NAS) keeps Llama's layers with an MLP width and KV heads of their own: vLLM, transformers and "
    "llama.cpp read any width, but SGLang (srt/models/nemotron_nas.py) and TensorRT-LLM "
    "(_torch/models/modeling_nemotron_nas.py) build a layer's MLP from its ffn_mult alone, as "
    "find_multiple(int(2 * ffn_mult * hidden / 3), 256): the MLP width (N for gate and up, K for down) must be a "
    "multiple of 256 for every engine to serve it; the query heads are the model's in every layer, so heads stay "
    "whole, and ranks have no DeciLM form (`gac export DIR --format deci` writes it)"
)


def _every(multiple: int) -> dict:
    """The same multiple for every group kind: an engine's rule is on widths, which every kind answers."""
    return dict.fromkeys(KINDS, multiple)


def _tp(n: int) -> Target:
    return Target(f"vllm:tp{n}", _every(8), _TP.format(n=n), tp=n)


TARGETS = {
    **{f"vllm:tp{n}": _tp(n) for n in (2, 4, 8)},
    "vllm:marlin": Target("vllm:marlin", _every(128), _MARLIN, out_multiples=_every(64)),
    "vllm:w4a16": Target("vllm:w4a16", _every(32), _W4A16, out_multiples=_every(32)),
    "llama.cpp:q8_0": Target("llama.cpp:q8_0", _every(32), _Q32.format(t="q8_0")),
    "llama.cpp:q4_0": Target("llama.cpp:q4_0", _every(32), _Q32.format(t="q4_0")),
    "llama.cpp:q4_k_m": Target("llama.cpp:q4_k_m", _every(256), _K256.format(t="q4_k_m")),
    "deci": Target("deci", {"mlp": 256}, _DECI, out_multiples={"mlp": 256}, whole=frozenset({"heads"}), low_rank=False),
}


@overload
def get_target(name: str) -> Target: ...
@overload
def get_target(name: None) -> None: ...
def get_target(name: str | None) -> Target | None:
    """The target `name` names: one row of TARGETS, or several joined by commas (combine)."""
    if name is None:
        return None
    parts = [p.strip() for p in name.split(",")]
    for part in parts:
        if part not in TARGETS:
            raise GacError(
                f"unknown target {part!r}: choose one of {', '.join(TARGETS)}, or several joined by "
                "commas, e.g. vllm:w4a16,vllm:tp2"
            )
    return combine([TARGETS[p] for p in parts]) if len(parts) > 1 else TARGETS[parts[0]]


def combine(targets: list[Target]) -> Target:
    """One target that every one of `targets` accepts: per kind and side the least common multiple of their
    multiples, and the one tensor-parallel degree among them (two degrees describe no one engine)."""
    degrees = sorted({t.tp for t in targets if t.tp > 1})
    if len(degrees) > 1:
        raise GacError(
            f"targets {', '.join(t.name for t in targets)} ask for tensor parallel sizes "
            f"{' and '.join(map(str, degrees))}: give one vllm:tpN"
        )

    def lcm(side: str) -> dict:
        kinds = {k for t in targets for k in getattr(t, side)}
        return {k: math.lcm(*(getattr(t, side)[k] for t in targets if k in getattr(t, side))) for k in sorted(kinds)}

    return Target(
        ",".join(t.name for t in targets),
        lcm("multiples"),
        "; ".join(t.why for t in targets),
        tp=degrees[0] if degrees else 1,
        out_multiples=lcm("out_multiples"),
        whole=frozenset().union(*(t.whole for t in targets)),
        low_rank=all(t.low_rank for t in targets),
    )
