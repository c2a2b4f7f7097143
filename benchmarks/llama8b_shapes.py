"""GPU evidence at Llama-3-8B shapes: baseline vs unaligned vs GAC prefill and decode latency.

No weights can be downloaded, so the model is a Llama-3-8B-shaped LlamaForCausalLM with random weights, built
directly on the device. gac's own pipeline (calibrate -> compressor analyze/allocate -> build_plan + select ->
materialize, as in gac.api.compress) picks the dims, calibrated on random tokens: the dims are therefore what
gac chooses for these shapes, not what it would choose for the trained model. Latency depends only on shapes.

Run on a GPU (not timed yet on one: the 224 fp32 SVDs of the analyze stage dominate; each stage logs its seconds
and GPU memory; `--layers 8` keeps every per-layer shape and cuts the pipeline time by 4):
    .venv/bin/python benchmarks/llama8b_shapes.py --device cuda --dtype bfloat16
GPU memory at full size: ~16 GB of bf16 weights, ~39 GB of fp32 SVDs during analyze (moved to host memory before
the two compressed copies are built), ~45 GB for the three models while timing.
Quick check on a CPU (a 2-layer, hidden-512 model with the same aspect ratios):
    .venv/bin/python benchmarks/llama8b_shapes.py --tiny --device cpu
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from pathlib import Path

# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json)
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)
# Same aspect ratios: intermediate/hidden = 3.5, head_dim 128, 4 query heads per KV head, vocab/hidden ~ 31.
TINY = dict(LLAMA3_8B, hidden_size=512, intermediate_size=1792, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, vocab_size=16032)
VARIANTS = ("baseline", "unaligned", "gac")

log = logging.getLogger("llama8b_shapes")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda[:N] or cpu [default: cuda]")
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 [default: bfloat16 on cuda, "
                                                 "float32 on cpu]")
    p.add_argument("--tiny", action="store_true", help="2-layer hidden-512 model of the same aspect ratios (CPU check)")
    p.add_argument("--layers", type=int, default=None, help="override the layer count (per-layer shapes unchanged)")
    p.add_argument("--compressor", default="asvd", help="[default: asvd]")
    p.add_argument("--ratio", type=float, default=0.15, help="[default: 0.15]")
    p.add_argument("--align", type=int, default=8, help="alignment multiple of the candidates [default: 8]")
    p.add_argument("--seqs", default="1024,2048", help="prefill lengths at batch 1 [default: 1024,2048]")
    p.add_argument("--rounds", type=int, default=None, help="prefill runs per point [default: 20 on cuda, 5 on cpu]")
    p.add_argument("--decode-rounds", type=int, default=None, help="[default: 64 on cuda, 16 on cpu]")
    p.add_argument("--calib-windows", type=int, default=8, help="random-token calibration windows [default: 8]")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per calibration window [default: 512]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="JSON to write [default: out/llama8b_shapes[_tiny]_DEV.json]")
    return p.parse_args(argv)


class Stages:
    """Wall-clock seconds of each pipeline stage, logged as they finish."""

    def __init__(self, device):
        self.device, self.seconds, self._t = device, {}, time.perf_counter()

    def done(self, name: str) -> None:
        import torch

        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[name] = round(now - self._t, 2)
        self._t = now
        extra = ""
        if torch.device(self.device).type == "cuda":
            extra = f", GPU memory {torch.cuda.memory_allocated(self.device) / 2**30:.1f} GiB " \
                    f"(peak {torch.cuda.max_memory_allocated(self.device) / 2**30:.1f})"
        log.info("%-12s %7.1f s%s", name, self.seconds[name], extra)


def build_model(shape: dict, *, device: str, dtype, seed: int):
    """A random-weight LlamaForCausalLM allocated directly on `device` in `dtype` (no fp32 copy first)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(**shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def _offload_svds(analyses) -> None:
    """Move every SVD to host memory: at 8B shapes they hold ~39 GB in fp32, and the two compressed copies
    still have to fit on the GPU. Factorizing from host tensors is cheap (slicing and scaling)."""
    from gac.linalg import ScaledSVD

    for a in analyses:
        s = getattr(a, "svd", None)
        if isinstance(s, ScaledSVD):  # low-rank units; other compressors' units keep what they hold
            a.svd = ScaledSVD(s.U.cpu(), s.S.cpu(), s.Vh.cpu(), None if s.scale is None else s.scale.cpu())


def compress_variants(model, args, stages: Stages) -> tuple[dict, dict]:
    """gac's own pipeline (gac.api.analyze_and_select + materialize_variants) on random-token calibration."""
    import torch

    from gac.api import CompressConfig, analyze_and_select, materialize_variants

    cfg = CompressConfig(model="random-llama", compressor=args.compressor, ratio=args.ratio, alignment=args.align,
                         device=args.device)
    g = torch.Generator().manual_seed(args.seed + 1)
    calib = torch.randint(0, model.config.vocab_size, (args.calib_windows, args.seq_len), generator=g)  # [n, S]
    selected = analyze_and_select(model, calib, cfg)
    stages.done("calibrate + analyze + select")
    if torch.device(args.device).type == "cuda":
        _offload_svds(selected.units)
        torch.cuda.empty_cache()
    variants = materialize_variants(model, selected)
    selected.units = None
    stages.done("materialize")
    info = {"compressible_params": selected.compressible, "budget_params": selected.budget,
            "selection": {k: v for k, v in selected.selection.to_dict().items() if k != "dims"},
            "ranks": selected.dims, "names": selected.names}
    return {"baseline": model, **variants}, info


def dims_table(models: dict, info: dict, alignment: int) -> tuple[str, dict]:
    """Markdown: per unit type (q_proj, ..., over all layers) the dims of both variants; params per variant."""
    from gac.models.dims import params_and_alignment

    groups: dict[str, list[str]] = {}
    for unit in info["ranks"]["unaligned"]:
        groups.setdefault(re.sub(r"\.\d+\.", ".*.", unit), []).append(unit)
    lines = [f"| unit | [out, in] | unaligned dims min-max (# untouched) | gac dims min-max (# untouched) | "
             f"gac dims aligned to {alignment} |",
             "|---|---|---|---|---:|"]
    for group, units in groups.items():
        layer = models["baseline"].get_submodule(units[0])
        shape = f"[{layer.out_features}, {layer.in_features}]" if hasattr(layer, "out_features") else "-"
        cells = []
        for variant in ("unaligned", "gac"):
            dims = [info["ranks"][variant][u] for u in units]
            kept = sorted(d for d in dims if d is not None)
            span = f"{kept[0]}-{kept[-1]}" if kept else "-"
            cells.append(f"{span} ({len(dims) - len(kept)})")
        gac = [d for d in (info["ranks"]["gac"][u] for u in units) if d is not None]
        aligned = f"{sum(d % alignment == 0 for d in gac)}/{len(gac)}" if gac else "-"
        lines.append(f"| {group} | {shape} | {cells[0]} | {cells[1]} | {aligned} |")
    summary = {}
    lines += ["", "| variant | params | vs budget | aligned fraction |", "|---|---:|---:|---:|"]
    for variant in VARIANTS:
        params, frac = params_and_alignment(models[variant], info["names"], alignment)
        summary[variant] = {"params": params, "aligned_fraction": frac}
        lines.append(f"| {variant} | {params:,} | {params / info['budget_params']:.4f} | {frac:.3f} |")
    return "\n".join(lines) + "\n", summary


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from gac.evaluate.bench import BenchConfig, bench, bench_table_markdown
    from gac.hw.device import check_device, torch_dtype

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    check_device(args.device)
    cuda = torch.device(args.device).type == "cuda"
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    shape = dict(TINY if args.tiny else LLAMA3_8B)
    if args.layers is not None:
        shape["num_hidden_layers"] = args.layers
    seqs = tuple(int(s) for s in args.seqs.split(","))
    bench_cfg = BenchConfig(points=tuple((1, s) for s in seqs), warmup=3 if cuda else 1,
                            rounds=args.rounds or (20 if cuda else 5),
                            decode_rounds=args.decode_rounds or (64 if cuda else 16), seed=args.seed)
    label = "tiny Llama-3-8B-proportioned" if args.tiny else "Llama-3-8B-shaped"
    notice = (f"NOTE: {label} model with RANDOM weights ({shape['num_hidden_layers']} layers, hidden "
              f"{shape['hidden_size']}, intermediate {shape['intermediate_size']}, {shape['num_attention_heads']} "
              f"heads / {shape['num_key_value_heads']} KV heads, vocab {shape['vocab_size']}). The dims below come "
              f"from gac's own pipeline ({args.compressor}, ratio {args.ratio}, align {args.align}) run on these "
              f"random weights with random-token calibration; latency depends only on the shapes.")
    print(notice, flush=True)

    stages = Stages(args.device)
    model = build_model(shape, device=args.device, dtype=torch_dtype(dtype), seed=args.seed)
    stages.done("build")
    models, info = compress_variants(model, args, stages)
    dims_md, summary = dims_table(models, info, args.align)
    print("\n" + dims_md, flush=True)
    result = bench(models, bench_cfg)
    stages.done("bench")

    bench_md = bench_table_markdown(result)
    print(bench_md)
    print(notice)
    record = {
        "benchmark": "llama8b_shapes", "tiny": args.tiny, "shape": shape, "random_weights": True,
        "calibration": f"{args.calib_windows} x {args.seq_len} random tokens",
        "compressor": args.compressor, "ratio": args.ratio, "alignment": args.align,
        "compressible_params": info["compressible_params"], "budget_params": info["budget_params"],
        "variants": summary, "selection": info["selection"], "stage_seconds": stages.seconds,
        "dims": {v: {n: r for n, r in info["ranks"][v].items() if r is not None} for v in ("unaligned", "gac")},
        "bench": result,
    }
    dev = "cuda" if cuda else "cpu"
    out = args.out or Path("out") / f"llama8b_shapes{'_tiny' if args.tiny else ''}_{dev}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    out.with_suffix(".md").write_text(f"{notice}\n\n{dims_md}\n{bench_md}")
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return record


if __name__ == "__main__":
    main()
