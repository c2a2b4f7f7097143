"""One process against N ranks under torchrun: the same dims, parameters and held-out perplexity (within --rtol).

    python benchmarks/same_results_torchrun.py --out runs/ asvd prune svd_llm palu
    python benchmarks/same_results_torchrun.py --nproc 2 --out runs/ asvd -- --calib-windows 2 --eval-windows 2 \\
        --seq-len 256

Each compressor runs `gac compress --ratio R` twice with the same flags (those after `--` added): in one process
and under `torchrun --standalone --nproc-per-node N`; their report.json files are compared (dims and parameters
equal, every variant's perplexity within --rtol) and both wall times printed. Exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def compress(launcher: list[str], compressor: str, ratio: float, out: Path, extra: list[str]) -> tuple[dict, float]:
    """(report.json, wall seconds) of one `gac compress` run."""
    args = [*launcher, "compress", "--compressor", compressor, "--ratio", str(ratio), "--out", str(out)]
    start = time.perf_counter()
    subprocess.run([*args, "--force", "--quiet", *extra], check=True)
    return json.loads((out / "report.json").read_text()), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("compressors", nargs="*", default=["asvd", "prune"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--rtol", type=float, default=1e-3)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    one = [sys.executable, "-m", "gac"]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    ranks = [torchrun, "--standalone", "--nproc-per-node", str(args.nproc), "-m", "gac"]
    failed = False
    for name in args.compressors:
        a, a_s = compress(one, name, args.ratio, args.out / f"{name}-1", extra)
        b, b_s = compress(ranks, name, args.ratio, args.out / f"{name}-{args.nproc}", extra)
        params = {k: (a["variants"][k]["params"], b["variants"][k]["params"]) for k in a["variants"]}
        ppl = {k: (a["variants"][k]["ppl"], b["variants"][k]["ppl"]) for k in a["variants"]}
        drift = max(abs(y - x) / x for x, y in ppl.values())
        same_dims, same_params = a["dims"] == b["dims"], all(x == y for x, y in params.values())
        ok = same_dims and same_params and drift <= args.rtol and b["distributed"]["world_size"] == args.nproc
        failed |= not ok
        print(
            f"{name}: dims {'equal' if same_dims else 'DIFFERENT'}, params {'equal' if same_params else 'DIFFERENT'}, "
            f"gac ppl {ppl['gac'][0]:.6g} (1 process) vs {ppl['gac'][1]:.6g} ({args.nproc} ranks), largest relative "
            f"ppl difference {drift:.1e}; wall {a_s:.1f} s vs {b_s:.1f} s",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
