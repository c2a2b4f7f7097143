"""GPU evidence for gac: kernel sweeps, the kernels cuBLAS and SDPA pick, and baseline vs unaligned vs gac latency
of random-weight SmolLM2-shaped and Llama-3-8B-shaped models compressed by gac's own pipeline.

Runs from the checkout with no install and no network (the GPU machine has torch and transformers but neither
gguf nor the embedded model: every model here is built from a config with random weights; latency depends only on
shapes). Each step writes its results into --out as soon as it ends, so a run cut off at its limit still returns
what it finished. benchmarks/gpu_evidence.sh runs the steps, each under its own `timeout`; `--tiny` runs the same
steps at toy sizes on a CPU in well under 3 minutes (tests/benchmarks/test_gpu_evidence.py does).

    python benchmarks/gpu_evidence.py env --out DIR --phase before
    python benchmarks/gpu_evidence.py sweeps --out DIR [--tiny]
    python benchmarks/gpu_evidence.py model --preset llama8b --compressors asvd,prune --out DIR [--reuse-dims]
    python benchmarks/gpu_evidence.py summary DIR [DIR...] --docs docs/gpu      (here, on the results)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from gac.io.atomic import write_text

log = logging.getLogger("gpu_evidence")

# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json) and SmolLM2-135M (HuggingFaceTB/SmolLM2-135M config.json)
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192, "rope_theta": 100000.0,
                "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
# Llama-3-8B's aspect ratios at toy size: intermediate/hidden 3.5, head_dim 128, 4 query heads per KV head.
TINY = dict(LLAMA3_8B, hidden_size=512, intermediate_size=1792, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, vocab_size=4096)
PRESETS = {"llama8b": LLAMA3_8B, "smollm2": SMOLLM2_135M, "tiny": TINY}
# Importance: the 8B shapes use the activation proxy (mean |x| from the calibration pass): the loss model and the
# Taylor score would need X^T X for 224 linears (~65 GB in fp64) or a backward pass through 8B parameters, which
# the whole-model pipeline cannot hold on one GPU yet. SmolLM2 shapes use each compressor's default.
OPTIONS = {"llama8b": {"importance": "activation"}, "tiny": {"importance": "activation"}, "smollm2": {}}


def options_for(preset: str, compressor: str, head_mode: str | None = None, layers: int | None = None) -> dict:
    """The compressor options of a preset; a model of two layers or fewer (the toy, gpu_owed.py's compile bench)
    prunes every layer (the default keeps the first and the last, as LLM-Pruner does)."""
    few = preset == "tiny" or (layers is not None and layers <= 2)
    extra = {"layers": "all"} if few and compressor == "prune" else {}
    if compressor == "prune" and head_mode:
        extra["head_mode"] = head_mode
    return {**OPTIONS[preset], **extra}
POINTS = ((1, 128), (1, 512), (1, 1024), (1, 2048), (8, 128), (8, 512), (8, 1024), (8, 2048))
TINY_POINTS = ((1, 32), (2, 32))


def _dump(path: Path, record) -> Path:
    return write_text(path, json.dumps(record, indent=1) + "\n")


# ---- env ---------------------------------------------------------------------------------------------------
SMI_FIELDS = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,memory.used"


def nvidia_smi() -> dict | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30, check=False)
    values = [v.strip() for v in out.stdout.strip().splitlines()[0].split(",")] if out.stdout.strip() else []
    return dict(zip(SMI_FIELDS.split(","), values)) or {"error": out.stderr.strip()[:300]}


def step_env(args) -> None:
    import torch
    import transformers

    path = args.out / "env.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    info = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nvidia_smi": nvidia_smi()}
    if not record:
        record = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "transformers": transformers.__version__, "cpu": platform.processor() or platform.machine(),
                  "cpu_count": os.cpu_count()}
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            record["gpu"] = {"name": p.name, "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1),
                             "l2_mb": round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
                             "capability": f"{p.major}.{p.minor}", "cudnn": torch.backends.cudnn.version()}
    record[args.phase] = info
    _dump(path, record)
    print(json.dumps(record, indent=1))


# ---- sweeps ------------------------------------------------------------------------------------------------
def _sweep_specs(tiny: bool):
    """(label, SweepSpec): GEMM N and K around 4096 and 14336 (K fixed at 4096), SDPA head dims around 128, the
    low-rank pair around rank 1024, at prefill M (1024) and decode (M = 1)."""
    from gac.hw.profile import FixedSizes, SweepSpec

    if tiny:
        sizes, m, gemm, heads, ranks = FixedSizes(hidden=256, lowrank_in=256, lowrank_out=256, heads=4, context=64), \
            64, tuple(range(96, 101)), (64, 72), tuple(range(30, 34))
        return [("gemm", SweepSpec(ops=("gemm_n", "gemm_k"), dims=gemm, m_values=(m, 1), sizes=sizes, repeats=3)),
                ("sdpa", SweepSpec(ops=("sdpa",), head_dims=heads, m_values=(m, 1), sizes=sizes, repeats=3)),
                ("lowrank", SweepSpec(ops=("lowrank",), dims=ranks, m_values=(m,), sizes=sizes, repeats=3))]
    sizes = FixedSizes(hidden=4096, lowrank_in=4096, lowrank_out=4096, heads=32, batch=1, context=2048)
    gemm = tuple(range(4064, 4129)) + tuple(range(14304, 14369))
    return [("gemm", SweepSpec(ops=("gemm_n", "gemm_k"), dims=gemm, m_values=(1024, 1), sizes=sizes, repeats=15)),
            ("sdpa", SweepSpec(ops=("sdpa",), head_dims=tuple(range(96, 161)), m_values=(1024, 1), sizes=sizes,
                               repeats=15)),
            ("lowrank", SweepSpec(ops=("lowrank",), dims=tuple(range(1000, 1057)), m_values=(1024,), sizes=sizes,
                                  repeats=15))]


KERNEL_GEMMS = ((1024, 4096, 4096), (1024, 4096, 4091), (1024, 4096, 4088), (1024, 4091, 4096), (1024, 1531, 4096),
                (1024, 1536, 4096), (1, 4096, 14336), (1, 4096, 14329),
                # a low-rank pair at a uniform 0.15 cut of Llama-3-8B's MLP: rank 2707 (unaligned) vs 2704
                (1024, 4096, 2707), (1024, 4096, 2704), (1024, 2707, 14336), (1024, 2704, 14336))
# (M, K, N): Y [M, N] = X [M, K] W^T
KERNEL_HEAD_DIMS = (64, 112, 120, 121, 128)


def kernel_names(device: str, dtype) -> dict:
    """Which kernels run an aligned vs an unaligned GEMM (cuBLAS's choice) and SDPA at several head dims (the
    backend PyTorch dispatches to), read from torch.profiler."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from gac.hw.profile import _first_sdpa_backend, _kernel

    dev = torch.device(device)
    activities = [ProfilerActivity.CUDA] if dev.type == "cuda" else [ProfilerActivity.CPU]

    def names(fn) -> list[str]:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        kinds = [e for e in prof.key_averages() if (e.device_type.name == "CUDA") == (dev.type == "cuda")]
        return sorted({e.key for e in kinds})[:8]

    out = {"gemm": [], "sdpa": []}
    with torch.inference_mode():
        for m, k, n in KERNEL_GEMMS:
            x = torch.randn(m, k, device=dev, dtype=dtype)
            w = torch.randn(n, k, device=dev, dtype=dtype)
            out["gemm"].append({"m": m, "k": k, "n": n, "kernels": names(lambda x=x, w=w: F.linear(x, w))})
        # the profile's SDPA call at prefill (causal over its own 1024 tokens; the head dim does not size the call)
        attention = _kernel("sdpa", 1024, 0, {"seq": 1024}, device=dev, dtype=dtype)
        for d in KERNEL_HEAD_DIMS:
            qkv = tuple(torch.randn(1, 32, 1024, d, device=dev, dtype=dtype) for _ in range(3))  # [B, H, S, D]
            out["sdpa"].append({"head_dim": d, "first_backend_that_runs": _first_sdpa_backend(attention, qkv, dev),
                                "kernels": names(lambda qkv=qkv: attention(*qkv))})
    return out


def step_kernels(args) -> None:
    from gac.hw.device import default_dtype, torch_dtype

    dtype = args.dtype or default_dtype(args.device)
    _dump(args.out / "kernels.json", {dtype: kernel_names(args.device, torch_dtype(dtype))})


def step_sweeps(args) -> None:
    import torch

    from gac.hw.device import torch_dtype
    from gac.hw.profile import run_profile

    dtypes = ("bfloat16", "float16") if args.device.startswith("cuda") else ("float32",)
    result = {}
    for dtype in dtypes:
        t0 = time.perf_counter()
        profiles = {label: run_profile(spec, device=args.device, dtype=dtype, progress=False)
                    for label, spec in _sweep_specs(args.tiny)}
        merged = dict(profiles["gemm"])
        merged["ops"] = [e for p in profiles.values() for e in p["ops"]]
        merged["elapsed_s"] = round(time.perf_counter() - t0, 1)
        result[dtype] = {"profile": merged, "kernels": kernel_names(args.device, torch_dtype(dtype))}
        _dump(args.out / "sweeps.json", result)  # after each dtype: a cut-off keeps the first
        log.info("sweeps %s: %d points in %.0f s", dtype, sum(len(e["dims"]) for e in merged["ops"]),
                 merged["elapsed_s"])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---- model: compress, materialize, bench -----------------------------------------------------------------
class Stages:
    """Wall-clock seconds of each stage (and peak GPU memory), logged as they finish."""

    def __init__(self, device: str):
        import torch

        self.cuda = torch.device(device).type == "cuda"
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def done(self, name: str) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[name] = round(now - self._t, 2)
        self._t = now
        extra = ""
        if self.cuda:
            extra = f", GPU memory {torch.cuda.memory_allocated() / 2**30:.1f} GiB " \
                    f"(peak {torch.cuda.max_memory_allocated() / 2**30:.1f})"
        log.info("%-34s %7.1f s%s", name, self.seconds[name], extra)


def build_model(shape: dict, *, device: str, dtype, seed: int):
    """A random-weight LlamaForCausalLM allocated directly on `device` in `dtype` (no fp32 copy first)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**shape), dtype=dtype)
    return model.eval()


def decay_spectra(model, power: float, seed: int) -> None:
    """Give every decoder linear a decaying spectrum, as trained weights have (random weights' spectra are flat, so
    a compressor would cut a few weights to rank ~1 and keep the rest whole): input column j, in a random order
    per weight, is scaled by (1 + j)^-power."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.get_decoder().layers.modules():
            if isinstance(module, torch.nn.Linear):
                cols = module.in_features
                scale = (1.0 + torch.randperm(cols, generator=g).double()).pow(-power)  # [in]
                module.weight.mul_(scale.to(module.weight.device, module.weight.dtype))


def uniform_allocation(ratio: float):
    """An allocator giving every group the same kept share of its parameters (SVD-LLM's and LLM-Pruner's uniform
    setting): dim = floor(((1 - ratio) * dense params - fixed) / params per dim), within the group's bounds. The
    sum stays under gac's budget; gac then selects aligned dims under that same budget."""

    def allocate(units, budget):
        dims = {}
        for u in units:
            d = int(((1.0 - ratio) * u.numel - u.fixed_params) // u.params_per_dim)
            dims[u.name] = max(u.min_dim, min(u.max_dim, d))
        assert sum(u.params(d) for u, d in zip(units, dims.values())) <= budget
        return dims

    return allocate


def _offload_factors(units) -> None:
    """Move every unit's SVD to host memory: at 8B shapes they hold ~39 GB in fp32 and the two compressed copies
    still have to fit on the GPU. Cutting factors from host tensors is cheap (slicing and scaling)."""
    from gac.compressors.linalg import ScaledSVD

    for u in units:
        s = getattr(u, "svd", None)
        if isinstance(s, ScaledSVD):
            u.svd = ScaledSVD(s.U.cpu(), s.S.cpu(), s.Vh.cpu(), None if s.scale is None else s.scale.cpu())


def shape_only_cut(model, group, dim: int):
    """A cut of the right shape for `group` at `dim` without any analysis: random factors for a rank group, the
    first channels or KV groups for a width or head group. For reruns that go straight to the bench from saved
    dims: latency depends on the shapes only."""
    import torch

    from gac.models.groups import HeadGroup, RankGroup, WidthGroup
    from gac.models.surgery import Factors, Keep, KeepHeads

    weight = model.get_submodule(group.linears[0]).weight
    if isinstance(group, RankGroup):
        g = torch.Generator(device=weight.device).manual_seed(dim)
        a = torch.randn(dim, group.in_features, generator=g, device=weight.device) / group.in_features ** 0.5
        b = torch.randn(group.out_features, dim, generator=g, device=weight.device) / dim ** 0.5
        return Factors(a, b)
    if isinstance(group, WidthGroup):
        return Keep(torch.arange(dim))
    if isinstance(group, HeadGroup):
        steps, gs = dim // group.step, group.group_size
        if group.mode == "group":
            kv = torch.arange(steps)
            return KeepHeads((kv[:, None] * gs + torch.arange(gs)).reshape(-1), kv)
        kv = torch.arange(group.num_kv_heads)
        return KeepHeads(torch.cat([k * gs + torch.arange(steps) for k in range(group.num_kv_heads)]), kv)
    raise TypeError(f"no shape-only cut for {type(group).__name__}")


def variants_from_dims(model, compressor, dims: dict) -> dict:
    import copy

    from gac.models import surgery

    out = {}
    for variant, chosen in dims.items():
        m = copy.deepcopy(model)
        groups = {g.name: g for g in compressor.groups(m)}
        surgery.apply(m, [(groups[n], shape_only_cut(m, groups[n], d)) for n, d in chosen.items() if d is not None])
        out[variant] = m.eval()
    return out


def layer_params(model) -> int:
    """Parameters of the decoder layers: what prefill multiplies by every token (logits are for one position)."""
    return sum(p.numel() for p in model.get_decoder().layers.parameters())


def compress_variants(model, preset: str, compressor_name: str, args, stages: Stages, dims_path: Path) -> tuple:
    """(variants, info): gac's own pipeline (analyze, select_dims, materialize_variants) on random-token
    calibration, the dims saved to `dims_path` right after selection; or, with --reuse-dims and a saved entry,
    shape-only variants from those dims."""
    import torch

    from gac.api import CompressConfig
    from gac.compressors import make_compressor
    from gac.objectives import select_dims
    from gac.pipelines.whole_model import analyze, materialize_variants

    saved = json.loads(dims_path.read_text()) if dims_path.exists() else {}
    cfg = CompressConfig(model=f"random-{preset}", compressor=compressor_name, ratio=args.ratio,
                         alignment=args.align, device=args.device,
                         compressor_options=options_for(preset, compressor_name, args.head_mode,
                                                        model.config.num_hidden_layers),
                         progress=False)
    compressor = make_compressor(compressor_name, **cfg.compressor_options)
    if args.reuse_dims and compressor_name in saved:
        entry = saved[compressor_name]
        variants = variants_from_dims(model, compressor, entry["dims"])
        stages.done(f"{compressor_name}: variants from saved dims")
        return variants, {**entry, "reused_dims": True}
    if args.allocation == "uniform":
        compressor.allocate = uniform_allocation(args.ratio)
    g = torch.Generator().manual_seed(args.seed + 1)
    calib = torch.randint(0, model.config.vocab_size, (args.calib_windows, args.seq_len), generator=g)  # [n, S]
    selected = select_dims(model, analyze(model, calib, cfg, compressor), cfg)
    stages.done(f"{compressor_name}: calibrate + analyze + select")
    entry = {"compressor": compressor_name, "options": cfg.compressor_options, "allocation": args.allocation, "factorization": cfg.factorization_method,
             "calibration": f"{args.calib_windows} x {args.seq_len} random tokens",
             "compressible_params": selected.compressible, "budget_params": selected.budget,
             "dims": selected.dims, "seconds": dict(stages.seconds)}
    saved[compressor_name] = entry
    _dump(dims_path, saved)  # a rerun with --reuse-dims goes straight to the bench
    if torch.device(args.device).type == "cuda":
        _offload_factors(selected.units)
        torch.cuda.empty_cache()
    variants = materialize_variants(model, selected)
    selected.units = None
    stages.done(f"{compressor_name}: materialize")
    return variants, entry


def _variant_summary(models: dict, entry: dict, alignment: int) -> dict:
    base = layer_params(models["baseline"])
    out = {}
    for name, m in models.items():
        params = layer_params(m)
        dims = [d for d in (entry["dims"].get(name) or {}).values() if d is not None]
        out[name] = {"layer_params": params, "flop_ratio_vs_baseline": params / base,
                     "reduced_dims": len(dims), "aligned_fraction": (sum(d % alignment == 0 for d in dims) / len(dims)
                                                                     if dims else 1.0)}
    return out


def step_model(args) -> None:
    import torch

    from gac.evaluate.bench import BenchConfig, bench, bench_table_markdown
    from gac.hw.device import check_device, default_dtype, torch_dtype

    check_device(args.device)
    cuda = torch.device(args.device).type == "cuda"
    preset = "tiny" if args.tiny else args.preset
    shape = dict(PRESETS[preset])
    if args.layers is not None:
        shape["num_hidden_layers"] = args.layers
    dtype = args.dtype or default_dtype(args.device)
    tiny = preset == "tiny"
    bench_cfg = BenchConfig(points=TINY_POINTS if tiny else POINTS, decode_batches=(1, 2) if tiny else (1, 16),
                            decode_context=16 if tiny else 512, warmup=1 if tiny else 2,
                            rounds=args.rounds or (3 if tiny else 10), decode_rounds=3 if tiny else 30,
                            seed=args.seed)
    result_path, dims_path = args.out / f"{args.preset}.json", args.out / f"{args.preset}_dims.json"
    if args.dims_file is not None and args.dims_file.resolve() != dims_path.resolve():
        dims_path.write_text(args.dims_file.read_text())
    record = {"preset": args.preset, "allocation": args.allocation, "head_mode": args.head_mode, "shape": shape, "random_weights": True, "dtype": dtype, "ratio": args.ratio,
              "alignment": args.align, "device": args.device, "compressors": {}}
    stages = Stages(args.device)
    model = build_model(shape, device=args.device, dtype=torch_dtype(dtype), seed=args.seed)
    if args.decay:
        decay_spectra(model, args.decay, args.seed)
    record["spectra"] = f"column scale (1 + j)^-{args.decay}" if args.decay else "random (flat)"
    stages.done("build")
    for name in args.compressors.split(","):
        try:
            variants, entry = compress_variants(model, preset, name, args, stages, dims_path)
            models = {"baseline": model, **variants}
            summary = _variant_summary(models, entry, args.align)
            result = bench(models, bench_cfg)
            stages.done(f"{name}: bench")
            print(bench_table_markdown(result), flush=True)
            record["compressors"][name] = {"variants": summary, "bench": result,
                                           **{k: v for k, v in entry.items() if k != "dims"}}
        except Exception as e:  # one compressor failing must not lose the other's results
            log.exception("%s failed", name)
            record["compressors"][name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        finally:
            variants = models = None
            if cuda:
                torch.cuda.empty_cache()
        record["stage_seconds"] = dict(stages.seconds)
        _dump(result_path, record)  # after each compressor
    print(f"wrote {result_path} and {dims_path}")


# ---- summary (here, on the results) ------------------------------------------------------------------------
def _ranges(dims: list[int], gap: int = 64) -> list[list[int]]:
    """Indices of `dims` split where consecutive swept dims are more than `gap` apart."""
    out = [[0]]
    for i in range(1, len(dims)):
        (out[-1].append(i) if dims[i] - dims[i - 1] <= gap else out.append([i]))
    return out


def plot_sweeps(profile: dict, path: Path) -> Path:
    """One panel per op entry and swept range: median ms per dim, multiples of 8 marked, p10-p90 band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(e, r) for e in profile["ops"] for r in _ranges(e["dims"])]
    cols = 4
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    for ax, (e, idx) in zip(axes.flat, panels):
        dims = [e["dims"][i] for i in idx]
        ms = [e["ms"][i] for i in idx]
        ax.fill_between(dims, [e["p10_ms"][i] for i in idx], [e["p90_ms"][i] for i in idx], color="0.85")
        ax.plot(dims, ms, color="0.5", lw=0.8)
        aligned = [(d, t) for d, t in zip(dims, ms) if d % 8 == 0]
        ax.scatter(*zip(*aligned), s=12, color="tab:blue", label="multiple of 8", zorder=3) if aligned else None
        ax.set_title(f"{e['op']} m={e['m']} {e['shape']}", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{profile['device_name']}, {profile['dtype']}, torch {profile['torch']}, {profile['date'][:10]}: "
                 "median ms per dim (CUDA-graph replays, inputs over 2x L2)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _headline_row(folder: Path, rec: dict, name: str, c: dict, point: str = "1x1024") -> str:
    """One row of the headline table at prefill `point` (a --tiny run: its first point)."""
    ratios, v = c["bench"]["ratios_vs_first"], c["variants"]
    if point not in ratios["gac"]["prefill"]:
        point = next(iter(ratios["gac"]["prefill"]))
    un, gac = ratios["unaligned"]["prefill"][point], ratios["gac"]["prefill"][point]
    how = "saved dims" if c.get("reused_dims") else c.get("allocation", "compressor")
    return (f"| {folder.name} | {rec['preset']} | {name} | {how} | {v['unaligned']['aligned_fraction']:.2f} | "
            f"{v['gac']['flop_ratio_vs_baseline']:.3f} | {un:.3f} | {gac:.3f} | **{un / gac:.2f}x** | "
            f"{c['bench']['aa_floor_pct']:.1f}% |")


def step_summary(args) -> None:
    from gac.evaluate.bench import bench_table_markdown

    docs = args.docs
    docs.mkdir(parents=True, exist_ok=True)
    head = [("| results | shapes | compressor | dims | unaligned: aligned share | FLOP ratio | unaligned / baseline "
             "1x1024 | gac / baseline 1x1024 | unaligned / gac | A/A floor |"),
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    lines = []
    for folder in args.dirs:
        sweeps = folder / "sweeps.json"
        if sweeps.exists():
            for dtype, entry in json.loads(sweeps.read_text()).items():
                plot_sweeps(entry["profile"], docs / f"sweeps_{dtype}.png")
        for result in sorted(folder.glob("*.json")):
            rec = json.loads(result.read_text())
            if not isinstance(rec, dict) or "compressors" not in rec:
                continue
            for name, c in rec["compressors"].items():
                if "bench" not in c:
                    lines.append(f"- {folder.name} {rec['preset']} {name}: {c.get('error', 'no bench')}")
                    continue
                head.append(_headline_row(folder, rec, name, c))
                v = c["variants"]
                lines += [(f"## {folder.name}: {rec['preset']} ({rec['dtype']}, {rec.get('spectra', 'random')} "
                           f"weights), {name} at ratio {rec['ratio']}"), "",
                          "| variant | decoder-layer params | FLOP ratio vs baseline | aligned dims |",
                          "|---|---:|---:|---:|"]
                lines += [f"| {n} | {s['layer_params']:,} | {s['flop_ratio_vs_baseline']:.3f} | "
                          f"{s['aligned_fraction']:.2f} of {s['reduced_dims']} |" for n, s in v.items()]
                lines += ["", bench_table_markdown(c["bench"]).replace("# gac bench", "### bench"), ""]
    text = "\n".join(["# GPU evidence", "", *head, "", *lines]) + "\n"
    write_text(docs / "SUMMARY.md", text)
    print("\n".join(head))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    for name in ("env", "sweeps", "kernels", "model"):
        s = sub.add_parser(name)
        s.add_argument("--out", type=Path, required=True, help="results folder (created)")
        s.add_argument("--device", default=None, help="[default: cuda when available, else cpu]")
        s.add_argument("--tiny", action="store_true", help="toy sizes: the same steps on a CPU in seconds")
    sub.choices["env"].add_argument("--phase", default="before", choices=("before", "after"))
    sub.choices["kernels"].add_argument("--dtype", default=None, help="[default: bfloat16 on cuda, float32 on cpu]")
    m = sub.choices["model"]
    m.add_argument("--preset", default="llama8b", choices=sorted(PRESETS))
    m.add_argument("--compressors", default="asvd,prune")
    m.add_argument("--ratio", type=float, default=0.15)
    m.add_argument("--align", type=int, default=8)
    m.add_argument("--dtype", default=None, help="[default: bfloat16 on cuda, float32 on cpu]")
    m.add_argument("--layers", type=int, default=None, help="override the layer count (per-layer shapes unchanged)")
    m.add_argument("--rounds", type=int, default=None)
    m.add_argument("--calib-windows", type=int, default=8)
    m.add_argument("--seq-len", type=int, default=512)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--reuse-dims", action="store_true", help="go straight to the bench from a saved *_dims.json")
    m.add_argument("--dims-file", type=Path, default=None, help="saved dims to start from [default: OUT/PRESET_dims.json]")
    m.add_argument("--decay", type=float, default=0.0, help="decaying spectra: scale input column j by (1+j)^-DECAY")
    m.add_argument("--allocation", default="compressor", choices=("compressor", "uniform"),
                   help="the compressor's own allocation, or the same kept share for every weight")
    m.add_argument("--head-mode", default=None, choices=("group", "uniform", "none"), help="prune's head mode")
    s = sub.add_parser("summary")
    s.add_argument("dirs", type=Path, nargs="+")
    s.add_argument("--docs", type=Path, default=Path("docs/gpu"))
    args = p.parse_args(argv)
    if args.step != "summary":
        import torch

        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        args.out.mkdir(parents=True, exist_ok=True)
        if args.step == "model" and args.tiny:
            args.calib_windows, args.seq_len = 2, 32
    return args


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    {"env": step_env, "sweeps": step_sweeps, "kernels": step_kernels, "model": step_model, "summary": step_summary}[args.step](args)


if __name__ == "__main__":
    main()
