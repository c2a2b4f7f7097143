"""Per-family adapters: the ONLY place projection names are spelled. A family maps to a block layout
(attention q/k/v/o, MLP producers/consumers); everything else asks the adapter or the dimension groups.

Adding a family whose modules are named differently: add a `Layout` (if new) and a line in FAMILIES, plus a
tiny-model test. modeling_gac.py builds its Gac*ForCausalLM class from the transformers class by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gac.errors import GacError

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class Layout:
    """Where a decoder layer's projections live, relative to `layers_path.{i}`."""

    attention: str = "self_attn"
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    mlp: str = "mlp"
    producers: tuple[str, ...] = ("gate_proj", "up_proj")  # read the hidden state, each [intermediate, hidden]
    producer_parts: int = 1  # row blocks per producer: 2 for a fused gate_up [2 x intermediate, hidden] (gate, up)
    consumers: tuple[str, ...] = ("down_proj",)  # read the intermediate channels, each [hidden, intermediate]
    layers_path: str = "model.layers"
    per_head_norm: str | None = "q_norm"  # a norm over each head's channels (qwen3): heads prunable if per head
    # mixture of experts: the MLP block's experts module (None: every layer dense), its fused 3D weights (transformers
    # 5's layout: gate_up [E, 2I, H], gate rows then up rows; down [E, H, I]), the config's keys for the expert count
    # and the expert width, and the per-expert checkpoint names the fused weights are made of (gate, up, down; None:
    # checkpoints store the fused weights as they are, as transformers saves gpt-oss)
    experts: str | None = None
    expert_weights: tuple[str, str] = ("gate_up_proj", "down_proj")
    expert_count: str = "num_experts"
    expert_width: str = "moe_intermediate_size"
    expert_checkpoint: tuple[str, str, str] | None = ("gate_proj", "up_proj", "down_proj")  # {block}.experts.{e}.{name}
    checkpoint_mlp: str = "mlp"  # the MLP block's name in per-expert checkpoints
    expert_transposed: bool = False  # fused weights stored [E, in, out]: gate_up [E, H, 2I], down [E, I, H] (gpt-oss)
    expert_interleaved: bool = False  # gate and up alternate along gate_up's channels (gate [..., ::2], up [..., 1::2])
    expert_biases: tuple[str, str] | None = None  # the fused weights' biases: gate_up's [E, 2I], down's [E, H]
    head_parameters: tuple[str, ...] = ()  # attention parameters with one entry per query head (gpt-oss's sinks)
    router: str = "gate"  # the MLP block's router (weight [E, H], a bias [E] if any): one row per expert

    @property
    def attention_projections(self) -> tuple[str, str, str, str]:
        return self.q, self.k, self.v, self.o


LLAMA = Layout()
PHI = Layout(o="dense", producers=("fc1",), consumers=("fc2",), per_head_norm="q_layernorm")  # ungated MLP
# fused projections (Phi-3, Phi-4-mini): q, k and v are rows of one qkv_proj, gate and up the two halves of gate_up_proj
PHI3 = Layout(
    q="qkv_proj", k="qkv_proj", v="qkv_proj", producers=("gate_up_proj",), producer_parts=2, per_head_norm=None
)
GEMMA3 = Layout(layers_path="model.language_model.layers")  # a multimodal checkpoint's language model (text_config)
QWEN3_MOE = Layout(experts="experts")  # sparse layers' MLP is experts + router; mlp_only_layers keep a dense MLP
MIXTRAL = Layout(
    experts="experts",
    expert_count="num_local_experts",
    expert_width="intermediate_size",
    expert_checkpoint=("w1", "w3", "w2"),
    checkpoint_mlp="block_sparse_moe",
    per_head_norm=None,
)
# gpt-oss: experts [E, in, out] with gate and up interleaved and biased, saved fused; per-head attention sinks
GPT_OSS = Layout(
    experts="experts",
    expert_count="num_local_experts",
    expert_width="intermediate_size",
    expert_checkpoint=None,
    expert_transposed=True,
    expert_interleaved=True,
    expert_biases=("gate_up_proj_bias", "down_proj_bias"),
    per_head_norm=None,
    head_parameters=("sinks",),
    router="router",
)
OLMOE = Layout(experts="experts", expert_width="intermediate_size")  # its q norm spans all heads: MLP only


@dataclass(frozen=True)
class GgufNames:
    """llama.cpp's side of a family, what `gac export` writes: the architecture description it runs as
    (gac.export.gguf_arch.ARCHS) and its tensor names. q..consumers pair with the Layout field of the same name
    (producers and consumers in the Layout's order); layer_norms are relative to the decoder layer, `model` to the
    decoder (the parent of the Layout's layers_path: `model`, or a multimodal checkpoint's `model.language_model`),
    `head` to the whole model."""

    arch: str = "llama"
    q: str = "attn_q"
    k: str = "attn_k"
    v: str = "attn_v"
    o: str = "attn_output"
    producers: tuple[str, ...] = ("ffn_gate", "ffn_up")
    consumers: tuple[str, ...] = ("ffn_down",)
    layer_norms: tuple[tuple[str, str], ...] = (
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
    )
    model: tuple[tuple[str, str], ...] = (("embed_tokens", "token_embd"), ("norm", "output_norm"))
    head: tuple[tuple[str, str], ...] = (("lm_head", "output"),)


# Gemma 3 norms its attention output and its MLP input and output apart (sandwich norms), and q/k per head; llama.cpp
# calls the pre-MLP norm ffn_norm, as llama's post-attention one
GEMMA3_GGUF = GgufNames(
    arch="gemma3",
    layer_norms=(
        ("input_layernorm", "attn_norm"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("post_attention_layernorm", "post_attention_norm"),
        ("pre_feedforward_layernorm", "ffn_norm"),
        ("post_feedforward_layernorm", "post_ffw_norm"),
    ),
)

# model_type -> llama.cpp's architecture and names: llama and mistral run as `llama` (`deci` when layers differ),
# Gemma 3 as `gemma3` (a multimodal checkpoint: its language model, as llama.cpp's converter writes it)
GGUF_FAMILIES = {"llama": GgufNames(), "mistral": GgufNames(), "gemma3_text": GEMMA3_GGUF, "gemma3": GEMMA3_GGUF}


@dataclass(frozen=True)
class VllmNames:
    """vLLM's side of a layout: the vLLM model class gac's plugin builds on, and the fused linears that class makes
    of the q/k/v projections and of the MLP producers (loaded from the separate HF weights by shard)."""

    model_class: str = "LlamaForCausalLM"
    qkv: str = "qkv_proj"
    producers: str = "gate_up_proj"


# model_type -> vLLM's names, for the families gac's vLLM plugin serves (gac.serve.vllm_model has a Gac<model_class>)
VLLM_FAMILIES = {
    "llama": VllmNames(),
    "mistral": VllmNames("MistralForCausalLM"),
    "qwen2": VllmNames("Qwen2ForCausalLM"),
    "qwen3": VllmNames("Qwen3ForCausalLM"),
    "gemma3_text": VllmNames("Gemma3ForCausalLM"),
    "phi3": VllmNames("Phi3ForCausalLM"),
    "qwen3_moe": VllmNames("Qwen3MoeForCausalLM"),
    "mixtral": VllmNames("MixtralForCausalLM"),
}

# model_type -> layout. Each needs a transformers `<Name>ForCausalLM` (see modeling_gac.py).
FAMILIES = {
    "llama": LLAMA,
    "qwen2": LLAMA,
    "qwen3": LLAMA,
    "mistral": LLAMA,
    "granite": LLAMA,
    "olmo2": LLAMA,
    "phi": PHI,
    "qwen3_moe": QWEN3_MOE,
    "mixtral": MIXTRAL,
    "gpt_oss": GPT_OSS,
    "olmoe": OLMOE,
    "gemma3_text": LLAMA,
    "gemma3": GEMMA3,
    "phi3": PHI3,
}


@dataclass(frozen=True)
class AttentionGeometry:
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads


@dataclass(frozen=True)
class LayerModules:
    """Fully qualified module names of one decoder layer."""

    index: int
    attention: str
    q: str
    k: str
    v: str
    o: str
    mlp: str
    producers: tuple[str, ...]
    consumers: tuple[str, ...]
    experts: str | None = None  # an MoE layer's experts module (producers and consumers are then empty)
    expert_weights: tuple[str, ...] = ()  # its fused weights: (gate_up [E, 2I, H], down [E, H, I]) parameter names
    producer_parts: int = 1  # row blocks of each producer (2: a fused gate_up)
    expert_biases: tuple[str, ...] = ()  # the fused weights' biases (gate_up's [E, 2I], down's [E, H]) if any
    expert_transposed: bool = False  # the fused weights stored [E, in, out] (Layout.expert_transposed)
    expert_interleaved: bool = False  # gate and up alternate along gate_up's channels (Layout.expert_interleaved)
    head_parameters: tuple[str, ...] = ()  # the attention's parameters with one entry per query head (sinks)
    router: str | None = None  # an MoE layer's router module (one row per expert)

    @property
    def linears(self) -> list[str]:
        """Every linear, each once (a fused qkv_proj is q, k and v)."""
        return list(dict.fromkeys([self.q, self.k, self.v, self.o, *self.producers, *self.consumers]))

    @property
    def fused_qkv(self) -> bool:
        """q, k and v are rows of one linear (Phi-3's qkv_proj)."""
        return self.q == self.k == self.v

    @property
    def weights(self) -> list[str]:
        """Every weight a group of this layer may name: its linears and its fused expert parameters."""
        return [*self.linears, *self.expert_weights]

    def expert_shapes(self, hidden: int, num_experts: int, width: int) -> dict[str, tuple[int, ...]]:
        """{fused expert weight or bias: shape} at expert width `width` (nothing for a dense layer)."""
        if not self.expert_weights:
            return {}
        gate_up, down = self.expert_weights
        shapes: dict[str, tuple[int, ...]] = (
            {gate_up: (num_experts, hidden, 2 * width), down: (num_experts, width, hidden)}
            if self.expert_transposed
            else {gate_up: (num_experts, 2 * width, hidden), down: (num_experts, hidden, width)}
        )
        if self.expert_biases:
            gate_up_bias, down_bias = self.expert_biases
            shapes |= {gate_up_bias: (num_experts, 2 * width), down_bias: (num_experts, hidden)}
        return shapes

    def shapes(self, hidden: int, q_width: int, kv_width: int, mlp_width: int) -> dict[str, tuple[int, int]]:
        """{linear: (out_features, in_features)} of every dense projection at these widths."""
        qkv = (
            {self.q: (q_width + 2 * kv_width, hidden)}
            if self.fused_qkv
            else {self.q: (q_width, hidden), self.k: (kv_width, hidden), self.v: (kv_width, hidden)}
        )
        producers = dict.fromkeys(self.producers, (self.producer_parts * mlp_width, hidden))
        return {**qkv, self.o: (hidden, q_width), **producers, **dict.fromkeys(self.consumers, (hidden, mlp_width))}


@dataclass(frozen=True)
class Adapter:
    """One family's layout, read against a config."""

    model_type: str
    layout: Layout

    def layer_count(self, config: PretrainedConfig) -> int:
        return text_config(config).num_hidden_layers

    def layer(self, config: PretrainedConfig, i: int) -> LayerModules:
        lay = self.layout
        prefix = self.layer_prefix(i)
        attn, mlp = f"{prefix}.{lay.attention}", f"{prefix}.{lay.mlp}"
        q, k, v, o = (f"{attn}.{p}" for p in lay.attention_projections)
        head_parameters = tuple(f"{attn}.{p}" for p in lay.head_parameters)
        if self.is_moe_layer(config, i):
            experts = f"{mlp}.{lay.experts}"
            return LayerModules(
                i,
                attn,
                q,
                k,
                v,
                o,
                mlp,
                (),
                (),
                experts,
                tuple(f"{experts}.{w}" for w in lay.expert_weights),
                expert_biases=tuple(f"{experts}.{b}" for b in lay.expert_biases or ()),
                expert_transposed=lay.expert_transposed,
                expert_interleaved=lay.expert_interleaved,
                router=f"{mlp}.{lay.router}",
                head_parameters=head_parameters,
            )
        return LayerModules(
            i,
            attn,
            q,
            k,
            v,
            o,
            mlp,
            tuple(f"{mlp}.{p}" for p in lay.producers),
            tuple(f"{mlp}.{p}" for p in lay.consumers),
            producer_parts=lay.producer_parts,
            head_parameters=head_parameters,
        )

    def is_moe_layer(self, config: PretrainedConfig, i: int) -> bool:
        """Whether decoder layer i's MLP is a mixture of experts (Qwen3-MoE keeps `mlp_only_layers` dense and makes
        every `decoder_sparse_step`-th layer sparse; Mixtral's are all sparse)."""
        config = text_config(config)
        if self.layout.experts is None or not getattr(config, self.layout.expert_count, 0):
            return False
        step = getattr(config, "decoder_sparse_step", 1) or 1
        return i not in (getattr(config, "mlp_only_layers", None) or ()) and (i + 1) % step == 0

    def expert_geometry(self, config: PretrainedConfig) -> tuple[int, int, int]:
        """(experts per MoE layer, expert width, experts routed per token)."""
        config = text_config(config)
        return (
            getattr(config, self.layout.expert_count),
            getattr(config, self.layout.expert_width),
            config.num_experts_per_tok,
        )

    def model_name(self, checkpoint_name: str) -> str:
        """The model's name for a checkpoint tensor (Mixtral's checkpoints call the MLP block block_sparse_moe)."""
        lay = self.layout
        if lay.checkpoint_mlp == lay.mlp:
            return checkpoint_name
        return checkpoint_name.replace(f".{lay.checkpoint_mlp}.", f".{lay.mlp}.")

    def expert_checkpoint_names(self, layer: LayerModules, num_experts: int) -> dict[str, list[tuple[str, ...]]]:
        """{fused expert weight: per expert the checkpoint tensors it is made of} for an MoE layer: gate_up from
        each expert's (gate, up), down from its (down,), as Hugging Face checkpoints store them per expert; nothing
        for a family whose checkpoints store the fused weights themselves (gpt-oss)."""
        lay = self.layout
        if lay.expert_checkpoint is None:
            return {}
        gate, up, down = lay.expert_checkpoint
        gate_up, fused_down = layer.expert_weights
        each = [f"{self.layer_prefix(layer.index)}.{lay.checkpoint_mlp}.{lay.experts}.{e}" for e in range(num_experts)]
        return {
            gate_up: [(f"{x}.{gate}.weight", f"{x}.{up}.weight") for x in each],
            fused_down: [(f"{x}.{down}.weight",) for x in each],
        }

    def layer_prefix(self, i: int) -> str:
        """The module path of decoder layer i, e.g. model.layers.3."""
        return f"{self.layout.layers_path}.{i}"

    @property
    def layers_path(self) -> str:
        """The module path of the ModuleList of decoder layers."""
        return self.layout.layers_path

    def layers(self, config: PretrainedConfig) -> list[LayerModules]:
        return [self.layer(config, i) for i in range(self.layer_count(config))]

    def linear_names(self, config: PretrainedConfig) -> list[str]:
        """Fully qualified names of every compressible weight (not embeddings, not lm_head), in layer order: the
        linears, and an MoE layer's fused expert weights."""
        return [n for layer in self.layers(config) for n in layer.weights]

    def geometry(self, config: PretrainedConfig) -> AttentionGeometry:
        return attention_geometry(config)

    def hidden_size(self, config: PretrainedConfig) -> int:
        return text_config(config).hidden_size

    def intermediate_size(self, config: PretrainedConfig) -> int:
        return text_config(config).intermediate_size

    def vocab_size(self, config: PretrainedConfig) -> int:
        return text_config(config).vocab_size

    def gguf_family(self) -> GgufNames:
        """llama.cpp's architecture and names for this family; a family llama.cpp cannot run is one line."""
        names = GGUF_FAMILIES.get(self.model_type)
        if names is None:
            raise GacError(
                f"GGUF export supports the {', '.join(GGUF_FAMILIES)} families, not {self.model_type!r}: "
                "serve this model with transformers (gac.load) instead"
            )
        return names

    def gguf_names(self, config: PretrainedConfig) -> dict[str, str]:
        """{module name: GGUF tensor prefix} for every weight-bearing module (`.weight` follows both), e.g.
        the first layer's q projection -> "blk.0.attn_q". A family llama.cpp cannot run is one line."""
        names = self.gguf_family()
        decoder = self.layers_path.rpartition(".")[0]
        out = {f"{decoder}.{hf}": gg for hf, gg in names.model} | dict(names.head)
        for layer in self.layers(config):
            blk = f"blk.{layer.index}"
            pairs = [
                (layer.q, names.q),
                (layer.k, names.k),
                (layer.v, names.v),
                (layer.o, names.o),
                *zip(layer.producers, names.producers, strict=True),
                *zip(layer.consumers, names.consumers, strict=True),
            ]
            prefix = self.layer_prefix(layer.index)
            pairs += [(f"{prefix}.{hf}", gg) for hf, gg in names.layer_norms]
            out.update({hf: f"{blk}.{gg}" for hf, gg in pairs})
        return out

    def vllm_names(self) -> VllmNames:
        """vLLM's names for this family; a family gac's vLLM plugin does not serve is one line."""
        names = VLLM_FAMILIES.get(self.model_type)
        if names is None:
            raise GacError(
                f"gac's vLLM plugin serves the {', '.join(VLLM_FAMILIES)} families, not {self.model_type!r}: "
                "serve this model with transformers (gac.load, lm-eval's hf backend) instead"
            )
        return names

    def per_head_norm(self, attention_module: nn.Module) -> nn.Module | None:
        """The attention's query norm module, if the family has one (None otherwise)."""
        name = self.layout.per_head_norm
        return getattr(attention_module, name, None) if name else None


def config_of(model: nn.Module) -> PretrainedConfig:
    """A transformers model's config: what every question about its geometry reads."""
    config: PretrainedConfig | None = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"{type(model).__name__} has no transformers config to read its layers from")
    return config


def text_config(config: PretrainedConfig) -> PretrainedConfig:
    """The language model's config: a multimodal checkpoint's text_config (Gemma 3), else the config itself."""
    get = getattr(config, "get_text_config", None)
    return get() if get is not None else config


def attention_geometry(config: PretrainedConfig) -> AttentionGeometry:
    """Head counts and head_dim from a config (KV heads default to the query heads)."""
    config = text_config(config)
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return AttentionGeometry(heads, kv, head_dim)


def adapter_for(config: PretrainedConfig) -> Adapter:
    """The family's adapter; a gac output's model type (gac_<family>) reads as its family."""
    # lazy: `import gac` reads FAMILIES (gac.checkpoint.auto_classes), and modeling_gac imports torch
    from gac.models.modeling_gac import family_of

    model_type = getattr(config, "model_type", None)
    model_type = family_of(model_type) if isinstance(model_type, str) else model_type
    if model_type not in FAMILIES:
        raise GacError(
            f"unsupported architecture {model_type!r}: gac supports {', '.join(FAMILIES)}; "
            f"pass a model of one of these families"
        )
    return Adapter(model_type, FAMILIES[model_type])
