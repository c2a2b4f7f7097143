"""The four importance proxies side by side: `gac compress` at one ratio for `prune` and `asvd` with each proxy, on
the embedded SmolLM2-135M; writes the markdown table docs/PROXIES.md (figures are measured, never asserted).

Run: .venv/bin/python benchmarks/proxies.py [--eval-windows 8] [--calib-windows 16] [--quiet]
Each run is a full `gac.api.compress` (calibration, gradient pass where the proxy needs one, allocation, GAC
selection, perplexity, prefill/decode timed side by side for baseline, unaligned and gac). Finished runs are kept
in a JSON file, so an interrupted benchmark resumes where it stopped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

PROXIES = ("magnitude", "activation", "taylor", "fisher")
ROOT = Path(__file__).resolve().parents[1]


def cached_model(alias: str, cache: Path) -> Path:
    """The embedded GGUF model saved once as a Hugging Face directory, so every run loads it in seconds."""
    if (cache / "config.json").is_file():
        return cache
    from gac.checkpoint.loading import load_model

    loaded = load_model(alias)
    loaded.model.save_pretrained(cache)
    loaded.tokenizer.save_pretrained(cache)
    return cache


def run_one(model_dir: Path, compressor: str, proxy: str, args) -> dict:
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig
    from gac.evaluate.latency import LatencyConfig

    cfg = CompressConfig(model=str(model_dir), compressor=compressor, ratio=args.ratio,
                         compressor_options={"importance": proxy},
                         text=TextConfig(seq_len=args.seq_len, calib_windows=args.calib_windows,
                                         eval_windows=args.eval_windows),
                         latency=LatencyConfig(prefill_tokens=args.prefill_tokens, prefill_rounds=args.prefill_rounds,
                                               decode_rounds=args.decode_rounds),
                         progress=not args.quiet)
    r = compress(cfg).report.to_dict()  # the JSON of report.json, as this benchmark records it
    return {k: r[k] for k in ("compressible_params", "budget_params", "variants", "dims", "threads", "versions",
                              "device_name")}


def table(results: dict, args) -> str:
    lines = [
        "# Importance proxies compared",
        "",
        f"SmolLM2-135M (embedded), ratio {args.ratio}, float32 on CPU ({platform.processor() or platform.machine()}), "
        f"measured {datetime.date.today().isoformat()} with `benchmarks/proxies.py`.",
        "",
        f"Settings: calibration {args.calib_windows} x {args.seq_len} tokens (the gradient pass of taylor and fisher "
        f"uses the same windows), held-out perplexity on {args.eval_windows} x {args.seq_len} tokens of the pydoc "
        f"evaluation split, prefill batch 1 x {args.prefill_tokens} tokens, median of {args.prefill_rounds} "
        "interleaved runs per variant (baseline, unaligned and gac timed side by side in each run).",
        "`prune`: default layers (all but the first and last), head mode `group`. `asvd`: alpha 0.5, the proxy is "
        "the per-weight score (`fisher` is asvd's default).",
        "",
        "Element importance by proxy (`gac.calibration.importance`): magnitude w^2; activation mean|x_in|^2 "
        "(calibration input norm); taylor |dL/dw * w| and fisher (dL/dw)^2, each summed over calibration batches of a "
        "language-modelling loss. Summed per channel/head they choose what `prune` keeps (an MLP channel: its gate "
        "and up rows and its down column; a KV group: its k and v rows with its query heads' q rows and o columns); "
        "summed per unit and divided by its parameters they are the score s_i that the allocation and the GAC "
        "knapsack use.",
        "",
        "| compressor | importance | baseline ppl | unaligned ppl | gac ppl | aligned before | aligned after | "
        "gac params / budget | prefill baseline/unaligned | prefill baseline/gac | prefill unaligned/gac | "
        "prefill spread |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in results.items():
        compressor, proxy = key.split("/")
        v = r["variants"]
        base, un, g = v["baseline"], v["unaligned"], v["gac"]
        lines.append(
            f"| {compressor} | {proxy} | {base['ppl']:.2f} | {un['ppl']:.2f} | {g['ppl']:.2f} | "
            f"{un['aligned_fraction']:.2f} | {g['aligned_fraction']:.2f} | {g['params'] / r['budget_params']:.4f} | "
            f"{base['prefill_ms'] / un['prefill_ms']:.3f}x | {base['prefill_ms'] / g['prefill_ms']:.3f}x | "
            f"{un['prefill_ms'] / g['prefill_ms']:.3f}x | "
            f"{max(x['prefill_spread_pct'] for x in (base, un, g)):.0f}% |"
        )
    any_r = next(iter(results.values()))
    lines += [
        "",
        "Aligned before/after: share of compressed dims divisible by 8 in the unaligned and gac variants (pruned MLP "
        "and attention widths for `prune`, inner ranks for `asvd`). Prefill ratios above 1 mean faster. Timings come "
        "from a 2-core CPU, one row per run: ratios within one row come from one interleaved run, and "
        "the spread column (largest 10-90 percentile spread of the three variants' prefill times) says how far "
        "to trust them; `gac bench` with more rounds is the tool for a latency claim.",
        f"Versions: {json.dumps(any_r['versions'])}, {any_r['threads']} threads.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compressors", default="prune,asvd")
    p.add_argument("--proxies", default=",".join(PROXIES))
    p.add_argument("--ratio", type=float, default=0.15)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--calib-windows", type=int, default=16)
    p.add_argument("--eval-windows", type=int, default=8)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--prefill-rounds", type=int, default=10)
    p.add_argument("--decode-rounds", type=int, default=8)
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "gac" / "smollm2-135m-hf")
    p.add_argument("--results", type=Path, default=Path("/tmp/gac-proxies.json"), help="finished runs (resumable)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "PROXIES.md")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args()

    model_dir = cached_model("smollm2-135m", args.cache)
    results = json.loads(args.results.read_text()) if args.results.is_file() else {}
    keys = [f"{c}/{p}" for c in args.compressors.split(",") for p in args.proxies.split(",")]
    for key in keys:
        if key not in results:
            compressor, proxy = key.split("/")
            results[key] = run_one(model_dir, compressor, proxy, args)
            args.results.write_text(json.dumps(results, indent=1))
        un, g = results[key]["variants"]["unaligned"], results[key]["variants"]["gac"]
        print(f"{key}: ppl {un['ppl']:.2f} -> {g['ppl']:.2f}, aligned {un['aligned_fraction']:.2f} -> "
              f"{g['aligned_fraction']:.2f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table({k: results[k] for k in keys}, args))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
