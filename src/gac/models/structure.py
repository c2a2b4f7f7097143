"""The saved structure (`config.gac_structure`): written here, read off the live model; read back on load by
modeling_gac.apply_gac_structure (self-contained, it travels with every saved model).

Keys: "linear" {name: [out, in]} for linears of a new shape, "attention" {block: {num_heads, num_kv_heads}},
"lowrank" {name: rank}, "grouped_lowrank" {name: [r_1, ..., r_G]}, "parameter" {name: shape} for fused expert
weights (and their biases) and per-head attention parameters (gpt-oss's sinks) of a new shape.
"""

from __future__ import annotations

import copy

from torch import nn

from gac.models.adapters import adapter_for, config_of
from gac.models.groups import is_grouped_lowrank, is_lowrank
from gac.models.modeling_gac import apply_gac_structure
from gac.models.surgery import linear_at

KEYS = ("linear", "attention", "lowrank", "grouped_lowrank", "parameter")
__all__ = ["KEYS", "apply_gac_structure", "structure_of"]


def structure_of(model: nn.Module) -> dict:
    """config.gac_structure for the live model, whatever changed it: every compressible linear whose [out, in]
    differs from the config's, the head counts of narrowed attention blocks, every rank. Entries the config
    already recorded for modules outside this scan are kept; the scanned ones are replaced, so none goes stale."""
    config = config_of(model)
    adapter = adapter_for(config)
    geo = adapter.geometry(config)
    hidden, inter = adapter.hidden_size(config), adapter.intermediate_size(config)
    q, kv = geo.num_heads * geo.head_dim, geo.num_kv_heads * geo.head_dim
    live: dict = {key: {} for key in KEYS}
    covered: dict[str, set[str]] = {"linear": set(), "attention": set(), "parameter": set()}
    for layer in adapter.layers(config):
        default = layer.shapes(hidden, q, kv, inter)
        for name, shape in default.items():
            m = linear_at(model, name)
            if (m.out_features, m.in_features) != shape:
                live["linear"][name] = [m.out_features, m.in_features]
        fused: dict[str, tuple[int, ...]] = {}
        if layer.experts:
            num_experts, expert_width, _ = adapter.expert_geometry(config)
            fused = layer.expert_shapes(hidden, num_experts, expert_width)
        fused |= {name: (geo.num_heads, *model.get_parameter(name).shape[1:]) for name in layer.head_parameters}
        for name, fused_shape in fused.items():
            if tuple(model.get_parameter(name).shape) != fused_shape:
                live["parameter"][name] = list(model.get_parameter(name).shape)
        covered["parameter"].update(fused)
        widths = tuple(linear_at(model, n).out_features for n in (layer.q, layer.k))
        if widths != (q, kv) and not layer.fused_qkv:  # a fused q/k/v keeps every head
            heads, kv_heads = (w // geo.head_dim for w in widths)
            live["attention"][layer.attention] = {"num_heads": heads, "num_kv_heads": kv_heads}
        covered["linear"].update(default)
        covered["attention"].add(layer.attention)
    modules = set()
    for name, m in model.named_modules():
        modules.add(name)
        if is_lowrank(m):
            live["lowrank"][name] = int(m.rank)
        elif is_grouped_lowrank(m):
            live["grouped_lowrank"][name] = [int(r) for r in m.ranks]
    covered["lowrank"] = covered["grouped_lowrank"] = modules
    merged = copy.deepcopy(getattr(config, "gac_structure", None) or {})  # unknown keys: kept, ignored on load
    for key, entries in live.items():
        kept = {n: v for n, v in merged.get(key, {}).items() if n not in covered[key]}
        merged[key] = {**kept, **entries}
        if not merged[key]:
            del merged[key]
    return merged
