"""Perplexity of gac outputs on the held-out docs and on every text unlike the calibration text, as a ratio to the
original's: how far off its calibration domain a compressed (or healed) model holds.

    python benchmarks/texts.py out/asvd-0.15 out/asvd-0.15-healed out/prune-0.30      # --original: from the plan

The texts are `gac heal`'s evaluation windows (gac.heal.texts.heal_windows: the held-out Python docs, Python's
licence and IDLE's release notes where installed), so the figures line up with heal.json's; one table row a model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    from gac.checkpoint.gac_dir import load, read_plan
    from gac.checkpoint.loading import load_model
    from gac.heal.run import original_of
    from gac.heal.texts import heal_windows

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path, help="gac output directories")
    ap.add_argument("--original", help="the uncompressed model [default: the first output's gac_plan.json]")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=24)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    original = args.original or original_of(args.models[0], read_plan(args.models[0]))
    reference = load_model(original)
    texts = heal_windows(reference.tokenizer, heal_file=None, eval_file=None, unlike_file=None,
                         seq_len=args.seq_len, eval_windows=args.eval_windows)
    evaluated = texts.evaluated()
    rows = {"original": texts.perplexities(reference.model, progress=False)}
    del reference
    for path in args.models:
        rows[str(path)] = texts.perplexities(load(path).model, progress=False)
    base = rows["original"]
    print("| model | " + " | ".join(f"{texts.names[k]} ({w.shape[0]} x {w.shape[1]})" for k, w in evaluated.items())
          + " |")
    print("|---|" + "---:|" * len(evaluated))
    for name, p in rows.items():
        print(f"| {name} | " + " | ".join(f"{p[k]:.2f} ({p[k] / base[k]:.3f}x)" for k in evaluated) + " |")
    if args.json:
        args.json.write_text(json.dumps({"original": original, "texts": texts.names, "ppl": rows}, indent=1))


if __name__ == "__main__":
    main()
