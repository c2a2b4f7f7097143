"""gac's model class for vLLM: the family's own vLLM model, each decoder layer built at its saved sizes.

Registered by gac's vLLM plugin (gac.serve.vllm_plugin) under the architecture name gac writes into config.json
(e.g. GacLlamaForCausalLM), so `vllm serve DIR` and `LLM(model=DIR)` load a gac output with vLLM's own layers,
attention, KV cache and tensor parallelism. Sizes and the sharding plan come from gac.serve.layout: a layer whose
q/k/v (or MLP producers) are all dense keeps vLLM's fused linear at the layer's head counts (or width); a factorized
projection is a pair of vLLM linears (column: a replicated, b column-parallel; row: a row-parallel, b replicated).
Weights load under their HF names; vLLM checks that every parameter was loaded, so a damaged directory fails.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable

import torch
from torch import nn
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from vllm.model_executor.models.utils import WeightsMapper, extract_layer_index

from gac.models.adapters import adapter_for
from gac.serve.layout import LayerLayout, Projection, check_tensor_parallel, layer_layouts


class LowRankColumn(nn.Module):
    """y = b(a(x)) with its output sharded: a [r, in] replicated, b [out / N, r] column-parallel."""

    def __init__(self, p: Projection, bias: bool, quant_config, prefix: str):
        super().__init__()
        self.a = ReplicatedLinear(p.in_features, p.rank, bias=False, quant_config=quant_config, prefix=f"{prefix}.a")
        self.b = ColumnParallelLinear(p.rank, p.out_features, bias=bias, quant_config=quant_config,
                                      prefix=f"{prefix}.b")

    def forward(self, x):
        return self.b(self.a(x)[0])


class LowRankRow(nn.Module):
    """y = b(a(x)) with its input sharded: a [r, in / N] row-parallel (all-reduce on r values), b replicated."""

    def __init__(self, p: Projection, bias: bool, quant_config, prefix: str):
        super().__init__()
        self.a = RowParallelLinear(p.in_features, p.rank, bias=False, input_is_parallel=True, reduce_results=True,
                                   quant_config=quant_config, prefix=f"{prefix}.a")
        self.b = ReplicatedLinear(p.rank, p.out_features, bias=bias, quant_config=quant_config, prefix=f"{prefix}.b")

    def forward(self, x):
        return self.b(self.a(x)[0])


class GroupedLowRankColumn(nn.Module):
    """PaLU's K/V projection: one replicated a [sum r_g, in], then each KV-head group's b_g [out / G, r_g]; a
    tensor-parallel rank applies the groups of its own heads (G / N of them)."""

    def __init__(self, p: Projection, bias: bool, quant_config, prefix: str):
        super().__init__()
        self.ranks = list(p.ranks)
        self.a = ReplicatedLinear(p.in_features, sum(self.ranks), bias=False, quant_config=quant_config,
                                  prefix=f"{prefix}.a")
        group_out = p.out_features // len(self.ranks)
        self.b = nn.ModuleList(ReplicatedLinear(r, group_out, bias=bias, quant_config=quant_config,
                                                prefix=f"{prefix}.b.{g}") for g, r in enumerate(self.ranks))
        per_rank = len(self.ranks) // get_tensor_model_parallel_world_size()
        first = get_tensor_model_parallel_rank() * per_rank
        self.local = range(first, first + per_rank)

    def forward(self, x):
        latents = self.a(x)[0].split(self.ranks, dim=-1)  # G x [T, r_g]
        return torch.cat([self.b[g](latents[g])[0] for g in self.local], dim=-1), None  # [T, out / N]


class Concat(nn.Module):
    """Sibling column projections that read the same input (q/k/v, or the MLP producers), outputs concatenated in
    order: what the block's fused linear returns, for a layer where some of them are factorized."""

    def __init__(self, parts: dict[str, nn.Module]):
        super().__init__()
        for name, part in parts.items():
            self.add_module(name, part)

    def forward(self, x):
        return torch.cat([part(x)[0] for part in self.children()], dim=-1), None


def column(p: Projection, bias: bool, quant_config, prefix: str) -> nn.Module:
    if p.ranks:
        return GroupedLowRankColumn(p, bias, quant_config, prefix)
    if p.rank:
        return LowRankColumn(p, bias, quant_config, prefix)
    return ColumnParallelLinear(p.in_features, p.out_features, bias=bias, quant_config=quant_config, prefix=prefix)


def row(p: Projection, bias: bool, quant_config, prefix: str) -> nn.Module:
    if p.rank:
        return LowRankRow(p, bias, quant_config, prefix)
    return RowParallelLinear(p.in_features, p.out_features, bias=bias, quant_config=quant_config, prefix=prefix)


class HfNamedBlock:
    """Loads a block's weights under their HF names: a dense projection fused with its siblings goes to the fused
    linear by shard (`stacked`: HF name -> (fused linear, shard id)); any other to the parameter of its own name,
    inside the Concat that holds it (`holders`: HF name -> Concat's attribute)."""

    stacked: dict
    holders: dict

    def use_parts(self, fused: str, parts: tuple[Projection, ...], build, bias: bool, quant_config, prefix: str,
                  shard_ids) -> None:
        """Keep vLLM's fused linear `fused` where every part is dense; else a Concat of the parts under it."""
        if all(p.dense for p in parts):
            self.stacked.update({p.name: (fused, s) for p, s in zip(parts, shard_ids)})
            return
        setattr(self, fused, Concat({p.name: build(p, bias, quant_config, f"{prefix}.{p.name}") for p in parts}))
        self.holders.update({p.name: fused for p in parts})

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            proj, _, rest = name.partition(".")
            if proj in self.stacked:
                fused, shard = self.stacked[proj]
                key = f"{fused}.{rest}"
                params[key].weight_loader(params[key], tensor, shard)
            else:
                key = f"{self.holders[proj]}.{name}" if proj in self.holders else name
                if key not in params:
                    raise ValueError(f"gac: the checkpoint's {name} has no parameter in {type(self).__name__} "
                                     f"(it has {sorted(params)}): the saved structure does not match the weights")
                getattr(params[key], "weight_loader", default_weight_loader)(params[key], tensor)
            loaded.add(key)
        return loaded


class GacAttention(HfNamedBlock, LlamaAttention):
    """vLLM's attention at the layer's head counts; factorized q/k/v or o projections as vLLM linear pairs."""

    def __init__(self, *, layout: LayerLayout, fused_qkv: str, **kwargs):
        super().__init__(**kwargs)  # the layer's own config: its head counts, vLLM's fused qkv at that size
        self.stacked, self.holders = {}, {}
        quant, prefix, bias = kwargs.get("quant_config"), kwargs["prefix"], kwargs.get("bias", False)
        self.use_parts(fused_qkv, layout.qkv, column, bias, quant, prefix, ("q", "k", "v"))
        if not layout.o.dense:
            setattr(self, layout.o.name, row(layout.o, kwargs.get("bias_o_proj", False), quant,
                                             f"{prefix}.{layout.o.name}"))


class GacMLP(HfNamedBlock, LlamaMLP):
    """vLLM's MLP at the layer's width; factorized producers or consumer as vLLM linear pairs."""

    def __init__(self, *, layout: LayerLayout, fused_producers: str, prefix: str, quant_config, bias: bool, **kwargs):
        super().__init__(intermediate_size=layout.width, quant_config=quant_config, bias=bias, prefix=prefix, **kwargs)
        self.stacked, self.holders = {}, {}
        self.use_parts(fused_producers, layout.producers, column, bias, quant_config, prefix,
                       range(len(layout.producers)))
        (down,) = layout.consumers
        if not down.dense:
            setattr(self, down.name, row(down, bias, quant_config, f"{prefix}.{down.name}"))


class GacDecoderLayer(LlamaDecoderLayer):
    """vLLM's decoder layer built from a per-layer copy of the config (head counts, MLP width)."""

    def __init__(self, *, vllm_config, layouts: list[LayerLayout], prefix: str = "", config=None):
        config = config or vllm_config.model_config.hf_config
        layout = layouts[extract_layer_index(prefix)]
        names = adapter_for(config).vllm_names()
        own = copy.copy(config)
        own.num_attention_heads, own.num_key_value_heads = layout.num_heads, layout.num_kv_heads
        own.head_dim, own.intermediate_size = layout.head_dim, layout.width

        def attention(**kwargs):
            return GacAttention(layout=layout, fused_qkv=names.qkv, **kwargs)

        super().__init__(vllm_config=vllm_config, prefix=prefix, config=own, attn_layer_type=attention)
        self.mlp = GacMLP(layout=layout, fused_producers=names.producers, hidden_size=own.hidden_size,
                          hidden_act=own.hidden_act, quant_config=self.get_quant_config(vllm_config),
                          bias=getattr(own, "mlp_bias", False), prefix=f"{prefix}.mlp")


class GacLlamaForCausalLM(LlamaForCausalLM):
    """A gac output of a Llama-layout model; weights keep their HF names (each block maps its own)."""

    hf_to_vllm_mapper = WeightsMapper()

    def __init__(self, *, vllm_config, prefix: str = ""):
        layouts = layer_layouts(vllm_config.model_config.hf_config)  # read once, handed to every layer
        check_tensor_parallel(layouts, get_tensor_model_parallel_world_size())
        super().__init__(vllm_config=vllm_config, prefix=prefix,
                         layer_type=functools.partial(GacDecoderLayer, layouts=layouts))
        self.model.hf_to_vllm_mapper = WeightsMapper()  # the blocks map q/k/v and the producers themselves
