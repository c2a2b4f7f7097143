"""A gac export served by a stock vLLM, in an environment where gac is not installed, against gac's own forward.

    .venv/bin/python benchmarks/stock_serving.py reference out/prune --out ref.json      # gac.load's greedy tokens
    STOCK/bin/python benchmarks/stock_serving.py serve out/prune-deci --reference ref.json [--dtype float32]
    STOCK/bin/python benchmarks/stock_serving.py openai out/prune-deci                    # chat and completions

`reference` runs where gac is (8 prompts of the embedded docs, 32 greedy tokens each, float32, the prompts as
gac.serve.agreement builds them). `serve` refuses to run where gac imports, loads the directory with
`LLM(model=DIR, trust_remote_code=True)` and prints the token agreement, the mean greedy prefix and how many linears
each kernel computes. `openai` starts vLLM's OpenAI server on the directory and asks it one completion and one chat
turn over loopback.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MAX_TOKENS = 32


def reference(model_dir: str, out: Path) -> None:
    from transformers import AutoTokenizer

    from gac.serve.agreement import hf_run, prompt_ids

    prompts = prompt_ids(AutoTokenizer.from_pretrained(model_dir))
    run = hf_run(model_dir, prompts, MAX_TOKENS)
    out.write_text(json.dumps({"model": model_dir, "prompts": prompts, "tokens": run["tokens"]}))
    print(f"{model_dir}: {len(prompts)} prompts x {MAX_TOKENS} greedy tokens -> {out}")


def _no_gac() -> None:
    if importlib.util.find_spec("gac") is not None:
        sys.exit("error: gac is importable here: run this in an environment without gac (a stock vLLM)")


def linear_kernels(model) -> dict[str, str]:
    """{module: the kernel or linear method vLLM computes it with} (run inside the engine by LLM.apply_model)."""
    from vllm.model_executor.layers.linear import LinearBase

    return {
        name: type(getattr(getattr(m, "scheme", None), "kernel", None) or m.quant_method).__name__
        for name, m in model.named_modules()
        if isinstance(m, LinearBase)
    }


def serve(model_dir: str, ref_path: Path, dtype: str) -> None:
    _no_gac()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: apply_model reaches it
    import vllm
    from vllm import LLM, SamplingParams, TokensPrompt

    ref = json.loads(ref_path.read_text())
    start = time.perf_counter()
    llm = LLM(model=model_dir, trust_remote_code=True, dtype=dtype, max_model_len=512, enforce_eager=True)
    load_s = time.perf_counter() - start
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ref["prompts"]], params, use_tqdm=False)
    got = [list(o.outputs[0].token_ids) for o in outs]
    pairs = [(a, b) for x, y in zip(ref["tokens"], got) for a, b in zip(x, y)]
    prefixes = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) / len(x)
                for x, y in zip(ref["tokens"], got)]
    kernels = collections.Counter(llm.apply_model(linear_kernels)[0].values())
    print(json.dumps({
        "model": model_dir, "vllm": vllm.__version__, "dtype": dtype, "gac_installed": False,
        "load_s": round(load_s, 1), "token_agreement": sum(a == b for a, b in pairs) / len(pairs),
        "greedy_prefix": sum(prefixes) / len(prefixes), "kernels": dict(kernels),
    }, indent=1))


def openai(model_dir: str, port: int) -> None:
    _no_gac()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--trust-remote-code",
           "--port", str(port), "--max-model-len", "512", "--enforce-eager", "--served-model-name", "m"]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if server.poll() is not None:
                sys.exit(f"error: the server exited ({server.stderr.read()[-2000:]})")
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        for path, body in (
            ("/v1/completions", {"model": "m", "prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0}),
            ("/v1/chat/completions", {"model": "m", "max_tokens": 24, "temperature": 0,
                                      "messages": [{"role": "user", "content": "What is a Python list?"}]}),
        ):
            req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
            answer = json.loads(urllib.request.urlopen(req, timeout=300).read())
            choice = answer["choices"][0]
            text = choice.get("text") or choice["message"]["content"]
            print(f"{path}: {answer['usage']['completion_tokens']} tokens: {text!r}")
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("reference")
    r.add_argument("model")
    r.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("serve")
    s.add_argument("model")
    s.add_argument("--reference", type=Path, required=True)
    s.add_argument("--dtype", default="float32")
    o = sub.add_parser("openai")
    o.add_argument("model")
    o.add_argument("--port", type=int, default=8011)
    args = p.parse_args()
    if args.verb == "reference":
        reference(args.model, args.out)
    elif args.verb == "serve":
        serve(args.model, args.reference, args.dtype)
    else:
        openai(args.model, args.port)


if __name__ == "__main__":
    main()
