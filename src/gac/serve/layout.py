"""What a serving engine must build for a saved gac model, read off its config alone (no weights, no engine):
each decoder layer's head counts, MLP width and every projection's shape and factorization, and the tensor-parallel
sharding those sizes allow. Pure: the vLLM model classes (gac.serve.vllm_model) and gac's own checks ask it.

Sharding plan for a degree-N tensor-parallel engine (Megatron's column/row split, one all-reduce per block):
  column projections (q, k, v, MLP producers; output sharded by head or channel):
      dense        column-parallel
      low rank     a replicated [r, in], b column-parallel [out / N, r]: no communication, r unchanged per shard
      PaLU groups  a replicated, each rank applies the up-projections of its own KV-head groups
  row projections (o, MLP consumers; input sharded, output all-reduced):
      dense        row-parallel
      low rank     a row-parallel [r, in / N] with the all-reduce on r values (not the hidden size), b replicated
  experts      an MoE layer's experts at one width a layer, split over the ranks by vLLM's FusedMoE
So N must divide every layer's query heads, KV heads and MLP (or expert) width; ranks are never split, and each
shard's GEMM reads in / N (width / N, heads x head_dim / N) values a row: the alignment a `vllm:tpN` target asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gac.errors import GacError
from gac.models.adapters import adapter_for
from gac.models.groups import heads_split
from gac.models.kinds.experts import channel_axes

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class Projection:
    """One HF linear as saved: its module path, shape and factorization."""

    path: str  # its module path in the HF model, e.g. model.layers.0.self_attn and its name
    in_features: int
    out_features: int
    rank: int | None = None  # a low-rank pair b(a(x))
    ranks: tuple[int, ...] | None = None  # PaLU: one shared a, an up-projection per KV-head group

    @property
    def name(self) -> str:
        """Its name inside its block (the last part of its path)."""
        return self.path.rpartition(".")[2]

    @property
    def dense(self) -> bool:
        return self.rank is None and self.ranks is None

    @property
    def pair_rank(self) -> int:
        """`rank`, of a projection saved as a low-rank pair."""
        if self.rank is None:
            raise GacError(f"{self.path} is not saved as a low-rank pair")
        return self.rank

    @property
    def group_ranks(self) -> tuple[int, ...]:
        """`ranks`, of a projection saved as PaLU's head groups."""
        if self.ranks is None:
            raise GacError(f"{self.path} is not saved as low-rank head groups")
        return self.ranks


@dataclass(frozen=True)
class LayerLayout:
    index: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    width: int | None  # a dense MLP's intermediate channels (None: the layer's MLP is a mixture of experts)
    expert_width: int | None  # each expert's intermediate channels, one width a layer (None: a dense MLP)
    qkv: tuple[Projection, ...]  # q, k, v; or the one fused linear they are rows of (Phi-3's qkv_proj)
    o: Projection
    producers: tuple[Projection, ...]  # gate, up; or one fused gate_up; none in an MoE layer
    consumers: tuple[Projection, ...]

    @property
    def projections(self) -> tuple[Projection, ...]:
        return (*self.qkv, self.o, *self.producers, *self.consumers)

    @property
    def mlp_width(self) -> int:
        """The channels tensor parallelism splits: the dense MLP's, or each expert's."""
        width = self.width if self.width is not None else self.expert_width
        if width is None:
            raise GacError(f"layer {self.index} has neither an MLP width nor an expert width")
        return width


def layer_layouts(config: PretrainedConfig) -> list[LayerLayout]:
    """Every decoder layer's sizes from `config` and its `gac_structure` (an original model: all at full size)."""
    adapter = adapter_for(config)
    geo = adapter.geometry(config)
    structure = getattr(config, "gac_structure", None) or {}
    linear, lowrank = structure.get("linear", {}), structure.get("lowrank", {})
    grouped, attention = structure.get("grouped_lowrank", {}), structure.get("attention", {})
    parameter = structure.get("parameter", {})  # fused expert weights' saved shapes
    hidden, inter = adapter.hidden_size(config), adapter.intermediate_size(config)

    layouts = []
    for layer in adapter.layers(config):
        heads = attention.get(layer.attention, {})
        num_heads = int(heads.get("num_heads", geo.num_heads))
        num_kv = int(heads.get("num_kv_heads", geo.num_kv_heads))
        shapes = {
            **layer.shapes(hidden, num_heads * geo.head_dim, num_kv * geo.head_dim, inter),
            **{n: tuple(shape) for n, shape in linear.items()},
        }  # saved shapes over the defaults
        p = {
            n: Projection(
                n,
                int(shapes[n][1]),
                int(shapes[n][0]),
                lowrank.get(n),
                tuple(int(r) for r in grouped[n]) if n in grouped else None,
            )
            for n in layer.linears
        }
        width = expert_width = None
        if layer.experts:  # down [E, H, I] (or, transposed, [E, I, H]): the saved width, else the config's
            down, axis = layer.expert_weights[1], channel_axes(layer.expert_transposed)[1]
            expert_width = int(parameter[down][axis]) if down in parameter else adapter.expert_geometry(config)[1]
        else:
            widths = {p[n].out_features // layer.producer_parts for n in layer.producers} | {
                p[n].in_features for n in layer.consumers
            }
            if len(widths) != 1:
                raise GacError(
                    f"{layer.mlp}: its projections disagree on the MLP width ({sorted(widths)}): the "
                    "saved structure is damaged; re-run `gac compress`"
                )
            width = widths.pop()
        qkv = tuple(p[n] for n in dict.fromkeys((layer.q, layer.k, layer.v)))
        layouts.append(
            LayerLayout(
                layer.index,
                num_heads,
                num_kv,
                geo.head_dim,
                width,
                expert_width,
                qkv,
                p[layer.o],
                tuple(p[n] for n in layer.producers),
                tuple(p[n] for n in layer.consumers),
            )
        )
    return layouts


def check_tensor_parallel(layouts: list[LayerLayout], tp: int) -> None:
    """Raise one GacError naming the first layer a degree-`tp` sharding cannot split (see the module docstring)."""
    if tp < 1:
        raise GacError(f"tensor parallel size {tp} is not valid: use 1 or more")
    fix = f"compress with --target vllm:tp{tp}, or serve with a tensor parallel size that divides it"
    for lay in layouts:
        dense_kv = all(p.dense for p in lay.qkv[1:])  # vLLM replicates dense KV heads over surplus ranks
        heads_ok = heads_split(lay.num_heads, lay.num_kv_heads, tp, kv_replicable=dense_kv)
        problems = [
            f"{lay.num_heads} query heads and {lay.num_kv_heads} KV heads" if not heads_ok else "",
            f"{'MLP' if lay.width is not None else 'expert'} width {lay.mlp_width}" if lay.mlp_width % tp else "",
        ]
        problems += [f"{p.name}'s {len(p.ranks)} PaLU groups" for p in lay.qkv if p.ranks and len(p.ranks) % tp]
        problems = [p for p in problems if p]
        if problems:
            raise GacError(
                f"layer {lay.index} keeps {' and '.join(problems)}, not divisible by tensor parallel size {tp}: {fix}"
            )
