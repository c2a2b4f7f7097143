"""Where a decode step's time goes in vLLM, per model: torch's profiler around batch-1 greedy decoding, each model in
an engine of its own (one process at a time, the engine in that process), the ops' self CPU time per generated token.
The op names say which kernel ran: vLLM's int4 GEMM, oneDNN's int8 one, or torch's bf16 matmul.

Run: .venv/bin/python benchmarks/vllm_decode_profile.py BASELINE QUANTIZED... --dtype bfloat16 --out bench/profile
Writes OUT/decode_profile.json and OUT/decode_profile.md (the top ops of each model, side by side).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="model directories")
    p.add_argument("--out", required=True, help="directory for decode_profile.json and decode_profile.md")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--decode-tokens", type=int, default=128, help="greedy steps profiled [default: 128]")
    p.add_argument("--top", type=int, default=12, help="ops listed per model [default: 12]")
    p.add_argument("--eager", action="store_true", help="no torch.compile (vLLM's default compiles the model)")
    return p.parse_args(argv)


def profile_one(model_dir: str, args: argparse.Namespace, conn) -> None:
    """One engine in this process: the ops' self CPU time over `decode_tokens` greedy steps, and the wall time."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model runs here, where the profiler sees it
    import torch
    from vllm import SamplingParams, TokensPrompt

    from gac.serve.vllm_engine import make_llm

    llm = make_llm(model_dir, dtype=args.dtype, max_model_len=1024, kv_cache_gib=1, enforce_eager=args.eager)
    prompt = [TokensPrompt(prompt_token_ids=list(range(100, 100 + args.prompt_tokens)))]
    params = SamplingParams(temperature=0, max_tokens=args.decode_tokens, ignore_eos=True)
    llm.generate(prompt, params, use_tqdm=False)  # warm-up (and compilation)
    start = time.perf_counter()
    llm.generate(prompt, params, use_tqdm=False)
    wall = time.perf_counter() - start
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        llm.generate(prompt, params, use_tqdm=False)
    ops = [
        {"op": e.key, "self_ms_per_token": e.self_cpu_time_total / 1e3 / args.decode_tokens, "calls": e.count}
        for e in prof.key_averages()
    ]
    ops.sort(key=lambda o: -o["self_ms_per_token"])
    conn.send({"ms_per_token": wall * 1e3 / args.decode_tokens, "threads": torch.get_num_threads(), "ops": ops})


def main(argv=None) -> None:
    args = parse_args(argv)
    from gac.serve.vllm_engine import check_servable

    for model in args.models:
        check_servable(model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    ctx = mp.get_context("spawn")
    for model in args.models:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=profile_one, args=(model, args, child))
        proc.start()
        results[Path(model).name] = parent.recv()
        proc.join()
        print(f"{Path(model).name}: {results[Path(model).name]['ms_per_token']:.2f} ms a token", flush=True)
    record = {"models": dict(zip(results, args.models)), "dtype": args.dtype, "eager": args.eager,
              "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
              "date": time.strftime("%Y-%m-%d %H:%M"), "results": results}
    (out / "decode_profile.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "decode_profile.md").write_text(markdown(record, args.top))
    print(markdown(record, args.top))


def markdown(record: dict, top: int) -> str:
    lines = []
    for name, r in record["results"].items():
        total = sum(o["self_ms_per_token"] for o in r["ops"])
        lines += [f"**{name}**: {r['ms_per_token']:.2f} ms a token (wall, {r['threads']} torch thread(s)); "
                  f"profiled ops {total:.2f} ms a token", "", "| op | ms / token | share | calls |",
                  "|---|---:|---:|---:|"]
        for o in r["ops"][:top]:
            lines.append(f"| `{o['op']}` | {o['self_ms_per_token']:.3f} | {o['self_ms_per_token'] / total:.1%} | "
                         f"{o['calls']} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
