"""Where the layer-wise pipeline's time goes: `gac compress --layerwise` on a model directory (e.g. benchmarks/big_model.py's
random 8B-shaped model) with timers around its stages, summed over layers.

    python benchmarks/big_model.py --config docs/configs/llama-3-8b --layers 2 --out /tmp/llama-3-8b-2l
    python benchmarks/layer_time.py --model /tmp/llama-3-8b-2l --out /tmp/l8-2l [--compressor asvd --ratio 0.15]

Stages: the statistics forward (the layer run on its stored input with the calibration hooks), the gradient pass
(recompute and backward with the output-gradient hooks), the factorizations (SVDs), the loss model's curves, the
cut state written to the factor cache, the rest of the analysis (loading layers, the forward sweep, the head's
gradient), materialization with the sharded save; the whole wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing

TIMES: dict[str, float] = defaultdict(float)


def _timed(fn, key: str):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[key] += time.perf_counter() - start

    return wrapper


def _timed_block(cm, key: str):
    @contextlib.contextmanager
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            with cm(*args, **kwargs) as value:
                yield value
        finally:
            TIMES[key] += time.perf_counter() - start

    return wrapper


def instrument() -> None:
    import gac.api as api
    import gac.compressors.base as base
    import gac.pipelines.layerwise.analyze as analyze
    import gac.pipelines.layerwise.materialize as materialize

    analyze.collect_stats = _timed_block(analyze.collect_stats, "statistics forward")
    analyze._gradient_hooks = _timed_block(analyze._gradient_hooks, "gradient pass")
    base.LowRankCompressor.factorize_units = _timed(base.LowRankCompressor.factorize_units, "factorizations (SVD)")
    base.add_loss_curves = _timed(base.add_loss_curves, "loss-model curves")
    analyze.FactorCache.__setitem__ = _timed(analyze.FactorCache.__setitem__, "factor cache write")
    analyze.analyze_layerwise = _timed(analyze.analyze_layerwise, "analysis (all)")
    materialize.materialize_layerwise = _timed(materialize.materialize_layerwise, "materialization and save")
    del api  # imported first so that its lazy imports find the wrapped functions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--compressor", default="asvd")
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--calib-windows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--json", type=Path, help="write the stage times here")
    args = parser.parse_args()
    instrument()
    import torch

    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig
    from gac.models.adapters import adapter_for
    from gac.pipelines.memory import config_of

    config = config_of(args.model)
    layers = adapter_for(config).layer_count(config)
    start = time.perf_counter()
    result = compress(CompressConfig(model=args.model, compressor=args.compressor, ratio=args.ratio, dtype=args.dtype,
                                     pipeline="layerwise", evaluate=False, out=args.out, force=True, progress=False,
                                     text=TextConfig(calib_windows=args.calib_windows, seq_len=args.seq_len)))
    TIMES["wall"] = time.perf_counter() - start
    stages = ("statistics forward", "gradient pass", "factorizations (SVD)", "loss-model curves", "factor cache write")
    TIMES["rest of the analysis"] = TIMES["analysis (all)"] - sum(TIMES[k] for k in stages)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {layers} layers")
    print("| stage | seconds | per layer |\n|---|---:|---:|")
    for key in (*stages, "rest of the analysis", "analysis (all)", "materialization and save", "wall"):
        print(f"| {key} | {TIMES[key]:.1f} | {TIMES[key] / layers:.1f} |")
    print("dims:", json.dumps(result.report.dims)[:200], "...")
    if args.json:
        args.json.write_text(json.dumps({"layers": layers, "seconds": dict(TIMES), "dims": result.report.dims},
                                        indent=1))


if __name__ == "__main__":
    main()
