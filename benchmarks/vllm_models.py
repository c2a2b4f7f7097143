"""The models the vLLM checks and benchmark serve, from the embedded SmolLM2-135M: the original as a Hugging Face
directory, and for each compressor the gac and the unaligned (--no-align) variant of one analysis (one calibration,
the same budget), plus the unaligned asvd model repaired (zero-padded). Written under --out, one directory each.

Run: .venv/bin/python benchmarks/vllm_models.py --out bench/vllm-models [--compressors asvd prune]
Then: gac serve-check bench/vllm-models/*   and   benchmarks/vllm_bench.py original prune-unaligned prune-gac ...
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

COMPRESSORS = ("asvd", "svd_llm", "palu", "prune")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for the model directories")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--ratio", type=float, default=0.15)
    p.add_argument("--compressors", nargs="+", default=list(COMPRESSORS), choices=COMPRESSORS)
    p.add_argument("--target", help="deployment target of the gac variants, e.g. vllm:tp2")
    p.add_argument("--force", action="store_true", help="replace existing model directories")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)  # first: --help answers before the heavy imports
    from transformers import AutoTokenizer

    from gac.api import CompressConfig, compress
    from gac.checkpoint.gac_dir import save
    from gac.compressors import make_compressor
    from gac.export.export import ExportConfig, export_hf
    from gac.repair.repair import repair_dir

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    export_hf(ExportConfig(model=args.model, out=str(out / "original"), format="hf", force=args.force))
    print(f"original: {time.perf_counter() - start:.0f} s", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(out / "original")
    for name in args.compressors:
        start = time.perf_counter()
        cfg = CompressConfig(model=args.model, compressor=name, ratio=args.ratio, out=str(out / f"{name}-gac"),
                             target=args.target, evaluate=False, force=args.force, progress=False)
        result = compress(cfg)
        from gac.pipelines.outputs import plan_and_files

        report = dataclasses.replace(result.report, saved_variant="unaligned")
        unaligned = dataclasses.replace(cfg, align=False, out=str(out / f"{name}-unaligned"))
        plan, files = plan_and_files(result.models["unaligned"], unaligned, report, make_compressor(name))
        save(result.models["unaligned"], tokenizer, unaligned.out, plan=plan, extra_files=files, force=args.force)
        print(f"{name}: gac and unaligned in {time.perf_counter() - start:.0f} s", flush=True)
    if "asvd" in args.compressors:
        repair_dir(str(out / "asvd-unaligned"), str(out / "asvd-repaired"), force=args.force, measure_latency=False)
        print("asvd-repaired: done", flush=True)


if __name__ == "__main__":
    main()
