"""Save a compressed model atomically (safetensors + config + plan + its own modeling code) and load it back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gac.errors import GacError

PLAN_FILE = "gac_plan.json"
MODELING_FILE = "modeling_gac.py"
PLAN_VERSION = 1


@dataclass
class LoadedModel:
    model: object  # transformers PreTrainedModel, in eval mode
    tokenizer: object
    source: str  # what the user asked for


def plan_record(*, variant: str, source_model: str, alignment: int | None, dims: dict, versions: dict | None = None,
                **extra) -> dict:
    """The content of gac_plan.json, the one writer of its keys: variant ("gac", "unaligned", "repaired"),
    source_model, alignment, dims per group, versions, and what the verb adds (compressor, ratio, budget_params,
    strategy, overhead, profile, source_plan...)."""
    if versions is None:
        import torch
        import transformers

        from gac import __version__

        versions = {"gac": __version__, "torch": torch.__version__, "transformers": transformers.__version__}
    return {"gac_plan": PLAN_VERSION, "variant": variant, "source_model": source_model, "alignment": alignment,
            "dims": dims, "versions": versions, **extra}


def is_gac_dir(path) -> bool:
    return (Path(path) / PLAN_FILE).is_file()


def check_out_dir(out_dir, force: bool) -> Path:
    """Refuse an existing output unless --force (checked before any long work starts)."""
    out = Path(out_dir)
    if out.exists() and not force:
        raise GacError(f"output directory {out} already exists: choose another --out or pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise GacError(f"{out} exists and is not a directory: choose another --out")
    return out


def save(model, tokenizer, out_dir, *, plan: dict, extra_files: dict | None = None, force: bool = False) -> Path:
    """Write the model to `out_dir` atomically: built in a sibling temp dir, then renamed into place.

    The structure modeling_gac.py rebuilds on load is read off the live model (gac.models.structure).
    plan: plan_record(...), written as gac_plan.json.
    extra_files: {file name: str or bytes} written beside the model (report.json, report.md, plots).
    """
    out = check_out_dir(out_dir, force).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        _write(model, tokenizer, tmp, plan, extra_files or {})
        if out.exists():  # --force: swap in the new directory, then drop the old one
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write(model, tokenizer, d: Path, plan: dict, extra_files: dict) -> None:
    from gac.models.modeling_gac import gac_class
    from gac.models.structure import structure_of

    config = model.config
    config.gac_structure = structure_of(model)
    name = gac_class(config.model_type).__name__
    config.auto_map = {"AutoModelForCausalLM": f"modeling_gac.{name}"}
    config.architectures = [name]
    model.save_pretrained(d, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(d)
    shutil.copyfile(Path(__file__).with_name(MODELING_FILE), d / MODELING_FILE)
    (d / PLAN_FILE).write_text(json.dumps(plan, indent=2))
    for name, content in extra_files.items():
        mode = "wb" if isinstance(content, bytes) else "w"
        with open(d / name, mode) as f:
            f.write(content)


def read_plan(path) -> dict:
    try:
        return json.loads((Path(path) / PLAN_FILE).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GacError(f"{path} is not a gac model directory ({PLAN_FILE} unreadable): pass a directory gac wrote") from e


def load(path, *, dtype: str = "float32", device: str = "cpu"):
    """Load a directory written by `save`: rebuild the compressed shapes from its config, then the weights."""
    from transformers import AutoConfig, AutoTokenizer

    from gac.hw.device import check_device, torch_dtype
    from gac.models.adapters import adapter_for
    from gac.models.modeling_gac import gac_class

    path = Path(path)
    read_plan(path)
    check_device(device)
    config = AutoConfig.from_pretrained(path)
    adapter_for(config)  # a supported family, or one line saying which are
    cls = gac_class(config.model_type)
    model = cls.from_pretrained(path, dtype=torch_dtype(dtype)).to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tokenizer = None
    return LoadedModel(model, tokenizer, str(path))
