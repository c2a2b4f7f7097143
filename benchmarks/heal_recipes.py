"""Healing recipes side by side: each one distills the same gac output from the same starting tensors (one process,
the model and its original loaded once) on `gac heal`'s windows, then prints one JSON line: the held-out loss curve,
the wall, the trained tensor count and, unless --no-ppl, the perplexities on gac heal's evaluation texts. A recipe
is a JSON object of gac.heal.distill.DistillConfig fields; list one twice for an A/A twin of its timing.

    python benchmarks/heal_recipes.py /work/heal/asvd-0.15 '[{"train": "all"}, {"train": "changed"}]'
    python benchmarks/heal_recipes.py /work/heal/asvd-0.15 --no-ppl \\
        '[{"tokens": 8192, "eval_every": 100}, {"tokens": 8192, "eval_every": 100, "train": "changed"}]'
"""

from __future__ import annotations

import argparse
import copy
import json
import time


def main() -> None:
    from gac.checkpoint.gac_dir import load, read_plan
    from gac.checkpoint.loading import load_model
    from gac.heal.distill import DistillConfig, distill
    from gac.heal.run import original_of
    from gac.heal.texts import heal_windows

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a gac output directory")
    ap.add_argument("recipes", help="a JSON list of DistillConfig fields, one object a recipe")
    ap.add_argument("--original", help="the uncompressed model [default: the output's gac_plan.json]")
    ap.add_argument("--before", action="store_true", help="print the perplexities before healing first")
    ap.add_argument("--no-ppl", action="store_true", help="time the recipes only: no perplexities after")
    args = ap.parse_args()
    recipes = [DistillConfig(**r) for r in json.loads(args.recipes)]  # a bad field fails before any model loads
    loaded = load(args.model)
    teacher = load_model(args.original or original_of(args.model, read_plan(args.model))).model
    texts = heal_windows(loaded.tokenizer, heal_file=None, eval_file=None, unlike_file=None, seq_len=512,
                         eval_windows=24)
    student, start = loaded.model, copy.deepcopy(loaded.model.state_dict())

    def ppl() -> dict:
        return {k: round(v, 3) for k, v in texts.perplexities(student, progress=False).items()}

    if args.before:
        print(json.dumps({"before": ppl()}), flush=True)
    for cfg in recipes:
        student.load_state_dict(start)
        t = time.perf_counter()
        run = distill(student, teacher, texts.train, texts.val, cfg, progress=False)
        wall = time.perf_counter() - t
        out = {"recipe": {k: v for k, v in vars(cfg).items() if v != getattr(DistillConfig, k, None)},
               "trained_tensors": run.trainable_params, "steps": run.steps, "seconds": round(wall, 1),
               "held_out_loss": [round(v, 4) for _, v in run.held_out_loss], "best_step": run.best_step,
               "backoffs": run.backoffs}
        if not args.no_ppl:
            out["ppl"] = ppl()
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
