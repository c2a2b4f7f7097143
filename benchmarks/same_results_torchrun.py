"""One process against N ranks under torchrun: the same dims, parameters and held-out perplexity (within --rtol).

    python benchmarks/same_results_torchrun.py --out runs/ asvd prune svd_llm palu
    python benchmarks/same_results_torchrun.py --nproc 2 --out runs/ asvd -- --calib-windows 2 --eval-windows 2 \\
        --seq-len 256 --layerwise
    python benchmarks/same_results_torchrun.py --nodes 2 --nproc 1 --out runs/ asvd      # two nodes on localhost
    python benchmarks/same_results_torchrun.py --threads 2 --rounds 2 --out runs/ asvd   # wall time, A/A rounds
    python benchmarks/same_results_torchrun.py --out runs/ prune -- --speedup 1.1 --retime   # closed loops, afresh

Each compressor runs `gac compress --ratio R` twice with the same flags (those after `--` added): in one process
(OMP_NUM_THREADS=--threads; under --speedup the ranks per node, the threads rank 0 times with) and under `torchrun
--standalone --nproc-per-node N` (one thread per rank), or, with --nodes K, K torchrun launches as nodes of a c10d
rendezvous on localhost (N ranks each). Their report.json files are compared (dims and parameters equal, every variant's
perplexity within --rtol) and both wall times printed with their ratio (with --rounds R, R pairs in alternating order,
ABBA..., each ratio and the spread of each side's times: the A/A floor), and the Amdahl estimate for --amdahl ranks from
the one-process run's stage times (report.json's stages_s: the split stages divided by the ranks, the rest of its wall
time as it is). Exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from gac.pipelines.stages import amdahl


def compress(
    launchers: list[list[str]], compressor: str, ratio: float, out: Path, extra: list[str], threads: int | None = None
) -> tuple[dict, float]:
    """(report.json, wall seconds) of one `gac compress` run, started by each launcher side by side (the nodes of a
    rendezvous; one launcher otherwise)."""
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    args = ["compress", "--compressor", compressor, "--out", str(out), "--force", "--quiet"]
    if "--speedup" not in extra:  # the latency objective has no ratio
        args += ["--ratio", str(ratio)]
    start = time.perf_counter()
    running = [subprocess.Popen([*launcher, *args, *extra], env=env) for launcher in launchers]
    if any(p.wait() != 0 for p in running):
        raise SystemExit(f"{compressor}: a run failed")
    return json.loads((out / "report.json").read_text()), time.perf_counter() - start


def launchers(torchrun: str, nproc: int, nodes: int) -> list[list[str]]:
    """torchrun's command lines: one standalone launch, or one per node of a c10d rendezvous on localhost."""
    if nodes == 1:
        return [[torchrun, "--standalone", "--nproc-per-node", str(nproc), "-m", "gac"]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rdzv = ["--nnodes", str(nodes), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d"]
    rdzv += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "same-results"]
    return [[torchrun, *rdzv, "--node-rank", str(r), "-m", "gac"] for r in range(nodes)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("compressors", nargs="*", default=["asvd", "prune"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nproc", type=int, default=2, help="ranks per node")
    parser.add_argument("--nodes", type=int, default=1, help="torchrun launches as nodes on localhost")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the one-process run")
    parser.add_argument("--amdahl", type=int, default=8, help="ranks of the Amdahl estimate")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs, in alternating order")
    parser.add_argument("--ratio", type=float, default=0.15)
    parser.add_argument("--rtol", type=float, default=1e-3)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    one = [sys.executable, "-m", "gac"]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    world = args.nproc * args.nodes
    if "--speedup" in extra:  # rank 0 times with its node's threads (one per rank): one process must time with as many
        if args.threads not in (None, args.nproc):
            parser.error(
                f"--speedup: rank 0 times with the node's {args.nproc} threads: give --threads {args.nproc} "
                "(or leave it out) so the two sides time alike"
            )
        args.threads = args.nproc
    failed = False
    for name in args.compressors:
        walls: dict[str, list[float]] = {"one": [], "ranks": []}
        for r in range(args.rounds):
            order = ("one", "ranks") if r % 2 == 0 else ("ranks", "one")
            for side in order:
                if side == "one":
                    a, a_s = compress([one], name, args.ratio, args.out / f"{name}-1", extra, args.threads)
                    walls["one"].append(a_s)
                else:
                    runners = launchers(torchrun, args.nproc, args.nodes)
                    b, b_s = compress(runners, name, args.ratio, args.out / f"{name}-{world}", extra)
                    walls["ranks"].append(b_s)
        if args.rounds > 1:
            ratios = [y / x for x, y in zip(walls["one"], walls["ranks"])]
            spread = {k: 100 * (max(v) - min(v)) / min(v) for k, v in walls.items()}
            print(
                f"{name}: wall 1 process {', '.join(f'{x:.1f}' for x in walls['one'])} s; {world} ranks "
                f"{', '.join(f'{x:.1f}' for x in walls['ranks'])} s; ratios {', '.join(f'{x:.2f}' for x in ratios)} "
                f"(median {sorted(ratios)[len(ratios) // 2]:.2f}x); A/A spread 1 process {spread['one']:.1f}%, "
                f"{world} ranks {spread['ranks']:.1f}%",
                flush=True,
            )
        params = {k: (a["variants"][k]["params"], b["variants"][k]["params"]) for k in a["variants"]}
        ppl = {k: (a["variants"][k]["ppl"], b["variants"][k]["ppl"]) for k in a["variants"]}
        drift = max(abs(y - x) / x for x, y in ppl.values())
        same_dims, same_params = a["dims"] == b["dims"], all(x == y for x, y in params.values())
        ok = same_dims and same_params and drift <= args.rtol and b["distributed"]["world_size"] == world
        failed |= not ok
        print(
            f"{name}: dims {'equal' if same_dims else 'DIFFERENT'}, params {'equal' if same_params else 'DIFFERENT'}, "
            f"gac ppl {ppl['gac'][0]:.6g} (1 process) vs {ppl['gac'][1]:.6g} ({world} ranks), largest relative "
            f"ppl difference {drift:.1e}; wall {a_s:.1f} s vs {b_s:.1f} s ({b_s / a_s:.2f}x); Amdahl estimate for "
            f"{args.amdahl} ranks {amdahl(a['stages_s'], a_s, args.amdahl):.2f}x; stages of one process "
            + ", ".join(f"{k} {v:.1f} s" for k, v in a["stages_s"].items()),
            flush=True,
        )
        if "latency_objective" in a:  # --speedup: what each side's closed loop measured, which explains a difference
            for side, r in (("1 process", a), (f"{world} ranks", b)):
                lo = r["latency_objective"]
                rounds = "; ".join(
                    f"{x['round']}: {x['params'] / 1e6:.2f}M {x['measured_speedup']:.3f}x" for x in lo["rounds"]
                )
                print(
                    f"{name}, {side}, timed with {r['threads']} threads: kept round {lo['round']} of "
                    f"{len(lo['rounds'])}, baseline {lo['baseline_measured_ms']:.1f} ms, "
                    f"gac {lo['gac_measured_ms']:.1f} ms, speed-up {lo['measured_speedup']:.3f}x; "
                    f"rounds (params, measured speed-up) {rounds}",
                    flush=True,
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
