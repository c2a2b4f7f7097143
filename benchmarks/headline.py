"""The seed paper's headline comparison on this device: prefill latency of the baseline, the compressor's own
(unaligned) dims and GAC's aligned dims at the same parameter budget; batch 1, 1024 tokens, ratio 0.15.

The three models come from gac.api.compress (evaluate=False); prefill is timed with gac's one timer, all three
interleaved round-robin in each block, `--repeats` independent blocks. Figures are printed, never asserted.

Run: .venv/bin/python benchmarks/headline.py --rounds 15 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

VARIANTS = ("baseline", "unaligned", "gac")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="alias, HF dir or .gguf [default: smollm2-135m]")
    p.add_argument("--compressor", default="asvd", help="[default: asvd]")
    p.add_argument("--ratio", type=float, default=0.15, help="share of compressible params removed [default: 0.15]")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] [default: cpu]")
    p.add_argument("--dtype", default=None,
                   help="float32 | bfloat16 | float16 [default: float32 on cpu, bfloat16 on cuda]")
    p.add_argument("--seq", type=int, default=1024, help="prefill tokens [default: 1024]")
    p.add_argument("--batch", type=int, default=1, help="[default: 1]")
    p.add_argument("--rounds", type=int, default=15, help="timed prefill calls per model per block [default: 15]")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per model per block [default: 2]")
    p.add_argument("--repeats", type=int, default=3, help="independent interleaved blocks [default: 3]")
    p.add_argument("--threads", type=int, default=None, help="CPU threads [default: torch's current count]")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from gac.api import CompressConfig, compress
    from gac.evaluate.latency import LatencyConfig, prefill_timings
    from gac.hw.device import device_name
    from gac.hw.timing import cpu_threads

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    cfg = CompressConfig(model=args.model, compressor=args.compressor, ratio=args.ratio, device=args.device,
                         dtype=dtype, evaluate=False)
    with cpu_threads(args.threads) as threads:
        start = time.perf_counter()
        result = compress(cfg)
        compress_s = time.perf_counter() - start
        models = {v: result.models[v] for v in VARIANTS}
        lat = LatencyConfig(warmup=args.warmup, prefill_rounds=args.rounds)
        blocks = []
        for i in range(args.repeats):
            t = prefill_timings(models, args.batch, args.seq, lat)
            blocks.append(t)
            print(f"block {i + 1}/{args.repeats}: " + ", ".join(f"{v} {t[v].median_ms:.2f} ms" for v in VARIANTS),
                  flush=True)

    variants = result.report.variants
    print()
    print(f"{args.model} · {args.compressor} · ratio {args.ratio} · prefill batch {args.batch} x {args.seq} "
          f"tokens · {device_name(args.device)} ({args.device}, {dtype}, {threads} threads) · "
          f"torch {torch.__version__}")
    print(f"compress (evaluate=False) took {compress_s:.0f} s; {args.repeats} block(s) x {args.rounds} interleaved "
          f"rounds after {args.warmup} warm-up calls")
    print()
    print(f"{'variant':<10} {'params':>12} {'aligned':>8} {'median ms':>10} {'p10-p90 ms (per block)':>28}")
    summary = {}
    for v in VARIANTS:
        med = statistics.median(b[v].median_ms for b in blocks)
        bands = "; ".join(f"{b[v].p10_ms:.1f}-{b[v].p90_ms:.1f}" for b in blocks)
        summary[v] = {"median_ms": med, "blocks": [{"median_ms": b[v].median_ms, "p10_ms": b[v].p10_ms,
                                                    "p90_ms": b[v].p90_ms} for b in blocks]}
        print(f"{v:<10} {variants[v].params:>12,} {variants[v].aligned_fraction:>8.2f} {med:>10.2f} "
              f"{bands:>28}")
    ratios = {}
    print()
    for num, den in (("gac", "unaligned"), ("gac", "baseline"), ("unaligned", "baseline")):
        per_block = [b[num].median_ms / b[den].median_ms for b in blocks]
        r = statistics.median(per_block)
        ratios[f"{num}/{den}"] = {"median": r, "blocks": per_block}
        spread = f" (blocks: {min(per_block):.3f}-{max(per_block):.3f})" if len(per_block) > 1 else ""
        print(f"latency {num}/{den} = {r:.3f}{spread}  ->  speed-up {1 / r:.3f}x")

    record = {
        "benchmark": "headline", "model": args.model, "compressor": args.compressor, "ratio": args.ratio,
        "device": args.device, "device_name": device_name(args.device), "dtype": dtype, "threads": threads,
        "torch": torch.__version__, "batch": args.batch, "seq": args.seq, "rounds": args.rounds,
        "warmup": args.warmup, "repeats": args.repeats, "compress_s": round(compress_s, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": {v: variants[v].params for v in VARIANTS}, "budget_params": result.report.budget_params,
        "aligned_fraction": {v: variants[v].aligned_fraction for v in VARIANTS},
        "prefill": summary, "ratios": ratios,
    }
    print()
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
