"""Throughput of gac outputs inside vLLM, side by side in one run: each model served by its own vLLM engine (one
process per model, all alive together), timed in interleaved rounds whose order alternates, the first model served
twice as an A/A twin (the noise floor of every ratio). vLLM's default path (torch.compile) unless --eager.

Measured per model: prefill tokens/s at each BxS point (B prompts of S fresh random tokens, one output token;
prefix caching off, so every round prefills in full) and decode tokens/s at each batch (B prompts of --context
tokens, then --decode-tokens greedy steps: the time beyond the same requests' one-token run). Medians over rounds,
ratios against the first model; written to DIR/vllm_bench.json and DIR/vllm_bench.md, never asserted.

Run: .venv/bin/python benchmarks/vllm_bench.py BASELINE UNALIGNED GAC --dtype bfloat16 --out bench/vllm-bf16
Each engine is a process of its own, talking to this one over loopback; a model given as DIR@PYTHON is served by
that interpreter's vLLM (a stock environment without gac: the directory's own code, trust_remote_code), timed in the
same rounds as the others.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import time
from multiprocessing.connection import Client, Listener
from pathlib import Path

AUTHKEY = secrets.token_bytes(16)  # engines connect back to main over loopback with it


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="model directories (the first is the reference and gets the A/A twin); "
                   "DIR@PYTHON serves DIR with another environment's interpreter (e.g. a stock vLLM without gac)")
    p.add_argument("--out", required=True, help="directory for vllm_bench.json and vllm_bench.md")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--prefill", default="1x512,8x512", help="prefill points BxS [default: 1x512,8x512]")
    p.add_argument("--decode-batches", default="1,16", help="decode batch sizes [default: 1,16]")
    p.add_argument("--context", type=int, default=128, help="prompt tokens before decode [default: 128]")
    p.add_argument("--decode-tokens", type=int, default=64, help="greedy steps timed [default: 64]")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds [default: 5]")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE per engine (whole GiB)")
    p.add_argument("--no-aa", action="store_true", help="leave out the A/A twin")
    p.add_argument("--eager", action="store_true", help="no torch.compile (vLLM's default compiles the model)")
    return p.parse_args(argv)


def points(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in part.lower().split("x")) for part in text.split(",")]


def serve(model_dir: str, dtype: str, kv_gib: int, eager: bool, conn) -> None:
    """One engine: answers ("prefill", B, S, seed) and ("decode", B, S, N, seed) with seconds, until None."""
    import random

    from vllm import SamplingParams, TokensPrompt

    try:
        from gac.serve.vllm_engine import make_llm
    except ImportError:  # a stock environment (MODEL@PYTHON): vLLM alone, the directory's own code trusted
        from vllm import LLM

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))
        llm = LLM(model=model_dir, dtype=dtype, max_model_len=2048, enforce_eager=eager, enable_prefix_caching=False,
                  trust_remote_code=True)
    else:
        llm = make_llm(model_dir, dtype=dtype, max_model_len=2048, kv_cache_gib=kv_gib, enforce_eager=eager,
                       enable_prefix_caching=False)
    vocab = llm.get_tokenizer().vocab_size

    def run(batch, seq, tokens, seed):
        rng = random.Random(seed)
        prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(100, vocab) for _ in range(seq)])
                   for _ in range(batch)]
        params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start

    run(2, 64, 4, 0)  # warm-up
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        kind, batch, seq, seed = msg[0], msg[1], msg[2], msg[-1]
        if kind == "prefill":
            conn.send(run(batch, seq, 1, seed))
        else:  # decode: the steps beyond the first token, the same prompts timed both ways
            steps = msg[3]
            conn.send(run(batch, seq, steps + 1, seed) - run(batch, seq, 1, seed))
    llm.llm_engine.engine_core.shutdown()


def main(argv=None) -> None:
    args = parse_args(argv)
    from gac.serve.vllm_engine import check_servable

    models = [(m.partition("@")[0], m.partition("@")[2] or None) for m in args.models]  # (dir, interpreter)
    for model, python in models:  # every engine's limit stated before any starts (a W4A16 model without AVX-512)
        if python is None:
            check_servable(model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    labels = [Path(m).name + (" (stock)" if py else "") for m, py in models]
    specs = list(zip(labels, models))
    if not args.no_aa:
        specs.append((f"{labels[0]} (A/A)", models[0]))
    engines = {}
    with Listener(("127.0.0.1", 0), authkey=AUTHKEY) as listener:
        for label, (model, python) in specs:  # one at a time: two engines loading at once would share 2 cores
            cmd = [python or sys.executable, __file__, "--engine", model, "--dtype", args.dtype,
                   "--kv-cache-gib", str(args.kv_cache_gib), "--port", str(listener.address[1])]
            proc = subprocess.Popen(cmd + (["--eager"] if args.eager else []),
                                    env={**os.environ, "GAC_BENCH_KEY": AUTHKEY.hex()})
            conn = listener.accept()
            assert conn.recv() == "ready"
            engines[label] = (proc, conn)
            print(f"{label}: engine ready", flush=True)
    prefill, batches = points(args.prefill), [int(b) for b in args.decode_batches.split(",")]
    tasks = [("prefill", b, s) for b, s in prefill] + [("decode", b, args.context, args.decode_tokens)
                                                        for b in batches]
    times = {label: {str(t): [] for t in tasks} for label in engines}
    names = list(engines)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for task in tasks:
            for label in order:
                conn = engines[label][1]
                conn.send((*task, 1000 * r + tasks.index(task)))  # same prompts for every model in a round
                times[label][str(task)].append(conn.recv())
                time.sleep(0.5)  # let the previous engine's OpenMP threads go idle
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    for proc, conn in engines.values():
        conn.send(None)
        proc.wait(timeout=120)
    result = summarize(args, tasks, times, names)
    (out / "vllm_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "vllm_bench.md").write_text(markdown(result))
    print(markdown(result))


def summarize(args, tasks, times, names) -> dict:
    def rate(task, seconds):
        kind, batch = task[0], task[1]
        tokens = batch * (task[2] if kind == "prefill" else task[3])
        return tokens / seconds

    rows = {}
    for label in names:
        rows[label] = {}
        for task in tasks:
            rates = [rate(task, s) for s in times[label][str(task)]]
            rows[label][key(task)] = {"tokens_per_s": statistics.median(rates), "min": min(rates),
                                      "max": max(rates), "seconds": times[label][str(task)]}
    ref = names[0]
    for label in names:
        for k, v in rows[label].items():
            v["vs_first"] = v["tokens_per_s"] / rows[ref][k]["tokens_per_s"]
    import torch
    import vllm

    aa = next((n for n in names if n.endswith("(A/A)")), None)
    dirs = [m.partition("@")[0] for m in args.models]
    paths = dict(zip(names, [*dirs, dirs[0]]))
    return {"models": paths, "dtype": args.dtype,
            "weights_bytes": {n: sum(f.stat().st_size for f in Path(p).glob("*.safetensors")) for n, p in paths.items()},
            "rounds": args.rounds, "context": args.context, "decode_tokens": args.decode_tokens,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "versions": {"vllm": vllm.__version__, "torch": torch.__version__},
            "date": time.strftime("%Y-%m-%d %H:%M"), "enforce_eager": args.eager, "results": rows,
            "aa_floor_pct": None if aa is None else
            100 * max(abs(v["vs_first"] - 1) for v in rows[aa].values())}


def key(task) -> str:
    return f"prefill {task[1]}x{task[2]}" if task[0] == "prefill" else f"decode b{task[1]}"


def markdown(result: dict) -> str:
    names = list(result["results"])
    keys = list(result["results"][names[0]])
    mode = "eager" if result["enforce_eager"] else "compiled"
    lines = [f"vLLM {result['versions']['vllm']} ({result['dtype']}, {mode}, {result['rounds']} interleaved rounds, "
             f"{result['date']}): tokens/s, median (ratio to {names[0]})", "",
             "| model | " + " | ".join(keys) + " | weights MiB |", "|---|" + "---:|" * (len(keys) + 1)]
    for n in names:
        cells = [f"{result['results'][n][k]['tokens_per_s']:.1f} ({result['results'][n][k]['vs_first']:.3f})"
                 for k in keys]
        size = result.get("weights_bytes", {}).get(n)
        lines.append(f"| {n} | " + " | ".join(cells) + (f" | {size / 2**20:.1f} |" if size else " | - |"))
    if result["aa_floor_pct"] is not None:
        lines += ["", f"A/A floor: {result['aa_floor_pct']:.1f}% (the first model's twin, same rounds)."]
    return "\n".join(lines) + "\n"


def engine_main(argv: list[str]) -> None:
    """An engine process (started by main, in its model's environment): serve() over a connection to main's listener."""
    p = argparse.ArgumentParser()
    p.add_argument("--engine", required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--kv-cache-gib", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--eager", action="store_true")
    a = p.parse_args(argv)
    conn = Client(("127.0.0.1", a.port), authkey=bytes.fromhex(os.environ["GAC_BENCH_KEY"]))
    serve(a.engine, a.dtype, a.kv_cache_gib, a.eager, conn)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--engine"]:
        engine_main(sys.argv[1:])
    else:
        main()
