"""The `heads` kind: a layer's attention heads, removed whole: KV groups with all their query heads (mode
"group"), or the same number of query heads in every KV group (mode "uniform")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from gac.errors import ConfigError, GacError, literal
from gac.models.adapters import Adapter, LayerModules, adapter_for, config_of
from gac.models.cuts import Cut, KeepHeads, cut_as
from gac.models.kinds.base import DimGroup, Term, shape
from gac.models.surgery import channels_of, keep_columns, keep_entries, keep_rows, linear_at, set_head_counts

MODES = ("group", "uniform")


@dataclass(frozen=True)
class HeadGroup(DimGroup):
    """A layer's attention heads. dim is a width in channels, always whole heads:
    group mode: kept KV width (kept KV groups x head_dim), each KV group with all its query heads;
    uniform mode: kept query width (num_kv_heads x kept heads per group x head_dim), k and v whole."""

    kind: ClassVar[str] = "heads"
    removes_heads: ClassVar[bool] = True

    dim: int  # live width in channels (never None)
    block: str = ""
    q: str = ""
    k: str = ""
    v: str = ""
    o: str = ""
    hidden: int = 0
    num_heads: int = 0  # of the original model
    num_kv_heads: int = 0
    head_dim: int = 0
    mode: str = "group"
    live_heads: int = 0  # query and KV heads of the live module
    live_kv_heads: int = 0
    head_parameters: tuple[str, ...] = ()  # parameters with an entry per query head (gpt-oss's sinks): cut alike

    @classmethod
    def read(
        cls, model: nn.Module, adapter: Adapter, layer: LayerModules, *, mode: str = "group", **_: Any
    ) -> list[DimGroup]:
        if mode not in MODES:
            raise GacError(f"unknown head mode {mode!r}: choose one of {', '.join(MODES)}")
        geo = adapter.geometry(config_of(model))
        if layer.fused_qkv:  # never cut (check_heads_prunable): the config's counts
            heads, kv = geo.num_heads, geo.num_kv_heads
        else:
            heads = linear_at(model, layer.q).out_features // geo.head_dim
            kv = linear_at(model, layer.k).out_features // geo.head_dim
        live = kv * geo.head_dim if mode == "group" else heads * geo.head_dim
        return [
            cls(
                layer.attention,
                live,
                block=layer.attention,
                q=layer.q,
                k=layer.k,
                v=layer.v,
                o=layer.o,
                hidden=adapter.hidden_size(config_of(model)),
                num_heads=geo.num_heads,
                num_kv_heads=geo.num_kv_heads,
                head_dim=geo.head_dim,
                mode=mode,
                live_heads=heads,
                live_kv_heads=kv,
                head_parameters=layer.head_parameters,
            )
        ]

    @property
    def linears(self) -> tuple[str, ...]:
        return (self.q, self.k, self.v, self.o)

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def numel(self) -> int:
        return 2 * self.hidden * self.head_dim * (self.num_heads + self.num_kv_heads)

    @property
    def params_per_dim(self) -> int:  # per KV channel: gs q rows, one k and one v row, gs o columns
        return (2 * self.group_size + 2) * self.hidden if self.mode == "group" else 2 * self.hidden

    @property
    def fixed_params(self) -> int:
        return 0 if self.mode == "group" else 2 * self.hidden * self.num_kv_heads * self.head_dim

    @property
    def step(self) -> int:
        return self.head_dim if self.mode == "group" else self.num_kv_heads * self.head_dim

    @property
    def min_dim(self) -> int:  # at least one KV group, or one query head per group
        return self.step

    @property
    def max_dim(self) -> int:
        return (self.num_kv_heads if self.mode == "group" else self.num_heads) * self.head_dim

    @property
    def profile_shape(self) -> dict[str, int]:
        return {"k": self.hidden}

    def widths(self, dim: int) -> tuple[int, int]:
        """(query width, KV width) kept at `dim`: group mode keeps each KV group's query heads, uniform mode every
        KV head."""
        if self.mode == "group":
            return dim * self.group_size, dim
        return dim, self.num_kv_heads * self.head_dim

    def row_lengths(self, dim: int) -> list[int]:
        """The o projection reads the kept query heads: KV width x group size (group mode), or the width."""
        return [self.widths(dim)[0]]

    def out_lengths(self, dim: int) -> list[int]:
        """q computes the kept query width; k and v the kept KV width, where the dim sets it (group mode)."""
        q, kv = self.widths(dim)
        return [q, kv] if self.mode == "group" else [q]

    def _shards(self, dim: int, tp: int) -> tuple[int, int] | None:
        """(query width, KV width) on each of `tp` ranks, or None where the heads do not split over them: every
        rank needs whole query heads and whole KV heads (or, with fewer KV heads than ranks, one replicated KV
        head, as vLLM does)."""
        q, kv = self.widths(dim)
        kv_heads = kv // self.head_dim
        if not heads_split(q // self.head_dim, kv_heads, tp):
            return None
        return q // tp, max(kv_heads // tp, 1) * self.head_dim

    def shard_row_lengths(self, dim: int, tp: int) -> list[int] | None:
        shards = self._shards(dim, tp)
        return None if shards is None else [shards[0]]

    def shard_out_lengths(self, dim: int, tp: int) -> list[int] | None:
        shards = self._shards(dim, tp)
        return None if shards is None else list(shards) if self.mode == "group" else [shards[0]]

    def compressed_dims(self) -> list[int]:
        """The query and KV widths where they differ from the original's."""
        widths = ((self.live_heads, self.num_heads), (self.live_kv_heads, self.num_kv_heads))
        return [live * self.head_dim for live, full in widths if live != full]

    def cut(self, model: nn.Module, cut: Cut) -> None:
        """Keep query heads `cut.q_heads` (q rows, o columns, their entries of per-head parameters such as gpt-oss's
        sinks) and KV heads `cut.kv_heads` (k and v rows)."""
        cut = cut_as(cut, KeepHeads, self.name)
        q_ch, kv_ch = channels_of(cut.q_heads, self.head_dim), channels_of(cut.kv_heads, self.head_dim)
        keep_rows(model, (self.q,), q_ch)
        keep_rows(model, (self.k, self.v), kv_ch)
        keep_columns(model, (self.o,), q_ch)
        for name in self.head_parameters:
            keep_entries(model, name, 0, cut.q_heads)
        set_head_counts(model.get_submodule(self.block), len(cut.q_heads), len(cut.kv_heads))

    # pad: DimGroup's refusal (gac.repair leaves attention as it is: see its docstring)

    def latency_terms(self) -> tuple[None, list[Term]]:
        """q rows and o columns (group_size x the KV width in group mode), the layer's attention timed at the kept
        query heads, and in group mode k and v, which lose the same KV width."""
        gs = self.group_size if self.mode == "group" else 1
        terms = [Term("gemm_n", shape(k=self.hidden), mult=gs), Term("gemm_k", shape(n=self.hidden), mult=gs)]
        # whole KV groups go with their query heads, or query heads go within each KV group and every KV head stays
        kv = shape(
            head_dim=self.head_dim, **({"q_per_kv": gs} if self.mode == "group" else {"kv_heads": self.num_kv_heads})
        )
        terms.append(Term("sdpa_heads", kv, mult=gs, div=self.head_dim))
        if self.mode == "group":
            terms.append(Term("gemm_n", shape(k=self.hidden), weight=2))
        return None, terms


def heads_split(num_heads: int, num_kv_heads: int, tp: int, *, kv_replicable: bool = True) -> bool:
    """Whether `tp` tensor-parallel ranks split a layer's heads: whole query heads per rank, and whole KV heads per
    rank or (kv_replicable: dense K/V, as vLLM does) fewer KV heads than ranks, each replicated."""
    kv_ok = num_kv_heads % tp == 0 or (kv_replicable and tp % num_kv_heads == 0)
    return num_heads % tp == 0 and kv_ok


def check_heads_prunable(model: nn.Module, group: HeadGroup) -> None:
    """Heads can be removed only where the family's per-head norms and GQA split allow it."""
    config = config_of(model)
    adapter = adapter_for(config)
    if group.q == group.k:
        raise ConfigError(
            f"{literal(config.model_type)}'s attention splits its fused q/k/v projection at the config's head "
            "counts, so its heads cannot be pruned per layer: use {head_mode:none} (MLP channels only)"
        )
    norm = adapter.per_head_norm(model.get_submodule(group.block))
    weight = getattr(norm, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.numel() != group.head_dim:
        raise ConfigError(
            f"{literal(config.model_type)}'s query norm spans all heads, so its heads cannot be pruned: "
            "use {head_mode:none} (MLP channels or expert widths only)"
        )
    if group.num_heads % group.num_kv_heads:
        raise GacError(f"{group.num_heads} query heads do not split into {group.num_kv_heads} KV groups")
