"""gac's vLLM plugin (entry point `vllm.general_plugins`, loaded by vLLM in every process it starts): registers
gac's model class under each architecture name gac writes (config.json's `architectures`, e.g.
GacLlamaForCausalLM), so vLLM builds a gac output with its own layers instead of the Transformers backend."""

from __future__ import annotations

from gac.models.adapters import VLLM_FAMILIES


def architectures() -> dict[str, str]:
    """{architecture name gac saves: gac's vLLM class for it} for every family the plugin serves; the class is
    named after the vLLM class it extends (GacLlamaForCausalLM extends vLLM's LlamaForCausalLM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return {f"Gac{MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t]}": f"gac.serve.vllm_model:Gac{names.model_class}"
            for t, names in VLLM_FAMILIES.items()}


def register() -> None:
    from vllm import ModelRegistry

    for arch, cls in architectures().items():
        ModelRegistry.register_model(arch, cls)
