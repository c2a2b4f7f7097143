"""The `mlp` kind: a layer's MLP width, its producers' rows and its consumers' columns the same channels
(gate/up/down, fc1/fc2, or a fused gate_up [2w, hidden] whose two halves are gate and up)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from gac.errors import GacError
from gac.models.adapters import Adapter, LayerModules, config_of
from gac.models.cuts import Cut, Keep, cut_as
from gac.models.kinds.base import ChannelGroup, DimGroup, Term, shape
from gac.models.surgery import keep_columns, keep_rows, linear_at, widen_columns, widen_rows


@dataclass(frozen=True)
class WidthGroup(ChannelGroup):
    """A layer's MLP width: producers' rows and consumers' columns are the same channels."""

    block: str = ""
    producers: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()
    parts: int = 1  # row blocks per producer (2: a fused gate_up, gate rows then up rows)
    kind: ClassVar[str] = "mlp"

    @classmethod
    def read(cls, model: nn.Module, adapter: Adapter, layer: LayerModules, **_: Any) -> list[DimGroup]:
        if not layer.producers:  # an MoE layer: its width is the experts kind's
            return []
        producers = [linear_at(model, n) for n in layer.producers]
        consumers = [linear_at(model, n) for n in layer.consumers]
        parts = layer.producer_parts
        widths = {m.out_features // parts for m in producers} | {m.in_features for m in consumers}
        if len(widths) != 1:
            raise GacError(
                f"{layer.mlp}: its projections disagree on the MLP width ({sorted(widths)}); "
                "this is not a model gac can resize"
            )
        return [
            cls(
                layer.mlp,
                widths.pop(),
                block=layer.mlp,
                producers=layer.producers,
                consumers=layer.consumers,
                hidden=adapter.hidden_size(config_of(model)),
                full=adapter.intermediate_size(config_of(model)),
                parts=parts,
            )
        ]

    @property
    def linears(self) -> tuple[str, ...]:
        return (*self.producers, *self.consumers)

    @property
    def params_per_dim(self) -> int:
        return self.hidden * (self.parts * len(self.producers) + len(self.consumers))

    def out_lengths(self, dim: int) -> list[int]:
        """The producers compute `dim` channels per part (a fused gate_up: 2 x dim rows)."""
        return [self.parts * dim]

    def shard_row_lengths(self, dim: int, tp: int) -> list[int] | None:
        """Channels are split over the ranks: producers column-parallel, the consumer row-parallel."""
        return None if dim % tp else [dim // tp]

    def shard_out_lengths(self, dim: int, tp: int) -> list[int] | None:
        # the producers' rows are the consumers' columns, split alike (a fused gate_up: each half)
        return None if dim % tp else [self.parts * dim // tp]

    def cut(self, model: nn.Module, cut: Cut) -> None:
        """Keep channels `cut.channels` in every producer (rows: in each of its parts) and consumer (columns)."""
        channels = cut_as(cut, Keep, self.name).channels
        keep_rows(model, self.producers, torch.cat([channels + k * self.dim for k in range(self.parts)]))
        keep_columns(model, self.consumers, channels)

    def pad(self, model: nn.Module, dim: int) -> None:
        widen_rows(model, self.producers, dim, parts=self.parts)
        widen_columns(model, self.consumers, dim)

    def latency_terms(self) -> tuple[None, list[Term]]:
        """Producers [parts x w, hidden] (N = parts x w), consumers [hidden, w] (K = w)."""
        return None, [
            Term("gemm_n", shape(k=self.hidden), mult=self.parts, weight=len(self.producers)),
            Term("gemm_k", shape(n=self.hidden), weight=len(self.consumers)),
        ]
