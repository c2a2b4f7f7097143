"""gac models measured in llama.cpp, side by side in one run: baseline, unaligned prune and gac prune (under each
llama.cpp target) of the embedded SmolLM2-135M, as GGUFs at f16, q8_0 and q4_k_m: file size, tensors that fell
back (by cause), held-out perplexity from llama.cpp's own logits on gac's evaluation windows, and prefill / decode
tokens/s from llama.cpp's timings (same threads, interleaved rounds, 10-90% spread).

Two phases: this process builds the variants with torch and writes the GGUFs; a child process that never imports
torch (whose OpenMP threads would compete with llama.cpp's) measures them with llama-cpp-python's defaults.
Figures are printed and written (results.json, results.md), never asserted.

Run: .venv/bin/python benchmarks/engine_bench.py --out bench/engine --rounds 5
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TYPES = ("f16", "q8_0", "q4_k_m")
TARGETS = ("llama.cpp:q8_0", "llama.cpp:q4_k_m")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for the GGUFs, results.json and results.md")
    p.add_argument("--ratio", type=float, default=0.15)
    p.add_argument("--calib-windows", type=int, default=16, help="calibration windows of 512 tokens [default: 16]")
    p.add_argument("--eval-windows", type=int, default=8, help="held-out windows of 512 tokens [default: 8]")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds [default: 5]")
    p.add_argument("--prefill", type=int, default=512, help="prefill tokens [default: 512]")
    p.add_argument("--decode", type=int, default=64, help="decode steps per round [default: 64]")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--measure", help=argparse.SUPPRESS)  # the child phase: a manifest.json to measure
    return p.parse_args(argv)


def build(args) -> Path:
    """Variants (one calibration, one analysis), f16 GGUFs, quantized GGUFs with their type reports."""
    import dataclasses

    from gac.align.targets import get_target
    from gac.api import CompressConfig
    from gac.calibration.texts import TextConfig, load_windows
    from gac.checkpoint.gac_dir import LoadedModel
    from gac.checkpoint.loading import load_model
    from gac.export.export import write_f16
    from gac.export.quantize import quantize, tensor_types, type_report
    from gac.objectives import select_dims
    from gac.objectives.parameter import select_within_budget
    from gac.pipelines.whole_model import analyze, materialize_variants

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_model("smollm2-135m")
    text = TextConfig(calib_windows=args.calib_windows, eval_windows=args.eval_windows)
    calib, held_out = load_windows(loaded.tokenizer, text)
    t0 = time.time()
    cfg = CompressConfig(compressor="prune", ratio=args.ratio, target=TARGETS[-1], progress=False, text=text)
    sel = select_dims(loaded.model, analyze(loaded.model, calib, cfg), cfg)
    dims = {"unaligned": sel.dims["unaligned"], f"gac {TARGETS[-1]}": sel.dims["gac"]}  # cfg's target
    for t in TARGETS[:-1]:
        chosen = select_within_budget(sel.units, sel.dims["unaligned"], sel.budget, alignment=8, window=1,
                                      candidates_for=get_target(t).candidates_for(8))
        dims[f"gac {t}"] = {**sel.dims["unaligned"], **chosen.dims}
    logging.info("analysis and selection: %.0f s", time.time() - t0)
    models = {"baseline": loaded.model, **materialize_variants(loaded.model, dataclasses.replace(sel, dims=dims))}
    files = []
    for name, model in models.items():
        stem = name.replace(" ", "-").replace(":", "-")
        f16 = out / f"{stem}-f16.gguf"
        geo = write_f16(LoadedModel(model, loaded.tokenizer, "smollm2-135m"), f16)
        params = sum(p.numel() for p in model.parameters())
        for type_ in TYPES:
            path = f16 if type_ == "f16" else out / f"{stem}-{type_}.gguf"
            fallbacks = [] if type_ == "f16" else quantize(f16, path, type_, threads=args.threads)
            report = type_report(tensor_types(path, fallbacks, geo), type_)
            files.append({"variant": name, "type": type_, "path": str(path), "bytes": path.stat().st_size,
                          "params": params, "arch": geo.arch, "ff": list(geo.ff), "heads": list(geo.heads),
                          "fallbacks_by_cause": report["fallbacks_by_cause"],
                          "fallbacks": [f"{f['name']} {f['row_length']} {f['wanted']}->{f['type']}"
                                        for f in report["fallbacks"] if f["cause"] == "pruned width"]})
    np.save(out / "eval_windows.npy", held_out.numpy())
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps({"files": files, "dims": {k: {n: v for n, v in d.items() if v is not None}
                                                              for k, d in dims.items()}}, indent=2))
    return manifest


def measure(args) -> None:
    """Child phase: perplexity of every file, then `rounds` interleaved timing rounds over all of them."""
    from gac.export.engine import EngineConfig, open_gguf, perplexity, timed_round

    manifest = Path(args.measure)
    info = json.loads(manifest.read_text())
    windows = np.load(manifest.parent / "eval_windows.npy")  # [n, 512]
    cfg = EngineConfig(threads=args.threads, n_ctx=max(windows.shape[1], args.prefill + args.decode + 8))
    for f in info["files"]:
        with open_gguf(Path(f["path"]), cfg, logits_all=True) as llm:
            f["ppl"] = perplexity(llm, windows)
        logging.info("%s %s ppl %.3f", f["variant"], f["type"], f["ppl"])
    prompt = windows.reshape(-1)[: args.prefill]
    samples = {i: {"prefill_tok_s": [], "decode_tok_s": []} for i in range(len(info["files"]))}
    import contextlib

    with contextlib.ExitStack() as stack:
        llms = [stack.enter_context(open_gguf(Path(f["path"]), cfg, logits_all=False)) for f in info["files"]]
        for llm in llms:  # warm-up
            timed_round(llm, prompt, 4)
        for r in range(args.rounds):
            order = list(range(len(llms))) if r % 2 == 0 else list(reversed(range(len(llms))))
            for i in order:
                for key, value in timed_round(llms[i], prompt, args.decode).items():
                    samples[i][key].append(value)
    for i, f in enumerate(info["files"]):
        for key, values in samples[i].items():
            p10, med, p90 = np.percentile(values, [10, 50, 90])
            f[key], f[key.replace("tok_s", "spread_pct")] = float(med), float((p90 - p10) / med * 100)
    (manifest.parent / "results.json").write_text(json.dumps(info, indent=2))


def table(info: dict) -> str:
    rows = ["| variant | type | arch | MiB | fallbacks: pruned width / hidden size | ppl | prefill tok/s | "
            "decode tok/s |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for f in info["files"]:
        fb = f["fallbacks_by_cause"]
        rows.append(f"| {f['variant']} | {f['type']} | {f['arch']} | {f['bytes'] / 2**20:.1f} | "
                    f"{fb.get('pruned width', 0)} / {fb.get('hidden size', 0)} | {f['ppl']:.3f} | "
                    f"{f['prefill_tok_s']:.0f} (±{f['prefill_spread_pct']:.0f}%) | "
                    f"{f['decode_tok_s']:.1f} (±{f['decode_spread_pct']:.0f}%) |")
    return "\n".join(rows) + "\n"


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    if args.measure:
        return measure(args)
    manifest = build(args)
    child = [sys.executable, __file__, "--out", args.out, "--measure", str(manifest), "--rounds", str(args.rounds),
             "--prefill", str(args.prefill), "--decode", str(args.decode), "--threads", str(args.threads)]
    subprocess.run(child, check=True)
    info = json.loads((manifest.parent / "results.json").read_text())
    md = table(info)
    (manifest.parent / "results.md").write_text(md)
    print(md)
    for f in info["files"]:
        if f["fallbacks"]:
            print(f"{f['variant']} {f['type']}: pruned-width fallbacks: {', '.join(f['fallbacks'])}")


if __name__ == "__main__":
    main()
