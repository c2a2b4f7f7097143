"""Write a model of a family llama.cpp runs as an f16 GGUF: the architecture (gac.export.gguf_arch: `llama`,
`deci` for per-layer widths, `gemma3`) and the tensor names come from the family adapter's GgufNames."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from gac.errors import ConfigError, GacError
from gac.export.gguf_arch import ARCHS, Arch, Geometry
from gac.models.adapters import adapter_for, text_config
from gac.models.groups import groups_of, is_grouped_lowrank, is_lowrank
from gac.models.padding import pad_cols, pad_rows

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from gac.export.tokenizer import TokenizerStep

log = logging.getLogger(__name__)


def _arch(model: PreTrainedModel) -> Arch:
    """The llama.cpp architecture description of the model's family (one line for a family llama.cpp cannot run)."""
    return ARCHS[adapter_for(model.config).gguf_family().arch]


def check_exportable(model: PreTrainedModel, *, pad_mlp: bool = False) -> None:
    """One line for what llama.cpp cannot run: a family it has no architecture for, factorized (low-rank)
    projections, what the family's architecture cannot hold (biases, rope types, per-layer heads...), and MLP
    widths that differ by layer where it holds one (unless pad_mlp)."""
    arch = _arch(model)
    if any(is_lowrank(m) or is_grouped_lowrank(m) for m in model.modules()):
        raise GacError(
            "this model has low-rank (factorized) projections, which no llama.cpp architecture can "
            "represent: export a pruned model (`gac compress --compressor prune`) or serve this one "
            "with transformers (gac.load)"
        )
    geo = geometry(model)
    arch.check(text_config(model.config), geo)
    widths = sorted(set(geo.ff))
    if arch.one_mlp_width and len(widths) > 1 and not pad_mlp:
        raise ConfigError(
            f"llama.cpp's {geo.arch} architecture holds one MLP width for every layer, but this model's "
            f"layers have {len(widths)} ({widths[0]}-{widths[-1]}): pass {{pad_mlp:True}} to write every layer "
            f"at {widths[-1]} with zero channels (the same outputs, but no smaller than the widest layer), "
            "or serve this model with transformers (gac.load)"
        )


def geometry(model: PreTrainedModel) -> Geometry:
    config = model.config
    adapter = adapter_for(config)
    geo = adapter.geometry(config)
    widths = [g.dim for g in groups_of(model, "mlp")]
    heads = groups_of(model, "heads")
    out = Geometry(
        adapter.hidden_size(config),
        geo.head_dim,
        tuple(widths),
        tuple(h.live_heads for h in heads),
        tuple(h.live_kv_heads for h in heads),
        adapter.intermediate_size(config),
        geo.num_heads,
    )
    return replace(out, arch=_arch(model).name(out))


def permute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half q/k rows [n_head * hd, in] -> llama.cpp's interleaved pairs (convert_hf_to_gguf's permute)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tied(model: PreTrainedModel) -> bool:
    """Whether the output projection equals the embedding (read off the weights, not a config: a multimodal
    checkpoint keeps tie_word_embeddings apart from its text_config)."""
    out, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out is None or emb is None:
        return False
    out_w, emb_w = out.get_parameter("weight"), emb.get_parameter("weight")
    return out_w.shape == emb_w.shape and (out_w.data_ptr() == emb_w.data_ptr() or torch.equal(out_w, emb_w))


def tensors(model: PreTrainedModel, geo: Geometry) -> dict[str, np.ndarray]:
    """{GGUF tensor name: array [out, in] (f16) or [n] (norms, f32)}, stored as the architecture reads them:
    q/k rows permuted for llama's rope, norms shifted for Gemma's (1 + w)."""
    config = model.config
    adapter = adapter_for(config)
    arch = _arch(model)
    names = adapter.gguf_names(config)
    rotary: dict[str, int] = {}  # q/k: heads to permute
    rows: dict[str, int] = {}  # MLP producers / consumers: width to pad to
    cols: dict[str, int] = {}
    for layer in adapter.layers(config):
        if arch.permute_qk:
            rotary[layer.q] = geo.heads[layer.index]
            rotary[layer.k] = geo.kv_heads[layer.index]
        rows |= dict.fromkeys(layer.producers, geo.ff[layer.index])
        cols |= dict.fromkeys(layer.consumers, geo.ff[layer.index])
    tied = _tied(model)
    out = {}
    for module_name, prefix in names.items():
        if prefix == "output" and tied:
            continue  # llama.cpp reuses token_embd when output.weight is absent
        w = model.get_parameter(f"{module_name}.weight").detach().to(torch.float32).cpu()
        # padded MLP channels: zero rows of gate and up (act(0) * 0 = 0), read by zero columns of down
        if module_name in rows and w.shape[0] < rows[module_name]:
            w, _ = pad_rows(w, rows[module_name])
        if module_name in cols and w.shape[1] < cols[module_name]:
            w = pad_cols(w, cols[module_name])
        weight = w.numpy()
        if module_name in rotary:
            weight = permute_rotary(weight, rotary[module_name])
        if prefix.endswith("norm"):  # every RMSNorm, as llama.cpp's converter shifts every *norm.weight
            weight = weight + np.float32(arch.norm_shift)
        out[f"{prefix}.weight"] = weight.astype(np.float16 if weight.ndim == 2 else np.float32)
    return out


def padded(geo: Geometry) -> Geometry:
    """`geo` with every layer's MLP at the widest layer's width (the model's own widths kept in model_ff)."""
    return replace(geo, ff=(max(geo.ff),) * len(geo.ff), model_ff=geo.ff)


def write_gguf(
    model: PreTrainedModel, path: Path, *, tokenizer_fields: TokenizerStep, name: str, pad_mlp: bool = False
) -> Geometry:
    """Write `model` to `path` (a plain file; the caller makes it atomic) as an f16 GGUF. tokenizer_fields:
    a callable that adds the tokenizer and chat template to a gguf.GGUFWriter (gac.export.tokenizer). pad_mlp:
    where the architecture holds one MLP width, write every layer at the widest with zero channels."""
    import gguf

    check_exportable(model, pad_mlp=pad_mlp)
    config = text_config(model.config)
    arch = _arch(model)
    geo = geometry(model)
    if arch.one_mlp_width and len(set(geo.ff)) > 1:
        geo = padded(geo)
        log.warning(
            "llama.cpp's %s holds one MLP width: every layer written at %d, zero-padded from %s",
            geo.arch,
            geo.ff[0],
            list(geo.model_ff),
        )
    logging.getLogger("gguf").setLevel(logging.WARNING)  # its INFO lines name the hidden temporary file
    w = gguf.GGUFWriter(str(path), geo.arch)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    arch.add_metadata(w, config, geo)
    tokenizer_fields(w, int(config.vocab_size))
    for tensor_name, array in tensors(model, geo).items():
        w.add_tensor(tensor_name, array)
    log.info("writing %s GGUF (%d layers, MLP widths %s)", geo.arch, len(geo.ff), sorted(set(geo.ff)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return geo
