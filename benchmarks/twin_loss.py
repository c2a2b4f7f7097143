"""Why a --speedup choice and its twin differ (issue 16): for each --speedup row of a pareto.py run, the loss model's
predicted calibration-loss increase and the real one (mean token loss over calibration windows) of the row's dims and
of its twin's (the parameter objective at the twin's ratio; where the --speedup guard kept the twin, the latency
knapsack's own choice instead), and both choices' groups' ms in one latency model.

  python benchmarks/twin_loss.py --run DIR/pareto.json --compressor asvd
Same model, calibration and alignment as pareto.py's defaults; no timing (the latency tables come from the cache).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a pareto.py pareto.json with twins")
    p.add_argument("--compressor", required=True)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--windows", type=int, default=6, help="calibration windows the real loss is measured on")
    args = p.parse_args(argv)

    from gac.api import CompressConfig
    from gac.calibration.texts import TextConfig, load_windows
    from gac.checkpoint.loading import load_model
    from gac.evaluate.perplexity import perplexity
    from gac.objectives import select_dims
    from gac.objectives.latency.config import SpeedupConfig, parse_shape
    from gac.objectives.latency.model import Phase, measure_latency_model
    from gac.pipelines.whole_model import analyze

    result = json.loads(Path(args.run).read_text())
    run = next(c for c in result["compressors"] if c["compressor"] == args.compressor)
    a = result["args"]
    batch, seq = parse_shape(a["shape"])
    loaded = load_model(args.model, dtype=a["dtype"], device=a["device"])
    model = loaded.model.eval()
    calib, _ = load_windows(loaded.tokenizer, TextConfig(seq_len=a["seq_len"], calib_windows=a["calib_windows"],
                                                         eval_windows=a["eval_windows"]))
    speedup = SpeedupConfig(1.2, phase=a["phase"], batch=batch, seq=seq)
    cfg = CompressConfig(compressor=args.compressor, device=a["device"], dtype=a["dtype"], alignment=a["align"],
                         progress=False, speedup=speedup)
    analyzed = analyze(model, calib, cfg)
    units = analyzed.units
    lm = measure_latency_model([u.group for u in units], Phase(a["phase"], batch, seq), alignment=a["align"],
                               device=a["device"], dtype=a["dtype"], progress=False)
    windows = calib[: args.windows]

    def loss(m) -> float:  # mean next-token loss over the windows
        return math.log(perplexity(m, windows, progress=False))

    base = loss(model)

    def figures(dims) -> dict:
        built = copy.deepcopy(model)
        analyzed.compressor.materialize(built, units, dims)
        return {"predicted_loss": -sum(u.quality_values([dims.get(u.name)])[0] for u in units),
                "real_loss": loss(built.eval()) - base, "groups_ms": lm.predict(dims) - lm.constant_ms,
                "low_rank": sum(d is not None for d in dims.values())}

    print("| target | | predicted loss | real loss | groups ms | low-rank weights | ppl | measured speedup |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for row in run["latency"]:
        # the other model beside the row: its twin, or the knapsack's own where the guard kept the twin (runs of
        # 2026-11-24 on record the dims; earlier ones the twin's ratio, its dims selected again here)
        other = next((row[k] for k in ("twin", "knapsack") if "dims" in row.get(k, {}) or
                      ("ratio" in row.get(k, {}) and not row[k].get("same"))), None)
        if other is None:
            continue
        dims = {u.name: None for u in units} | row["dims"]
        other_dims = ({u.name: None for u in units} | other["dims"] if "dims" in other else
                      select_dims(model, analyzed, CompressConfig(compressor=args.compressor, ratio=other["ratio"],
                                                                  alignment=a["align"], progress=False)).dims["gac"])
        label = (f"twin (ratio {other['ratio']:.3f})" if other is row.get("twin") else "knapsack's own")
        for name, d, r in ((f"--speedup ({row.get('kept', 'latency')})", dims, row), (label, other_dims, other)):
            f = figures(d)
            print(f"| {row['target']:.2f}x | {name} | {f['predicted_loss']:.3f} | {f['real_loss']:.3f} | "
                  f"{f['groups_ms']:.1f} | {f['low_rank']} | {r.get('ppl', float('nan')):.2f} | "
                  f"{r['measured_speedup']:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
