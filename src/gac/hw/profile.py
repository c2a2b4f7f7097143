"""Hardware profile: kernel latency swept over dims on this device (GEMM N/K, SDPA head dim, low-rank pair, and
for the latency model's groups SDPA query heads and an MoE layer's experts at their width).

Writes/reads the profile JSON ({"gac_profile": 1, ...}) and caches it per device name, dtype and torch version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import os
import re
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gac.errors import GacError
from gac.hw.device import check_device, device_name, dtype_name, torch_dtype
from gac.hw.experts import ExpertsKernel
from gac.hw.profile_schema import check_profile
from gac.hw.timing import cpu_threads, time_callable, time_interleaved
from gac.io.atomic import write_text
from gac.io.validate import read_json

if TYPE_CHECKING:
    from tqdm import tqdm

logger = logging.getLogger(__name__)

PROFILE_VERSION = 1
OPS = ("gemm_n", "gemm_k", "sdpa", "lowrank")  # a default sweep
# sdpa_heads: swept over query heads, sized by the latency model's head groups; experts: an MoE layer's experts
# forward (gac.hw.experts) swept over the expert width, sized by the experts kind's groups
# quantized GEMMs, X [M, K] @ W [N, K]^T as the engines' int8 and fp8 kernels run them (torch._int_mm,
# torch._scaled_mm with per-tensor scales): a shape the kernel refuses is recorded as refused, with its reason
QUANTIZED_OPS = ("int8_n", "int8_k", "fp8_n", "fp8_k")
ALL_OPS = (*OPS, "sdpa_heads", "experts", *QUANTIZED_OPS)
SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")  # tried in this order
MAX_HEAD_DIM = 1024  # above any model's attention head (usually 64-256); catches GEMM ranges given as head dims
CUDA_CHUNK = 32  # dims timed round-robin together on CUDA, each with input sets over twice the L2
# How a sweep lays out its operands, recorded in the profile; the caches measure again a sweep made another way.
# 2: on CPU too, a chunk's input sets together exceed twice the last-level cache (1: one set per dim on CPU, which
# timed decode GEMVs from cache, faster than the model runs them from memory)
SWEEP_METHOD = 2
CPU_ROTATION_CAP = 2 << 30  # bytes of input sets per chunk at most on CPU, whatever cache size the host reports
# Bytes of input sets (copies included) a chunk holds at most, one dim at least: an MoE layer's experts are up to GiBs
# per dim (Qwen3-30B-A3B's at width 768: 1.1 GiB in bfloat16), and a chunk's dims are all built before any is timed.
CHUNK_BYTES = 4 << 30


@dataclass(frozen=True)
class FixedSizes:
    """The sizes held fixed while one dim is swept."""

    hidden: int = 1024  # K of gemm_n, N of gemm_k
    lowrank_in: int = 1024
    lowrank_out: int = 1024
    batch: int = 1  # sdpa
    heads: int = 8
    context: int = 512  # sdpa key/value length for decode (m=1); prefill attends over its own m tokens
    # sdpa_heads (None: unused, left out of the spec's JSON so older specs and their caches keep their keys)
    head_dim: int | None = None
    kv_heads: int | None = None  # fixed KV heads (query heads cut within each KV group) ...
    q_per_kv: int | None = None  # ... or KV heads = query heads / q_per_kv (whole KV groups cut); neither: MHA
    # experts, over `hidden` (None: unused, as above)
    experts: int | None = None  # experts in the layer
    top_k: int | None = None  # experts routed per token

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            if value is not None and (int(value) != value or value < 1):
                raise GacError(f"{name} must be a positive integer, got {value!r}")
        if self.kv_heads is not None and self.q_per_kv is not None:
            raise GacError("give SDPA's kv_heads or q_per_kv, not both")
        if self.experts is not None and self.top_k is not None and self.top_k > self.experts:
            raise GacError(
                f"top_k {self.top_k} is more than the {self.experts} experts: a token is routed to at "
                "most every expert, e.g. --experts 128 --top-k 8"
            )

    @classmethod
    def of(cls, op: str, shape: Mapping[str, int]) -> FixedSizes | None:
        """The sizes that make the `op` sweep measure a unit of this shape (a unit's profile_shape, or a latency
        term's: "in"/"out" of a low-rank pair, "k" of gemm_n, "n" of gemm_k, SDPA heads' "head_dim" and "kv_heads"
        or "q_per_kv", the experts' "hidden", "experts" and "top_k"); None for an op that a shape does not size.
        SDPA's batch and KV length are the caller's."""
        if op == "lowrank":
            return cls(lowrank_in=shape["in"], lowrank_out=shape["out"])
        if op == "gemm_n":
            return cls(hidden=shape["k"])
        if op == "gemm_k":
            return cls(hidden=shape["n"])
        if op == "sdpa_heads":
            return cls(head_dim=shape["head_dim"], kv_heads=shape.get("kv_heads"), q_per_kv=shape.get("q_per_kv"))
        if op == "experts":
            return cls(hidden=shape["hidden"], experts=shape["experts"], top_k=shape["top_k"])
        return None


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep: ops, dims (head dims for sdpa), token counts M, fixed sizes and timing effort."""

    ops: tuple[str, ...] = OPS
    dims: tuple[int, ...] = tuple(range(64, 513))
    head_dims: tuple[int, ...] = tuple(range(64, 129))
    m_values: tuple[int, ...] = (512, 1)  # prefill tokens, then decode (GEMV)
    sizes: FixedSizes = field(default_factory=FixedSizes)
    warmup: int = 3
    repeats: int = 15
    threads: int | None = None  # None: torch's current count, recorded in the profile
    buffers: int = 4  # input copies rotated on GPU so caches do not flatter small shapes
    chunk: int = 64  # dims timed round-robin together (bounded so memory stays small)

    def __post_init__(self) -> None:
        unknown = set(self.ops) - set(ALL_OPS)
        if unknown or not self.ops:
            raise GacError(f"unknown op(s) {sorted(unknown)}; choose from {', '.join(ALL_OPS)}")
        for name in ("dims", "head_dims", "m_values"):
            values = getattr(self, name)
            if not values or any(int(v) != v or v < 1 for v in values):
                raise GacError(f"{name} must be a non-empty list of positive integers, got {list(values)[:8]}")
        if max(self.head_dims) > MAX_HEAD_DIM:
            raise GacError(
                f"SDPA head_dim {max(self.head_dims)} is not supported (at most {MAX_HEAD_DIM}): sweep "
                "head dims with e.g. --head-dims 64:256:8 and GEMM dims with --dims"
            )
        if self.repeats < 1 or self.warmup < 0 or self.buffers < 1 or self.chunk < 1:
            raise GacError("repeats, buffers and chunk must be >= 1 and warmup >= 0")
        if "sdpa_heads" in self.ops:
            kv_unit = self.sizes.kv_heads or self.sizes.q_per_kv or 1
            if self.sizes.head_dim is None or any(h % kv_unit for h in self.dims):
                raise GacError(
                    f"an SDPA heads sweep needs a head_dim and query heads that are multiples of "
                    f"{kv_unit} (the KV heads or query heads per KV head), got {list(self.dims)[:8]}"
                )
        if "experts" in self.ops and None in (self.sizes.experts, self.sizes.top_k):
            raise GacError(
                "an experts sweep needs the layer's experts and experts per token: give them, e.g. "
                "--experts 128 --top-k 8 (and its --hidden)"
            )

    @classmethod
    def quick(cls, m: int = 1024) -> SweepSpec:
        """Seconds on a small CPU: dims 96..128 at M=m and M=1, K=N=1024, head dims 64..128 step 8."""
        return cls(dims=tuple(range(96, 129)), head_dims=tuple(range(64, 129, 8)), m_values=(m, 1), repeats=15)

    def to_json(self) -> dict:
        """Tuples as lists, as stored in a profile; unused (None) sizes left out."""
        d = dataclasses.asdict(self)
        d["sizes"] = {k: v for k, v in d["sizes"].items() if v is not None}
        return json.loads(json.dumps(d))


# ---- sweeps ------------------------------------------------------------------------------------------------


def _gemm(op: str) -> str:
    """The float GEMM a quantized op sweeps the same way (int8_n: gemm_n's shapes), or `op` itself."""
    return f"gemm_{op[-1]}" if op in QUANTIZED_OPS else op


def _input_dtype(op: str, dtype: torch.dtype) -> torch.dtype:
    return {"int8": torch.int8, "fp8": torch.float8_e4m3fn}.get(op.partition("_")[0], dtype)


def _entry_shape(op: str, m: int, sizes: FixedSizes) -> dict[str, int]:
    op = _gemm(op)
    if op == "gemm_n":
        return {"k": sizes.hidden}
    if op == "gemm_k":
        return {"n": sizes.hidden}
    if op == "lowrank":
        return {"in": sizes.lowrank_in, "out": sizes.lowrank_out}
    if op == "experts":
        return {
            "hidden": sizes.hidden,
            "experts": _given(sizes.experts, "experts"),
            "top_k": _given(sizes.top_k, "top_k"),
        }
    seq = m if m > 1 else sizes.context
    if op == "sdpa_heads":
        kv = {"kv_heads": sizes.kv_heads} if sizes.kv_heads else {"q_per_kv": sizes.q_per_kv or 1}
        return {"batch": sizes.batch, "head_dim": _given(sizes.head_dim, "head_dim"), "seq": seq, **kv}
    return {"batch": sizes.batch, "heads": sizes.heads, "seq": seq}


def _given(size: int | None, name: str) -> int:
    """A size the sweep needs, which SweepSpec's checks have already required."""
    if size is None:
        raise GacError(f"this sweep needs its {name}: give it in the sweep's sizes")
    return size


def _tensor_shapes(op: str, m: int, dim: int, shape: Mapping[str, int]) -> list[tuple[int, ...]]:
    op = _gemm(op)
    if op == "gemm_n":
        return [(m, shape["k"]), (dim, shape["k"])]  # X [M, K], W [N=dim, K]
    if op == "gemm_k":
        return [(m, dim), (shape["n"], dim)]  # X [M, K=dim], W [N, K=dim]
    if op == "lowrank":
        return [(m, shape["in"]), (dim, shape["in"]), (shape["out"], dim)]  # X [M, in], A [r, in], B [out, r]
    if op == "experts":  # dim: expert width; X [M, H], gate_up [E, 2w, H], down [E, H, w]
        e, h = shape["experts"], shape["hidden"]
        return [(m, h), (e, 2 * dim, h), (e, h, dim)]
    b, s = shape["batch"], shape["seq"]
    if op == "sdpa_heads":  # dim: query heads
        kv, d = shape.get("kv_heads") or dim // shape["q_per_kv"], shape["head_dim"]
        return [(b, dim, m, d), (b, kv, s, d), (b, kv, s, d)]  # q [B, H, M, D], k and v [B, H_kv, S, D]
    return [(b, shape["heads"], m, dim), *2 * [(b, shape["heads"], s, dim)]]  # q [B, H, M, D], k and v [B, H, S, D]


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA as a model runs it: with grouped KV heads, torch's GQA (2.5+) or KV heads repeated, as transformers
    does on older torch."""
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if torch.__version__ >= "2.5":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))  # pragma: no cover - torch < 2.5
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _kernel(
    op: str, m: int, dim: int, shape: Mapping[str, int], *, device: torch.device, dtype: torch.dtype
) -> Callable[..., torch.Tensor]:
    """The op at one swept dim, called on an input set of _tensor_shapes."""
    if op.startswith("int8_"):
        return lambda x, w: torch._int_mm(x, w.t())  # int32 [M, N]
    if op.startswith("fp8_"):
        one = torch.ones((), device=device)
        return lambda x, w: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if op in ("gemm_n", "gemm_k"):
        return F.linear  # Y [M, N] = X [M, K] @ W[N, K]^T
    if op == "lowrank":
        return lambda x, a, b: F.linear(F.linear(x, a), b)  # [M, in] -> [M, r] -> [M, out]
    if op == "experts":
        return ExpertsKernel(m, dim, shape, device, dtype)  # [M, H] -> [M, H]
    causal = m == shape["seq"] and m > 1  # prefill attends over its own tokens, decode over the KV cache
    return lambda q, k, v: _attention(q, k, v, causal)  # [B, H, M, D]


def _backend(op: str, kernel: Callable, args: tuple, device: torch.device) -> str | None:
    """What runs the op on these inputs, recorded per dim: SDPA's backend, the experts implementation; None for a
    plain GEMM."""
    if op in ("sdpa", "sdpa_heads"):
        return _first_sdpa_backend(kernel, args, device)
    return cast(ExpertsKernel, kernel).fit(args) if op == "experts" else None  # _kernel's for "experts"


def _sdpa_context(backend: str | None) -> contextlib.AbstractContextManager[None]:
    """Pin an SDPA backend by name for the calls inside; no-op for any other backend (None, 'cpu', an experts
    implementation)."""
    if backend is None or backend not in SDPA_BACKENDS:
        return contextlib.nullcontext()
    return sdpa_kernel(getattr(SDPBackend, backend))


def _first_sdpa_backend(fn: Callable, args: tuple, device: torch.device) -> str:
    """On CUDA, the first SDPA backend that runs these inputs (flash, efficient, cuDNN, math); on CPU, 'cpu'."""
    if device.type != "cuda":
        return "cpu"
    for name in SDPA_BACKENDS:
        if not hasattr(SDPBackend, name):
            continue
        try:
            with warnings.catch_warnings(), _sdpa_context(name), torch.inference_mode():
                warnings.simplefilter("ignore")  # each refusing backend warns why
                fn(*args)
            torch.cuda.synchronize(device)
            return name
        except (RuntimeError, NotImplementedError):
            continue
    raise GacError(f"no SDPA backend runs head dim {args[0].shape[-1]} on this GPU")


@dataclass(frozen=True)
class _Point:
    """One swept dim of one op entry: a callable that rotates through its input buffers."""

    fn: Callable[[], object]
    backend: str | None
    copies: int


MAX_COPIES = 256


def _set_bytes(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> int:
    return sum(torch.Size(s).numel() for s in shapes) * torch.empty((), dtype=dtype).element_size()


def _copies(shapes: list[tuple[int, ...]], device: torch.device, dtype: torch.dtype, buffers: int) -> int:
    """Input sets to rotate through on CUDA: enough that together they exceed twice the L2 cache, so every call
    reads its operands from device memory as a real model's layers do (cached weights would flatter small M)."""
    if device.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    return int(min(MAX_COPIES, max(buffers, -(-2 * l2 // max(_set_bytes(shapes, dtype), 1)) + 1)))


@functools.cache
def last_level_cache_bytes() -> int:
    """The CPU's largest cache in bytes, from Linux's sysfs (read once per process); 32 MiB where it cannot be
    read."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            match = re.fullmatch(r"(\d+)([KMG]?)", f.read_text().strip())
        except OSError:
            continue
        if match is None:
            continue
        number, unit = match.groups()
        sizes.append(int(number) << {"": 0, "K": 10, "M": 20, "G": 30}[unit])
    return max(sizes, default=32 << 20)


def cpu_chunk_copies(chunk_bytes: int, llc_bytes: int | None = None) -> int:
    """Input sets per dim on CPU for a chunk whose dims' sets take `chunk_bytes`: the dims are timed round-robin, so
    a set comes back after every other dim's, and with this many copies of each the chunk's operands together
    exceed twice the last-level cache (at most CPU_ROTATION_CAP bytes): every call reads its operands from memory,
    as the model's layers do with 400+ MiB of weights streaming through."""
    llc = last_level_cache_bytes() if llc_bytes is None else llc_bytes
    want = min(2 * llc, CPU_ROTATION_CAP)
    return int(min(MAX_COPIES, max(1, -(-want // max(chunk_bytes, 1)))))


def _build_point(
    op: str,
    m: int,
    dim: int,
    shape: Mapping[str, int],
    *,
    device: torch.device,
    dtype: torch.dtype,
    buffers: int,
    gen: torch.Generator,
    copies: int | None = None,
) -> _Point:
    """`copies` input sets (default: _copies), the first random, the rest its clones (the values do not matter to
    the time, only that each copy has its own memory)."""
    shapes = _tensor_shapes(op, m, dim, shape)
    copies = _copies(shapes, device, _input_dtype(op, dtype), buffers) if copies is None else copies
    first = tuple(_random(s, gen, device, dtype, _input_dtype(op, dtype)) for s in shapes)
    inputs = [first, *(tuple(t.clone() for t in first) for _ in range(copies - 1))]
    kernel = _kernel(op, m, dim, shape, device=device, dtype=dtype)
    backend = _backend(op, kernel, inputs[0], device)
    state = {"i": 0}

    def call() -> object:
        state["i"] = (state["i"] + 1) % copies
        return kernel(*inputs[state["i"]])

    return _Point(call, backend, copies)


def _random(
    shape: tuple[int, ...], gen: torch.Generator, device: torch.device, dtype: torch.dtype, input_dtype: torch.dtype
) -> torch.Tensor:
    if input_dtype == torch.int8:
        return torch.randint(-128, 128, shape, generator=gen, device=device, dtype=torch.int8)
    x = torch.randn(shape, generator=gen, device=device, dtype=dtype if input_dtype == dtype else torch.float32)
    return x.to(input_dtype)


def _refusal(op: str, point: _Point) -> str | None:
    """Why a quantized kernel refuses this shape (its first error line), or None; float ops take every shape."""
    if op not in QUANTIZED_OPS:
        return None
    try:
        point.fn()
    except RuntimeError as e:
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return None


def _entries(spec: SweepSpec) -> list[tuple[str, int, tuple[int, ...]]]:
    return [(op, m, spec.head_dims if op == "sdpa" else spec.dims) for op in spec.ops for m in spec.m_values]


def _chunk_size(
    op: str,
    m: int,
    dims: tuple[int, ...],
    shape: Mapping[str, int],
    spec: SweepSpec,
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> int:
    """Dims timed round-robin together: spec.chunk (CUDA_CHUNK at most on CUDA), fewer where the largest dim's input
    sets (its CUDA copies included; on CPU a chunk this large gets one copy per dim) would pass CHUNK_BYTES."""
    shapes = _tensor_shapes(op, m, max(dims), shape)
    dtype = _input_dtype(op, dtype)
    copies = _copies(shapes, device, dtype, spec.buffers)
    size = min(spec.chunk, CUDA_CHUNK) if device.type == "cuda" else spec.chunk
    return max(1, min(size, CHUNK_BYTES // (copies * _set_bytes(shapes, dtype))))


def _sweep_entry(
    op: str,
    m: int,
    dims: tuple[int, ...],
    spec: SweepSpec,
    *,
    device: torch.device,
    dtype: torch.dtype,
    gen: torch.Generator,
    bar: tqdm,
) -> dict[str, Any]:
    shape = _entry_shape(op, m, spec.sizes)
    ms: list[float | None] = []
    p10: list[float | None] = []
    p90: list[float | None] = []
    backends: list[str | None] = []
    methods: set[str] = set()
    n_copies: set[int] = set()
    refused: dict[str, str] = {}  # {dim: why} of the shapes a quantized kernel refused
    chunk_size = _chunk_size(op, m, dims, shape, spec, device=device, dtype=dtype)  # bounded memory
    for start in range(0, len(dims), chunk_size):
        chunk = dims[start : start + chunk_size]
        copies = None  # CUDA: per dim (_copies)
        if device.type == "cpu":
            copies = cpu_chunk_copies(
                sum(_set_bytes(_tensor_shapes(op, m, d, shape), _input_dtype(op, dtype)) for d in chunk)
            )
        points = {
            d: _build_point(op, m, d, shape, device=device, dtype=dtype, buffers=spec.buffers, gen=gen, copies=copies)
            for d in chunk
        }
        for d in list(points):
            if (why := _refusal(op, points[d])) is not None:
                refused[str(d)] = why
                del points[d]
        by_backend: dict[str | None, dict[str, Callable]] = {}
        for d, p in points.items():
            by_backend.setdefault(p.backend, {})[str(d)] = p.fn
        timings = {}
        # On CUDA a sample is one replay of a CUDA graph holding a call on every input set (at least 8 calls),
        # divided by the calls: the launch cost is amortized and the events time the kernels.
        graph_calls = max(8, max(p.copies for p in points.values())) if device.type == "cuda" else 0
        for backend, fns in by_backend.items():  # pinned once per group, outside the timed calls
            with _sdpa_context(backend):
                timings.update(
                    time_interleaved(
                        fns, device=device, warmup=spec.warmup, rounds=spec.repeats, graph_calls=graph_calls
                    )
                )
        n_copies.update(p.copies for p in points.values())
        for d in chunk:
            if str(d) in refused:  # no time: the kernel does not run this shape
                ms.append(None)
                p10.append(None)
                p90.append(None)
                backends.append(None)
                continue
            t = timings[str(d)]
            methods.add(t.method)
            ms.append(round(t.median_ms, 6))
            p10.append(round(t.p10_ms, 6))
            p90.append(round(t.p90_ms, 6))
            backends.append(points[d].backend)
        del points, by_backend  # free this chunk's input sets before the next is built
        bar.update(len(chunk))
    entry = {
        "op": op,
        "shape": shape,
        "m": m,
        "backend": max(set(backends), key=backends.count),
        "dims": list(dims),
        "ms": ms,
        "p10_ms": p10,
        "p90_ms": p90,
        "timing": "+".join(sorted(methods)),
        "copies": max(n_copies, default=0),
    }  # input sets rotated per dim (the most of any chunk)
    if refused:
        entry["refused"] = refused
    if len(set(backends)) > 1:
        entry["backends"] = backends  # per dim, when the SDPA backend changes along the sweep
    return entry


def _estimate_s(spec: SweepSpec, *, device: torch.device, dtype: torch.dtype, gen: torch.Generator) -> float:
    """Seconds the sweep should take, from timing the middle point of each op entry once."""
    total = 0.0
    for op, m, dims in _entries(spec):
        point = _build_point(
            op, m, dims[len(dims) // 2], _entry_shape(op, m, spec.sizes), device=device, dtype=dtype, buffers=1, gen=gen
        )
        if _refusal(op, point) is not None:
            continue  # a shape the kernel refuses takes no time
        per_call = time_callable(point.fn, device=device, warmup=1, repeats=2).median_ms
        total += per_call / 1e3 * len(dims) * (spec.warmup + spec.repeats)
    return total


def _busy_cores(interval_s: float = 0.25) -> float | None:
    """Cores kept busy by other processes right now (from /proc/stat over a short interval); None off Linux."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]  # user nice system idle iowait irq ...
        return sum(values), values[3] + values[4]

    try:
        total0, idle0 = sample()
        time.sleep(interval_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (1 - (idle1 - idle0) / max(total1 - total0, 1)) * (os.cpu_count() or 1)


def _warn_if_busy(device: torch.device, threads: int) -> None:
    """CPU timings with several threads fall apart when other processes hold the cores: say so up front."""
    cores = os.cpu_count() or 1
    busy = _busy_cores() if device.type == "cpu" else None
    if busy is not None and busy + threads > cores + 0.3:
        logger.warning(
            "other processes keep %.1f of %d cores busy and %d threads were asked: CPU timings will "
            "be noisy; profile on an idle machine or pass fewer threads",
            busy,
            cores,
            threads,
        )


def resolve_spec(spec: SweepSpec | None) -> SweepSpec:
    """`spec` (default SweepSpec()) with the thread count made explicit."""
    spec = spec or SweepSpec()
    return spec if spec.threads is not None else dataclasses.replace(spec, threads=torch.get_num_threads())


def run_profile(spec: SweepSpec | None, *, device: str = "cpu", dtype: str = "float32", progress: bool = True) -> dict:
    """Sweep every op entry of `spec` on `device` and return the profile dict (not saved)."""
    from tqdm.auto import tqdm

    dev, name = check_device(device), dtype_name(dtype)
    spec = resolve_spec(spec)
    gen = torch.Generator(device=dev).manual_seed(0)
    entries = _entries(spec)
    n_points = sum(len(dims) for _, _, dims in entries)
    _warn_if_busy(dev, spec.threads if spec.threads is not None else torch.get_num_threads())
    t0 = time.perf_counter()
    with cpu_threads(spec.threads) as threads:
        estimate = _estimate_s(spec, device=dev, dtype=torch_dtype(name), gen=gen)
        logger.info("profiling %d points on %s (%s), about %.0f s", n_points, device_name(dev), name, estimate)
        with tqdm(total=n_points, desc=f"profile (~{estimate:.0f}s)", unit="pt", disable=not progress) as bar:
            ops = [
                _sweep_entry(op, m, dims, spec, device=dev, dtype=torch_dtype(name), gen=gen, bar=bar)
                for op, m, dims in entries
            ]
    return {
        "gac_profile": PROFILE_VERSION,
        "device": dev.type,
        "device_name": device_name(dev),
        "torch": torch.__version__,
        "dtype": name,
        "threads": threads,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "elapsed_s": round(time.perf_counter() - t0, 2),
        "spec": spec.to_json(),
        "sweep_method": SWEEP_METHOD,
        "ops": ops,
    }


# ---- files and cache ---------------------------------------------------------------------------------------


def save_profile(profile: Mapping, path: str | os.PathLike) -> Path:
    """Write atomically and signal-safe; one line per key and per op entry so the file stays readable."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in profile.items() if k != "ops"]
    ops = ",\n".join("    " + json.dumps(e) for e in profile.get("ops", []))
    lines.append(f'  "ops": [\n{ops}\n  ]')
    return write_text(Path(path), "{\n" + ",\n".join(lines) + "\n}\n")  # a profile is meant to be shared: 0644


def load_profile(path: str | os.PathLike) -> dict:
    """Read and check a profile file (bounded read, schema in gac.hw.profile_schema); one-line GacError when invalid."""
    path = Path(path)
    if not path.exists():
        raise GacError(f"profile {path} not found: create it with `gac profile --out {path}`")
    return check_profile(read_json(path, "profile", "--profile", fix="re-run `gac profile`"), path)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def cache_root() -> Path:
    """$GAC_CACHE_DIR, else ~/.cache/gac: what gac measured once (profiles, the originals' perplexities)."""
    root = os.environ.get("GAC_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "gac"


def cache_dir() -> Path:
    """$GAC_CACHE_DIR/profiles, else ~/.cache/gac/profiles."""
    return cache_root() / "profiles"


def cached_profile_path(device: str = "cpu", dtype: str = "float32") -> Path:
    """Cache file for this device's name, the dtype and the torch version."""
    dev = check_device(device)
    name = f"{dev.type}-{_slug(device_name(dev))}-{dtype_name(dtype)}-torch{_slug(torch.__version__)}.json"
    return cache_dir() / name


def load_cached_profile(spec: SweepSpec | None = None, *, device: str = "cpu", dtype: str = "float32") -> dict | None:
    """The cached profile when one exists (and, given `spec`, was swept with the same spec); else None."""
    path = cached_profile_path(device, dtype)
    if not path.is_file():
        return None
    try:
        cached = load_profile(path)
    except GacError as e:
        logger.warning("ignoring the cached profile: %s", e)
        return None
    if spec is not None and cached.get("spec") != resolve_spec(spec).to_json():
        return None
    return cached if current_method(cached) else None


def current_method(profile: Mapping) -> bool:
    """Whether a (cached) profile was swept the way this version sweeps (SWEEP_METHOD; profiles before it: 1)."""
    if profile.get("sweep_method", 1) == SWEEP_METHOD:
        return True
    logger.info(
        "the cached sweep was measured by method %s, not %s (operands rotated past the cache on CPU too): "
        "measuring again",
        profile.get("sweep_method", 1),
        SWEEP_METHOD,
    )
    return False


def sweep_cache_path(spec: SweepSpec, *, device: str, dtype: str) -> Path:
    """Cache file of one sweep spec: the device/dtype/torch cache name and a hash of the resolved spec, apart from
    the one-per-device file of `gac profile` (cached_profile_path)."""
    key = hashlib.sha1(json.dumps(resolve_spec(spec).to_json(), sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "auto" / f"{cached_profile_path(device, dtype).stem}-{key}.json"


def cached_sweep(spec: SweepSpec, *, device: str, dtype: str, progress: bool = True) -> dict:
    """The sweep of `spec`, measured once per device, dtype, torch version and spec, then read back: the sweeps of
    `gac compress --profile auto` and of the latency objective's tables."""
    path = sweep_cache_path(spec, device=device, dtype=dtype)
    if path.is_file():
        try:
            cached = load_profile(path)
            if current_method(cached):
                logger.info("reusing the cached sweep %s", path)
                return cached
        except GacError as e:
            logger.warning("measuring again: %s", e)
    result = run_profile(spec, device=device, dtype=dtype, progress=progress)
    try:
        save_profile(result, path)
    except OSError as e:
        logger.warning("could not cache the sweep: %s", e)
    return result


def profile(
    spec: SweepSpec | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    out: str | os.PathLike | None = None,
    force: bool = False,
    progress: bool = True,
) -> dict:
    """Measure this device (or reuse the cached profile swept with the same spec unless `force`), save it."""
    spec = resolve_spec(spec)
    result = None if force else load_cached_profile(spec, device=device, dtype=dtype)
    if result is not None:
        logger.info("reusing the cached profile %s", cached_profile_path(device, dtype))
    else:
        result = run_profile(spec, device=device, dtype=dtype, progress=progress)
        try:
            save_profile(result, cached_profile_path(device, dtype))
        except OSError as e:
            logger.warning("could not cache the profile: %s", e)
    if out is not None:
        save_profile(result, out)
    return result
