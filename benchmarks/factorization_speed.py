"""Seconds per weight of the factorizations (gac.compressors.linalg.scaled_svd: "svd", "gram" in float64, "gram32" in
float32) at Llama-3-8B's shapes, on this machine's CPU, with an ASVD-style per-channel scale; and how far each Gram
spectrum is from the SVD's.

    python benchmarks/factorization_speed.py [--shapes 4096x4096 4096x14336] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from gac.compressors.linalg import FACTORIZATIONS, scaled_svd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["4096x4096", "4096x14336"])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    rows = []
    for shape in args.shapes:
        out, inp = (int(x) for x in shape.split("x"))
        w = torch.randn(out, inp, generator=g) / inp**0.5  # [out, in]
        scale = torch.rand(inp, generator=g) + 0.5  # [in]
        result = {"shape": shape}
        spectra = {}
        for method in FACTORIZATIONS:
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                svd = scaled_svd(w, scale, method)
                times.append(time.perf_counter() - start)
            spectra[method] = svd.S.double()
            result[f"{method}_s"] = round(min(times), 2)
        for method in FACTORIZATIONS[1:]:
            result[f"{method}_speedup"] = round(result["svd_s"] / result[f"{method}_s"], 2)
            diff = (spectra[method] - spectra["svd"]).abs() / spectra["svd"][0]
            result[f"{method}_max_rel_sigma_diff"] = float(diff.max())
        rows.append(result)
        print(json.dumps(result), flush=True)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": platform.processor()}))


if __name__ == "__main__":
    main()
