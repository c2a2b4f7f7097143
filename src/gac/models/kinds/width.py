"""The `mlp` kind: a layer's MLP width, its producers' rows and its consumers' columns the same channels
(gate/up/down, or fc1/fc2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gac.errors import GacError
from gac.models.kinds.base import DimGroup, Term, shape


@dataclass(frozen=True)
class WidthGroup(DimGroup):
    """A layer's MLP width: producers' rows and consumers' columns are the same channels."""

    block: str = ""
    producers: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()
    hidden: int = 0
    full: int = 0
    kind: ClassVar[str] = "mlp"

    @classmethod
    def read(cls, model, adapter, layer, **_) -> list[DimGroup]:
        if not layer.producers:  # an MoE layer: its width is the experts kind's
            return []
        producers = [model.get_submodule(n) for n in layer.producers]
        consumers = [model.get_submodule(n) for n in layer.consumers]
        widths = {m.out_features for m in producers} | {m.in_features for m in consumers}
        if len(widths) != 1:
            raise GacError(f"{layer.mlp}: its projections disagree on the MLP width ({sorted(widths)}); "
                           "this is not a model gac can resize")
        return [cls(layer.mlp, widths.pop(), block=layer.mlp, producers=layer.producers, consumers=layer.consumers,
                    hidden=adapter.hidden_size(model.config), full=adapter.intermediate_size(model.config))]

    @property
    def linears(self):
        return (*self.producers, *self.consumers)

    @property
    def numel(self):
        return self.full * self.params_per_dim

    @property
    def params_per_dim(self):
        return self.hidden * len(self.linears)

    @property
    def max_dim(self):
        return self.full

    @property
    def profile_shape(self):
        return {"k": self.hidden}

    def shard_row_lengths(self, dim: int, tp: int) -> list[int] | None:
        """Channels are split over the ranks: producers column-parallel, the consumer row-parallel."""
        return None if dim % tp else [dim // tp]

    def shard_out_lengths(self, dim: int, tp: int) -> list[int] | None:
        return self.shard_row_lengths(dim, tp)  # the producers' rows are the consumers' columns, split alike

    def cut(self, model, cut) -> None:
        """Keep channels `cut.channels` in every producer (rows) and consumer (columns)."""
        from gac.models.surgery import keep_columns, keep_rows

        keep_rows(model, self.producers, cut.channels)
        keep_columns(model, self.consumers, cut.channels)

    def pad(self, model, dim: int) -> None:
        from gac.models.surgery import widen_columns, widen_rows

        widen_rows(model, self.producers, dim)
        widen_columns(model, self.consumers, dim)

    def latency_terms(self):
        """Producers [w, hidden] (N = w), consumers [hidden, w] (K = w)."""
        return None, [Term("gemm_n", shape(k=self.hidden), weight=len(self.producers)),
                      Term("gemm_k", shape(n=self.hidden), weight=len(self.consumers))]
