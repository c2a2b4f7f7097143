"""Low-rank kinds: `rank`, one linear [out, in] as a pair b(a(x)) of inner rank d (None while dense), and
`head_rank`, one PaLU group of KV heads of a K or V projection: rows [row0, row0 + rows), its own rank, the
projection's head groups sharing one down-projection a."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

from torch import nn

from gac.errors import GacError
from gac.models.adapters import Adapter, LayerModules, config_of
from gac.models.cuts import Cut, Factors, cut_as
from gac.models.kinds.base import FULL, Dense, DimGroup, Term, is_grouped_lowrank, is_lowrank, shape
from gac.models.surgery import (
    factorize,
    factorize_head_groups,
    linear_at,
    pad_grouped_lowrank_linear,
    pad_lowrank_linear,
)

X = TypeVar("X")


def max_useful_rank(in_features: int, out_features: int) -> int:
    """Break-even: the largest rank whose factorization r (in + out) has fewer parameters than the dense weight."""
    return (in_features * out_features - 1) // (in_features + out_features)


@dataclass(frozen=True)
class RankGroup(DimGroup):
    linear: str = ""
    in_features: int = 0
    out_features: int = 0
    kind: ClassVar[str] = "rank"
    profile_op: ClassVar[str] = "lowrank"

    allows_dense: ClassVar[bool] = True  # keeping the weight whole is one of its options

    @classmethod
    def read(cls, model: nn.Module, adapter: Adapter, layer: LayerModules, **_: Any) -> list[DimGroup]:
        groups: list[DimGroup] = []
        for name in layer.linears:
            m = linear_at(model, name)  # a dense linear, or a factorized pair with the same feature counts
            if is_grouped_lowrank(m):
                continue  # its ranks are head_rank groups
            rank = int(m.rank) if is_lowrank(m) else None
            groups.append(cls(name, rank, linear=name, in_features=m.in_features, out_features=m.out_features))
        return groups

    @property
    def linears(self) -> tuple[str, ...]:
        return (self.linear,)

    @property
    def rows(self) -> slice:
        """The rows of `linear` this group factorizes: all of them (a head group: its heads' rows)."""
        return slice(0, self.out_features)

    @property
    def numel(self) -> int:
        return self.in_features * self.out_features

    @property
    def params_per_dim(self) -> int:
        return self.in_features + self.out_features

    @property
    def max_dim(self) -> int:  # the largest rank that still saves parameters
        return max_useful_rank(self.in_features, self.out_features)

    @property
    def full_dim(self) -> None:
        return None

    @property
    def profile_shape(self) -> dict[str, int]:
        return {"in": self.in_features, "out": self.out_features}

    def check(self, dim: int) -> None:  # any rank up to full is a valid factorization, if not a saving one
        if not 1 <= dim <= min(self.in_features, self.out_features):
            raise GacError(f"{self.name}: rank {dim} is outside [1, {min(self.in_features, self.out_features)}]")

    def cut(self, model: nn.Module, cut: Cut) -> None:
        factors = cut_as(cut, Factors, self.name)
        factorize(model, self.linear, factors.A, factors.B)

    def pad(self, model: nn.Module, dim: int) -> None:
        pad_lowrank_linear(model, self.linear, dim)

    def latency_terms(self) -> tuple[Dense, list[Term]]:
        """b(a(x)): both GEMMs of the pair; dense: one GEMM [out, in]."""
        dense = [(Term("gemm_n", shape(k=self.in_features)), self.out_features)]
        return dense, [Term("lowrank", shape(**{"in": self.in_features, "out": self.out_features}))]

    def wide_candidates(self, alignment: int) -> list[int | None]:
        """Every aligned rank that saves parameters, then the dense weight."""
        return [*self.aligned_dims(alignment), FULL]


@dataclass(frozen=True)
class HeadRankGroup(RankGroup):
    """Rows [row0, row0 + out_features) of a K or V projection: one PaLU group of KV heads. Its output width is
    its share of the shared down-projection's rows (that GEMM's N is the sum over the linear's groups: a multiple
    of anything every group's rank is a multiple of)."""

    group: int = 0
    row0: int = 0
    groups_per_linear: int = 1  # head groups of its linear, all sharing its down-projection
    kind: ClassVar[str] = "head_rank"
    allows_dense: ClassVar[bool] = False  # the grouped factorization has no dense member

    @classmethod
    def read(
        cls, model: nn.Module, adapter: Adapter, layer: LayerModules, *, heads_per_group: int = 1, **_: Any
    ) -> list[DimGroup]:
        config = config_of(model)
        geo = adapter.geometry(config)
        if heads_per_group < 1 or geo.num_kv_heads % heads_per_group:
            raise GacError(
                f"palu group size {heads_per_group} does not divide the {geo.num_kv_heads} KV heads: choose a divisor"
            )
        if layer.fused_qkv:
            raise GacError(
                f"{config.model_type} keeps K and V in one fused q/k/v projection, whose KV heads "
                "PaLU cannot factorize apart: use asvd, svd_llm or svd (they factorize it whole)"
            )
        rows = heads_per_group * geo.head_dim
        groups: list[DimGroup] = []
        for name in (layer.k, layer.v):
            m = linear_at(model, name)
            ranks: list[int | None] = list(m.ranks) if is_grouped_lowrank(m) else [None] * (m.out_features // rows)
            if len(ranks) * rows != m.out_features:
                raise GacError(f"{name}: {m.out_features} rows do not split into groups of {rows}")
            for g, rank in enumerate(ranks):
                groups.append(
                    cls(
                        f"{name}#g{g}",
                        rank,
                        linear=name,
                        in_features=m.in_features,
                        out_features=rows,
                        group=g,
                        row0=g * rows,
                        groups_per_linear=len(ranks),
                    )
                )
        return groups

    @property
    def rows(self) -> slice:
        return slice(self.row0, self.row0 + self.out_features)

    @property
    def max_dim(self) -> int:
        """Up to full rank, past break-even: a group cannot stay dense, but rank = its rows (whole heads, an
        aligned dim) reconstructs it exactly; capping at break-even (57 of 64 rows on SmolLM2) left GAC only 56
        for every group the allocation wanted whole."""
        return min(self.out_features, self.in_features)

    def cut(self, model: nn.Module, cut: Cut) -> None:
        type(self).cut_all(model, [(self, cut)])

    @classmethod
    def cut_all(cls, model: nn.Module, pairs: Sequence[tuple[DimGroup, Cut]]) -> None:
        """The head groups of one linear become one GroupedLowRankLinear: their A blocks stacked, in group order."""
        for linear, parts in _by_linear(pairs).items():
            first = parts[0][0]
            if len(parts) != first.groups_per_linear:
                raise GacError(
                    f"{linear}: {len(parts)} of its {first.groups_per_linear} head groups given a cut; "
                    "they share one down-projection: cut them all at once"
                )
            parts.sort(key=lambda p: p[0].group)
            factors = [cut_as(c, Factors, g.name) for g, c in parts]
            factorize_head_groups(model, linear, [(f.A, f.B) for f in factors])

    def pad(self, model: nn.Module, dim: int) -> None:
        type(self).pad_all(model, [(self, dim)])

    @classmethod
    def pad_all(cls, model: nn.Module, pairs: Sequence[tuple[DimGroup, int]]) -> None:
        """Each linear rebuilt once, its groups not named keeping their ranks."""
        for linear, parts in _by_linear(pairs).items():
            pad_grouped_lowrank_linear(model, linear, {g.group: dim for g, dim in parts})

    def latency_terms(self) -> tuple[Dense, list[Term]]:
        """A 1/G share of the shared down GEMM [G r, in] and its own up GEMM; dense: a 1/G share of [G rows, in]."""
        G = self.groups_per_linear
        dense = [(Term("gemm_n", shape(k=self.in_features), weight=1.0 / G), G * self.out_features)]
        return dense, [
            Term("gemm_n", shape(k=self.in_features), mult=G, weight=1.0 / G),
            Term("gemm_k", shape(n=self.out_features)),
        ]

    def wide_candidates(self, alignment: int) -> list[int | None]:
        """Aligned ranks only (a grouped factorization has no dense member), at least its full rank."""
        return [*self.aligned_dims(alignment)] or [self.max_dim]


def _by_linear(pairs: Sequence[tuple[DimGroup, X]]) -> dict[str, list[tuple[HeadRankGroup, X]]]:
    """The pairs by their linear; by_kind handed HeadRankGroup.cut_all and pad_all their kind's groups only."""
    out: dict[str, list[tuple[HeadRankGroup, X]]] = {}
    for group, x in pairs:
        g = cast(HeadRankGroup, group)
        out.setdefault(g.linear, []).append((g, x))
    return out
