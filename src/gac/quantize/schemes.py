"""The quantization schemes gac writes, as compressed-tensors schemes, and the options of a quantization run.

w4a16  int4 weights, symmetric, one scale per group of input channels (default 32); activations unquantized.
       compressed-tensors' pack-quantized format (weight_packed, weight_scale, weight_shape).
w8a8   int8 weights, symmetric, one scale per output channel; int8 activations, one scale per token computed
       at run time. compressed-tensors' int-quantized format (int8 weight, weight_scale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gac.errors import GacError
from gac.quantize.kernels import CHANNEL, DEVICES

if TYPE_CHECKING:
    from compressed_tensors.quantization import QuantizationScheme

SCHEMES = ("w4a16", "w8a8")
METHODS = ("rtn", "gptq")  # round to nearest (no data), or GPTQ (llm-compressor's, on calibration text)
DEFAULT_GROUP = 32  # w4a16: divides every width a vllm:w4a16 target makes (multiples of 32)


@dataclass(frozen=True)
class QuantizeConfig:
    """One quantization run: the scheme and how its scales are found, and the engine it must serve in."""

    scheme: str
    group: int | None = None  # w4a16: input channels per scale (-1: per output channel) [DEFAULT_GROUP]
    method: str = "gptq"
    skip_unfit: bool = False  # leave the linears the kernel refuses unquantized (listed) instead of refusing
    device: str = "cpu"  # the device vLLM will serve on, whose kernel rules the linears must meet
    tp: int = 1  # the tensor-parallel size it will serve at (the rules hold per rank)
    dtype: str = "float32"  # what the model computes in while calibrating, and its unquantized tensors' dtype
    # (bfloat16 halves what stays unquantized, but on a CPU without native bf16 GPTQ's passes run several times
    # slower)
    calib_windows: int = 16  # GPTQ: calibration windows of seq_len tokens
    seq_len: int = 512
    calib_file: str | None = None

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise GacError(f"unknown scheme {self.scheme!r}: choose one of {', '.join(SCHEMES)}")
        if self.method not in METHODS:
            raise GacError(f"unknown method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.device not in DEVICES:
            raise GacError(f"unknown serving device {self.device!r}: choose one of {', '.join(DEVICES)}")
        if self.scheme == "w8a8" and self.group not in (None, CHANNEL):
            raise GacError("w8a8 quantizes weights per output channel, without groups: leave out the group")
        if self.scheme == "w4a16":
            group = DEFAULT_GROUP if self.group is None else self.group
            if group != CHANNEL and group < 2:
                raise GacError(
                    f"group {group} is not a group size: pass a positive even number of input channels "
                    f"per scale, e.g. {DEFAULT_GROUP}, or -1 for one scale per output channel"
                )
            object.__setattr__(self, "group", group)
        if self.tp < 1:
            raise GacError(f"tensor parallel size {self.tp} is not valid: use 1 or more")

    @property
    def saved_dtype(self) -> str:
        """The checkpoint's dtype for what stays unquantized: w4a16's activations are 16-bit (vLLM's int4 GEMMs, on
        CPU and GPU, run in bfloat16 or float16 only), so a w4a16 run computed in float32 is saved in bfloat16."""
        return "bfloat16" if self.scheme == "w4a16" and self.dtype == "float32" else self.dtype

    @property
    def label(self) -> str:
        """e.g. w4a16-g32-gptq: what the report and the results name the run."""
        group = "" if self.scheme != "w4a16" else "-ch" if self.group == CHANNEL else f"-g{self.group}"
        return f"{self.scheme}{group}-{self.method}"


def scheme_args(cfg: QuantizeConfig) -> QuantizationScheme:
    """The compressed-tensors QuantizationScheme of `cfg`, targeting every Linear (vLLM's linears match by class
    name: ReplicatedLinear, ColumnParallelLinear, RowParallelLinear...)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    if cfg.scheme == "w4a16":
        weights = (
            QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="channel")
            if cfg.group == CHANNEL
            else QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=cfg.group)
        )
        return QuantizationScheme(targets=["Linear"], weights=weights)
    weights = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel")
    activations = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    return QuantizationScheme(targets=["Linear"], weights=weights, input_activations=activations)
