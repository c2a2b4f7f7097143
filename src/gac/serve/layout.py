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
So N must divide every layer's query heads, KV heads and MLP width; ranks are never split, and each shard's
GEMM reads in / N (width / N, heads x head_dim / N) values a row: the alignment a `vllm:tpN` target asks of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gac.errors import GacError
from gac.models.adapters import adapter_for
from gac.models.groups import heads_split


@dataclass(frozen=True)
class Projection:
    """One HF linear as saved: its name inside its block (e.g. the q projection's), shape and factorization."""

    name: str
    in_features: int
    out_features: int
    rank: int | None = None  # a low-rank pair b(a(x))
    ranks: tuple[int, ...] | None = None  # PaLU: one shared a, an up-projection per KV-head group

    @property
    def dense(self) -> bool:
        return self.rank is None and self.ranks is None


@dataclass(frozen=True)
class LayerLayout:
    index: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    width: int  # MLP intermediate channels
    qkv: tuple[Projection, Projection, Projection]
    o: Projection
    producers: tuple[Projection, ...]
    consumers: tuple[Projection, ...]

    @property
    def projections(self) -> tuple[Projection, ...]:
        return (*self.qkv, self.o, *self.producers, *self.consumers)


def layer_layouts(config) -> list[LayerLayout]:
    """Every decoder layer's sizes from `config` and its `gac_structure` (an original model: all at full size)."""
    adapter = adapter_for(config)
    geo = adapter.geometry(config)
    structure = getattr(config, "gac_structure", None) or {}
    linear, lowrank = structure.get("linear", {}), structure.get("lowrank", {})
    grouped, attention = structure.get("grouped_lowrank", {}), structure.get("attention", {})
    hidden, inter = adapter.hidden_size(config), adapter.intermediate_size(config)

    layouts = []
    for layer in adapter.layers(config):
        heads = attention.get(layer.attention, {})
        num_heads = int(heads.get("num_heads", geo.num_heads))
        num_kv = int(heads.get("num_kv_heads", geo.num_kv_heads))
        shapes = {**layer.shapes(hidden, num_heads * geo.head_dim, num_kv * geo.head_dim, inter),
                  **{n: tuple(shape) for n, shape in linear.items()}}  # saved shapes over the defaults
        p = {n: Projection(n.rpartition(".")[2], int(shapes[n][1]), int(shapes[n][0]), lowrank.get(n),
                           tuple(int(r) for r in grouped[n]) if n in grouped else None) for n in layer.linears}
        widths = {p[n].out_features for n in layer.producers} | {p[n].in_features for n in layer.consumers}
        if len(widths) != 1:
            raise GacError(f"{layer.mlp}: its projections disagree on the MLP width ({sorted(widths)}): the saved "
                           "structure is damaged; re-run `gac compress`")
        layouts.append(LayerLayout(layer.index, num_heads, num_kv, geo.head_dim, widths.pop(),
                                   (p[layer.q], p[layer.k], p[layer.v]), p[layer.o],
                                   tuple(p[n] for n in layer.producers), tuple(p[n] for n in layer.consumers)))
    return layouts


def check_tensor_parallel(layouts: list[LayerLayout], tp: int) -> None:
    """Raise one GacError naming the first layer a degree-`tp` sharding cannot split (see the module docstring)."""
    if tp < 1:
        raise GacError(f"tensor parallel size {tp} is not valid: use 1 or more")
    fix = f"compress with --target vllm:tp{tp}, or serve with a tensor parallel size that divides it"
    for lay in layouts:
        dense_kv = all(p.dense for p in lay.qkv[1:])  # vLLM replicates dense KV heads over surplus ranks
        heads_ok = heads_split(lay.num_heads, lay.num_kv_heads, tp, kv_replicable=dense_kv)
        problems = [f"{lay.num_heads} query heads and {lay.num_kv_heads} KV heads" if not heads_ok else "",
                    f"MLP width {lay.width}" if lay.width % tp else ""]
        problems += [f"{p.name}'s {len(p.ranks)} PaLU groups" for p in lay.qkv if p.ranks and len(p.ranks) % tp]
        problems = [p for p in problems if p]
        if problems:
            raise GacError(f"layer {lay.index} keeps {' and '.join(problems)}, not divisible by tensor parallel "
                           f"size {tp}: {fix}")
