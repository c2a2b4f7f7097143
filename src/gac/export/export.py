"""`gac export`: a model (a gac output, an HF directory, a .gguf or the embedded alias) as a GGUF that llama.cpp
serves, quantized by llama.cpp, with the per-tensor type report; or (`--format hf`) as a Hugging Face directory that
transformers and vLLM read (the embedded original's baseline beside its compressed models); or (`--format deci`,
gac.export.deci) as a DeciLM directory that engines without gac serve. Outputs are atomic. What it takes:
gac.export.config."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gac.checkpoint.gac_dir import LoadedModel, is_gac_dir, read_plan, save
from gac.checkpoint.loading import load_model
from gac.compressors import REGISTRY, make_compressor
from gac.errors import GacError
from gac.export.config import ExportConfig
from gac.export.gguf_arch import Geometry
from gac.export.gguf_writer import check_exportable, write_gguf
from gac.export.quantize import llama_cpp_module, quantize, tensor_types, type_report
from gac.export.tokenizer import tokenizer_fields
from gac.io import validate
from gac.io.atomic import atomic_dir, write_file, write_text

log = logging.getLogger(__name__)


@dataclass
class ExportResult:
    path: Path
    arch: str
    report: dict  # gac.export.quantize.type_report + arch, per-layer geometry, file size


def _check_out_file(spec: str, suffix: str, flag: str, force: bool, example: str = "") -> Path:
    """`spec` must be a path ending in `suffix` that `flag` may write (checked before any work)."""
    path = Path(spec).expanduser()
    if path.suffix != suffix:
        raise GacError(f"{flag} {spec} must end in {suffix}{example}")
    if path.exists() and not path.is_dir() and not force:
        raise GacError(f"{spec} already exists: choose another {flag} or pass --force to replace it")
    return validate.output_file(path, flag)


def check_output(out: str, force: bool) -> Path:
    """The output must be a .gguf path we may write (checked before any work)."""
    return _check_out_file(out, ".gguf", "--out", force, ": e.g. --out model-q4_k_m.gguf")


def check_model_dir(spec: str) -> Path:
    """`spec` as a path; a directory must hold a model (config.json), checked before anything is loaded."""
    path = Path(spec).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        raise GacError(
            f"{spec} is neither a gac output nor a model directory (no config.json): pass a "
            "directory `gac compress` wrote, a Hugging Face model directory or a .gguf"
        )
    return path


def check_source(spec: str) -> None:
    """A directory must be a model directory; a gac output must be one export can represent (checked before
    the model is loaded where the plan says so)."""
    path = check_model_dir(spec)
    if path.is_dir() and is_gac_dir(path):
        compressor = (read_plan(path).get("compressor") or {}).get("name")
        if compressor in REGISTRY and make_compressor(compressor).factorizes:
            raise GacError(
                f"{spec} was compressed with {compressor}, a low-rank (factorized) model that no "
                "llama.cpp architecture can represent: export a pruned model (`gac compress "
                "--compressor prune`) or serve this one with transformers (gac.load)"
            )


def write_f16(loaded: LoadedModel, path: Path, *, pad_mlp: bool = False) -> Geometry:
    """The f16 GGUF of a loaded model at `path` (a plain write; callers make it atomic). Returns its Geometry."""
    src = Path(loaded.source).expanduser()
    fields = tokenizer_fields(loaded.source, src if src.is_dir() else None)
    name = Path(loaded.source).name.removesuffix(".gguf") or "gac"
    return write_gguf(loaded.model, path, tokenizer_fields=fields, name=name, pad_mlp=pad_mlp)


def export_hf(cfg: ExportConfig) -> Path:
    """A Hugging Face directory of the model: a gac output keeps its structure and plan (gac.checkpoint.gac_dir.save);
    any other model (the embedded GGUF, dequantized; an HF directory) is saved as its family's own class, which
    transformers, lm-evaluation-harness and vLLM load natively."""
    out = validate.output_dir(cfg.out, force=cfg.force)
    validate.not_quantized(cfg.model, "export")
    source = check_model_dir(cfg.model)
    loaded = load_model(cfg.model, dtype="float32", device="cpu")
    if source.is_dir() and is_gac_dir(source):
        return save(loaded.model, loaded.tokenizer, out, plan=read_plan(source), force=cfg.force)
    with atomic_dir(out, force=cfg.force) as tmp:
        loaded.model.save_pretrained(tmp, safe_serialization=True)
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(tmp)
    return out


def export(cfg: ExportConfig) -> ExportResult:
    validate.not_quantized(cfg.model, "export")
    out = check_output(cfg.out, cfg.force)
    if cfg.report:
        check_output_report(cfg.report, cfg.force)
    check_source(cfg.model)
    if cfg.type != "f16":
        llama_cpp_module()  # installed, or one line, before the model is loaded
    loaded = load_model(cfg.model, dtype="float32", device="cpu")
    check_exportable(loaded.model, pad_mlp=cfg.pad_mlp)
    state: dict[str, Any] = {}  # what the write leaves: the geometry, the quantizer's fallbacks

    def write(tmp: Path) -> None:
        if cfg.type == "f16":
            state["geo"] = write_f16(loaded, tmp, pad_mlp=cfg.pad_mlp)
            state["fallbacks"] = []
            return
        with tempfile.TemporaryDirectory(prefix=".gac-export-", dir=tmp.parent) as d:
            f16 = Path(d) / "f16.gguf"
            state["geo"] = write_f16(loaded, f16, pad_mlp=cfg.pad_mlp)
            state["fallbacks"] = quantize(f16, tmp, cfg.type, threads=cfg.threads)

    write_file(out, write)
    geo = state["geo"]
    report = type_report(tensor_types(out, state["fallbacks"], geo), cfg.type)
    report = {
        "file": str(out),
        "bytes": out.stat().st_size,
        "arch": geo.arch,
        "source": loaded.source,
        "hidden": geo.hidden,
        "ff": list(geo.ff),
        "heads": list(geo.heads),
        "kv_heads": list(geo.kv_heads),
        **({"model_ff": list(geo.model_ff)} if geo.model_ff else {}),
        **report,
    }
    if cfg.report:
        write_text(cfg.report, json.dumps(report, indent=2), flag="--report")
    return ExportResult(out, geo.arch, report)


def check_output_report(report: str, force: bool) -> None:
    _check_out_file(report, ".json", "--report", force)
