"""Selection speed on Llama-3-8B- and 70B-shaped low-rank plans: solver time and the whole `gac select`.

Run: .venv/bin/python benchmarks/select_speed.py   (figures are printed, never asserted)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gac.align.plan import Plan, select

# name: (hidden, kv dim, intermediate, layers); Llama-3 shapes.
SHAPES = {"llama-3-8b": (4096, 1024, 14336, 32), "llama-3-70b": (8192, 1024, 28672, 80)}


def llama_plan(hidden: int, kv: int, inter: int, layers: int, seed: int = 0) -> dict:
    """A low-rank plan: |W(r)| = r * (in + out), d* an irregular rank near 85% of the params.

    The budget is floor(sum |W(d*)|): the aligned dims must fit exactly where the compressor's dims did.
    """
    rng = np.random.default_rng(seed)
    linears = {  # name: (in, out)
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (hidden, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    weights, total = [], 0.0
    for layer in range(layers):
        for name, (n_in, n_out) in linears.items():
            per_dim = n_in + n_out
            rank = round(0.85 * n_in * n_out / per_dim * rng.uniform(0.8, 1.2))
            if rank % 8 == 0:  # irregular on purpose: the compressor's own dim is never aligned
                rank += 1
            total += rank * per_dim
            weights.append(
                {
                    "name": f"model.layers.{layer}.{name}",
                    "dim": rank,
                    "score": float(rng.lognormal(0.0, 1.0)),
                    "params_per_dim": per_dim,
                    "max_dim": min(n_in, n_out),
                }
            )
    return {"budget": math.floor(total), "alignment": 8, "weights": weights}


def gac_command() -> list[str]:
    exe = Path(sys.executable).with_name("gac")  # the console script of this environment
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gac"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=list(SHAPES),
                        help="which model shapes to plan (default: all)")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, {os.cpu_count()} cpus")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            shape = SHAPES[model]
            plan_dict = llama_plan(*shape)
            plan = Plan.from_dict(plan_dict)
            runs = [select(plan) for _ in range(5)]
            solver_ms = statistics.median(r.solver_ms for r in runs)
            path, out = Path(tmp, f"{model}.json"), Path(tmp, f"{model}.result.json")
            path.write_text(json.dumps(plan_dict))
            command_s = statistics.median(_command_seconds(path, out) for _ in range(3))
            r = runs[0]
            print(
                f"{model}: {len(plan.weights)} weights, solver_ms={solver_ms:.1f} (median of 5), "
                f"gac_select_command_s={command_s:.2f} (median of 3, whole process), exact={r.exact}, "
                f"params/budget={r.params / r.budget:.6f}, aligned_fraction={r.aligned_fraction:.3f}"
            )


def _command_seconds(plan: Path, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run([*gac_command(), "select", str(plan), "--out", str(out)], check=True, capture_output=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
