"""One process against N ranks under torchrun for `gac heal`: the same steps and tokens, held-out perplexity within
--rtol.

    python benchmarks/same_heal_torchrun.py OUT_DIR --out runs/ -- --seq-len 256 --eval-windows 8 --heal-tokens 16384

Runs `gac heal MODEL` twice with the same flags (those after `--` added): in one process and under
`torchrun --standalone --nproc-per-node N`, each with a cache of its own (both measure the original's perplexities);
their heal.json files are compared (steps and tokens equal, every perplexity after healing within --rtol) and both
wall times printed. Exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def heal(launcher: list[str], model: str, out: Path, extra: list[str]) -> tuple[dict, float]:
    """(heal.json, wall seconds) of one `gac heal` run, with a perplexity cache of its own."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "GAC_CACHE_DIR": cache}
        start = time.perf_counter()
        subprocess.run([*launcher, "heal", model, "--out", str(out), "--force", "--quiet", *extra], check=True, env=env)
        seconds = time.perf_counter() - start
    return json.loads((out / "heal.json").read_text()), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a gac output (gac compress --out)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rtol", type=float, default=0.02)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    one = [sys.executable, "-m", "gac"]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    ranks = [torchrun, "--standalone", "--nproc-per-node", str(args.nproc), "-m", "gac"]
    a, a_s = heal(one, args.model, args.out / "heal-1", extra)
    b, b_s = heal(ranks, args.model, args.out / f"heal-{args.nproc}", extra)
    same_run = all(a["run"][k] == b["run"][k] for k in ("steps", "tokens", "stopped", "best_step"))
    drift = max(abs(b["ppl"]["after"][k] / v - 1) for k, v in a["ppl"]["after"].items())
    ok = same_run and drift <= args.rtol and b["distributed"]["world_size"] == args.nproc
    for key in a["ppl"]["after"]:
        before, one_after, ranks_after = a["ppl"]["before"][key], a["ppl"]["after"][key], b["ppl"]["after"][key]
        print(
            f"{key}: ppl before {before:.4f}, after {one_after:.4f} (1 process) vs {ranks_after:.4f} "
            f"({args.nproc} ranks)"
        )
    print(
        f"steps {a['run']['steps']} vs {b['run']['steps']}, tokens {a['run']['tokens']} vs {b['run']['tokens']}, "
        f"largest relative ppl difference {drift:.1e}; wall {a_s:.1f} s vs {b_s:.1f} s; healing loop "
        f"{a['run']['seconds']:.1f} s vs {b['run']['seconds']:.1f} s",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
