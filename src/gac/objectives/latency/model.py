"""Predicted latency of every dimension group at every candidate dim, at one phase and shape: the kernel sweeps of
`gac profile` measured at each group's real shapes, summed over the ops that change with the group's dim, plus a
measured constant for everything that does not (embeddings, norms, logits, untouched layers).

The model is additive: predict(dims) = constant_ms + sum_g table_g[dims[g]]. Tables keep every measured entry,
non-monotone ones included (cliffs are the point). A candidate None is the group left as the original has it;
so is a width or head group's full dim (`full_dims`), which the tables key None.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gac.errors import ConfigError, GacError, literal
from gac.hw.device import ALIGNMENT, device_name
from gac.hw.profile import FixedSizes, SweepSpec, cached_sweep
from gac.models.groups import DimGroup
from gac.models.kinds.base import FULL, Term

log = logging.getLogger(__name__)
OpTables = dict[tuple[str, tuple[Any, ...]], dict[int, float]]  # {(op, shape): {swept dim: ms}}
PHASES = ("prefill", "decode")
MIN_FIT, MAX_FIT = 0.5, 2.0  # the table scales `LatencyModel.fitted` trusts


@dataclass(frozen=True)
class Phase:
    """Where latency is predicted: prefill of batch x seq tokens, or one decode step per sequence of a batch over a
    KV cache of `seq` tokens."""

    name: str = "prefill"
    batch: int = 1
    seq: int = 512

    def __post_init__(self) -> None:
        if self.name not in PHASES:
            raise ConfigError(
                f"unknown phase {literal(repr(self.name))}: choose prefill or decode, e.g. {{phase:prefill}}"
            )
        if int(self.batch) != self.batch or int(self.seq) != self.seq or self.batch < 1 or self.seq < 1:
            raise GacError(f"bad shape {self.batch}x{self.seq}: batch and seq must be positive integers, e.g. 1x512")

    @property
    def m(self) -> int:
        """Rows of every projection GEMM: all tokens at prefill, one per sequence at decode."""
        return self.batch * self.seq if self.name == "prefill" else self.batch

    @property
    def shape(self) -> str:
        return f"{self.batch}x{self.seq}"

    def to_dict(self) -> dict[str, str]:
        return {"phase": self.name, "shape": self.shape}


@dataclass
class LatencyModel:
    """{group: {candidate dim or None: predicted ms}} at one phase, and the measured constant."""

    phase: Phase
    tables: dict[str, dict[int | None, float]]  # the candidates' predicted ms
    original: dict[str, float]  # each group as the original model has it (also tables[g][FULL] where a candidate)
    constant_ms: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)  # device, dtype, torch, how the constant was measured
    full_dims: dict[str, int] = field(default_factory=dict)  # the original's dim (group.full_dim; none for ranks)

    def full_ms(self) -> float:
        """Predicted time of every group as the original model has it."""
        return math.fsum(self.original.values())

    def ms(self, group: str, dim: int | None) -> float:
        """The group's predicted ms at `dim`; None, or its full dim where that is no candidate, is the original."""
        table = self.tables[group]
        if dim is None or (dim not in table and dim == self.full_dims.get(group)):
            return self.original[group]
        if dim in table:
            return table[dim]
        ints = [d for d in table if d is not None]
        raise GacError(
            f"{group}: no predicted latency for dim {dim}, not one of its candidates "
            f"({min(ints, default='-')}..{max(ints, default='-')}{', full' if FULL in table else ''}"
            f"{f', full dim {self.full_dims[group]}' if group in self.full_dims else ''})"
        )

    def predict(self, dims: dict[str, int | None]) -> float:
        """Whole-model ms for {group: dim or None}; groups not named keep their original size."""
        return self.constant_ms + math.fsum(self.ms(g, dims.get(g)) for g in self.tables)

    def calibrated(self, baseline_ms: float) -> LatencyModel:
        """The model with its constant set so that the original predicts `baseline_ms` (measured). When the op
        sweeps add up to more than the whole model (launch overheads of tiny shapes, a busy CPU), the tables are
        scaled down to fit it with a zero constant, and meta["table_scale"] says by how much."""
        full = self.full_ms()
        scale = baseline_ms / full if full > baseline_ms > 0 else 1.0
        if scale != 1.0:
            log.warning(
                "the op sweeps add up to %.3g ms, more than the %.3g ms measured for the whole model: "
                "tables scaled by %.3f",
                full,
                baseline_ms,
                scale,
            )
        return replace(
            self.scaled(scale, baseline_ms=baseline_ms, table_scale=scale),
            constant_ms=max(baseline_ms - full * scale, 0.0),
        )

    def scaled(self, scale: float, **meta: float | None) -> LatencyModel:
        """Every table and original time times `scale`, `meta` added to the model's."""
        return replace(
            self,
            tables={g: {d: ms * scale for d, ms in t.items()} for g, t in self.tables.items()},
            original={g: ms * scale for g, ms in self.original.items()},
            meta={**self.meta, **meta},
        )

    def fastest_ms(self) -> float:
        """Every group's predicted ms at its fastest candidate, summed: no budget below this is reachable."""
        return math.fsum(min(t.values()) for t in self.tables.values())

    def fitted(self, baseline_ms: float, reference: dict[str, int | None], reference_ms: float) -> LatencyModel:
        """The model calibrated on two whole-model timings taken side by side: the original (`baseline_ms`) and a
        reference model with the groups at `reference` dims ({group: dim}). The tables are scaled so that the
        reference's predicted saving is the measured one, then the constant set as `calibrated` sets it. Isolated
        kernel sweeps need not time an op as the model runs it (caches, threads, another day's machine speed), and
        may under-predict every saving alike. A scale outside
        [MIN_FIT, MAX_FIT] (a timing spike, a reference that saves nothing) is not trusted: the tables stay. Where
        the fitted groups add up to more than the original, `calibrated` scales them down again (meta
        table_scale), as it does unfitted tables."""
        predicted = self.full_ms() - math.fsum(self.ms(g, reference.get(g)) for g in self.tables)
        measured = baseline_ms - reference_ms
        scale = measured / predicted if predicted > 0 else None  # None: a reference predicted to save nothing
        fit = {"reference_ms": reference_ms, "reference_predicted_saving_ms": predicted, "fit_scale": scale}
        if scale is None or not MIN_FIT <= scale <= MAX_FIT:
            log.warning(
                "the reference model saved %.3g ms measured against %.3g ms predicted: the latency tables are "
                "not rescaled (a scale outside [%g, %g] is not trusted)",
                measured,
                predicted,
                MIN_FIT,
                MAX_FIT,
            )
            scale = 1.0
        return self.scaled(scale, **fit, saving_scale=scale).calibrated(baseline_ms)

    def recentred(self, baseline_ms: float) -> LatencyModel:
        """The same tables with the constant re-set so that the original predicts `baseline_ms` (never below zero):
        a recalibration that keeps the tables, and so the knapsack items built from them, as they are."""
        return replace(
            self, constant_ms=max(baseline_ms - self.full_ms(), 0.0), meta={**self.meta, "baseline_ms": baseline_ms}
        )

    def to_json(self) -> str:
        tables = {g: {("full" if d is None else str(d)): ms for d, ms in t.items()} for g, t in self.tables.items()}
        return json.dumps(
            {
                "gac_latency_model": 1,
                **self.phase.to_dict(),
                "batch": self.phase.batch,
                "seq": self.phase.seq,
                "constant_ms": self.constant_ms,
                "meta": self.meta,
                "original": self.original,
                "full_dims": self.full_dims,
                "tables": tables,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> LatencyModel:
        """The saved model; one written before full_dims existed loads with none (a full dim given as an int is
        then an error, None still the original)."""
        d = json.loads(text)
        if d.get("gac_latency_model") != 1:
            raise GacError("not a gac latency model (no gac_latency_model: 1 key)")
        tables = {
            g: {(None if k == "full" else int(k)): float(ms) for k, ms in t.items()} for g, t in d["tables"].items()
        }
        return cls(
            Phase(d["phase"], d["batch"], d["seq"]),
            tables,
            {g: float(ms) for g, ms in d["original"].items()},
            float(d["constant_ms"]),
            d.get("meta", {}),
            {g: int(x) for g, x in d.get("full_dims", {}).items()},
        )


def reference_dims(lm: LatencyModel, groups: Iterable[str]) -> dict[str, int | None]:
    """{group: dim} for the second point of `LatencyModel.fitted`: each of `groups` (names; the rest stay as the
    original) at the candidate predicted nearest half its original's time, a model in the middle of the range
    the objective chooses from."""
    dims: dict[str, int | None] = {}
    for g in groups:
        table = lm.tables[g]
        cands = [d for d in table if d is not FULL and d != lm.full_dims.get(g)]
        if cands:
            dims[g] = min(cands, key=lambda d: (abs(table[d] - lm.original[g] / 2), d))
    return dims


# ---- which ops change with each group's dim ----------------------------------------------------------------


def sweep_needs(groups: list[DimGroup], alignment: int) -> dict[tuple[str, tuple[Any, ...]], set[int]]:
    """{(op, shape): set of swept dims} every group's candidates need."""
    needs: defaultdict[tuple[str, tuple[Any, ...]], set[int]] = defaultdict(set)
    for g in groups:
        dense, terms = g.latency_terms()
        for term, x in dense or [(t, t.dim(g.max_dim)) for t in terms]:  # the original layout
            needs[(term.op, term.shape)].add(x)
        for d in g.wide_candidates(alignment):
            if d is not FULL:
                for term in terms:
                    needs[(term.op, term.shape)].add(term.dim(d))
    return needs


def _terms_ms(terms: list[Term], d: int, op_tables: OpTables) -> float:
    """The group's terms at dim d, summed from the op tables."""
    return math.fsum(t.weight * op_tables[(t.op, t.shape)][t.dim(d)] for t in terms)


def build_tables(
    groups: list[DimGroup], alignment: int, op_tables: OpTables
) -> tuple[dict[str, dict[int | None, float]], dict[str, float]]:
    """({group: {candidate: ms}}, {group: ms as the original has it}) from measured op tables
    {(op, shape): {swept dim: ms}}."""
    tables: dict[str, dict[int | None, float]] = {}
    original: dict[str, float] = {}
    for g in groups:
        dense, terms = g.latency_terms()
        original[g.name] = (
            math.fsum(t.weight * op_tables[(t.op, t.shape)][x] for t, x in dense)
            if dense
            else _terms_ms(terms, g.max_dim, op_tables)
        )
        tables[g.name] = {
            d: original[g.name] if d is FULL else _terms_ms(terms, d, op_tables) for d in g.wide_candidates(alignment)
        }
    return tables, original


# ---- measuring: one cached profile sweep per op and shape --------------------------------------------------


def op_spec(op: str, shape: tuple[Any, ...], dims: Iterable[int], phase: Phase, repeats: int) -> SweepSpec:
    """The sweep of `op` over `dims` at the phase: GEMMs at its M rows; SDPA over query heads at prefill causal over
    its own seq tokens, or at decode one query token per sequence over a KV cache of seq tokens."""
    sizes, m = FixedSizes.of(op, dict(shape)), phase.m
    if sizes is None:
        raise ValueError(f"a {op} term has no sweep of its own")
    if op == "sdpa_heads":
        sizes = dataclasses.replace(sizes, batch=phase.batch, context=phase.seq)
        m = phase.seq if phase.name == "prefill" else 1
    return SweepSpec(ops=(op,), dims=tuple(sorted(dims)), m_values=(m,), sizes=sizes, warmup=2, repeats=repeats)


def measure_latency_model(
    groups: list[DimGroup],
    phase: Phase,
    *,
    alignment: int = ALIGNMENT,
    device: str = "cpu",
    dtype: str = "float32",
    repeats: int = 11,
    progress: bool = True,
) -> LatencyModel:
    """Sweep every op and shape the groups' candidates need at the phase's M (cached per device, dtype, torch and
    spec, the spec holding M and the shapes), and return the model with a zero constant (see `calibrated` and
    `fitted`)."""
    if not groups:
        raise GacError("no dimension groups to predict latency for")
    op_tables: OpTables = {}
    for (op, shape), dims in sorted(sweep_needs(groups, alignment).items()):
        spec = op_spec(op, shape, dims, phase, repeats)
        log.info("latency table: %s %s at M=%d, %d dims", op, dict(shape), spec.m_values[0], len(dims))
        entry = cached_sweep(spec, device=device, dtype=dtype, progress=progress)["ops"][0]
        op_tables[(op, shape)] = {int(d): float(ms) for d, ms in zip(entry["dims"], entry["ms"])}
    meta = {
        "device": device,
        "device_name": device_name(device),
        "dtype": dtype,
        "torch": torch.__version__,
        "alignment": alignment,
        "repeats": repeats,
    }
    full_dims = {g.name: g.full_dim for g in groups if g.full_dim is not None}
    return LatencyModel(phase, *build_tables(groups, alignment, op_tables), 0.0, meta, full_dims)
