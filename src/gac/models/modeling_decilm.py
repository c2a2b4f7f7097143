"""DeciLM (Nemotron-NAS) model code that gac writes beside a pruned Llama-layout model (`gac export --format deci`),
so that `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` builds it at each layer's sizes.

Self-contained on purpose: it imports torch and transformers only, never gac (its configuration is the file beside
it). The model is transformers' Llama with each decoder layer built by transformers' own LlamaDecoderLayer at that
layer's MLP width and KV heads (`config.block_configs`): Llama's layers copy their sizes from the config when built,
so each is built while the config shows its sizes, and keeps the model's config (a later change of attention
implementation reaches every layer). Weights keep Llama's names.
"""

import contextlib
from collections.abc import Iterator

from transformers import LlamaForCausalLM, LlamaModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from .configuration_decilm import DeciLMConfig


@contextlib.contextmanager
def _showing(config: DeciLMConfig, **sizes: int) -> Iterator[None]:
    """`config` with `sizes` in place of its own while the block runs."""
    saved = {name: getattr(config, name) for name in sizes}
    for name, value in sizes.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


class DeciLMModel(LlamaModel):
    """The decoder: Llama's embeddings, norm and rotary embedding, then one Llama layer per block at its sizes."""

    config_class = DeciLMConfig

    def __init__(self, config: DeciLMConfig):
        blocks = config.block_configs or []
        if len(blocks) != config.num_hidden_layers or not all(b.plain() for b in blocks):
            raise ValueError(
                "this DeciLM code builds a block (attention and MLP, neither no_op nor replace_with_linear) for "
                "every layer: config.json's block_configs do not give one"
            )
        with _showing(config, num_hidden_layers=0):
            super().__init__(config)  # everything but the layers
        for index, block in enumerate(blocks):
            width = block.mlp_width(config.hidden_size)
            kv_heads = block.kv_heads(config.num_attention_heads)
            with _showing(config, intermediate_size=width, num_key_value_heads=kv_heads):
                self.layers.append(LlamaDecoderLayer(config, index))
        self.post_init()


class DeciLMForCausalLM(LlamaForCausalLM):
    """Llama's causal LM (output head, generation, tied embeddings) over DeciLMModel."""

    config_class = DeciLMConfig

    def __init__(self, config: DeciLMConfig):
        with _showing(config, num_hidden_layers=0):
            super().__init__(config)  # the head; its decoder is replaced below
        self.model = DeciLMModel(config)
        self.post_init()


__all__ = ["DeciLMForCausalLM", "DeciLMModel"]
