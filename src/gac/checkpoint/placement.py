"""Where a big model's weights live: accelerate's device maps and per-device memory caps (`--device-map auto`,
`--max-memory cpu=8GiB,0=20GiB`), and the shard size of saved outputs. Parsing and checks only: placement itself is
accelerate's (through transformers' `from_pretrained(device_map=..., max_memory=..., offload_folder=...)`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gac.errors import ConfigError, literal

if TYPE_CHECKING:
    import torch
    from torch import nn

SHARD_SIZE = "2GB"  # max_shard_size of saved outputs (transformers' format: shards + model.safetensors.index.json)
DEVICE_MAPS = ("auto", "balanced", "sequential")


def parse_max_memory(spec: str | dict | None) -> dict | None:
    """accelerate's max_memory {device: bytes} from "cpu=8GiB,0=20GiB" (GPU indices as integers, "disk" allowed),
    or None. A bad entry is one line naming the format."""
    if spec is None or (isinstance(spec, dict) and not spec):
        return None
    from accelerate.utils import convert_file_size_to_int

    pairs = (
        spec.items()
        if isinstance(spec, dict)
        else (part.partition("=")[::2] for part in str(spec).split(",") if part.strip())
    )
    out = {}
    for device, size in pairs:
        device = str(device).strip()
        key = int(device) if device.isdigit() else device
        if not (isinstance(key, int) or key in ("cpu", "disk", "mps")) and not device.startswith("cuda:"):
            raise ConfigError(
                f"bad {{max_memory}} device {literal(repr(device))}: use cpu, disk or a GPU index, "
                "e.g. cpu=8GiB,0=20GiB"
            )
        if device.startswith("cuda:") and device[5:].isdigit():
            key = int(device[5:])
        size = str(size).strip()
        try:
            out[key] = int(size) if size.isdigit() else convert_file_size_to_int(size)  # bytes, or 8GiB, 500MB
        except (ValueError, TypeError, AttributeError):
            out[key] = -1
        if out[key] <= 0:
            raise ConfigError(
                f"bad {{max_memory}} size {literal(repr(size))} for {literal(device)}: use a size such as 8GiB or "
                "500MB, e.g. cpu=8GiB,0=20GiB"
            )
    if not out:
        raise ConfigError(f"bad {{max_memory}} {literal(repr(spec))}: use device=size pairs, e.g. cpu=8GiB,0=20GiB")
    return out


@dataclass(frozen=True)
class Placement:
    """How to place a model's weights on load: None = all on one `device` (gac's default); "auto" (or balanced,
    sequential) = accelerate's dispatch over GPUs, CPU and disk within `max_memory`, offloading the rest to
    `offload_folder` (a temporary directory when none is given)."""

    device_map: str | None = None
    max_memory: dict | None = None  # {0: bytes, "cpu": bytes, ...}, accelerate's format (a string is parsed)
    offload_folder: str | None = None

    def __post_init__(self) -> None:
        if self.device_map is not None and self.device_map not in DEVICE_MAPS:
            raise ConfigError(
                f"unknown {{device_map}} {literal(repr(self.device_map))}: use one of {', '.join(DEVICE_MAPS)}"
            )
        object.__setattr__(self, "max_memory", parse_max_memory(self.max_memory))
        if self.device_map is None and (self.max_memory is not None or self.offload_folder is not None):
            given = "{max_memory}" if self.max_memory is not None else "{offload_folder}"
            raise ConfigError(
                f"{given} places a model through accelerate and needs {{device_map}}: pass {{device_map:auto}} as "
                "well, or leave it out"
            )
        if self.max_memory is not None:
            import torch

            gpus = sorted(k for k in self.max_memory if isinstance(k, int) and k >= torch.cuda.device_count())
            if gpus:
                raise ConfigError(
                    f"{{max_memory}} names GPU {gpus[0]} but this machine has {torch.cuda.device_count()} "
                    "CUDA device(s): give sizes for cpu, disk and the GPUs present, e.g. cpu=8GiB"
                )

    @property
    def dispatched(self) -> bool:
        return self.device_map is not None

    def from_pretrained_kwargs(self) -> dict:
        """The keyword arguments of transformers' from_pretrained for this placement ({} for one device)."""
        if not self.dispatched:
            return {}
        kwargs: dict[str, object] = {"device_map": self.device_map}
        if self.max_memory is not None:
            kwargs["max_memory"] = dict(self.max_memory)
        if self.offload_folder is not None:
            kwargs["offload_folder"] = self.offload_folder
        return kwargs


def input_device(model: nn.Module) -> torch.device:
    """The device the model's inputs go to: the embeddings' (a dispatched model's first parameters may be on
    `meta` while offloaded), else the first parameter's."""
    import torch

    embeddings = getattr(model, "get_input_embeddings", None)
    emb = embeddings() if embeddings is not None else None
    weight = getattr(emb, "weight", None)
    if weight is not None and weight.device.type != "meta":
        return weight.device
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate's hooks run inside the model's forward (moving tensors between devices, reading
    offloaded weights): such a forward cannot be captured in a CUDA graph and is timed eagerly."""
    return any(hasattr(m, "_hf_hook") for m in model.modules())


def placement_summary(model: nn.Module) -> dict | None:
    """Where accelerate put a model: {"modules": {device: n}, "params": {device: n}} from its hf_device_map
    (devices "cuda:N", "cpu", "disk"; modules at accelerate's granularity, parameters counted under the longest
    mapped prefix), or None for a model loaded whole onto one device."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return None

    def name(where: int | str) -> str:
        return f"cuda:{where}" if isinstance(where, int) else str(where)

    modules: dict[str, int] = {}
    for where in device_map.values():
        modules[name(where)] = modules.get(name(where), 0) + 1
    prefixes = sorted(device_map, key=len, reverse=True)  # longest first: the most specific entry wins
    params: dict[str, int] = {}
    for pname, p in model.named_parameters():
        key = next((k for k in prefixes if k == "" or pname == k or pname.startswith(k + ".")), None)
        if key is not None:
            params[name(device_map[key])] = params.get(name(device_map[key]), 0) + p.numel()
    return {"modules": modules, "params": params}
