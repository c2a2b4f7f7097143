"""Option types whose bad values fail at parse time, before any work, as one line naming the fix; and the flags that
the library's configuration fields are given as (CONFIG_FLAGS), which the CLI's errors name them by."""

from __future__ import annotations

from typing import Any

import click

from gac.errors import ConfigError, GacError
from gac.io.validate import real

# a config field (or one setting of it) -> the option that sets it: a ConfigError names fields, the CLI its flags
CONFIG_FLAGS = {
    "ratio": "--ratio",
    "speedup": "--speedup",
    "alignment": "--align",
    "align=False": "--no-align",
    "profile": "--profile",
    "target": "--target",
    "pipeline": "--pipeline",
    "pipeline=layerwise": "--layerwise",
    "max_memory": "--max-memory",
    "device_map": "--device-map",
    "offload_folder": "--offload-folder",
    "device": "--device",
    "dist_timeout_s": "--dist-timeout",
    "heal": "--heal",
    "quantize": "--quantize",
    "compressor": "--compressor",
    "dtype": "--dtype",
    "drop_experts": "--drop-experts",
    "layers": "--prune-layers",
    "head_mode": "--head-mode",
    "alpha": "--alpha",
    "importance": "--importance",
    "group_size": "--group-size",
    "param_cap": "--param-cap",
    "margin": "--margin",
    "phase": "--phase",
    "shape": "--shape",
    "retime=True": "--retime",
    "guard=False": "--no-guard",
    "seq_len": "--seq-len",
    "calib_windows": "--calib-windows",
    "eval_windows": "--eval-windows",
    "calib_file": "--calib-file",
    "unlike_file": "--unlike-file",
    "prefill_tokens": "--prefill-tokens",
    "original": "--original",
    "heal_file": "--heal-file",
    "samples": "--heal-samples",
    "distill.tokens": "--heal-tokens",
    "distill.batch": "--heal-batch",
    "distill.lr": "--heal-lr",
    "distill.train": "--heal-train",
    "distill.precision": "--heal-precision",
    "distill.hidden_weight": "--hidden-weight",
    "distill.ce_weight": "--ce-weight",
    "group": "--group",
    "skip_unfit=True": "--skip-unfit",
    "format": "--format",
    "type": "--type",
    "report": "--report",
    "pad_mlp=True": "--pad-mlp",
}


def in_flags(e: GacError) -> str:
    """A library error as the CLI words it: a ConfigError's fields named by their flags (CONFIG_FLAGS)."""
    return e.worded(CONFIG_FLAGS) if isinstance(e, ConfigError) else str(e)


class Int(click.ParamType):
    """An integer in [minimum, maximum]; `hint` (optional) replaces the generic advice."""

    name = "integer"

    def __init__(self, minimum: int = 1, maximum: int | None = None, *, example: int, hint: str = ""):
        self.minimum, self.maximum, self.example, self.hint = minimum, maximum, example, hint

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        flag = param.opts[0] if param is not None and param.opts else "value"
        try:
            number = value if isinstance(value, int) else int(str(value).strip(), 10)
        except ValueError:
            number = None
        if number is not None and number >= self.minimum and (self.maximum is None or number <= self.maximum):
            return number
        limits = f">= {self.minimum}" if self.maximum is None else f"from {self.minimum} to {self.maximum}"
        hint = self.hint or f"give an integer {limits}, e.g. {flag} {self.example}"
        raise GacError(f"bad {flag} {value!r}: {hint}")


class Real(click.ParamType):
    """A finite float in the open interval (low, high)."""

    name = "number"

    def __init__(self, low: float | None = None, high: float | None = None, *, example: float, what: str = ""):
        self.low, self.high, self.example, self.what = low, high, example, what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        flag = param.opts[0] if param is not None and param.opts else "value"
        return real(value, flag, low=self.low, high=self.high, example=self.example)
