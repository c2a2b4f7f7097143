"""Allocation study (issue 14): the output-error loss model vs the energy x Fisher model, per compressor.

Run: PYTHONPATH=src python benchmarks/allocation_study.py [--cache DIR] [--compressors asvd,svd_llm,palu]
         [--allocations output,fisher] [--no-eval]
Stage 1 caches, once, what the allocation needs from the model (calibration X^T X and mean |x| per linear, the
output-gradient Fisher per linear, the weight-gradient Fisher scores of the old model) under --cache; stage 2
allocates from the cache for each compressor and allocation, builds the unaligned and gac variants exactly as
`gac compress` does (gac.api.analyze_and_select's budget and selection), and measures calibration-loss and held-out
perplexity. Choices are made by calibration perplexity; held-out figures are reported, never tuned on.

The figures of docs/RESULTS.md (2026-11-23) came from:
    allocation_study.py --stats-only                      # stats.pt: X^T X, mean |x|, output Fisher (one pass each)
    allocation_study.py --keep-units --runs svd_llm:output,palu:output
    allocation_study.py --runs asvd:output                # (also the main job: gac compress --compressor asvd)
Rows are appended to <cache>/results.jsonl with the ranks chosen.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

DEFAULT_CACHE = Path("/work/wt14-cache")


def load(alias="smollm2-135m"):
    from gac.data import TextConfig, load_windows
    from gac.models.loading import load_model

    loaded = load_model(alias)
    calib, held_out = load_windows(loaded.tokenizer, TextConfig())
    return loaded.model, calib, held_out


def cached_stats(model, calib, names, cache: Path):
    """Calibrate stats with X^T X (stats[name].extra["out_fisher"]: the output-gradient Fisher), computed once and
    kept on disk, and the seconds each pass took."""
    from gac.calibrate import calibrate
    from gac.importance import output_fisher

    f = cache / "stats.pt"
    if f.is_file():
        return torch.load(f, weights_only=False)
    t = time.time()
    stats = calibrate(model, calib, names, xtx=True)
    seconds = {"calibrate_xtx": time.time() - t}
    t = time.time()
    ofisher = output_fisher(model, calib, names)
    seconds["output_fisher"] = time.time() - t
    for n in names:
        stats[n].extra["out_fisher"] = ofisher[n]
    out = {"stats": stats, "seconds": seconds}
    torch.save(out, f)
    return out


def perplexity_of(model, windows) -> float:
    from gac.evaluate.perplexity import perplexity

    return perplexity(model, windows, progress=False)


def study_one(model, calib, held_out, names, stats, compressor: str, importance: str, args) -> dict:
    """Allocate from the cached statistics as `gac compress` does, build unaligned and gac, measure them."""
    import copy
    import math

    from gac.api import CompressConfig, _select_within_budget
    from gac.compressors import make_compressor

    cfg = CompressConfig(compressor=compressor, ratio=args.ratio, progress=False)
    comp = make_compressor(compressor, importance=importance)
    targets = comp.targets(names) if hasattr(comp, "targets") else names
    units_file = args.cache / f"units-{compressor}-{importance}.pt"
    t = time.time()
    if units_file.is_file():
        units = torch.load(units_file, weights_only=False)
    else:
        units = comp.analyze(model, targets, stats, probe=None, keep=1 - args.ratio, progress=False,
                             windows=calib if comp.needs_windows else None)
        if args.keep_units:
            torch.save(units, units_file)
    t_analyze = time.time() - t
    budget = math.floor((1 - args.ratio) * sum(u.numel for u in units))
    t = time.time()
    unaligned = comp.allocate(units, budget)
    t_alloc = time.time() - t
    selection = _select_within_budget(units, unaligned, budget, cfg, None)
    dims = {"unaligned": unaligned, "gac": {**unaligned, **selection.dims}}
    row = {"compressor": compressor, "importance": importance, "seconds_analyze": round(t_analyze, 1),
           "seconds_allocate": round(t_alloc, 2), "budget": budget}
    curves = [u for u in units if u.curve is not None]
    for variant, d in dims.items():
        if variant not in args.variants.split(","):
            continue
        used = sum(u.params(d[u.name]) for u in units)
        if curves:
            row[f"{variant}_predicted"] = float(sum(
                u.options()[0][u.max_dim + 1 if d[u.name] is None else d[u.name]] for u in units))
        m = copy.deepcopy(model)
        comp.materialize(m, units, d)
        m.eval()
        row[f"{variant}_params"] = used
        row[f"{variant}_calib_ppl"] = perplexity_of(m, calib[: args.calib_eval])
        if not args.no_eval:
            row[f"{variant}_heldout_ppl"] = perplexity_of(m, held_out)
        del m
        print(json.dumps(row), flush=True)
    row["ranks"] = {k: v for k, v in unaligned.items()}
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--stats-only", action="store_true")
    p.add_argument("--ratio", type=float, default=0.15)
    p.add_argument("--runs", default="asvd:output,svd_llm:output,palu:output",
                   help="compressor:importance pairs, comma-separated")
    p.add_argument("--calib-eval", type=int, default=4, help="calibration windows for the calibration perplexity")
    p.add_argument("--no-eval", action="store_true", help="skip held-out perplexity")
    p.add_argument("--keep-units", action="store_true", help="cache the analyzed units (SVDs, curves) on disk")
    p.add_argument("--variants", default="unaligned,gac")
    args = p.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    from gac.models.adapters import adapter_for

    model, calib, held_out = load()
    names = adapter_for(model.config).linear_names(model.config)
    c = cached_stats(model, calib, names, args.cache)
    print(json.dumps(c["seconds"]))
    if args.stats_only:
        return
    results = args.cache / "results.jsonl"
    for run in args.runs.split(","):
        compressor, importance = run.split(":")
        row = study_one(model, calib, held_out, names, c["stats"], compressor, importance, args)
        with results.open("a") as fh:
            fh.write(json.dumps({**row, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")


if __name__ == "__main__":
    main()
