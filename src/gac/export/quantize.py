"""Quantization by llama.cpp's own quantizer (`llama_model_quantize` through the llama-cpp-python bindings), and the
per-tensor type report read back from the file: the type each tensor got and every fallback llama.cpp made
(a row length not divisible by the type's block), classified by cause."""

from __future__ import annotations

import ctypes
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from gac.errors import GacError
from gac.io.llama_log import collected_log

if TYPE_CHECKING:
    from gac.export.gguf_arch import Geometry

# --type -> llama.cpp's file type (enum llama_ftype); f16 is written directly, without the quantizer
FTYPES = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
}
INSTALL = "pip install 'gac[llamacpp]' (or `bash scripts/setup.sh llamacpp`)"
# llama.cpp's message (llama-quant.cpp, tensor_type_fallback), printed in pieces through its log callback
_FALLBACK = re.compile(
    r"warning: (\S+)\s+- ncols\s+(\d+) not divisible by\s+(\d+) \(required for type\s+(\S+)\)"
    r"[^\n]*?-> falling back to\s+(\S+)"
)


@dataclass(frozen=True)
class TensorType:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (the row length) first
    type: str  # what the file holds, e.g. "Q4_K", "Q5_0", "F16"
    wanted: str | None = None  # the type llama.cpp's mix chose before falling back (None: no fallback)
    cause: str | None = None  # "pruned width" | "hidden size" | "model shape": why the row length did not fit

    @property
    def row_length(self) -> int:
        return self.shape[0]


def check_type(type_: str) -> str:
    if type_ not in FTYPES:
        raise GacError(f"unknown GGUF type {type_!r}: choose one of {', '.join(FTYPES)}")
    return type_


def llama_cpp_module() -> ModuleType:
    """The llama_cpp bindings, or one line saying how to install them."""
    try:
        import llama_cpp
    except ImportError:
        raise GacError(f"quantizing needs llama.cpp's bindings (llama-cpp-python): {INSTALL}") from None
    return llama_cpp


def quantize(src: Path, dst: Path, type_: str, *, threads: int = 0) -> list[dict]:
    """Quantize the f16 GGUF `src` into `dst` with llama.cpp's mix for `type_`; returns the fallbacks llama.cpp
    reported: [{name, row_length, block, wanted, got}]."""
    llama_cpp = llama_cpp_module()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[check_type(type_)])
    params.nthread = threads
    with collected_log(llama_cpp) as messages:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        last = next((m.strip() for m in reversed(messages) if m.strip()), "no message")
        raise GacError(f"llama.cpp could not quantize {src.name} to {type_} ({last[:200]}): check the f16 export")
    text = "".join(messages)
    return [
        {"name": m[1], "row_length": int(m[2]), "block": int(m[3]), "wanted": m[4], "got": m[5]}
        for m in _FALLBACK.finditer(text)
    ]


def tensor_types(path: Path, fallbacks: list[dict], geo: Geometry) -> list[TensorType]:
    """Every tensor of the GGUF at `path` with its type, and for each fallback why its row length did not fit:
    a width gac or the compressor chose ("pruned width") or the unmodified model's own ("hidden size" when it is
    the hidden size, else "model shape"). geo: the exported model's Geometry."""
    import gguf

    by_name = {f["name"]: f for f in fallbacks}
    out = []
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(x) for x in t.shape)
        fb = by_name.get(t.name)
        wanted = cause = None
        if fb is not None:
            wanted = fb["wanted"].upper()
            if shape[0] != geo.original_row_length(t.name):
                cause = "pruned width"
            else:
                cause = "hidden size" if shape[0] == geo.hidden else "model shape"
        out.append(TensorType(t.name, shape, t.tensor_type.name, wanted, cause))
    return out


def type_report(types: list[TensorType], requested: str) -> dict:
    """The JSON report: counts by type, every fallback (with its cause), and every tensor."""
    counts = dict(Counter(t.type for t in types))
    fallbacks = [asdict(t) | {"row_length": t.row_length} for t in types if t.wanted is not None]
    by_cause = dict(Counter(f["cause"] for f in fallbacks))
    return {
        "requested": requested,
        "types": counts,
        "fallbacks": fallbacks,
        "fallbacks_by_cause": by_cause,
        "tensors": [{"name": t.name, "shape": list(t.shape), "type": t.type} for t in types],
    }
