"""The handler interface every group kind answers, with the defaults most kinds share.

A kind states, in its own file: how its groups are read off a model (`read`), its members (`linears`), its
parameters at a dim (`params`), its grid, the input and output widths a dim sets (for deployment targets, whole and
per tensor-parallel rank), its cut and its zero-pad (through gac.models.surgery's primitives), the ops whose time
changes with its dim (`latency_terms`, plain data) and its wide candidate range. Surgery, latency, targets and the
compressors ask the group; nothing switches on its type. What each kind must state is abstract here; the defaults
most kinds share are not.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard, TypeVar

from torch import nn

from gac.errors import GacError
from gac.models.cuts import Cut

if TYPE_CHECKING:
    from gac.models.adapters import Adapter, LayerModules
    from gac.models.modeling_gac import GroupedLowRankLinear, LowRankLinear

X = TypeVar("X")  # what a pair carries beside its group: a cut, or a dim

FULL = None  # a candidate dim: the group as the original model has it (dense weight, whole width, every head)


def is_lowrank(module: object) -> TypeGuard[LowRankLinear]:
    """A factorized pair, gac's own class or the copy a trust_remote_code load brings."""
    return type(module).__name__ == "LowRankLinear"


def is_grouped_lowrank(module: object) -> TypeGuard[GroupedLowRankLinear]:
    return type(module).__name__ == "GroupedLowRankLinear"


def shape(**sizes: int) -> tuple[tuple[str, int], ...]:
    """A profile sweep's fixed sizes as sorted (key, value) pairs: hashable, one spelling per shape."""
    return tuple(sorted(sizes.items()))


@dataclass(frozen=True)
class Term:
    """One op whose time changes with a group's dim: `weight` x the op's time at the swept dim `mult * d // div`
    (e.g. a query projection's N is group_size x the KV width; SDPA's query heads are a width / head_dim)."""

    op: str  # a gac.hw.profile sweep: gemm_n | gemm_k | lowrank | sdpa_heads | experts
    shape: tuple[tuple[str, int], ...]  # sorted (key, value) pairs of the op's fixed sizes (SDPA's batch and seq come
    # from the phase)
    mult: int = 1
    weight: float = 1.0
    div: int = 1

    def dim(self, d: int) -> int:
        return self.mult * d // self.div


Dense = list[tuple[Term, int]]  # (term, swept dim) pairs that time a group's original layout (a dense weight)


@dataclass(frozen=True)
class DimGroup(ABC):
    """The common protocol: |W(d)| = fixed_params + d * params_per_dim; d on range(min_dim, max_dim + 1, step)."""

    name: str
    dim: int | None  # live dim; None: whole (a dense linear of a rank group)

    kind: ClassVar[str] = ""
    removes_heads: ClassVar[bool] = False  # its cut removes attention heads (--speedup may hold such groups whole)

    @property
    def fixed_params(self) -> int:
        """Parameters kept whatever the dim."""
        return 0

    @property
    def step(self) -> int:
        """The grid's step: dims are multiples of it."""
        return 1

    @property
    def min_dim(self) -> int:
        return 1

    # --- reading a model ----------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def read(cls, model: nn.Module, adapter: Adapter, layer: LayerModules, **options: Any) -> list[DimGroup]:
        """The kind's groups in one decoder layer (`layer`: gac.models.adapters.LayerModules) of the live model;
        options: what gac.models.groups.groups_of was given (mode, heads_per_group)."""

    # --- geometry -----------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def linears(self) -> tuple[str, ...]:
        """Every linear the group resizes (what calibration hooks and parameter counts cover)."""

    @property
    @abstractmethod
    def numel(self) -> int:
        """Parameters of the members at full size: the unit of the budget."""

    @property
    @abstractmethod
    def params_per_dim(self) -> int: ...

    @property
    @abstractmethod
    def max_dim(self) -> int: ...

    @property
    def full_dim(self) -> int | None:
        """The dim of the uncompressed model (None for a rank group: a dense weight has no rank)."""
        return self.max_dim

    def params(self, dim: int | None) -> int:
        return self.numel if dim is None else self.fixed_params + dim * self.params_per_dim

    @property
    def changes_whole(self) -> bool:
        """Whether the group's cut changes the model even at its whole dim (an MoE layer dropping experts): then it
        is cut at max_dim where its dim is None."""
        return False

    def grid(self) -> range:
        return range(self.min_dim, self.max_dim + 1, self.step)

    def check(self, dim: int) -> None:
        if dim % self.step or not self.min_dim <= dim <= self.max_dim:
            raise GacError(
                f"{self.name}: dim {dim} is not valid (multiples of {self.step} in [{self.min_dim}, {self.max_dim}])"
            )

    def compressed_dims(self) -> list[int]:
        """The dims this group has changed from the original model, judged for alignment."""
        return [] if self.dim is None or self.dim == self.full_dim else [self.dim]

    # --- widths a deployment target judges (gac.align.targets) --------------------------------------------
    def row_lengths(self, dim: int) -> list[int]:
        """The input widths (K: a weight row's length, what a serving engine packs in blocks, e.g. llama.cpp's 32
        or 256) of the member linears that `dim` sets: a width's consumers, a low-rank pair's second half."""
        return [dim]

    def out_lengths(self, dim: int) -> list[int]:
        """The output widths (N: a weight's row count, what a GEMM kernel tiles, e.g. Marlin's 64) of the member
        linears that `dim` sets: a width's producers, a low-rank pair's first half."""
        return [dim]

    def shard_row_lengths(self, dim: int, tp: int) -> list[int] | None:
        """The row lengths each rank of a degree-`tp` tensor-parallel engine reads at `dim` (gac.serve.layout's
        sharding plan), or None where `tp` cannot split the group evenly. A low-rank pair's inner rank is never
        split: every tensor-parallel rank reads all of it."""
        return self.row_lengths(dim)

    def shard_out_lengths(self, dim: int, tp: int) -> list[int] | None:
        """The output widths each tensor-parallel rank computes at `dim`; None exactly where shard_row_lengths is."""
        return self.out_lengths(dim)

    # --- surgery (through gac.models.surgery's primitives) ------------------------------------------------
    @abstractmethod
    def cut(self, model: nn.Module, cut: Cut) -> None:
        """Cut the group into `model` at what the compressor handed over (gac.models.cuts: Factors, Keep, ...)."""

    @classmethod
    def cut_all(cls, model: nn.Module, pairs: Sequence[tuple[DimGroup, Cut]]) -> None:
        """Cut every (group of this kind, cut) pair; a kind whose groups share a module cuts them together."""
        for group, cut in pairs:
            group.cut(model, cut)

    def pad(self, model: nn.Module, dim: int) -> None:
        """Zero-pad the group to `dim` (>= its live dim): the model computes the same function."""
        raise TypeError(f"{type(self).__name__} cannot be zero-padded exactly")

    @classmethod
    def pad_all(cls, model: nn.Module, pairs: Sequence[tuple[DimGroup, int]]) -> None:
        for group, dim in pairs:
            group.pad(model, dim)

    # --- latency (gac.objectives.latency.model) ----------------------------------------------------------------
    profile_op: ClassVar[str] = "gemm_n"  # the profile sweep whose latency depends on this dim

    @property
    @abstractmethod
    def profile_shape(self) -> dict[str, int]: ...

    @abstractmethod
    def latency_terms(self) -> tuple[Dense | None, list[Term]]:
        """(dense, terms): the ops whose time changes with the group's dim d, and for a group whose original layout
        is not its terms at full dim (a dense weight), the (term, swept dim) pairs that time that layout (else
        None)."""

    def aligned_dims(self, alignment: int) -> list[int]:
        """Every grid point (whole heads for a coarse grid), or every multiple of `alignment` on a fine one."""
        if self.step > 1:
            return list(self.grid())
        return [d for d in range(alignment, self.max_dim + 1, alignment) if d >= self.min_dim]

    def wide_candidates(self, alignment: int) -> list[int | None]:
        """The latency objective's candidates: the aligned dims below the full one, then FULL (the original)."""
        return [d for d in self.aligned_dims(alignment) if d < self.max_dim] + [FULL]


def by_kind(pairs: list[tuple[DimGroup, X]]) -> dict[type[DimGroup], list[tuple[DimGroup, X]]]:
    """(group, x) pairs by the group's kind, in first-seen order: what a kind's batch handlers take."""
    out: defaultdict[type[DimGroup], list[tuple[DimGroup, X]]] = defaultdict(list)
    for pair in pairs:
        out[type(pair[0])].append(pair)
    return dict(out)


@dataclass(frozen=True)
class ChannelGroup(DimGroup):
    """A group whose dim is a count of channels out of `full` (an MLP's or every expert's width): its parameters
    are `full` x params_per_dim, and its latency is swept at the model's hidden width."""

    dim: int  # live width (a count of channels: never None)
    hidden: int = 0
    full: int = 0

    @property
    def numel(self) -> int:
        return self.full * self.params_per_dim

    @property
    def max_dim(self) -> int:
        return self.full

    @property
    def profile_shape(self) -> dict[str, int]:
        return {"k": self.hidden}
