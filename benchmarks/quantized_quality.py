"""What quantization costs each model: every model quantized by each scheme and method (`gac quantize`), and its
perplexity on the held-out docs and the texts unlike them, before and after, with the ratio quantized / unquantized.
A model the scheme's kernel refuses is recorded as refused, with gac's one line. The same windows for every model.

Run: .venv/bin/python benchmarks/quantized_quality.py out/smollm2 out/prune-w4a16t out/prune --out bench/quality \
         --runs w4a16:rtn w4a16:gptq w8a8:gptq
Writes OUT/quality.json and OUT/quality.md (a row per model and run), and OUT/<model>-<label>/ (the checkpoints).
Rows already in OUT/quality.json are kept, not measured again (delete it to start afresh).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="unquantized model directories (gac outputs or Hugging Face ones)")
    p.add_argument("--out", required=True, help="directory for the checkpoints, quality.json and quality.md")
    p.add_argument("--runs", nargs="+", default=["w4a16:rtn", "w4a16:gptq", "w8a8:rtn", "w8a8:gptq"],
                   help="SCHEME:METHOD pairs [default: both schemes by both methods]")
    p.add_argument("--dtype", default="float32", help="quantize's --dtype: float32 isolates the quantization's cost")
    p.add_argument("--eval-windows", type=int, default=24)
    p.add_argument("--force", action="store_true", help="quantize again where a checkpoint exists")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from gac.checkpoint.loading import load_model
    from gac.errors import GacError
    from gac.heal.texts import heal_windows
    from gac.quantize.run import quantize_dir
    from gac.quantize.schemes import QuantizeConfig

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the texts healing is evaluated on: the held-out docs and the texts unlike them
    texts = heal_windows(AutoTokenizer.from_pretrained(args.models[0]), heal_file=None, eval_file=None,
                         unlike_file=None, seq_len=512, eval_windows=args.eval_windows)
    names = texts.names
    done = out / "quality.json"
    rows = json.loads(done.read_text())["rows"] if done.is_file() else []
    have = {(r["model"], r["run"]) for r in rows}

    def ppl(path) -> dict:
        model = load_model(str(path)).model
        return {k: _perplexity(model, w) for k, w in texts.evaluated().items()}

    import torch

    from gac.checkpoint.gac_dir import versions

    def write() -> dict:  # after every row, so an interrupted run keeps what it measured
        result = {"texts": names, "dtype": args.dtype, "eval_windows": args.eval_windows, "rows": rows,
                  "versions": versions(), "threads": torch.get_num_threads(),
                  "date": time.strftime("%Y-%m-%d %H:%M")}
        done.write_text(json.dumps(result, indent=2) + "\n")
        (out / "quality.md").write_text(markdown(result))
        return result

    for model in args.models:
        name = Path(model).name
        if (name, "unquantized") not in have:
            start = time.perf_counter()
            rows.append({"model": name, "run": "unquantized", "ppl": ppl(model), "bytes": _size(model)})
            print(f"{name}: unquantized {_fmt(rows[-1]['ppl'])} ({time.perf_counter() - start:.0f} s)", flush=True)
            write()
        base = next(r["ppl"] for r in rows if (r["model"], r["run"]) == (name, "unquantized"))
        for run in args.runs:
            scheme, _, method = run.partition(":")
            cfg = QuantizeConfig(scheme, method=method, dtype=args.dtype)
            if (name, cfg.label) in have:
                continue
            target = out / f"{name}-{cfg.label}"
            start = time.perf_counter()
            try:
                if args.force or not target.is_dir():
                    quantize_dir(model, target, cfg, force=True, progress=False)
            except GacError as e:
                rows.append({"model": name, "run": cfg.label, "refused": str(e)})
                print(f"{name}: {cfg.label} refused: {e}", flush=True)
                write()
                continue
            q = ppl(target)
            rows.append({"model": name, "run": cfg.label, "ppl": q, "bytes": _size(target),
                         "ratio": {k: q[k] / base[k] for k in q}})
            print(f"{name}: {cfg.label} {_fmt(q)} ({time.perf_counter() - start:.0f} s)", flush=True)
            write()
    print(markdown(write()))


def _perplexity(model, windows) -> float:
    from gac.evaluate.perplexity import perplexity

    return perplexity(model, windows, progress=False)


def _size(path) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def _fmt(p: dict) -> str:
    return " / ".join(f"{v:.2f}" for v in p.values())


def markdown(result: dict) -> str:
    keys = [k for k in result["texts"] if k != "train"]  # held_out, then the unlike texts ("train" is healing's)
    heads = [result["texts"][k] for k in keys]
    lines = ["| model | run | " + " | ".join(heads) + " | ratio to unquantized | weights MiB |",
             "|---|---|" + "---:|" * (len(heads) + 2)]
    for r in result["rows"]:
        if "refused" in r:
            lines.append(f"| {r['model']} | {r['run']} | refused: {r['refused']} |" + " |" * (len(heads) + 1))
            continue
        ratio = " / ".join(f"{r['ratio'][k]:.3f}x" for k in keys) if "ratio" in r else "-"
        lines.append(f"| {r['model']} | {r['run']} | " + " | ".join(f"{r['ppl'][k]:.2f}" for k in keys)
                     + f" | {ratio} | {r['bytes'] / 2**20:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
