"""`gac quantize MODEL --scheme S --out DIR`: a gac output (or a Hugging Face model, the baseline to serve beside it)
written as a compressed-tensors checkpoint that vLLM serves with its quantized kernels and transformers loads.

load -> plan (every linear vLLM builds checked against the kernel's rule, before any work) -> scales by
llm-compressor (round to nearest, or GPTQ on calibration text) -> compressed-tensors packs the weights -> save
atomically, with gac's structure and plan where the source had them, and quantize.json (what was quantized, what
was not and why).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gac.calibration.texts import TextConfig, calibration_windows
from gac.checkpoint import deci
from gac.checkpoint.deci import DeciLayer
from gac.checkpoint.gac_dir import (
    QUANTIZE_FILE,
    LoadedModel,
    check_out_dir,
    is_gac_dir,
    read_config,
    read_plan,
    save,
    versions,
)
from gac.checkpoint.loading import load_model, read_config_checked
from gac.errors import GacError
from gac.io import validate
from gac.io.atomic import atomic_dir
from gac.quantize.plan import QuantPlan, check_covers, plan
from gac.quantize.schemes import QuantizeConfig, scheme_args

if TYPE_CHECKING:
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from datasets import Dataset
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

INSTALL = "pip install 'gac[quantize]' (or `bash scripts/setup.sh`)"


@dataclass
class QuantizeResult:
    report: dict  # quantize.json's content
    out: Path


def check_installed() -> None:
    import importlib.util

    for module, package in (("compressed_tensors", "compressed-tensors"), ("llmcompressor", "llmcompressor")):
        if importlib.util.find_spec(module) is None:
            raise GacError(f"quantizing needs {package}, which is not installed here: {INSTALL}")


def quantize_dir(
    model: str | Path, out: str | Path, cfg: QuantizeConfig, *, force: bool = False, progress: bool = True
) -> QuantizeResult:
    """Quantize `model` (a gac output, a Hugging Face directory, a .gguf or the embedded alias) into `out`."""
    model, out = str(model), str(out)
    check_installed()
    validate.not_quantized(model, "quantize")
    validate.output_dir(out, "--out", force=force)
    check_out_dir(out, force)
    config = _config(model)
    qplan = plan(config, cfg) if config is not None else None  # a refusal before the model is even read
    loaded = load_model(model, dtype=cfg.dtype)
    deci_layers = _deci_layers(model, loaded.model)  # read while the linears are plain ones
    qplan = qplan or plan(loaded.model.config, cfg)
    check_covers(qplan, loaded.model)
    start = time.perf_counter()
    # llm-compressor reads the source's config.json again: a DeciLM directory's names its code, which gac.load has
    # just checked is the code gac wrote
    compressor = quantize_model(
        loaded.model, loaded.tokenizer, qplan, progress=progress, trust_code=deci_layers is not None
    )
    _cast(loaded.model, cfg.saved_dtype)
    report = quantize_report(model, qplan, time.perf_counter() - start)
    written = _save(loaded, model, out, report, compressor, force, deci_layers)
    return QuantizeResult(report, written)


def _deci_layers(spec: str, model: nn.Module) -> list[DeciLayer] | None:
    """A DeciLM directory's layers (gac.checkpoint.deci.layers_of), or None for any other model."""
    return deci.layers_of(model) if Path(spec).is_dir() and deci.is_deci_dir(spec) else None


def _config(spec: str) -> PretrainedConfig | None:
    """The model's config read without its weights where it is a directory (None otherwise: read on load)."""
    path = Path(spec)
    if not (path / "config.json").is_file():
        return None
    if deci.is_deci_dir(path):
        return deci.read_config(path)
    if is_gac_dir(path):
        return read_config(path)
    return read_config_checked(str(path), spec)


def quantize_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    qplan: QuantPlan,
    *,
    progress: bool = True,
    trust_code: bool = False,
) -> ModelCompressor:
    """Quantize `model` in place by the plan (llm-compressor finds the scales; compressed-tensors packs the weights);
    returns the compressed-tensors ModelCompressor, whose update_config writes the checkpoint's quantization_config.
    trust_code: llm-compressor may run the code the source directory's config names (its config is read again)."""
    import os

    # llm-compressor logs INFO lines and, on import, "No accelerator available!" on any CPU: errors only, unless the
    # user set its level (its own variable, read when it is first imported)
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.offload.dispatch import remove_dispatch
    from llmcompressor import oneshot

    cfg = qplan.cfg
    groups = {"group_0": scheme_args(cfg)}
    # llm-compressor traces each decoder layer with torch.fx, whose notice on every run says nothing to a user
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    if cfg.method == "gptq":
        from llmcompressor.modifiers.gptq import GPTQModifier

        windows = _calibration(tokenizer, cfg)
        log.info("GPTQ on %d windows of %d tokens", *windows.shape)
        oneshot(
            model=model,
            recipe=GPTQModifier(config_groups=groups, ignore=qplan.ignore),
            dataset=_dataset(windows),
            num_calibration_samples=len(windows),
            max_seq_length=windows.shape[1],
            shuffle_calibration_samples=False,
            trust_remote_code_model=trust_code,
        )
    else:
        from llmcompressor.modifiers.quantization import QuantizationModifier

        recipe = QuantizationModifier(config_groups=groups, ignore=qplan.ignore)
        oneshot(model=model, recipe=recipe, trust_remote_code_model=trust_code)
    remove_dispatch(model)  # llm-compressor's offloading hooks: the model is saved and used as a plain one
    vars(model).pop("save_pretrained", None)  # and its save wrapper: gac writes the checkpoint (update_config)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    return compressor


def _cast(model: PreTrainedModel, dtype: str) -> None:
    """The unquantized tensors (and the scales) in the checkpoint's dtype, which config.json records: vLLM's and
    transformers' "auto" dtype read it."""
    import torch

    model.to(getattr(torch, dtype))  # floating tensors only: the packed int weights keep their integer type
    model.config.dtype = dtype


def _calibration(tokenizer: PreTrainedTokenizerBase | None, cfg: QuantizeConfig) -> torch.Tensor:
    if tokenizer is None:
        raise GacError(
            "GPTQ calibrates on text and this model has no tokenizer: put its tokenizer files beside the weights, "
            "or use --method rtn"
        )
    text = TextConfig(calib_file=cfg.calib_file, seq_len=cfg.seq_len, calib_windows=cfg.calib_windows)
    return calibration_windows(tokenizer, text)[0]  # [n, seq_len]


def _dataset(windows: torch.Tensor) -> Dataset:
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": windows.tolist(), "attention_mask": [[1] * windows.shape[1]] * len(windows)})


def quantize_report(model: str, qplan: QuantPlan, seconds: float) -> dict:
    """quantize.json: the run's scheme, options and versions, and its plan (every linear, quantized or why not)."""
    import compressed_tensors
    import llmcompressor

    cfg = qplan.cfg
    return {
        "model": str(model),
        "scheme": cfg.scheme,
        "label": cfg.label,
        "config": asdict(cfg),
        "seconds": seconds,
        "versions": {
            **versions(),
            "compressed_tensors": compressed_tensors.__version__,
            "llmcompressor": llmcompressor.__version__,
        },
        **qplan.report(),
    }


# gac_export.json's engines for a quantized DeciLM directory: what gac checks (vLLM's compressed-tensors kernels,
# transformers' decompression); llama.cpp reads GGUF from the unquantized export; SGLang and TensorRT-LLM are not
# checked on quantized checkpoints
QUANTIZED_ENGINES = {
    "vLLM": {"serves": True, "reads": "compressed-tensors (quantization_config) and ffn_mult, else intermediate_size"},
    "transformers": {"serves": True, "reads": "gac's modeling_decilm.py, compressed-tensors decompressing"},
    "llama.cpp": {"serves": False, "why": "a compressed-tensors checkpoint: export the unquantized one to GGUF"},
}


def quantized_summary(report: dict) -> dict:
    """gac_plan.json's "quantization": what the checkpoint is (quantize.json beside it has the rest)."""
    return {k: report[k] for k in ("scheme", "label", "quantized", "unquantized")}


def _save(
    loaded: LoadedModel,
    model: str,
    out: str,
    report: dict,
    compressor: ModelCompressor,
    force: bool,
    deci_layers: list[DeciLayer] | None = None,
) -> Path:
    """A gac output stays one (its structure, plan and modeling code; the plan records the quantization), and a
    DeciLM export one too (its config and code, which engines without gac read; its record, the quantization); any
    other model is written as a plain Hugging Face directory. All atomically, quantization_config in config.json."""
    files = {QUANTIZE_FILE: json.dumps(report, indent=2) + "\n"}
    if deci_layers is not None:
        record = {**deci.read_record(model), "quantization": quantized_summary(report), "engines": QUANTIZED_ENGINES}
        return deci.save(
            loaded.model,
            loaded.tokenizer,
            out,
            record=record,
            layers=deci_layers,
            extra_files=files,
            force=force,
            finish=compressor.update_config,
        )
    if Path(model).is_dir() and is_gac_dir(model):
        return save(
            loaded.model,
            loaded.tokenizer,
            out,
            plan={**read_plan(model), "quantization": quantized_summary(report)},
            extra_files=files,
            force=force,
            finish=compressor.update_config,
        )
    target = Path(out).resolve()
    with atomic_dir(target, force=force) as tmp:
        loaded.model.save_pretrained(tmp)
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(tmp)
        compressor.update_config(tmp)
        (Path(tmp) / QUANTIZE_FILE).write_text(files[QUANTIZE_FILE])
    return target
