"""Write a model of a llama-layout family as an f16 GGUF that llama.cpp runs: architecture `llama` when every layer
has the same geometry, `deci` (llama.cpp's DeciLM / Nemotron-NAS graph, per-layer feed-forward length and head
counts) when pruning left layers of different widths. Tensor names come from the family adapter."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gac.errors import GacError

log = logging.getLogger(__name__)


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

    @property
    def uniform(self) -> bool:
        return len(set(self.ff)) == 1 and len(set(self.heads)) == 1 and len(set(self.kv_heads)) == 1

    @property
    def arch(self) -> str:
        return "llama" if self.uniform else "deci"

    def original_row_length(self, tensor: str) -> int:
        """Row length (ggml ne0, a linear's in_features) of `tensor` in the unmodified model."""
        if tensor.endswith("ffn_down.weight"):
            return self.original_ff
        if tensor.endswith("attn_output.weight"):
            return self.original_heads * self.head_dim
        return self.hidden


def check_exportable(model) -> None:
    """One line for what llama.cpp cannot run: factorized (low-rank) projections, biases, other rope types."""
    from gac.models.adapters import adapter_for
    from gac.models.groups import is_grouped_lowrank, is_lowrank

    config = model.config
    adapter = adapter_for(config)
    adapter.gguf_names(config)  # a family llama.cpp runs, or one line
    if any(is_lowrank(m) or is_grouped_lowrank(m) for m in model.modules()):
        raise GacError("this model has low-rank (factorized) projections, which no llama.cpp architecture can "
                       "represent: export a pruned model (`gac compress --compressor prune`) or serve this one "
                       "with transformers (gac.load)")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise GacError("GGUF export handles bias-free llama-layout models only: this one has projection biases")
    rope = _rope(config)
    if rope.get("rope_type", "default") not in ("default", None):
        raise GacError(f"GGUF export handles the default rope only, not {rope.get('rope_type')!r}: "
                       "convert this model with llama.cpp's convert_hf_to_gguf.py")


def geometry(model) -> Geometry:
    from gac.models.adapters import adapter_for
    from gac.models.groups import groups_of

    config = model.config
    adapter = adapter_for(config)
    geo = adapter.geometry(config)
    widths = [g.dim for g in groups_of(model, "mlp")]
    heads = groups_of(model, "heads")
    return Geometry(adapter.hidden_size(config), geo.head_dim, tuple(widths), tuple(h.live_heads for h in heads),
                    tuple(h.live_kv_heads for h in heads), adapter.intermediate_size(config),
                    geo.num_heads)


def _rope(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(rope)


def _rope_theta(config) -> float:
    return float(_rope(config).get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half q/k rows [n_head * hd, in] -> llama.cpp's interleaved pairs (convert_hf_to_gguf's permute)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensors(model, geo: Geometry) -> dict[str, np.ndarray]:
    """{GGUF tensor name: array [out, in] (f16) or [n] (norms, f32)}, q/k rows permuted for llama.cpp's rope."""
    from gac.models.adapters import adapter_for

    config = model.config
    adapter = adapter_for(config)
    names = adapter.gguf_names(config)
    rotary = {}
    for layer in adapter.layers(config):
        rotary[layer.q] = geo.heads[layer.index]
        rotary[layer.k] = geo.kv_heads[layer.index]
    tied = getattr(config, "tie_word_embeddings", False)
    out = {}
    for module_name, prefix in names.items():
        if prefix == "output" and tied:
            continue  # llama.cpp reuses token_embd when output.weight is absent
        weight = model.get_submodule(module_name).weight.detach().to(torch.float32).cpu().numpy()
        if module_name in rotary:
            weight = permute_rotary(weight, rotary[module_name])
        out[f"{prefix}.weight"] = weight.astype(np.float16 if weight.ndim == 2 else np.float32)
    return out


def write_gguf(model, path: Path, *, tokenizer_fields, name: str) -> Geometry:
    """Write `model` to `path` (a plain file; the caller makes it atomic) as an f16 GGUF. tokenizer_fields:
    a callable that adds the tokenizer and chat template to a gguf.GGUFWriter (gac.export.tokenizer)."""
    import gguf

    check_exportable(model)
    config = model.config
    geo = geometry(model)
    logging.getLogger("gguf").setLevel(logging.WARNING)  # its INFO lines name the hidden temporary file
    w = gguf.GGUFWriter(str(path), geo.arch)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(int(config.max_position_embeddings))
    w.add_embedding_length(geo.hidden)
    w.add_block_count(len(geo.ff))
    uniform = geo.uniform
    w.add_feed_forward_length(geo.ff[0] if uniform else list(geo.ff))
    w.add_head_count(geo.heads[0] if uniform else list(geo.heads))
    w.add_head_count_kv(geo.kv_heads[0] if uniform else list(geo.kv_heads))
    w.add_key_length(geo.head_dim)
    w.add_value_length(geo.head_dim)
    w.add_rope_dimension_count(geo.head_dim)
    w.add_rope_freq_base(_rope_theta(config))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    w.add_vocab_size(int(config.vocab_size))
    tokenizer_fields(w, int(config.vocab_size))
    for tensor_name, array in tensors(model, geo).items():
        w.add_tensor(tensor_name, array)
    log.info("writing %s GGUF (%d layers, MLP widths %s)", geo.arch, len(geo.ff), sorted(set(geo.ff)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return geo
