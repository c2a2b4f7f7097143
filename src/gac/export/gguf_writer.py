"""Write a model of a family llama.cpp runs as an f16 GGUF: the architecture (gac.export.gguf_arch: `llama`,
`deci` for per-layer widths, `gemma3`) and the tensor names come from the family adapter's GgufNames."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from gac.errors import ConfigError, GacError

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


def _arch(model):
    """The llama.cpp architecture description of the model's family (one line for a family llama.cpp cannot run)."""
    from gac.export.gguf_arch import ARCHS
    from gac.models.adapters import adapter_for

    return ARCHS[adapter_for(model.config).gguf_family().arch]


def check_exportable(model, *, pad_mlp: bool = False) -> None:
    """One line for what llama.cpp cannot run: a family it has no architecture for, factorized (low-rank)
    projections, what the family's architecture cannot hold (biases, rope types, per-layer heads...), and MLP
    widths that differ by layer where it holds one (unless pad_mlp)."""
    from gac.models.adapters import text_config
    from gac.models.groups import is_grouped_lowrank, is_lowrank

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


def geometry(model) -> Geometry:
    from gac.models.adapters import adapter_for
    from gac.models.groups import groups_of

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


def _tied(model) -> bool:
    """Whether the output projection equals the embedding (read off the weights, not a config: a multimodal
    checkpoint keeps tie_word_embeddings apart from its text_config)."""
    out, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out is None or emb is None or out.weight.shape != emb.weight.shape:
        return False
    return out.weight.data_ptr() == emb.weight.data_ptr() or torch.equal(out.weight, emb.weight)


def tensors(model, geo: Geometry) -> dict[str, np.ndarray]:
    """{GGUF tensor name: array [out, in] (f16) or [n] (norms, f32)}, stored as the architecture reads them:
    q/k rows permuted for llama's rope, norms shifted for Gemma's (1 + w)."""
    from gac.models.adapters import adapter_for
    from gac.models.padding import pad_cols, pad_rows

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
        weight = model.get_submodule(module_name).weight.detach().to(torch.float32).cpu()
        # padded MLP channels: zero rows of gate and up (act(0) * 0 = 0), read by zero columns of down
        if module_name in rows and weight.shape[0] < rows[module_name]:
            weight, _ = pad_rows(weight, rows[module_name])
        if module_name in cols and weight.shape[1] < cols[module_name]:
            weight = pad_cols(weight, cols[module_name])
        weight = weight.numpy()
        if module_name in rotary:
            weight = permute_rotary(weight, rotary[module_name])
        if prefix.endswith("norm"):  # every RMSNorm, as llama.cpp's converter shifts every *norm.weight
            weight = weight + np.float32(arch.norm_shift)
        out[f"{prefix}.weight"] = weight.astype(np.float16 if weight.ndim == 2 else np.float32)
    return out


def padded(geo: Geometry) -> Geometry:
    """`geo` with every layer's MLP at the widest layer's width (the model's own widths kept in model_ff)."""
    return replace(geo, ff=(max(geo.ff),) * len(geo.ff), model_ff=geo.ff)


def write_gguf(model, path: Path, *, tokenizer_fields, name: str, pad_mlp: bool = False) -> Geometry:
    """Write `model` to `path` (a plain file; the caller makes it atomic) as an f16 GGUF. tokenizer_fields:
    a callable that adds the tokenizer and chat template to a gguf.GGUFWriter (gac.export.tokenizer). pad_mlp:
    where the architecture holds one MLP width, write every layer at the widest with zero channels."""
    import gguf

    from gac.models.adapters import text_config

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
