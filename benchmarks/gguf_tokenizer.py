"""Held-out perplexity of a GGUF model computed by transformers alone, gac not imported: the reference that gac's own
baseline (`gac bench MODEL.gguf --ppl`) is compared with, in any environment's transformers.

    python benchmarks/gguf_tokenizer.py MODEL.gguf --eval-windows 8 --seq-len 512 --out ref.json
    gac bench MODEL.gguf --ppl --eval-windows 8 --seq-len 512 --points 1x16 --no-aa \
        --out bench/

The text and windows are gac's (every fifth Python-docs topic, windows from its start, BOS first in each where the
tokenizer starts a sequence with it), written out again here so that nothing of gac runs; the JSON holds the
perplexity, the transformers release and the windows' token ids, so two environments' tokenizations can be compared
id by id (`--compare A.json B.json`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

EVAL_EVERY = 5  # gac.calibration.texts: every fifth topic, sorted by name, is held out


def held_out_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for i, k in enumerate(sorted(topics)) if i % EVAL_EVERY == 0)


def reference(gguf: Path, windows: int, seq_len: int) -> dict:
    """Perplexity on three windowings of the held-out text: gac's (BOS first in every window where the tokenizer
    starts a sequence with it, then seq_len - 1 text tokens), without special tokens (gac's before BOS-first
    windows), and the text encoded whole with its special tokens, then cut (BOS once, before the first window)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = held_out_text()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id if tok("a")["input_ids"][:1] == [tok.bos_token_id] else None

    def cut(tokens: list[int], step: int):
        n = min(len(tokens) // step, windows)
        return torch.tensor(tokens[: n * step]).view(n, step)  # [n, step]

    plain = cut(ids, seq_len)
    gac_windows = plain if bos is None else cut(ids, seq_len - 1)
    if bos is not None:
        gac_windows = torch.cat([torch.full((len(gac_windows), 1), bos), gac_windows], dim=1)  # [n, seq_len]
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()

    def ppl(batch) -> float:
        nll, count = 0.0, 0
        with torch.inference_mode():
            for w in batch.split(4):
                logits = model(w, use_cache=False).logits[:, :-1].float()  # [B, S-1, V]
                target = w[:, 1:].flatten()
                nll += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), target, reduction="sum"))
                count += target.numel()
        return math.exp(nll / count)

    return {
        "model": str(gguf),
        "transformers": transformers.__version__,
        "ppl": ppl(gac_windows),
        "ppl_no_special_tokens": ppl(plain),
        "ppl_bos_once": ppl(cut(tok(text)["input_ids"], seq_len)),
        "bos_first": bos is not None,
        "windows": len(gac_windows),
        "seq_len": seq_len,
        "hello_world": tok("Hello world")["input_ids"],
        "ids": gac_windows.tolist(),
        "seconds": round(time.time() - start),
    }


def compare(a: dict, b: dict) -> None:
    flat = [[t for w in x["ids"] for t in w] for x in (a, b)]
    same = sum(p == q for p, q in zip(*flat, strict=True)) if len(flat[0]) == len(flat[1]) else 0
    for x in (a, b):
        print(
            f"transformers {x['transformers']}: ppl {x['ppl']:.3f} (BOS first: {x['bos_first']}), without special "
            f"tokens {x['ppl_no_special_tokens']:.3f}, BOS once {x['ppl_bos_once']:.3f}; 'Hello world' "
            f"{x['hello_world']}"
        )
    print(f"window ids equal at {same} of {len(flat[0])} positions; ppl ratio {a['ppl'] / b['ppl']:.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf", nargs="?", type=Path)
    p.add_argument("--eval-windows", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--out", type=Path)
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"))
    args = p.parse_args()
    if args.compare:
        compare(*(json.loads(f.read_text()) for f in args.compare))
        return
    result = reference(args.gguf, args.eval_windows, args.seq_len)
    print(
        f"transformers {result['transformers']}: held-out ppl {result['ppl']:.3f} ({result['windows']} x "
        f"{args.seq_len}, BOS first: {result['bos_first']}); without special tokens "
        f"{result['ppl_no_special_tokens']:.3f}; BOS once {result['ppl_bos_once']:.3f}"
    )
    if args.out:
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
