"""Per-family adapters: which linears a compressor may touch and the attention geometry, by model_type."""

from __future__ import annotations

from dataclasses import dataclass

from gac.errors import GacError

# Families whose decoder layers use the Llama projection layout:
# layers[i].self_attn.{q,k,v,o}_proj and layers[i].mlp.{gate,up,down}_proj.
LLAMA_LAYOUT = ("llama", "qwen2", "qwen3", "mistral", "granite", "olmo2")
ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJ = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AttentionGeometry:
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads


def attention_geometry(config) -> AttentionGeometry:
    """Head counts and head_dim from a Llama-layout config (KV heads default to the query heads)."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return AttentionGeometry(heads, kv, head_dim)


@dataclass(frozen=True)
class Adapter:
    """Names the compressible linears of one model family."""

    model_type: str
    layers_path: str = "model.layers"

    def layer_count(self, config) -> int:
        return config.num_hidden_layers

    def linear_names(self, config) -> list[str]:
        """Fully qualified names of every compressible linear (not embeddings, not lm_head), in layer order."""
        names = []
        for i in range(self.layer_count(config)):
            names += [f"{self.layers_path}.{i}.self_attn.{p}" for p in ATTN_PROJ]
            names += [f"{self.layers_path}.{i}.mlp.{p}" for p in MLP_PROJ]
        return names

    def geometry(self, config) -> AttentionGeometry:
        return attention_geometry(config)


def adapter_for(config) -> Adapter:
    model_type = getattr(config, "model_type", None)
    if model_type not in LLAMA_LAYOUT:
        raise GacError(
            f"unsupported architecture {model_type!r}: gac supports the Llama projection layout "
            f"({', '.join(LLAMA_LAYOUT)}); pass a model of one of these families"
        )
    return Adapter(model_type)
