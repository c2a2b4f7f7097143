"""Save a compressed model atomically (safetensors + config + plan + its own modeling code) and load it back."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gac import __version__
from gac.checkpoint import deci, verify
from gac.checkpoint.auto_classes import register_configs
from gac.checkpoint.placement import SHARD_SIZE, Placement, parse_max_memory
from gac.errors import GacError, first_line
from gac.hw.device import check_device, torch_dtype
from gac.io.atomic import atomic_dir
from gac.io.validate import read_json
from gac.models import modeling_gac
from gac.models.adapters import adapter_for
from gac.models.modeling_gac import family_of, gac_class, gac_config_class
from gac.models.structure import structure_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

PLAN_FILE = "gac_plan.json"
MODELING_FILE = "modeling_gac.py"
MODELING_HASH = "modeling_sha256"  # gac_plan.json: sha256 of the modeling_gac.py gac wrote
QUANTIZE_FILE = "quantize.json"  # beside a quantized model: what gac quantize quantized, and what not and why
PLAN_VERSION = 1


@dataclass
class LoadedModel:
    model: PreTrainedModel  # in eval mode
    tokenizer: PreTrainedTokenizerBase | None
    source: str  # what the user asked for


def versions() -> dict:
    """The versions recorded in report.json and gac_plan.json."""
    import torch
    import transformers

    return {"gac": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


def plan_record(
    *, variant: str | None, source_model: str | None, alignment: int | None, dims: dict | None, **extra: object
) -> dict:
    """The content of gac_plan.json, the one writer of its keys: variant ("gac", "unaligned", "repaired"),
    source_model, alignment, dims per group, versions, and what the verb adds (compressor, ratio, budget_params,
    strategy, overhead, profile, source_plan...)."""
    return {
        "gac_plan": PLAN_VERSION,
        "variant": variant,
        "source_model": source_model,
        "alignment": alignment,
        "dims": dims,
        "versions": versions(),
        **extra,
    }


def is_gac_dir(path: str | Path) -> bool:
    return (Path(path) / PLAN_FILE).is_file()


def check_out_dir(out_dir: str | Path, force: bool) -> Path:
    """Refuse an existing output unless --force (checked before any long work starts)."""
    out = Path(out_dir)
    if out.exists() and not force:
        raise GacError(f"output directory {out} already exists: choose another --out or pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise GacError(f"{out} exists and is not a directory: choose another --out")
    return out


def save(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    out_dir: str | Path,
    *,
    plan: dict,
    extra_files: dict | None = None,
    force: bool = False,
    max_shard_size: str | int = SHARD_SIZE,
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """Write the model to `out_dir` atomically: built in a sibling temp dir, then renamed into place. Weights are
    safetensors shards of at most `max_shard_size` with transformers' index (one file when they fit in one).

    The structure modeling_gac.py rebuilds on load is read off the live model (gac.models.structure).
    plan: plan_record(...), written as gac_plan.json.
    extra_files: {file name: str or bytes} written beside the model (report.json, report.md, plots).
    finish: called with the directory once all is written, before it takes its place (a quantized model's
    compressed-tensors config is written into config.json there).
    """
    out = check_out_dir(out_dir, force).resolve()
    with atomic_dir(out, force=force) as tmp:  # signal-safe: no hidden .partial or .old leftovers
        _write(model, tokenizer, tmp, plan, extra_files or {}, max_shard_size)
        if finish is not None:
            finish(tmp)
    return out


def write_beside_weights(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    d: str | Path,
    *,
    plan: dict,
    extra_files: dict | None = None,
) -> None:
    """Everything of a saved model but its weights (config with the structure, tokenizer, modeling code, plan,
    extra files) into directory `d`: for weights written layer by layer (gac.checkpoint.sharded)."""
    _write(model, tokenizer, Path(d), plan, extra_files or {}, weights=False)


def _write(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    d: Path,
    plan: dict,
    extra_files: dict,
    max_shard_size: str | int = SHARD_SIZE,
    weights: bool = True,
) -> None:
    model.config.gac_structure = structure_of(model)
    if weights:
        model.save_pretrained(d, safe_serialization=True, max_shard_size=max_shard_size)
    # after save_pretrained, which writes the live config: config.json gets gac's model type and class names
    saved_config(model.config).save_pretrained(d)
    if not weights and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(d)
    if tokenizer is not None:
        tokenizer.save_pretrained(d)
    shutil.copyfile(Path(modeling_gac.__file__), d / MODELING_FILE)  # the package data the saved model runs
    # what gac wrote, so that gac.load can refuse an edited copy (which trust_remote_code users would run)
    plan = {**plan, MODELING_HASH: verify.code_hash(d / MODELING_FILE)}
    (d / PLAN_FILE).write_text(json.dumps(plan, indent=2))
    for name, content in extra_files.items():
        mode = "wb" if isinstance(content, bytes) else "w"
        with open(d / name, mode) as f:
            f.write(content)


def saved_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config gac saves: the family's config as Gac<Config> (model_type gac_<family>, which transformers
    knows only through gac or the directory's modeling_gac.py, so the output never loads as the family's plain
    class with random factorized weights); `architectures` names gac's class, under which serving engines find
    gac's plugin (vLLM), never their own class for the original shapes; auto_map points trust_remote_code users
    without gac at the directory's modeling_gac.py."""
    saved = as_gac_config(config)
    name = gac_class(saved.model_type).__name__
    saved.architectures = [name]
    saved.auto_map = {
        "AutoConfig": f"modeling_gac.{type(saved).__name__}",
        "AutoModelForCausalLM": f"modeling_gac.{name}",
        "AutoModel": f"modeling_gac.{gac_class(saved.model_type, base_model=True).__name__}",
    }
    return saved


def as_gac_config(config: PretrainedConfig) -> PretrainedConfig:
    """`config` (the family's, or already gac's) as a new Gac<Config> of the same values."""
    values = {k: v for k, v in config.to_dict().items() if k != "model_type"}  # the class says which
    return gac_config_class(config.model_type).from_dict(values)


def read_config(path: Path) -> PretrainedConfig:
    """config.json as gac's config class, without running the directory's code: gac's model type (gac_<family>)
    and, for outputs of earlier gac versions, the family's own."""
    from transformers import AutoConfig

    register_configs()  # gac's model types, whatever the import order was
    try:
        config = AutoConfig.from_pretrained(path)  # registered classes: never the directory's modeling_gac.py
    except ValueError:  # a model type neither transformers nor gac knows (AutoConfig asks for remote code)
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
        raise GacError(
            f"{path}: unsupported model type {model_type!r} in config.json: pass a directory gac wrote "
            "for a family it supports, or restore its config.json"
        ) from None
    adapter_for(config)  # a supported family, or one line saying which are
    return as_gac_config(config)


def read_plan(path: str | Path) -> dict:
    try:
        plan = read_json(Path(path) / PLAN_FILE, PLAN_FILE, "the model directory")
    except GacError as e:
        raise GacError(f"{path} is not a readable gac model directory ({e}); pass a directory gac wrote") from None
    if not isinstance(plan, dict):
        raise GacError(f"{path}: {PLAN_FILE} is not a JSON object: restore it or re-run `gac compress`")
    return plan


def load(
    path: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    device_map: str | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | None = None,
    allow_modified_code: bool = False,
) -> LoadedModel:
    """Load a directory written by `save` (or a DeciLM directory `gac export --format deci` wrote): rebuild the
    compressed shapes from its config, then the weights, with gac's own classes: the directory's code is never run.

    device_map="auto" (with optional max_memory, accelerate's format or "cpu=8GiB,0=20GiB") places the model
    through accelerate over the GPUs, CPU and disk (offload_folder, a temporary directory by default) instead of
    loading it whole onto `device`. A modeling_gac.py that differs from the one gac wrote is refused (users of
    trust_remote_code would run it); allow_modified_code=True loads anyway, with a warning."""
    from transformers import AutoTokenizer

    path = Path(path)
    if deci.is_deci_dir(path):  # its code's hashes are in its own record, checked as it is read
        check_device(device)
        config = deci.read_config(path, allow_modified_code=allow_modified_code)
    else:
        plan = read_plan(path)
        check_device(device)
        verify.check_modeling_code(
            path / MODELING_FILE, plan.get(MODELING_HASH), PLAN_FILE, allow_modified=allow_modified_code
        )
        config = read_config(path)
    placement = Placement(device_map, parse_max_memory(max_memory), offload_folder)
    cls = gac_class(config.model_type)
    verify.check_structure(getattr(config, "gac_structure", None), str(path))
    verify.check_config(config, str(path))
    verify.check_weight_files(path)
    try:
        model, info = cls.from_pretrained(
            path,
            config=config,
            dtype=torch_dtype(dtype),
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # mismatches are reported below
            **placement_kwargs(placement),
        )
    except (AttributeError, KeyError, ValueError, TypeError, RuntimeError) as e:  # structure names no such module
        first = first_line(e, 200)
        raise GacError(
            f"{path}: gac_structure does not fit the {family_of(config.model_type)} model ({first}): the "
            "output is damaged or edited; restore it or re-run `gac compress`"
        ) from None
    verify.check_loading_info(info, str(path), gac_output=True)  # the structure must place every tensor, both ways
    model = model.eval() if placement.dispatched else model.to(device).eval()
    # a DeciLM directory's config names its code (auto_map): the tokenizer takes gac's reading of it instead
    config_given = {"config": config, "trust_remote_code": False} if deci.is_deci_dir(path) else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **config_given)
    except (OSError, ValueError):
        tokenizer = None
    verify.check_tokenizer_fits(model, tokenizer, str(path))
    verify.check_finite(model, str(path))
    return LoadedModel(model, tokenizer, str(path))


def placement_kwargs(placement: Placement) -> dict:
    """from_pretrained's placement arguments; a dispatched load without an offload folder gets a temporary one
    (removed at exit), so disk offload works without asking."""
    kwargs = placement.from_pretrained_kwargs()
    if placement.dispatched and "offload_folder" not in kwargs:
        import atexit
        import tempfile

        folder = tempfile.mkdtemp(prefix="gac-offload-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        kwargs["offload_folder"] = folder
    return kwargs
