"""`gac export MODEL --format deci --out DIR`: a pruned Llama-layout model (a gac prune output, a Hugging Face
directory or the embedded alias) as a DeciLM (Nemotron-NAS) directory that engines without gac serve, with the
engines that can (gac_export.json's "engines", and one printed line). What DeciLM cannot hold is refused in one
line, before the model is loaded where its config and plan say so."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gac.checkpoint import deci
from gac.checkpoint.deci import DeciLayer, ffn_mult_for
from gac.checkpoint.gac_dir import is_gac_dir, read_config, read_plan, versions
from gac.checkpoint.loading import load_model, read_config_checked
from gac.compressors import REGISTRY, make_compressor
from gac.errors import GacError, first_line
from gac.export.config import ExportConfig
from gac.export.export import check_model_dir
from gac.export.gguf_writer import check_exportable
from gac.io import validate
from gac.models.adapters import adapter_for
from gac.models.configuration_decilm import FFN_MULTIPLE

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# engines that build a layer's MLP from its ffn_mult alone (a layer with intermediate_size fails to load there), as
# their sources read block_configs
FFN_MULT_ONLY = {
    "SGLang": "python/sglang/srt/models/nemotron_nas.py",
    "TensorRT-LLM": "tensorrt_llm/_torch/models/modeling_nemotron_nas.py",
}


@dataclass
class DeciExport:
    path: Path
    record: dict  # gac_export.json's content as gac wrote it (source, plan, engines, layers)


def check_source(spec: str) -> None:
    """What DeciLM cannot hold, from the config and plan alone (a directory): a low-rank output, a family other than
    Llama's layout, per-layer query heads. The embedded alias and .gguf files are checked once loaded."""
    path = check_model_dir(spec)
    if not path.is_dir():
        return
    if deci.is_deci_dir(path):
        config = deci.read_config(path)
    elif is_gac_dir(path):
        compressor = (read_plan(path).get("compressor") or {}).get("name")
        if compressor in REGISTRY and make_compressor(compressor).factorizes:
            raise deci.low_rank_error(spec, compressor)
        config = read_config(path)
    else:
        config = read_config_checked(str(path), spec)
    deci.check_config(config, spec)


def export_deci(cfg: ExportConfig) -> DeciExport:
    validate.not_quantized(cfg.model, "export")
    out = validate.output_dir(cfg.out, force=cfg.force)
    check_source(cfg.model)
    loaded = load_model(cfg.model, dtype="float32", device="cpu")
    deci.check_config(loaded.model.config, cfg.model)
    layers = deci.layers_of(loaded.model)
    source = Path(cfg.model).expanduser()
    plan = None  # the gac plan the model was made by, where it has one (a DeciLM directory carries its source's)
    if source.is_dir() and is_gac_dir(source):
        plan = read_plan(source)
    elif source.is_dir() and deci.is_deci_dir(source):
        plan = deci.read_record(source).get("source_plan")
    record = {
        "source": cfg.model,
        "source_plan": plan,
        "versions": versions(),
        "engines": engines(loaded.model, layers),
    }
    path = deci.save(loaded.model, loaded.tokenizer, out, record=record, force=cfg.force)
    return DeciExport(path, deci.read_record(path))


def engines(model: PreTrainedModel, layers: list[DeciLayer]) -> dict:
    """{engine: {"serves": bool, "reads": how, "why": the first reason it cannot}} for a DeciLM export of `model`."""
    hidden = adapter_for(model.config).hidden_size(model.config)
    out: dict[str, dict] = {
        "vLLM": {
            "serves": True,
            "reads": "ffn_mult, else intermediate_size (vllm/model_executor/models/nemotron_nas.py)",
        },
        "transformers": {"serves": True, "reads": "gac's modeling_decilm.py (trust_remote_code=True)"},
    }
    try:
        check_exportable(model)
        out["llama.cpp"] = {"serves": True, "reads": "`gac export DIR --format gguf`: its deci architecture"}
    except GacError as e:
        out["llama.cpp"] = {"serves": False, "why": first_line(e)}
    plain = [(i, x.mlp_width) for i, x in enumerate(layers) if ffn_mult_for(x.mlp_width, hidden) is None]
    for name, source in FFN_MULT_ONLY.items():
        out[name] = {"serves": not plain, "reads": f"ffn_mult only ({source})"}
        if plain:
            i, width = plain[0]
            unmet = (
                f"layer {i}'s width {width} is not a multiple of {FFN_MULTIPLE}"
                if len(plain) == 1
                else f"{len(plain)} layers' widths are not multiples of {FFN_MULTIPLE} (layer {i}'s is {width})"
            )
            out[name]["why"] = f"{unmet}: use `--target deci`"
    return out


def engines_line(engines: dict) -> str:
    """ "vLLM, transformers, llama.cpp: yes; SGLang, TensorRT-LLM: no (why)": the engines that serve it, then those
    that do not, grouped by their reason."""
    yes = [name for name, e in engines.items() if e["serves"]]
    reasons: dict[str, list[str]] = {}
    for name, e in engines.items():
        if not e["serves"]:
            reasons.setdefault(e.get("why", ""), []).append(name)
    parts = [f"{', '.join(yes)}: yes"] if yes else []
    parts += [f"{', '.join(names)}: no ({why})" for why, names in reasons.items()]
    return "; ".join(parts)
