"""The llama.cpp architectures `gac export` writes, each as llama.cpp's loader and graph read it: its name, how its
weights are stored, what it cannot hold (one line, before anything is written) and its metadata."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gac.errors import ConfigError, GacError, literal

if TYPE_CHECKING:
    from gguf import GGUFWriter
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class Geometry:
    """What llama.cpp must know per layer, read off the live model (not the config, which keeps the originals)."""

    hidden: int
    head_dim: int
    ff: tuple[int, ...]  # MLP width per layer
    heads: tuple[int, ...]  # query heads per layer
    kv_heads: tuple[int, ...]
    original_ff: int  # the unmodified model's, to tell a pruned width from the model's own
    original_heads: int
    arch: str = ""  # the llama.cpp architecture written (gac.export.gguf_arch)
    model_ff: tuple[int, ...] = ()  # the model's own MLP widths where ff zero-pads them (pad_mlp); else empty

    @property
    def uniform(self) -> bool:
        return len(set(self.ff)) == 1 and len(set(self.heads)) == 1 and len(set(self.kv_heads)) == 1

    def original_row_length(self, tensor: str) -> int:
        """Row length (ggml ne0, a linear's in_features) of `tensor` in the unmodified model."""
        if tensor.endswith("ffn_down.weight"):
            return self.original_ff
        if tensor.endswith("attn_output.weight"):
            return self.original_heads * self.head_dim
        return self.hidden


class Arch(Protocol):
    """A llama.cpp architecture as `gac export` writes it."""

    norm_shift: float  # added to every RMSNorm weight
    permute_qk: bool  # q/k rows permuted from HF's rotate-half to llama.cpp's interleaved pairs
    one_mlp_width: bool  # every layer read at one MLP width

    def name(self, geo: Geometry) -> str: ...
    def check(self, config: PretrainedConfig, geo: Geometry) -> None: ...
    def add_metadata(self, w: GGUFWriter, config: PretrainedConfig, geo: Geometry) -> None: ...


def rope_of(config: PretrainedConfig) -> dict:
    """The rope parameters of a (text) config: transformers 5's rope_parameters, else rope_scaling."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rope)


def _theta(rope: dict, config: PretrainedConfig) -> float:
    return float(rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def _per_layer(values: tuple[int, ...], uniform: bool) -> int | list[int]:
    return values[0] if uniform else list(values)


def _add_shape(w: GGUFWriter, config: PretrainedConfig, geo: Geometry, *, uniform: bool) -> None:
    """What every architecture reads: widths, head counts (a scalar, or one value per layer), head size, norm eps."""
    w.add_context_length(int(config.max_position_embeddings))
    w.add_embedding_length(geo.hidden)
    w.add_block_count(len(geo.ff))
    w.add_feed_forward_length(_per_layer(geo.ff, uniform))
    w.add_head_count(_per_layer(geo.heads, uniform))
    w.add_head_count_kv(_per_layer(geo.kv_heads, uniform))
    w.add_key_length(geo.head_dim)
    w.add_value_length(geo.head_dim)
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    w.add_vocab_size(int(config.vocab_size))


class LlamaArch:
    """llama.cpp's `llama` graph when every layer has the same geometry, `deci` (its DeciLM / Nemotron-NAS graph,
    which reads the MLP width and head counts per layer) when pruning left layers of different widths."""

    norm_shift = 0.0  # llama's RMSNorm multiplies by w, as llama.cpp does
    permute_qk = True  # llama.cpp's llama rope rotates interleaved pairs, HF's the two halves of each head
    one_mlp_width = False  # deci holds a width per layer

    def name(self, geo: Geometry) -> str:
        return "llama" if geo.uniform else "deci"

    def check(self, config: PretrainedConfig, geo: Geometry) -> None:
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            raise GacError("GGUF export handles bias-free llama-layout models only: this one has projection biases")
        rope = rope_of(config)
        if rope.get("rope_type", "default") not in ("default", None):
            raise GacError(
                f"GGUF export handles the default rope only, not {rope.get('rope_type')!r}: "
                "convert this model with llama.cpp's convert_hf_to_gguf.py"
            )

    def add_metadata(self, w: GGUFWriter, config: PretrainedConfig, geo: Geometry) -> None:
        _add_shape(w, config, geo, uniform=geo.uniform)
        w.add_rope_dimension_count(geo.head_dim)
        w.add_rope_freq_base(_theta(rope_of(config), config))


class Gemma3Arch:
    """llama.cpp's `gemma3` graph: sandwich norms, per-head q/k norms, neox rope with a base for the global layers
    and one for the sliding-window layers, the embedding scaled by sqrt(hidden) in the graph itself. Its loader makes
    every layer's tensors at the first layer's MLP width and head counts (a per-layer feed_forward_length array is
    read, then refused by the tensor shapes), so a pruned model needs one of each: widths can be zero-padded."""

    norm_shift = 1.0  # Gemma's RMSNorm multiplies by (1 + w); llama.cpp's by w, so its converter stores w + 1
    permute_qk = False  # gemma3 uses neox rope in llama.cpp: HF's rotate-half layout as it is
    one_mlp_width = True

    def name(self, geo: Geometry) -> str:
        return "gemma3"

    def check(self, config: PretrainedConfig, geo: Geometry) -> None:
        fix = "serve this model with transformers (gac.load)"
        if len(set(geo.heads)) > 1 or len(set(geo.kv_heads)) > 1:
            raise ConfigError(
                f"llama.cpp's gemma3 graph needs the same head counts in every layer, but pruning left "
                f"{literal(sorted(set(zip(geo.heads, geo.kv_heads))))} (query, KV) heads: compress with "
                f"{{head_mode:none}} (MLP channels only) or {fix}"
            )
        if getattr(config, "attention_bias", False):
            raise GacError(f"llama.cpp's gemma3 graph has no projection biases, and this model has them: {fix}")
        act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
        if act != "gelu_pytorch_tanh":
            raise GacError(f"llama.cpp's gemma3 graph runs the tanh GELU, not this model's {act!r}: {fix}")
        for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
            if getattr(config, cap, None):
                raise GacError(
                    f"llama.cpp's gemma3 graph has no {cap.replace('_', ' ')} ({getattr(config, cap)}): {fix}"
                )
        if "sliding_attention" not in config.layer_types:  # llama.cpp aborts the process on such a file
            raise GacError(
                f"llama.cpp's gemma3 graph needs at least one sliding-window layer, and this model has none: {fix}"
            )
        if getattr(config, "use_bidirectional_attention", False):
            raise GacError(f"this Gemma 3 attends both ways (an embedding model), llama.cpp's gemma3 causally: {fix}")
        want = float(config.query_pre_attn_scalar) ** -0.5
        got = self._attention_scale(geo)
        if not math.isclose(want, got, rel_tol=1e-6):
            raise GacError(
                f"llama.cpp's gemma3 graph scales queries by {got:.6g}, this model by "
                f"query_pre_attn_scalar ** -0.5 = {want:.6g}: {fix}"
            )
        for kind, rope in self._ropes(config).items():
            allowed = ("default", "linear") if kind == "full_attention" else ("default",)
            if rope.get("rope_type", "default") not in allowed:
                raise GacError(
                    f"llama.cpp's gemma3 graph runs {' or '.join(allowed)} rope on {kind} layers, not "
                    f"{rope.get('rope_type')!r}: {fix}"
                )

    @staticmethod
    def _attention_scale(geo: Geometry) -> float:
        # llama.cpp's loader: 1/sqrt(head_dim), but 1/sqrt(hidden / heads) when the model has 62 layers (the 27B)
        return (geo.hidden / geo.heads[0]) ** -0.5 if len(geo.ff) == 62 else geo.head_dim**-0.5

    @staticmethod
    def _ropes(config: PretrainedConfig) -> dict[str, dict]:
        """{layer type: rope parameters}: transformers 5 keeps one per layer type; older configs one rope_theta
        (global layers) beside rope_local_base_freq (sliding-window layers)."""
        rope = rope_of(config)
        if "full_attention" in rope:
            return {k: dict(v) for k, v in rope.items()}
        local = {"rope_type": "default", "rope_theta": getattr(config, "rope_local_base_freq", 10000.0)}
        return {"full_attention": rope | {"rope_theta": _theta(rope, config)}, "sliding_attention": local}

    def add_metadata(self, w: GGUFWriter, config: PretrainedConfig, geo: Geometry) -> None:
        import gguf

        _add_shape(w, config, geo, uniform=True)  # one width and head count (check, padding)
        ropes = self._ropes(config)
        full = ropes["full_attention"]
        w.add_rope_freq_base(_theta(full, config))
        w.add_rope_freq_base_swa(_theta(ropes["sliding_attention"], config))
        if full.get("rope_type") == "linear":  # llama.cpp scales the global layers' positions only, as HF
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(full["factor"]))
        # the layer pattern as the config gives it (llama.cpp's default is every sixth layer global)
        types = list(config.layer_types)
        w.add_sliding_window(int(config.sliding_window))
        w.add_sliding_window_pattern([t == "sliding_attention" for t in types])


# GgufNames.arch -> the architecture's description
ARCHS: dict[str, Arch] = {"llama": LlamaArch(), "gemma3": Gemma3Arch()}
