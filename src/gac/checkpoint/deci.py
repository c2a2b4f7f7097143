"""DeciLM (Nemotron-NAS) directories: a Llama-layout model whose layers differ only in MLP width and KV heads, saved
under DeciLM's config (`block_configs`) with gac's own configuration and modeling code, which stock engines read
(`gac export --format deci`); read back by gac as the gac model of the same shapes. The format's one writer and
reader; gac_export.json (written by gac, with the code files' sha256) is what marks such a directory.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gac.checkpoint.placement import SHARD_SIZE
from gac.checkpoint.verify import check_modeling_code, code_hash
from gac.errors import ConfigError, GacError
from gac.io.atomic import atomic_dir
from gac.io.validate import read_json
from gac.models import modeling_gac
from gac.models.adapters import adapter_for, text_config
from gac.models.configuration_decilm import FFN_MULTIPLE, BlockConfig, DeciLMConfig, ffn_mult_width
from gac.models.groups import groups_of, is_grouped_lowrank, is_lowrank
from gac.models.modeling_gac import family_of, gac_config_class

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

EXPORT_FILE = "gac_export.json"
EXPORT_VERSION = 1
FORMAT = "deci"
CONFIG_CODE, MODEL_CODE = "configuration_decilm.py", "modeling_decilm.py"
CODE_FILES = (CONFIG_CODE, MODEL_CODE)
ARCHITECTURE = "DeciLMForCausalLM"
AUTO_MAP = {
    "AutoConfig": "configuration_decilm.DeciLMConfig",
    "AutoModelForCausalLM": "modeling_decilm.DeciLMForCausalLM",
    "AutoModel": "modeling_decilm.DeciLMModel",
}
# families DeciLM's Llama layers compute exactly: Llama, and Mistral where no sliding window applies
FAMILIES = ("llama", "mistral")
# config.json keys that are DeciLM's, not the Llama configuration gac rebuilds the model from
DECI_KEYS = ("block_configs", "architectures", "auto_map", "model_type", "transformers_version")
# the source config's keys a DeciLM config does not carry (checked to be inactive before they are dropped)
DROPPED_KEYS = ("gac_structure", "sliding_window", "layer_types", "quantization_config", "_name_or_path")
FIX = "serve this model with gac's vLLM plugin (`gac export DIR --format hf`) or transformers (gac.load)"


@dataclass(frozen=True)
class DeciLayer:
    mlp_width: int
    kv_heads: int


def is_deci_dir(path: str | Path) -> bool:
    return (Path(path) / EXPORT_FILE).is_file()


# ----------------------------------------------------------------------------------------------- what DeciLM holds


def check_config(config: PretrainedConfig, source: str) -> None:
    """One line for what DeciLM cannot hold, read off a config (before any weight is read): a family other than
    Llama's layout, projection biases, a sliding window, low-rank projections or fused experts in a gac structure,
    and query heads that differ by layer (DeciLM's are the model's; only KV heads and MLP widths vary)."""
    text = text_config(config)
    family = family_of(str(getattr(text, "model_type", "")))
    if family not in FAMILIES:
        raise GacError(
            f"{source} is a {family} model, and DeciLM's layers are Llama's (llama, or mistral without a "
            f"sliding window): {FIX}"
        )
    if getattr(text, "attention_bias", False) or getattr(text, "mlp_bias", False):
        raise GacError(f"{source} has projection biases, which DeciLM's engines do not all build: {FIX}")
    window = getattr(text, "sliding_window", None)
    if window is not None and window < text.max_position_embeddings:
        raise GacError(
            f"{source} attends within a sliding window of {window} tokens, and DeciLM's Llama layers attend to "
            f"all: {FIX}"
        )
    structure = getattr(config, "gac_structure", None) or {}
    if structure.get("lowrank") or structure.get("grouped_lowrank"):
        raise GacError(f"{source} has low-rank (factorized) projections, which DeciLM cannot hold: {_LOW_RANK_FIX}")
    if structure.get("parameter"):
        raise GacError(f"{source} has resized fused parameters, which DeciLM cannot hold: {FIX}")
    adapter = adapter_for(config)
    heads = adapter.geometry(config).num_heads
    attention = structure.get("attention") or {}
    for layer in adapter.layers(config):
        kept = (attention.get(layer.attention) or {}).get("num_heads", heads)
        if kept != heads:
            raise query_heads_error(layer.index, kept, heads)


_LOW_RANK_FIX = (
    "export a pruned model (`gac compress --compressor prune --target deci`), or serve this one with gac's vLLM "
    "plugin (`gac export DIR --format hf`) or transformers (gac.load)"
)


def low_rank_error(source: str, compressor: str) -> GacError:
    return GacError(
        f"{source} was compressed with {compressor}, a low-rank (factorized) model, and DeciLM's layers hold only "
        f"an MLP width and KV heads of their own: {_LOW_RANK_FIX}"
    )


def query_heads_error(layer: int, kept: int, heads: int) -> ConfigError:
    return ConfigError(
        f"layer {layer} keeps {kept} of {heads} query heads, and DeciLM holds the model's query heads in every "
        "layer (only the KV heads and MLP width vary): compress with {target:deci} (heads whole) or "
        "{head_mode:none} (MLP channels only), or serve this model with gac's vLLM plugin"
    )


def layers_of(model: nn.Module) -> list[DeciLayer]:
    """Each layer's MLP width and KV heads, read off the live model; one line where a layer is not DeciLM's (a
    low-rank projection, fewer query heads than the model's, KV heads that do not divide them)."""
    if any(is_lowrank(m) or is_grouped_lowrank(m) for m in model.modules()):
        raise GacError(f"this model has low-rank (factorized) projections, which DeciLM cannot hold: {_LOW_RANK_FIX}")
    config = cast("PretrainedConfig", model.config)  # a transformers model's, as every caller's is
    heads = adapter_for(config).geometry(config).num_heads
    out = []
    for i, (mlp, attention) in enumerate(zip(groups_of(model, "mlp"), groups_of(model, "heads"))):
        if attention.live_heads != heads:
            raise query_heads_error(i, attention.live_heads, heads)
        if heads % attention.live_kv_heads:
            raise GacError(
                f"layer {i} keeps {attention.live_kv_heads} KV heads, which do not divide the {heads} query heads "
                f"as DeciLM's n_heads_in_group must: {FIX}"
            )
        out.append(DeciLayer(int(mlp.dim), int(attention.live_kv_heads)))
    return out


# ----------------------------------------------------------------------------------------------- block_configs


def ffn_mult_for(width: int, hidden: int) -> float | None:
    """An ffn_mult from which DeciLM's formula, `find_multiple(int(2 * m * hidden / 3), 256)` in the engines' float
    arithmetic, gives exactly `width` (checked, as config.json holds it); None where none does (a width that is not
    a multiple of 256). The ratio 3w / 2h: where floating point lands its product a hair under the width, int()
    gives one less, which the rounding up to 256 takes back; a hair over, int() gives the width itself."""
    if width <= 0 or width % FFN_MULTIPLE:
        return None
    mult = 3 * width / (2 * hidden)
    return mult if ffn_mult_width(json.loads(json.dumps(mult)), hidden) == width else None


def block_config(layer: DeciLayer, hidden: int, heads: int) -> dict:
    """A layer's `block_configs` entry: ffn_mult where it gives the width exactly, else intermediate_size alone."""
    mult = ffn_mult_for(layer.mlp_width, hidden)
    width = {"ffn_mult": mult} if mult is not None else {"intermediate_size": layer.mlp_width}
    return {
        "attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": heads // layer.kv_heads},
        "ffn": {"no_op": False, "replace_with_linear": False, **width},
    }


def deci_config(config: PretrainedConfig, layers: list[DeciLayer]) -> DeciLMConfig:
    """The DeciLM config (gac.models.configuration_decilm.DeciLMConfig) of a Llama-layout config at these layers."""
    adapter = adapter_for(config)
    hidden, heads = adapter.hidden_size(config), adapter.geometry(config).num_heads
    values = {k: v for k, v in text_config(config).to_dict().items() if k not in (*DECI_KEYS, *DROPPED_KEYS)}
    blocks = [block_config(layer, hidden, heads) for layer in layers]
    return DeciLMConfig.from_dict(
        {**values, "block_configs": blocks, "architectures": [ARCHITECTURE], "auto_map": dict(AUTO_MAP)}
    )


# ----------------------------------------------------------------------------------------------- write


def code_path(name: str) -> Path:
    """The package's copy of a DeciLM code file (package data beside gac.models.modeling_gac)."""
    return Path(modeling_gac.__file__).with_name(name)


def save(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    out: str | Path,
    *,
    record: dict,
    layers: list[DeciLayer] | None = None,
    force: bool = False,
    extra_files: dict | None = None,
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """Write `model` as a DeciLM directory at `out`, atomically: Llama-named safetensors, DeciLM's config.json,
    gac's configuration and modeling code, the tokenizer (with its chat template) and generation config, and
    gac_export.json (`record` with the layers' blocks and the code files' sha256). layers: the model's (read off it
    when not given; a quantized model's are read before it is quantized). finish: called with the directory once all
    is written (a quantized model's compressed-tensors config goes into config.json there)."""
    layers = layers if layers is not None else layers_of(model)
    target = Path(out).expanduser().resolve()
    with atomic_dir(target, force=force) as tmp:
        _write(model, tokenizer, tmp, layers, record, extra_files or {})
        if finish is not None:
            finish(tmp)
    return target


def _write(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    d: Path,
    layers: list[DeciLayer],
    record: dict,
    extra_files: dict,
) -> None:
    config = deci_config(model.config, layers)
    model.save_pretrained(d, safe_serialization=True, max_shard_size=SHARD_SIZE)
    (d / "config.json").unlink()  # the live model's (the family's, or gac's), replaced by DeciLM's
    config.save_pretrained(d)
    if tokenizer is not None:
        tokenizer.save_pretrained(d)
    for name in CODE_FILES:
        shutil.copyfile(code_path(name), d / name)
    blocks = [b.to_dict() for b in config.block_configs or []]
    written = {
        **record,
        "gac_export": EXPORT_VERSION,
        "format": FORMAT,
        "code_sha256": {name: code_hash(d / name) for name in CODE_FILES},
        "layers": [{"mlp_width": x.mlp_width, "kv_heads": x.kv_heads, **b} for x, b in zip(layers, blocks)],
    }
    (d / EXPORT_FILE).write_text(json.dumps(written, indent=2) + "\n")
    for name, content in extra_files.items():
        mode = "wb" if isinstance(content, bytes) else "w"
        with open(d / name, mode) as f:
            f.write(content)


# ----------------------------------------------------------------------------------------------- read


def read_record(path: str | Path) -> dict:
    """gac_export.json of a DeciLM directory gac wrote (one line where it is missing, unreadable or not DeciLM's)."""
    record = read_json(Path(path) / EXPORT_FILE, EXPORT_FILE, "the model directory")
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise GacError(f"{path}: {EXPORT_FILE} is not gac's record of a DeciLM export: restore it or export again")
    return record


def check_code(path: str | Path, record: dict, *, allow_modified: bool = False) -> None:
    """The configuration and modeling code are the files gac wrote (their sha256 in gac_export.json): stock engines
    run them with trust_remote_code."""
    hashes = record.get("code_sha256") or {}
    for name in CODE_FILES:
        check_modeling_code(
            Path(path) / name, hashes.get(name), EXPORT_FILE, allow_modified=allow_modified, export_format=FORMAT
        )


def read_config(path: str | Path, *, allow_modified_code: bool = False) -> PretrainedConfig:
    """The gac config (gac_llama, with the gac structure of each layer's width and KV heads) of a DeciLM directory
    gac wrote, read without running its code: what gac.load builds the model from."""
    path = Path(path)
    record = read_record(path)
    check_code(path, record, allow_modified=allow_modified_code)
    raw = read_json(path / "config.json", "config.json", "the model directory")
    damaged = f"{path}: config.json is not the DeciLM config gac wrote: restore it or export again"
    if not isinstance(raw, dict) or not isinstance(raw.get("block_configs"), list):
        raise GacError(damaged)
    values = {k: v for k, v in raw.items() if k not in DECI_KEYS}
    try:
        config = gac_config_class("llama").from_dict(values)
        blocks = [BlockConfig(**b) for b in raw["block_configs"]]
        config.gac_structure = structure_of_blocks(config, blocks)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as e:
        raise GacError(f"{damaged} ({type(e).__name__}: {e})") from None
    return config


def structure_of_blocks(config: PretrainedConfig, blocks: list[BlockConfig]) -> dict:
    """config.gac_structure for DeciLM blocks (configuration_decilm.BlockConfig): each layer's projections of a width
    or KV heads other than the config's."""
    adapter = adapter_for(config)
    geo = adapter.geometry(config)
    hidden, inter = adapter.hidden_size(config), adapter.intermediate_size(config)
    q, kv = geo.num_heads * geo.head_dim, geo.num_kv_heads * geo.head_dim
    layers = adapter.layers(config)
    if len(blocks) != len(layers) or not all(b.plain() for b in blocks):
        raise ValueError(f"{len(blocks)} blocks for {len(layers)} layers, each an attention and an MLP")
    linear: dict[str, list[int]] = {}
    attention: dict[str, dict[str, int]] = {}
    for layer, block in zip(layers, blocks):
        kv_heads = block.kv_heads(geo.num_heads)
        if kv_heads < 1 or geo.num_heads % kv_heads:
            raise ValueError(f"layer {layer.index}: n_heads_in_group {block.attention.n_heads_in_group}")
        default = layer.shapes(hidden, q, kv, inter)
        sized = layer.shapes(hidden, q, kv_heads * geo.head_dim, block.mlp_width(hidden))
        linear |= {name: list(shape) for name, shape in sized.items() if shape != default[name]}
        if kv_heads != geo.num_kv_heads:
            attention[layer.attention] = {"num_heads": geo.num_heads, "num_kv_heads": kv_heads}
    return {k: v for k, v in (("linear", linear), ("attention", attention)) if v}
