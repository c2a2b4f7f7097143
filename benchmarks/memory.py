"""Peak resident memory of `gac compress` against depth: random Llama-shaped models of one width at several layer
counts, each compressed in its own process; the growth from the shallowest to the deepest should stay under two
layers' weights for the layer-by-layer pipeline (it grows by the whole model for the whole-model one).

    python benchmarks/memory.py --layers 4 8 16 --hidden 1024 --out /tmp/gac-memory [--whole] [--eval]
    python benchmarks/memory.py --layers 4 8 16 --eval --budget cpu=2GiB   # no pipeline flag: gac chooses
    python benchmarks/memory.py --layers 4 16 --moe 32                       # Qwen3-MoE-shaped, pruned
    python benchmarks/memory.py --child DIR OUT [compress options...]       # one run (used by the above)

Each run: asvd at 0.15 (--moe: prune at 0.15 of every layer, one expert width a layer), float32, --no-eval (--eval:
evaluated as by default), 4 calibration windows of 128 tokens;
peak RSS of the child process
(VmHWM, its own address space: getrusage's ru_maxrss of a child started by vfork/exec reports the parent's peak when
larger, here the parent's while it built the random model), and its peak anonymous memory (RssAnon sampled every
20 ms: what the run allocates, without the file pages of the memory-mapped weights, which the kernel maps more of
when the file is still in the page cache); the page cache is dropped before each run where this user may (root),
so every run reads its model cold, as a first run on a real model does. The dry-run forecast is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPRESS = ["--ratio", "0.15", "--no-eval", "--seq-len", "128", "--calib-windows", "4", "--quiet", "--force"]
COMPRESSOR = {"llama": ["--compressor", "asvd"], "moe": ["--compressor", "prune", "--prune-layers", "all"]}


def make_model(d: Path, layers: int, hidden: int, dtype: str = "float32", experts: int = 0) -> int:
    """A random Llama-shaped model (Llama-3's proportions: MLP 3.5x, 4 query heads per KV head, head_dim 128), or with
    `experts` a Qwen3-MoE-shaped one (Qwen3-30B-A3B's proportions: expert width 0.375x, 8 experts a token), with the
    tests' tokenizer; returns one layer's weight bytes."""
    import torch
    import transformers

    sys.path.insert(0, str(ROOT))
    from tests.helpers_tiny import tiny_tokenizer

    heads = max(1, hidden // 128)
    shape = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                 num_key_value_heads=max(1, heads // 4), vocab_size=8192, max_position_embeddings=2048,
                 tie_word_embeddings=False)
    if experts:
        config = transformers.Qwen3MoeConfig(**shape, head_dim=128, intermediate_size=3 * hidden,
                                             moe_intermediate_size=int(0.375 * hidden), num_experts=experts,
                                             num_experts_per_tok=min(8, experts), decoder_sparse_step=1)
    else:
        config = transformers.LlamaConfig(**shape, intermediate_size=int(3.5 * hidden))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(d, max_shard_size="2GB")
    tiny_tokenizer().save_pretrained(d)
    return sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())


def child(model_dir: str, out: str, options: list[str]) -> None:
    """Run one compression in this process and print its peak RSS and stage time as JSON."""
    from click.testing import CliRunner

    from gac.cli import main as cli

    start = time.perf_counter()
    with AnonSampler() as anon:
        result = CliRunner().invoke(cli, ["compress", "--model", model_dir, "--out", out, *options],
                                    catch_exceptions=False)
    peak = peak_rss()
    report = Path(out) / "report.json"
    chosen = json.loads(report.read_text())["pipeline"] if report.is_file() else None
    print(json.dumps({"exit": result.exit_code, "peak_rss": peak, "peak_anon": anon.peak, "chosen": chosen,
                      "seconds": round(time.perf_counter() - start, 1), "tail": result.output[-300:]}))


class AnonSampler:
    """Peak RssAnon of this process, sampled every `interval` s by a daemon thread (0 where /proc is missing)."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()

    def _read(self) -> int:
        try:
            text = Path("/proc/self/status").read_text()
        except OSError:
            return 0
        return next((int(x.split()[1]) * 1024 for x in text.splitlines() if x.startswith("RssAnon:")), 0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._read())

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._read())


def drop_page_cache() -> bool:
    """Write back and drop the kernel's page cache (root only): the next run reads its model from disk."""
    try:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """This process's peak resident bytes: VmHWM on Linux (ru_maxrss can carry the parent's peak over exec)."""
    status = Path("/proc/self/status")
    if status.is_file():
        return next(int(x.split()[1]) for x in status.read_text().splitlines() if x.startswith("VmHWM:")) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def run_one(model_dir: Path, out: Path, options: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", str(model_dir), str(out), *options]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def forecast_bytes(model_dir: Path, options: list[str]) -> int:
    cmd = [sys.executable, "-m", "gac", "compress", "--model", str(model_dir), "--dry-run", *options]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("peak memory"))
    return int(float(line.split(":")[1].split()[0]) * 2**30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=Path("/tmp/gac-memory"))
    parser.add_argument("--whole", action="store_true", help="also run the whole-model pipeline")
    parser.add_argument("--eval", action="store_true", help="evaluate as the default command does (perplexity, "
                        "latency) instead of --no-eval")
    parser.add_argument("--budget", help="no pipeline flag: this --max-memory budget (e.g. cpu=2GiB), the "
                        "pipeline chosen by gac (report.json's pipeline is printed)")
    parser.add_argument("--moe", type=int, default=0, metavar="EXPERTS",
                        help="Qwen3-MoE-shaped models with this many experts a layer, pruned (experts' width)")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"))
    args, rest = parser.parse_known_args()
    if args.child:
        child(*args.child, rest)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for layers in args.layers:
        family = "moe" if args.moe else "llama"
        model_dir = args.out / f"{family}-{args.hidden}x{layers}"
        layer_bytes = make_model(model_dir, layers, args.hidden, experts=args.moe)
        for pipeline in (["layerwise", "whole"] if args.whole else ["layerwise"]):
            options = COMPRESSOR[family] + [o for o in COMPRESS if not (args.eval and o == "--no-eval")]
            if args.budget:
                options += ["--max-memory", args.budget]
            else:
                options += ["--layerwise"] if pipeline == "layerwise" else ["--whole-model"]
            cold = drop_page_cache()
            r = run_one(model_dir, args.out / "compressed", options)
            r.update(layers=layers, pipeline=pipeline, layer_bytes=layer_bytes, cold_cache=cold,
                     forecast=forecast_bytes(model_dir, options))
            rows.append(r)
            print(f"{r['chosen'] or pipeline:9s} {layers:3d} layers: peak RSS {r['peak_rss'] / 2**20:8.0f} MiB "
                  f"(anonymous "
                  f"{r['peak_anon'] / 2**20:.0f}), forecast {r['forecast'] / 2**20:8.0f} MiB, {r['seconds']} s "
                  f"(exit {r['exit']}{', cold page cache' if cold else ''})", flush=True)
        shutil.rmtree(model_dir)
    shutil.rmtree(args.out / "compressed", ignore_errors=True)
    for pipeline in {r["pipeline"] for r in rows}:
        mine = [r for r in rows if r["pipeline"] == pipeline]
        growth = mine[-1]["peak_rss"] - mine[0]["peak_rss"]
        anon = mine[-1]["peak_anon"] - mine[0]["peak_anon"]
        print(f"{pipeline}: growth {mine[0]['layers']} -> {mine[-1]['layers']} layers: {growth / 2**20:.0f} MiB RSS, "
              f"{anon / 2**20:.0f} MiB anonymous; two layers' weights: {2 * mine[0]['layer_bytes'] / 2**20:.0f} MiB")
    (args.out / "memory.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
