"""Devices and dtypes: the one place that checks a device string, names a dtype and names the hardware."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TYPE_CHECKING

from gac.errors import ConfigError, GacError, literal

if TYPE_CHECKING:
    import torch

# the default multiple every dim is aligned to: 8 elements is the 16 bytes that 16-bit tensor-core GEMMs (and SIMD
# rows on CPUs) read at once; `--align`, a profile or a --target chooses another
ALIGNMENT = 8

DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype for "float32" | "bfloat16" | "float16" (or a torch dtype)."""
    import torch

    return getattr(torch, dtype_name(name))


def dtype_name(dtype: str | torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise GacError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return name


def check_device(device: str | torch.device) -> torch.device:
    """The torch.device for `device`, or GacError when it is unknown or absent here."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise GacError(f"unknown device {device!r}: use cpu or cuda[:N]") from None
    if dev.type not in ("cpu", "cuda"):
        raise GacError(f"unknown device {device!r} (gac runs on cpu and cuda): use cpu or cuda[:N]")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {literal(repr(device))} asked for but CUDA is not available here (torch "
            f"{literal(torch.__version__)}): use {{device:cpu}}"
        )
    return dev


def device_name(device: str | torch.device) -> str:
    """GPU name from torch, CPU model from /proc/cpuinfo (or platform)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def default_dtype(device: str | torch.device) -> str:
    """bfloat16 on CUDA (tensor cores, the dtype models are served in), float32 elsewhere."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"
