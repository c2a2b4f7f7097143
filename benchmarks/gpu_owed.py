"""The GPU items owed by the CPU sessions (docs/results/), each a step writing JSON into --out as soon as it ends:

    python benchmarks/gpu_owed.py peak --out DIR -- compress --model M --device cuda ...   a gac command in-process:
        wall, peak RSS, peak CUDA memory (allocated and reserved by torch's allocator)
    python benchmarks/gpu_owed.py decode-bytes --out DIR     decode GEMVs at Llama-3-8B's shapes: a dense weight
        against its low-rank pair at gac's aligned rank and the unaligned one, time against the bytes read
    python benchmarks/gpu_owed.py compile --out DIR          baseline, unaligned and gac (Llama-3-8B-shaped layers,
        uniform dims) eager and under torch.compile (default, max-autotune-no-cudagraphs), prefill, side by side

Every timing is a CUDA-graph replay through gac's one timer (`gac.hw.timing.time_interleaved`), round-robin with an
A/A twin of the baseline. `--tiny` runs the same steps at toy sizes on a CPU in seconds (the CPU check of this file).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))

log = logging.getLogger("gpu_owed")

# Llama-3-8B's projections (out, in) and the ranks keeping 85% of each weight's parameters: the compressor's own
# (unaligned) and gac's aligned choice under the same budget (docs/results/gpu-alignment.md, the uniform rows).
PROJECTIONS = {"q/o": (4096, 4096, 1740, 1736), "k/v": (1024, 4096, 696, 696), "gate/up": (14336, 4096, 2707, 2704),
               "down": (4096, 14336, 2707, 2712)}
PER_LAYER = {"q/o": 2, "k/v": 2, "gate/up": 2, "down": 1}
TINY_PROJECTIONS = {"q/o": (256, 256, 107, 104), "k/v": (64, 256, 43, 40), "gate/up": (896, 256, 169, 168),
                    "down": (256, 896, 169, 168)}


def _dump(out: Path, name: str, record) -> None:
    from gac.io.atomic import write_text

    write_text(out / name, json.dumps(record, indent=1, default=str))


def _timing(t) -> dict:
    return {"median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "method": t.method}


def _aa_floor(timings: dict, a: str, b: str) -> float:
    return abs(timings[a].median_ms / timings[b].median_ms - 1.0)


# ---- peak: a gac command's wall and peak memory ---------------------------------------------------------------
def step_peak(args) -> None:
    import torch

    from gac.cli import main as gac_main

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start, rc = time.perf_counter(), 0
    try:
        gac_main.main(args.command, prog_name="gac", standalone_mode=False)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception as e:  # noqa: BLE001 - recorded, then raised for the log
        rc = 1
        log.exception("the command failed: %s", e)
    record = {"command": "gac " + " ".join(args.command), "rc": rc, "wall_s": round(time.perf_counter() - start, 1),
              "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if cuda:
        record |= {"cuda_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                   "cuda_peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
                   "device": torch.cuda.get_device_name()}
    _dump(args.out, args.name, record)
    print(json.dumps(record, indent=1))


# ---- decode-bytes: time against bytes at batch 1 ------------------------------------------------------------------
def _copies(shapes: list[tuple[int, int]], itemsize: int, floor_bytes: int) -> int:
    """Copies of a weight set whose bytes together exceed `floor_bytes` (twice the L2: no weight read from cache)."""
    return max(1, -(-floor_bytes // (sum(a * b for a, b in shapes) * itemsize)))


def step_decode_bytes(args) -> None:
    import torch
    import torch.nn.functional as F

    from gac.hw.timing import time_interleaved

    device, dtype = args.device, getattr(torch, args.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    projections = TINY_PROJECTIONS if args.tiny else PROJECTIONS
    floor = 2 * (torch.cuda.get_device_properties(device).L2_cache_size if device == "cuda" else 2**22)
    gen = torch.Generator(device).manual_seed(0)

    def weights(shapes):
        n = _copies(shapes, itemsize, floor)
        return [[torch.randn(s, generator=gen, device=device, dtype=dtype) * 0.02 for s in shapes] for _ in range(n)]

    record = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": args.dtype,
              "projections": {}}
    for batch in args.batches:
        for name, (out_f, in_f, unaligned, aligned) in projections.items():
            x = torch.randn(batch, in_f, generator=gen, device=device, dtype=dtype)
            sets = {"dense": weights([(out_f, in_f)]),
                    "pair unaligned": weights([(unaligned, in_f), (out_f, unaligned)]),
                    "pair gac": weights([(aligned, in_f), (out_f, aligned)])}
            bytes_ = {k: sum(w.numel() for w in v[0]) * itemsize for k, v in sets.items()}

            def run(copies):
                def fn():
                    for ws in copies:
                        y = x
                        for w in ws:
                            y = F.linear(y, w)
                return fn

            fns = {k: run(v) for k, v in sets.items()} | {"dense (A/A)": run(sets["dense"])}
            t = time_interleaved(fns, device=device, warmup=3, rounds=args.rounds,
                                 graph_calls=1 if device == "cuda" else 0)
            row = {}
            for k, ws in sets.items():
                us = t[k].median_ms * 1e3 / len(ws)
                row[k] = {"us": us, "bytes": bytes_[k], "GBps": bytes_[k] / us / 1e3, "copies": len(ws),
                          "spread_pct": t[k].spread_pct, "method": t[k].method}
            for k in ("pair unaligned", "pair gac"):
                row[k]["time_vs_dense"] = row[k]["us"] / row["dense"]["us"]
                row[k]["bytes_vs_dense"] = row[k]["bytes"] / row["dense"]["bytes"]
            row["aa_floor"] = _aa_floor(t, "dense", "dense (A/A)")
            record["projections"][f"{name} b{batch}"] = row
            log.info("%-8s b%-3d dense %7.1f us (%4.0f GB/s) | gac pair %7.1f us (%4.0f GB/s, time %.3f, bytes %.3f) | "
                     "unaligned %7.1f us (time %.3f) | A/A %.1f%%", name, batch, row["dense"]["us"],
                     row["dense"]["GBps"],
                     row["pair gac"]["us"], row["pair gac"]["GBps"], row["pair gac"]["time_vs_dense"],
                     row["pair gac"]["bytes_vs_dense"], row["pair unaligned"]["us"],
                     row["pair unaligned"]["time_vs_dense"], 100 * row["aa_floor"])
            del sets
        rows = {n: record["projections"][f"{n} b{batch}"] for n in projections}
        layer = {k: {f: sum(PER_LAYER[n] * row[k][f] for n, row in rows.items()) for f in ("us", "bytes")}
                 for k in ("dense", "pair gac", "pair unaligned")}
        for k, v in layer.items():
            v |= {"time_vs_dense": v["us"] / layer["dense"]["us"],
                  "bytes_vs_dense": v["bytes"] / layer["dense"]["bytes"]}
        record[f"layer b{batch}"] = layer
        log.info("a layer's projections, b%d: %s", batch, json.dumps(record[f"layer b{batch}"]))
        _dump(args.out, "decode_bytes.json", record)


# ---- compile: eager against torch.compile -----------------------------------------------------------------------
def step_compile(args) -> None:
    import torch

    from gac.hw.timing import time_interleaved
    from gpu_evidence import PRESETS, Stages, build_model, compress_variants

    deadline = time.monotonic() + args.budget_s
    device, dtype = args.device, getattr(torch, args.dtype)
    preset = "tiny" if args.tiny else "llama8b"
    shape = dict(PRESETS[preset], num_hidden_layers=args.layers)
    stages = Stages(device)
    model = build_model(shape, device=device, dtype=dtype, seed=0)
    ns = argparse.Namespace(ratio=0.15, align=8, device=device, head_mode="none", reuse_dims=False,  # prune: MLP only
                            allocation="uniform", seed=0, calib_windows=2, seq_len=64)
    record = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": args.dtype,
              "torch": torch.__version__, "shape": shape, "prefill": args.tokens, "modes": {}}
    for compressor in args.compressors:
        variants, entry = compress_variants(model, preset, compressor, ns, stages, args.out / "compile_dims.json")
        models = {"baseline": model, "unaligned": variants["unaligned"], "gac": variants["gac"]}
        ids = torch.randint(0, shape["vocab_size"], (1, args.tokens), device=device)
        for mode in args.modes:
            if time.monotonic() > deadline:
                log.info("%s %s: skipped, past the time budget", compressor, mode)
                continue
            start = time.perf_counter()
            fns = {}
            for name, m in models.items():
                forward = m.forward if mode == "eager" else torch.compile(m.forward, mode=mode, dynamic=False)

                def fn(forward=forward):
                    return forward(input_ids=ids, use_cache=False, logits_to_keep=1).logits
                fns[name] = fn
            fns["baseline (A/A)"] = fns["baseline"]
            try:
                with torch.inference_mode():
                    for fn in fns.values():  # compile here, timed apart from the rounds
                        fn()
                compile_s = time.perf_counter() - start
                t = time_interleaved(fns, device=device, warmup=2, rounds=args.rounds,
                                     graph_calls=args.graph_calls if device == "cuda" else 0)
            except Exception as e:  # noqa: BLE001 - one mode failing must not lose the others
                log.exception("%s %s failed", compressor, mode)
                record["modes"][f"{compressor} {mode}"] = {"error": f"{type(e).__name__}: {e}"[:500]}
                _dump(args.out, "compile.json", record)
                continue
            row = {k: _timing(v) for k, v in t.items()}
            row |= {"compile_s": compile_s, "unaligned_over_gac": t["unaligned"].median_ms / t["gac"].median_ms,
                    "gac_over_baseline": t["gac"].median_ms / t["baseline"].median_ms,
                    "unaligned_over_baseline": t["unaligned"].median_ms / t["baseline"].median_ms,
                    "aa_floor": _aa_floor(t, "baseline", "baseline (A/A)")}
            record["modes"][f"{compressor} {mode}"] = row
            log.info("%s %-28s baseline %.3f ms, unaligned %.3f, gac %.3f: unaligned/gac %.2fx, gac/baseline %.3f, "
                     "A/A %.1f%% (compile %.0f s)", compressor, mode, t["baseline"].median_ms, t["unaligned"].median_ms,
                     t["gac"].median_ms, row["unaligned_over_gac"], row["gac_over_baseline"], 100 * row["aa_floor"],
                     compile_s)
            _dump(args.out, "compile.json", record)
            torch._dynamo.reset()
        variants = models = None
        if device == "cuda":
            torch.cuda.empty_cache()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    for name in ("peak", "decode-bytes", "compile"):
        s = sub.add_parser(name)
        s.add_argument("--out", type=Path, required=True, help="results folder (created)")
        s.add_argument("--tiny", action="store_true", help="toy sizes on a CPU")
    pk = sub.choices["peak"]
    pk.add_argument("--name", default="peak.json")
    pk.add_argument("command", nargs=argparse.REMAINDER, help="-- then the gac command's arguments")
    for name in ("decode-bytes", "compile"):
        s = sub.choices[name]
        s.add_argument("--device", default=None, help="[default: cuda when available, else cpu]")
        s.add_argument("--dtype", default="bfloat16")
        s.add_argument("--rounds", type=int, default=20)
    sub.choices["decode-bytes"].add_argument("--batches", type=int, nargs="+", default=[1, 16])
    c = sub.choices["compile"]
    c.add_argument("--compressors", nargs="+", default=["asvd", "prune"])
    c.add_argument("--modes", nargs="+", default=["eager", "default", "max-autotune-no-cudagraphs"])
    c.add_argument("--layers", type=int, default=2)
    c.add_argument("--tokens", type=int, default=1024)
    c.add_argument("--graph-calls", type=int, default=4)
    c.add_argument("--budget-s", type=float, default=240, help="no new mode starts after this many seconds")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "peak":
        args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    else:
        import torch

        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if args.tiny:
            args.rounds = 3
            if args.step == "compile":
                args.tokens, args.layers = 16, 1
    return args


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    {"peak": step_peak, "decode-bytes": step_decode_bytes, "compile": step_compile}[args.step](args)


if __name__ == "__main__":
    main()
