"""Dims and held-out perplexity of every variant, per compressor, for comparing two commits of gac.

    python benchmarks/same_results.py --out before/ asvd svd_llm palu prune     # on one commit
    python benchmarks/same_results.py --out after/ asvd svd_llm palu prune      # on the other
    python benchmarks/same_results.py --compare before/ after/
    python benchmarks/same_results.py --out layerwise/ --layerwise asvd prune   # the layer-by-layer pipeline
    python benchmarks/same_results.py --out few/ --calib-windows 1 --seq-len 256 asvd   # fewer calibration tokens

Each run is gac.api.compress on the embedded model at --ratio (default text, evaluation on; latency cut to one
round, since only dims, parameters and perplexity are compared). Equal means equal to the last bit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path


def run(compressors: list[str], out: Path, ratio: float, layerwise: bool = False, text: dict | None = None) -> None:
    from gac.api import CompressConfig, compress
    from gac.evaluate.latency import LatencyConfig

    try:
        from gac.calibration.texts import TextConfig
    except ImportError:  # a commit before the layout of issue 71 (the same class, then gac.data's)
        from gac.data import TextConfig

    out.mkdir(parents=True, exist_ok=True)
    for name in compressors:
        start = time.time()
        latency = LatencyConfig(warmup=0, prefill_rounds=1, decode_rounds=1, prefill_tokens=64)
        extra: dict = {}  # older commits have no layer-by-layer pipeline, later ones a bool field, now a name
        if layerwise:
            named = "pipeline" in {f.name for f in dataclasses.fields(CompressConfig)}
            extra = {"pipeline": "layerwise"} if named else {"layerwise": True}
        if text:
            extra["text"] = TextConfig(**text)
        r = compress(CompressConfig(compressor=name, ratio=ratio, progress=False, latency=latency, **extra)).report
        r = r.to_dict() if hasattr(r, "to_dict") else r  # a typed Report; older commits return report.json's dict
        v = r["variants"]
        record = {key: {k: v[k][key] for k in v} for key in ("ppl", "params", "aligned_fraction")}
        record.update(budget=r["budget_params"], dims=r["dims"], seconds=round(time.time() - start))
        (out / f"{name}.json").write_text(json.dumps(record, indent=1))
        print(name, record["ppl"], record["params"], f"{record['seconds']} s", flush=True)


def compare(a: Path, b: Path) -> None:
    for path in sorted(a.glob("*.json")):
        other = b / path.name
        if not other.is_file():
            print(f"{path.stem}: only in {a}")
            continue
        x, y = json.loads(path.read_text()), json.loads(other.read_text())
        same = {key: x[key] == y[key] for key in ("dims", "params", "ppl")}
        drift = max((abs(y["ppl"][k] - v) / v for k, v in x["ppl"].items() if v and y["ppl"].get(k)), default=0.0)
        print(f"{path.stem}: " + ", ".join(f"{k} {'equal' if v else 'DIFFERENT'}" for k, v in same.items()),
              f"(ppl {y['ppl']}; largest relative ppl difference {drift:.1e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("compressors", nargs="*", default=["asvd", "svd_llm", "palu", "prune"])
    parser.add_argument("--out", type=Path, help="directory for one JSON per compressor")
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="compare two --out directories")
    parser.add_argument("--layerwise", action="store_true", help="the layer-by-layer pipeline (gac.pipelines)")
    parser.add_argument("--calib-windows", type=int, help="calibration windows (default: gac's)")
    parser.add_argument("--seq-len", type=int, help="tokens per window (default: gac's)")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
    elif args.out:
        text = {k: v for k, v in (("calib_windows", args.calib_windows), ("seq_len", args.seq_len)) if v}
        run(args.compressors, args.out, args.ratio, args.layerwise, text)
    else:
        parser.error("give --out DIR (run) or --compare A B")


if __name__ == "__main__":
    main()
