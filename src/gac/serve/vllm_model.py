"""gac's model classes for vLLM: each family's own vLLM model, every decoder layer built at its saved sizes.

Registered by gac's vLLM plugin (gac.serve.vllm_plugin) under the architecture names gac writes into config.json
(e.g. GacLlamaForCausalLM, GacGemma3ForCausalLM), so vLLM's OpenAI server and `LLM(model=DIR)` load a gac output with
vLLM's own layers, attention, KV cache, fused MoE and tensor parallelism.

How a layer gets its own sizes: every vLLM model builds its decoder layers through `make_layers(n, layer_fn,
prefix)`. While gac's class is built, that function, in the modules of the family's decoder model alone
(`gac_decoder`, see layer_builders), builds each layer with the config showing the layer's saved head counts, MLP
width and expert width (gac.serve.layout), then puts the projections the saved model factorized in place of
vLLM's dense ones: a column projection becomes a pair (a replicated, b column-parallel, or the family's own fused
linear at input r for a fused projection), a row projection a pair (a row-parallel, b replicated), and q/k/v (or
gate/up) of which some are factorized a Concat. Dense projections keep vLLM's fused linears and load through the
family's own loader; the factorized ones load here under their HF names. vLLM checks that every parameter was
loaded, so a damaged directory fails.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM, Gemma3Model
from vllm.model_executor.models.llama import LlamaForCausalLM, LlamaModel
from vllm.model_executor.models.mistral import MistralForCausalLM, MistralModel
from vllm.model_executor.models.mixtral import MixtralForCausalLM, MixtralModel
from vllm.model_executor.models.phi3 import Phi3ForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM, Qwen2Model
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM, Qwen3Model
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM, Qwen3MoeModel
from vllm.model_executor.models.utils import extract_layer_index

from gac.errors import GacError
from gac.models.adapters import VllmNames, adapter_for
from gac.serve.layout import LayerLayout, Projection, check_tensor_parallel, layer_layouts

if TYPE_CHECKING:
    from transformers import PretrainedConfig
    from vllm.config import VllmConfig
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
    from vllm.model_executor.models.utils import LayerFn

    # vLLM's make_layers(num_hidden_layers, layer_fn, prefix) -> (start_layer, end_layer, layers)
    MakeLayers = Callable[[int, LayerFn, str], tuple[int, int, nn.ModuleList]]


class LowRankColumn(nn.Module):
    """y = b(a(x)) with its output sharded: a [r, in] replicated, b [out / N, r] column-parallel (or, for a fused
    projection, the family's fused linear at input r, which splits its rows by head or by half)."""

    def __init__(
        self,
        p: Projection,
        bias: bool,
        quant_config: QuantizationConfig | None,
        prefix: str,
        fused: QKVParallelLinear | MergedColumnParallelLinear | None = None,
    ) -> None:
        super().__init__()
        rank = p.pair_rank
        self.a = ReplicatedLinear(p.in_features, rank, bias=False, quant_config=quant_config, prefix=f"{prefix}.a")
        self.b = (
            fused_at(fused, rank, bias, quant_config, f"{prefix}.b")
            if fused is not None
            else ColumnParallelLinear(rank, p.out_features, bias=bias, quant_config=quant_config, prefix=f"{prefix}.b")
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.b(self.a(x)[0])


class LowRankRow(nn.Module):
    """y = b(a(x)) with its input sharded: a [r, in / N] row-parallel (all-reduce on r values), b replicated."""

    def __init__(self, p: Projection, bias: bool, quant_config: QuantizationConfig | None, prefix: str) -> None:
        super().__init__()
        self.a = RowParallelLinear(
            p.in_features,
            p.pair_rank,
            bias=False,
            input_is_parallel=True,
            reduce_results=True,
            quant_config=quant_config,
            prefix=f"{prefix}.a",
        )
        self.b = ReplicatedLinear(
            p.pair_rank, p.out_features, bias=bias, quant_config=quant_config, prefix=f"{prefix}.b"
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.b(self.a(x)[0])


class GroupedLowRankColumn(nn.Module):
    """PaLU's K/V projection: one replicated a [sum r_g, in], then each KV-head group's b_g [out / G, r_g]; a
    tensor-parallel rank applies the groups of its own heads (G / N of them)."""

    def __init__(self, p: Projection, bias: bool, quant_config: QuantizationConfig | None, prefix: str) -> None:
        super().__init__()
        self.ranks = list(p.group_ranks)
        self.a = ReplicatedLinear(
            p.in_features, sum(self.ranks), bias=False, quant_config=quant_config, prefix=f"{prefix}.a"
        )
        group_out = p.out_features // len(self.ranks)
        self.b = nn.ModuleList(
            ReplicatedLinear(r, group_out, bias=bias, quant_config=quant_config, prefix=f"{prefix}.b.{g}")
            for g, r in enumerate(self.ranks)
        )
        per_rank = len(self.ranks) // get_tensor_model_parallel_world_size()
        first = get_tensor_model_parallel_rank() * per_rank
        self.local = range(first, first + per_rank)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        latents = self.a(x)[0].split(self.ranks, dim=-1)  # G x [T, r_g]
        return torch.cat([self.b[g](latents[g])[0] for g in self.local], dim=-1), None  # [T, out / N]


class Concat(nn.Module):
    """Sibling column projections that read the same input (q/k/v, or the MLP producers), outputs concatenated in
    order: what the block's fused linear returns, for a layer where some of them are factorized."""

    def __init__(self, parts: dict[str, nn.Module]) -> None:
        super().__init__()
        for name, part in parts.items():
            self.add_module(name, part)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.cat([part(x)[0] for part in self.children()], dim=-1), None


def fused_at(
    dense: QKVParallelLinear | MergedColumnParallelLinear,
    in_features: int,
    bias: bool,
    quant_config: QuantizationConfig | None,
    prefix: str,
) -> nn.Module:
    """The family's fused column linear `dense` (q/k/v by heads, or gate/up halves) rebuilt to read `in_features`
    values: the up-projection of a factorized fused projection, sharded as the dense one."""
    if isinstance(dense, QKVParallelLinear):
        return QKVParallelLinear(
            in_features,
            dense.head_size,
            dense.total_num_heads,
            dense.total_num_kv_heads,
            bias=bias,
            quant_config=quant_config,
            prefix=prefix,
        )
    return MergedColumnParallelLinear(
        in_features, list(dense.output_sizes), bias=bias, quant_config=quant_config, prefix=prefix
    )


def column(p: Projection, bias: bool, quant_config: QuantizationConfig | None, prefix: str) -> nn.Module:
    if p.ranks:
        return GroupedLowRankColumn(p, bias, quant_config, prefix)
    if p.rank:
        return LowRankColumn(p, bias, quant_config, prefix)
    return ColumnParallelLinear(p.in_features, p.out_features, bias=bias, quant_config=quant_config, prefix=prefix)


def factorize(
    block: nn.Module,
    prefix: str,
    fused: str,
    parts: tuple[Projection, ...],
    rows: tuple[Projection, ...],
    quant_config: QuantizationConfig | None,
) -> dict[str, str]:
    """Put the saved factorizations of one block (attention or MLP) in place of vLLM's dense linears: the column
    parts of its fused linear `fused`, and its row projections. Returns {HF module path: vLLM module path} of every
    projection moved, whose weights gac then loads."""
    moved: dict[str, str] = {}
    dense = getattr(block, fused)
    bias = getattr(dense, "bias", None) is not None
    if len(parts) == 1 and not parts[0].dense:  # one fused projection, factorized whole (Phi-3)
        setattr(block, fused, LowRankColumn(parts[0], bias, quant_config, f"{prefix}.{fused}", fused=dense))
        moved[parts[0].path] = f"{prefix}.{fused}"
    elif not all(p.dense for p in parts):
        # each part's linears named as the checkpoint names them (p.path), which the quantization config's
        # ignore list speaks, though the module sits under the fused linear's name here
        setattr(block, fused, Concat({p.name: column(p, bias, quant_config, p.path) for p in parts}))
        moved.update({p.path: f"{prefix}.{fused}.{p.name}" for p in parts})
    for p in rows:
        if not p.dense:
            bias = getattr(getattr(block, p.name), "bias", None) is not None
            setattr(block, p.name, LowRankRow(p, bias, quant_config, f"{prefix}.{p.name}"))
            moved[p.path] = f"{prefix}.{p.name}"
    return moved


@contextlib.contextmanager
def layer_sizes(config: PretrainedConfig, layout: LayerLayout, expert_width_key: str) -> Iterator[None]:
    """`config` showing one layer's saved sizes while vLLM builds that layer (restored after)."""
    sizes = {
        "num_attention_heads": layout.num_heads,
        "num_key_value_heads": layout.num_kv_heads,
        "head_dim": layout.head_dim,
    }
    if layout.width is not None:
        sizes["intermediate_size"] = layout.width
    if layout.expert_width is not None:
        sizes[expert_width_key] = layout.expert_width
    missing = object()
    before = {k: getattr(config, k, missing) for k in sizes}
    for k, v in sizes.items():
        setattr(config, k, v)
    try:
        yield
    finally:
        for k, old in before.items():
            delattr(config, k) if old is missing else setattr(config, k, old)


def factorize_layer(
    layer: nn.Module, prefix: str, lay: LayerLayout, names: VllmNames, quant_config: QuantizationConfig | None
) -> dict[str, str]:
    """factorize() on one decoder layer's attention (`self_attn`) and dense MLP (`mlp`)."""
    attention = layer.get_submodule("self_attn")
    moved = factorize(attention, f"{prefix}.self_attn", names.qkv, lay.qkv, (lay.o,), quant_config)
    if lay.width is not None:  # a dense MLP (an MoE layer's experts stay as vLLM's FusedMoE builds them)
        mlp = layer.get_submodule("mlp")
        moved |= factorize(mlp, f"{prefix}.mlp", names.producers, lay.producers, lay.consumers, quant_config)
    return moved


@dataclass
class SizedLayers:
    """A family's decoder layers built at their saved sizes. vLLM's DeciModel hands each layer its own config; a
    family's decoder cannot, so this stands in for `make_layers` in its modules while gac's class is built."""

    layouts: list[LayerLayout]
    text_config: PretrainedConfig  # what vLLM's layers read their sizes from
    expert_width_key: str
    names: VllmNames
    quant_config: QuantizationConfig | None
    moved: dict[str, str] = field(default_factory=dict)  # HF module path -> vLLM module path, each factorized one
    prefixes: list[str] = field(default_factory=list)  # the make_layers calls that went through gac

    def wrap(self, original: MakeLayers) -> MakeLayers:
        """vLLM's `make_layers` (`original`), building each layer through self.layer."""
        return partial(self.make_layers, original)

    def make_layers(
        self, original: MakeLayers, num_hidden_layers: int, layer_fn: LayerFn, prefix: str
    ) -> tuple[int, int, nn.ModuleList]:
        self.prefixes.append(prefix)
        return original(num_hidden_layers, partial(self.layer, layer_fn), prefix)

    def layer(self, layer_fn: LayerFn, prefix: str) -> nn.Module:
        """The layer at `prefix`, built by the family's `layer_fn` at its saved sizes, then factorized."""
        lay = self.layouts[extract_layer_index(prefix)]
        with layer_sizes(self.text_config, lay, self.expert_width_key):
            layer = layer_fn(prefix=prefix)
        self.moved.update(factorize_layer(layer, prefix, lay, self.names, self.quant_config))
        return layer


if TYPE_CHECKING:

    class _FamilyCausalLM(nn.Module):
        """What the mixin needs of the family's vLLM causal LM it is mixed into."""

        def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None: ...
        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]: ...

else:
    _FamilyCausalLM = object


class GacCausalLM(_FamilyCausalLM):
    """Mixed into a family's vLLM causal LM (the class after it in the bases): builds it with every decoder layer at
    its saved sizes and factorizations, and loads the factorized projections under their HF names."""

    # vLLM's model class whose __init__ builds the decoder layers (the causal LM's `model`): each family names its own
    gac_decoder: ClassVar[type[nn.Module]]

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        config = vllm_config.model_config.hf_config
        adapter = adapter_for(config)
        layouts = layer_layouts(config)  # read once, handed to every layer
        check_tensor_parallel(layouts, get_tensor_model_parallel_world_size())
        layers = SizedLayers(
            layouts,
            vllm_config.model_config.hf_text_config,
            adapter.layout.expert_width,
            adapter.vllm_names(),
            vllm_config.quant_config,
        )
        modules = layer_builders(self.gac_decoder)
        with _patched(modules, "make_layers", layers.wrap):
            super().__init__(vllm_config=vllm_config, prefix=prefix)
        if not layers.prefixes:  # vLLM built the layers elsewhere
            raise GacError(
                f"vLLM built {type(self).__name__}'s decoder layers without the make_layers of "
                f"{', '.join(m.__name__ for m in modules)}, so not at their saved sizes: gac's vLLM plugin does not "
                "serve this vLLM version; serve the model with transformers (gac.load) instead"
            )
        self.gac_moved = layers.moved

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        loaded_by_family = set(super().load_weights(self._load_moved(weights, params, loaded)))  # consumes them all
        return loaded | loaded_by_family

    def _load_moved(
        self, weights: Iterable[tuple[str, torch.Tensor]], params: dict[str, nn.Parameter], loaded: set[str]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Loads the weights of the moved projections (their parameters added to `loaded`) and yields the rest,
        which the family's own loader takes."""
        for name, tensor in weights:
            key = self._moved_key(name)
            if key is None:
                yield name, tensor
                continue
            if key not in params:
                raise ValueError(
                    f"gac: the checkpoint's {name} has no parameter {key} in {type(self).__name__}: "
                    "the saved structure does not match the weights"
                )
            getattr(params[key], "weight_loader", default_weight_loader)(params[key], tensor)
            loaded.add(key)

    def _moved_key(self, name: str) -> str | None:
        """The vLLM parameter of HF weight `name` if its projection was moved (a pair's ...a.weight or ...b.bias),
        else None."""
        parts = name.split(".")
        for cut in range(len(parts) - 1, max(len(parts) - 4, 0), -1):
            module = ".".join(parts[:cut])
            if module in self.gac_moved:
                return ".".join([self.gac_moved[module], *parts[cut:]])
        return None


def layer_builders(decoder: type[nn.Module]) -> list[ModuleType]:
    """The vLLM modules whose `make_layers` builds `decoder`'s layers: those of the classes in its MRO that import it
    (Python looks the name up in the module of the __init__ that calls it: Qwen3's in qwen2, Mistral's in llama)."""
    modules = {sys.modules[c.__module__] for c in decoder.__mro__}
    found = [m for m in modules if m.__name__.startswith("vllm.model_executor.models.") and hasattr(m, "make_layers")]
    return sorted(found, key=lambda m: m.__name__)


@contextlib.contextmanager
def _patched(modules: list[ModuleType], attr: str, wrap: Callable[[MakeLayers], MakeLayers]) -> Iterator[None]:
    """`attr` of each of `modules` (a function they import by name) wrapped by `wrap` while gac's class is built; put
    back after. Only the family's own modules: another model's build in the process never sees gac's sizes."""
    originals = [getattr(m, attr) for m in modules]
    for m, original in zip(modules, originals):
        setattr(m, attr, wrap(original))
    try:
        yield
    finally:
        for m, original in zip(modules, originals):
            setattr(m, attr, original)


# One class a family: gac's mixin before vLLM's class for it (adapters.VLLM_FAMILIES names which), and the
# vLLM model class that builds its decoder layers (Phi-3's is Llama's)
class GacLlamaForCausalLM(GacCausalLM, LlamaForCausalLM):
    gac_decoder = LlamaModel


class GacMistralForCausalLM(GacCausalLM, MistralForCausalLM):
    gac_decoder = MistralModel


class GacQwen2ForCausalLM(GacCausalLM, Qwen2ForCausalLM):
    gac_decoder = Qwen2Model


class GacQwen3ForCausalLM(GacCausalLM, Qwen3ForCausalLM):
    gac_decoder = Qwen3Model


class GacGemma3ForCausalLM(GacCausalLM, Gemma3ForCausalLM):
    gac_decoder = Gemma3Model


class GacPhi3ForCausalLM(GacCausalLM, Phi3ForCausalLM):
    gac_decoder = LlamaModel


class GacQwen3MoeForCausalLM(GacCausalLM, Qwen3MoeForCausalLM):
    gac_decoder = Qwen3MoeModel


class GacMixtralForCausalLM(GacCausalLM, MixtralForCausalLM):
    gac_decoder = MixtralModel
