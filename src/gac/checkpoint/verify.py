"""Verify what a checkpoint holds before and after loading it: a damaged, incomplete or tampered model is a
one-line GacError, never a silently random-initialized one.

Decisions (docs/USAGE.md):
- Weights are read from safetensors (model.safetensors or a sharded index). Every header is parsed and every
  shard must exist before transformers is asked to load anything.
- A pickle checkpoint (pytorch_model.bin) is read only through torch's weights-only unpickler
  (`torch.load(weights_only=True)`, which runs no code from the file); one holding anything but tensors is
  refused with the command that converts it to safetensors. transformers itself also loads it weights-only.
- After loading, transformers' loading info must show no missing and no mismatched tensors: a missing tensor
  would otherwise be randomly initialized. Unexpected (extra) tensors are logged and ignored.
- A gac output's `gac_structure` (config.json) is checked for types, applied, and then must account for every
  tensor in its weights, both ways.
- A gac output's `modeling_gac.py` is never run by gac, but users of trust_remote_code would run it: one that
  differs from the file gac wrote (its sha256 in gac_plan.json) is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from gac.errors import GacError, first_line
from gac.io.validate import quantization_of, read_json

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SAFETENSORS, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE, PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
CONVERT = (
    'convert it to safetensors where you trust the file: python -c "import torch, safetensors.torch as s; '
    "s.save_file(torch.load('pytorch_model.bin', weights_only=True), 'model.safetensors')\""
)


def _shards(d: Path, index_name: str, what: str) -> list[Path]:
    index = read_json(d / index_name, "weights index", "the model directory")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise GacError(f'{d / index_name} has no valid "weight_map": re-download or re-save the model')
    shards = sorted({d / v for v in weight_map.values()})
    for s in shards:
        if s.parent != d or not s.is_file():
            raise GacError(f"{what} shard {s.name} listed in {index_name} is missing: re-download the model")
    return shards


def _check_safetensors(path: Path, quantized: bool = False) -> None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
            dtypes = {k: f.get_slice(k).get_dtype() for k in keys if k.endswith(".weight")}
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError, ...: a damaged file either way
        first = first_line(e)
        raise GacError(
            f"{path} is not a readable safetensors file ({first}): it is truncated or damaged; "
            "re-download or re-save the model"
        ) from None
    if not keys:
        raise GacError(f"{path} holds no tensors: re-download or re-save the model")
    odd = {k: t for k, t in dtypes.items() if t not in FLOAT_DTYPES}
    if odd and not quantized:  # a compressed-tensors checkpoint holds int8 weights (W8A8)
        name, dtype = sorted(odd.items())[0]
        raise GacError(
            f"{path}: weight {name} is stored as {dtype}, not floating point (integer or quantized "
            "weights are not supported): pass the float16/bfloat16/float32 checkpoint"
        )


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors header names


def check_finite(model: nn.Module, source: str) -> None:
    """NaN or inf in a weight: a damaged checkpoint, which would otherwise fail deep inside an SVD."""
    import torch

    for name, p in model.named_parameters():
        if p.device.type == "meta":
            continue  # offloaded by accelerate (disk): checked when it is read, not loaded here just to check
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            raise GacError(
                f"{source}: weight {name} holds NaN or infinite values: the checkpoint is damaged; "
                "re-download or re-save the model"
            )


def _check_pickle(path: Path) -> None:
    import pickle

    import torch

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        raise GacError(
            f"refused {path}: it holds Python objects beyond tensors, which gac does not unpickle; {CONVERT}"
        ) from None
    except Exception:  # noqa: BLE001 - truncated zip, garbage bytes, the pre-1.6 legacy format
        raise GacError(
            f"{path} is not a readable PyTorch checkpoint (truncated, garbage, or the legacy pre-zip "
            f"format): re-download the model, or {CONVERT}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise GacError(f"refused {path}: not a plain dict of tensors; {CONVERT}")


def check_weight_files(d: str | Path) -> str:
    """Check the weights in directory `d` before loading; returns "safetensors" or "pickle"."""
    d = Path(d)
    quantized = (quantization_of(d) or {}).get("quant_method") == COMPRESSED_TENSORS
    formats = (
        ("safetensors", SAFE_INDEX, SAFETENSORS, "safetensors", partial(_check_safetensors, quantized=quantized)),
        ("pickle", PICKLE_INDEX, PICKLE, "checkpoint", _check_pickle),
    )
    for kind, index, single, label, check in formats:  # safetensors first, as transformers prefers them
        if (d / index).is_file():
            for shard in _shards(d, index, label):
                check(shard)
            return kind
        if (d / single).exists():
            check(d / single)
            return kind
    raise GacError(
        f"{d} has a config.json but no weights ({SAFETENSORS} or {PICKLE}): copy the weight files beside config.json"
    )


COMPRESSED_TENSORS = "compressed-tensors"


def check_config(config: PretrainedConfig, source: str) -> None:
    """Config values transformers would turn into a traceback, or into a model that cannot run."""
    from transformers.activations import ACT2FN

    def bad(what: str) -> NoReturn:
        raise GacError(f"{source}: config.json {what}: fix config.json or re-download the model")

    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size"):
        value = getattr(config, key, None)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            bad(f"has {key} = {value!r}, not a positive integer")
    kv = getattr(config, "num_key_value_heads", None)
    heads = getattr(config, "num_attention_heads", None)
    if kv is not None and not (isinstance(kv, int) and not isinstance(kv, bool) and kv >= 1):
        bad(f"has num_key_value_heads = {kv!r}, not a positive integer")
    if kv and heads and heads % kv:
        bad(f"has num_attention_heads {heads} not divisible by num_key_value_heads {kv}")
    hidden, head_dim = getattr(config, "hidden_size", None), getattr(config, "head_dim", None)
    if head_dim is None and hidden and heads and hidden % heads:
        bad(f"has hidden_size {hidden} not divisible by num_attention_heads {heads}")
    act = getattr(config, "hidden_act", None)
    if act is not None and (not isinstance(act, str) or act not in ACT2FN):
        bad(f"names an unknown activation hidden_act = {act!r}")
    quant = getattr(config, "quantization_config", None)
    method = (
        (quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None))
        if quant
        else None
    )
    # gac's own quantized outputs (compressed-tensors) load, decompressed by transformers, for evaluation and
    # serving; the verbs that rewrite weights refuse them (gac.quantize.run.check_not_quantized). Other quantized
    # checkpoints (gpt-oss's MXFP4: blocks and scales, not weights) are refused here.
    if quant and method != COMPRESSED_TENSORS:
        raise GacError(
            f"{source} is a quantized checkpoint ({method}), and gac compresses floating-point weights: "
            "pass its float16/bfloat16/float32 checkpoint (an MXFP4 one, e.g. gpt-oss's: load it with "
            "transformers' Mxfp4Config(dequantize=True) and save_pretrained)"
        )


def check_loading_info(info: dict, source: str, *, gac_output: bool = False) -> None:
    """transformers' output_loading_info: a missing or mismatched tensor is an error, never a random init. A tensor
    the model does not use is a warning, except in a gac output, whose structure must place every tensor."""

    def listed(keys: Iterable[str | tuple]) -> str:
        names = sorted(str(k if isinstance(k, str) else k[0]) for k in keys)
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    missing = info.get("missing_keys") or ()
    mismatched = info.get("mismatched_keys") or ()
    errors = info.get("error_msgs") or ()
    if missing:
        raise GacError(
            f"{source}: the checkpoint lacks {len(missing)} tensor(s) the model needs ({listed(missing)}); "
            "they would be random: re-download or re-save the model"
        )
    if mismatched:
        raise GacError(
            f"{source}: {len(mismatched)} tensor(s) do not match the shapes in config.json "
            f"({listed(mismatched)}): the config does not belong to these weights; use the matching "
            "config.json"
        )
    if errors:
        raise GacError(f"{source}: loading failed ({str(errors[0]).splitlines()[0]}): re-download the model")
    unexpected = info.get("unexpected_keys") or ()
    if unexpected and gac_output:
        raise GacError(
            f"{source}: its weights hold tensors its gac_structure does not place (e.g. "
            f"{sorted(unexpected)[0]}): the output is damaged or edited; re-run `gac compress`"
        )
    if unexpected:
        log.warning("%s: ignored %d tensor(s) the model does not use (%s)", source, len(unexpected), listed(unexpected))


def check_tokenizer_fits(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, source: str) -> None:
    """Token ids the tokenizer can produce must index the embedding: a smaller vocabulary reads out of range."""
    if tokenizer is None:
        return
    weight = cast("torch.Tensor", model.get_input_embeddings().weight)  # an embedding's, typed as any Module's
    rows = weight.shape[0]
    base = getattr(tokenizer, "vocab_size", None) or 0
    if base > rows:
        raise GacError(
            f"{source}: the tokenizer has {base} tokens but the embedding only {rows} rows: the "
            "tokenizer does not belong to this model; use the model's own tokenizer files"
        )
    if len(tokenizer) > rows:  # only added special tokens out of range: plain text never produces them
        log.warning(
            "%s: the tokenizer's added tokens reach id %d, beyond the embedding's %d rows",
            source,
            len(tokenizer) - 1,
            rows,
        )


def check_gac_files(d: str | Path) -> None:
    """A directory that gac wrote has its plan and its structure; one without either is damaged."""
    d = Path(d)
    has_plan = (d / "gac_plan.json").is_file()
    try:
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return  # the config reader reports this one
    has_structure = isinstance(config, dict) and "gac_structure" in config
    has_code = (d / "modeling_gac.py").is_file()
    if (has_structure or has_code) and not has_plan:
        raise GacError(f"{d} is a damaged gac output: gac_plan.json is missing; restore it or re-run `gac compress`")
    if has_plan and not has_structure:
        raise GacError(
            f"{d} is a damaged gac output: config.json has no gac_structure (the compressed shapes); "
            "restore config.json or re-run `gac compress`"
        )


def check_structure(structure: object, source: str) -> dict:
    """Types of config.gac_structure: {"linear": {name: [out, in]}, "attention": {name: {num_heads,
    num_kv_heads}}, "lowrank": {name: rank}, "grouped_lowrank": {name: [ranks]}}."""

    def bad(what: str) -> NoReturn:
        raise GacError(
            f"{source}: gac_structure in config.json {what}: the output is damaged or edited; "
            "restore it or re-run `gac compress`"
        )

    def pos(x: object) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 1

    if not isinstance(structure, dict):
        bad("is not an object")
    kinds = {"linear", "attention", "lowrank", "grouped_lowrank"}  # other keys: kept, not applied (newer gac)
    for kind, entries in structure.items():
        if kind not in kinds:
            continue
        if not isinstance(entries, dict) or not all(isinstance(k, str) and k for k in entries):
            bad(f'"{kind}" is not an object of module names')
        for name, v in entries.items():
            ok = {
                "linear": lambda v: isinstance(v, list) and len(v) == 2 and all(map(pos, v)),
                "attention": lambda v: (
                    isinstance(v, dict)
                    and pos(v.get("num_heads"))
                    and pos(v.get("num_kv_heads"))
                    and v["num_heads"] % v["num_kv_heads"] == 0
                ),
                "lowrank": pos,
                "grouped_lowrank": lambda v: isinstance(v, list) and v and all(map(pos, v)),
            }[kind](v)
            if not ok:
                bad(f"has an invalid {kind} entry for {name}: {v!r}")
    return structure


def code_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_modeling_code(
    code: Path, expected: str | None, plan_name: str, *, allow_modified: bool = False, export_format: str = "hf"
) -> None:
    """`code` (a directory's modeling_gac.py, or a DeciLM directory's code) is the one gac wrote (sha256 `expected`,
    recorded in `plan_name`), or one GacError; allow_modified: a warning instead. Outputs of gac versions that
    recorded no hash, and directories without the file (nothing there that could run), pass. export_format: the `gac
    export` format that writes gac's own copy again."""
    if expected is None or not code.is_file() or code_hash(code) == expected:
        return
    problem = (
        f"{code} differs from the file gac wrote (its sha256 in {plan_name}), and transformers runs it for "
        "anyone who loads this directory with trust_remote_code=True"
    )
    if allow_modified:
        log.warning("%s; loading with gac's own classes, which never run it", problem)
        return
    raise GacError(
        f"{problem}: remove it (gac never runs it; `gac export DIR --format {export_format} --out NEW` then writes "
        "gac's own) or restore it, or load anyway with gac.load(DIR, allow_modified_code=True)"
    )
