"""gac's vLLM plugin (entry point `vllm.general_plugins`, loaded by vLLM in every process it starts): registers
gac's model types (gac_<family>) with transformers, through which vLLM reads config.json, so that no
trust_remote_code is needed; gac's model class under each architecture name gac writes (config.json's
`architectures`, e.g. GacLlamaForCausalLM), so vLLM builds a gac output with its own layers instead of the
Transformers backend; and a config check for those names that refuses, while vLLM builds its configuration and
before any engine process starts, a vLLM release outside the range the plugin serves and a tensor-parallel size the
saved sizes do not divide.

The refusals live in that check, not in register(): vLLM calls register() in every process it starts, whatever
model it serves, and an error there would stop it serving any model, as a traceback from inside vLLM (an engine
core or worker process, where one loads plugins first); the check runs for gac's outputs only, in the process that
builds the configuration, and its one-line GacError is what `LLM(...)` raises; uncaught (the OpenAI server), it
ends the process with that one line."""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import TYPE_CHECKING, cast

from gac.checkpoint.auto_classes import register_configs
from gac.errors import GacError
from gac.models.adapters import VLLM_FAMILIES
from gac.serve import vllm_engine
from gac.serve.layout import check_tensor_parallel, layer_layouts

if TYPE_CHECKING:
    from vllm.config import ModelConfig, VllmConfig
    from vllm.model_executor.models.config import VerifyAndUpdateConfig


def architectures() -> dict[str, str]:
    """{architecture name gac saves: gac's vLLM class for it} for every family the plugin serves; the class is
    named after the vLLM class it extends (GacLlamaForCausalLM extends vLLM's LlamaForCausalLM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return {
        f"Gac{MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t]}": f"gac.serve.vllm_model:Gac{names.model_class}"
        for t, names in VLLM_FAMILIES.items()
    }


class ConfigCheck:
    """vLLM's per-architecture configuration hook (the interface of vllm.model_executor.models.config), for gac's
    architecture names and for the family's own (vLLM's class would build a gac output at the original shapes)."""

    @staticmethod
    def verify_and_update_config(vllm_config: VllmConfig) -> None:
        config = vllm_config.model_config.hf_config
        if getattr(config, "gac_structure", None) is None:
            return  # not a gac output
        vllm_engine.check_version(vllm_engine.vllm_version())
        arch = vllm_config.model_config.architecture
        gac_arch = f"Gac{arch}"
        if gac_arch in architectures():  # saved before gac wrote its own name: the family's class
            raise GacError(
                f"{vllm_config.model_config.model} is a gac output saved under {arch}, which vLLM builds "
                f'at the original shapes: serve it with --hf-overrides \'{{"architectures": '
                f'["{gac_arch}"]}}\', or re-save it with `gac export DIR --format hf --out NEW`'
            )
        check_tensor_parallel(layer_layouts(config), vllm_config.parallel_config.tensor_parallel_size)
        vllm_engine.check_quantized_kernels(vllm_config.model_config.model, str(vllm_config.model_config.dtype))

    @staticmethod
    def verify_and_update_model_config(model_config: ModelConfig) -> None:
        return


def one_line_refusals() -> None:
    """An uncaught GacError (the config check's refusal) ends the process with its one `error:` line, as gac's CLI
    ends, instead of Python's traceback through vLLM's frames (the OpenAI server builds its configuration outside
    any handler); other exceptions go to the hook there was, as do all with GAC_TRACEBACK set."""
    previous = sys.excepthook
    if getattr(previous, "gac_one_line", False):
        return  # installed already: vLLM loads plugins once a process, tests call register() more often

    def hook(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
        if issubclass(kind, GacError) and not os.environ.get("GAC_TRACEBACK"):
            sys.stderr.write(f"error: {' '.join(str(value).split())}\n")
        else:
            previous(kind, value, traceback)

    hook.gac_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def register() -> None:
    from vllm import ModelRegistry

    register_configs()
    one_line_refusals()
    for arch, cls in architectures().items():
        ModelRegistry.register_model(arch, cls)
    try:  # vLLM's table of configuration hooks; without it, the model class refuses the same sizes later
        from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    except ImportError:
        return
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    families = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[t] for t in VLLM_FAMILIES]
    for arch in [*architectures(), *families]:
        # ConfigCheck is that hook by its interface: subclassing vLLM's would import vLLM with this module
        MODELS_CONFIG_MAP.setdefault(arch, cast("type[VerifyAndUpdateConfig]", ConfigCheck))
