"""A model (gac output or HF directory) against its GGUF export run by llama.cpp: next-token logits on held-out
windows and prompts (max |difference|, relative to the largest |logit|, top-1 agreement) and greedy continuations
of each prompt (tokens equal before the first difference). Figures are printed and written, never asserted.

Run: .venv/bin/python benchmarks/gguf_agreement.py MODEL_DIR FILE.gguf --out agreement.json
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # torch and llama.cpp share libgomp (see tests/conftest.py)

PROMPTS = ("The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
           "The three primary colours are")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="the model the GGUF was exported from (a gac output or HF directory)")
    p.add_argument("gguf")
    p.add_argument("--out", help="also write the figures here (JSON)")
    p.add_argument("--windows", type=int, default=2, help="held-out windows (gac.calibration.texts) [default: 2]")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per window [default: 128]")
    p.add_argument("--greedy", type=int, default=32, help="greedy tokens per prompt [default: 32]")
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def compare(ref, got) -> dict:
    """Logits [S, V] of gac (ref) and llama.cpp (got)."""
    import numpy as np

    diff = float(np.abs(got - ref).max())
    return {"tokens": int(ref.shape[0]), "max_abs_diff": diff, "max_abs_logit": float(np.abs(ref).max()),
            "rel": diff / float(np.abs(ref).max()), "top1": float((got.argmax(-1) == ref.argmax(-1)).mean())}


def main(argv=None) -> dict:
    args = parse_args(argv)
    import numpy as np
    import torch

    from gac.calibration.texts import TextConfig, load_windows
    from gac.checkpoint.loading import load_model
    from gac.export.engine import EngineConfig, logits, open_gguf

    loaded = load_model(args.model, dtype="float32", device="cpu")
    model, tok = loaded.model.eval(), loaded.tokenizer
    _, held_out = load_windows(tok, TextConfig(seq_len=args.seq_len, calib_windows=1, eval_windows=args.windows))
    bos = tok.bos_token_id
    prompts = [([bos] if bos is not None else []) + tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]

    def gac_logits(ids):
        with torch.inference_mode():
            return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()

    def gac_greedy(ids):
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=args.greedy, do_sample=False, top_p=None,
                                 top_k=None, temperature=None)
        return out[0, len(ids):].tolist()

    result = {"model": args.model, "gguf": args.gguf, "windows": [], "prompts": []}
    with open_gguf(args.gguf, EngineConfig(threads=args.threads)) as llm:
        for window in held_out.tolist():
            result["windows"].append(compare(gac_logits(window), logits(llm, window)))
        for text, ids in zip(PROMPTS, prompts, strict=True):
            row = {"prompt": text, **compare(gac_logits(ids), logits(llm, ids))}
            want, seq = gac_greedy(ids), list(ids)
            for _ in range(args.greedy):
                seq.append(int(np.argmax(logits(llm, seq)[-1])))  # from an empty cache each step: plain and exact
            got = seq[len(ids):]
            same = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), len(want))
            row.update(greedy_equal=same, greedy_tokens=len(want), gac_text=tok.decode(want),
                       llama_text=tok.decode(got))
            result["prompts"].append(row)
    rows = result["windows"] + result["prompts"]
    result["summary"] = {"max_abs_diff": max(r["max_abs_diff"] for r in rows), "max_rel": max(r["rel"] for r in rows),
                         "top1": float(np.mean([r["top1"] for r in rows])),
                         "greedy_equal": f"{sum(r['greedy_equal'] for r in result['prompts'])}/"
                                         f"{sum(r['greedy_tokens'] for r in result['prompts'])}"}
    print(json.dumps(result["summary"]))
    for r in result["prompts"]:
        print(f"{r['prompt']!r}: {r['greedy_equal']}/{r['greedy_tokens']} greedy tokens equal; "
              f"max |diff| {r['max_abs_diff']:.4f}; gac: {r['gac_text']!r}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
