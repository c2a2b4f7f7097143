"""Where a compressed (or healed) model loses against its original, token by token, on gac heal's evaluation texts:
tokens a model can copy from earlier in its window (the two tokens before and this one occurred together before)
against fresh ones, as the excess NLL over the original's in nats per token of the whole text.

    python benchmarks/token_gap.py /work/heal/asvd-0.15 /work/heal/asvd-0.15-h2    # --original: from the plan
"""

from __future__ import annotations

import argparse
import math

import torch


def copyable(windows: torch.Tensor) -> torch.Tensor:
    """[n, seq - 1] bool: whether each predicted token's trigram (the two tokens before it and itself) occurred
    earlier in its window."""
    out = torch.zeros(windows.shape[0], windows.shape[1] - 1, dtype=torch.bool)
    for i, row in enumerate(windows.tolist()):
        seen = set()
        for t in range(2, len(row)):
            key = tuple(row[t - 2:t + 1])
            out[i, t - 1] = key in seen
            seen.add(key)
    return out


@torch.inference_mode()
def token_nll(model, windows: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """[n, seq - 1] next-token NLL of `model` on `windows` [n, seq]."""
    out = []
    for chunk in windows.split(batch):
        logits = model(chunk, use_cache=False).logits[:, :-1].float()  # [B, S-1, V]
        out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none"))
    return torch.cat(out)


def main() -> None:
    from gac.heal.run import original_of
    from gac.heal.texts import heal_windows
    from gac.models.io import load, read_plan
    from gac.models.loading import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="gac output directories")
    ap.add_argument("--original", help="the uncompressed model [default: the first output's gac_plan.json]")
    args = ap.parse_args()
    original = args.original or original_of(args.models[0], read_plan(args.models[0]))
    reference = load_model(original)
    texts = heal_windows(reference.tokenizer, heal_file=None, eval_file=None, unlike_file=None, seq_len=512,
                         eval_windows=24)
    models = {"original": reference.model, **{p: load(p).model for p in args.models}}
    print("| text | model | ppl | ppl, copyable tokens | ppl, fresh tokens | excess nats/token: copyable | fresh |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key, windows in texts.evaluated().items():
        mask = copyable(windows)
        nll = {name: token_nll(m, windows) for name, m in models.items()}
        base = nll["original"]
        for name, v in nll.items():
            excess = [float((v[m] - base[m]).sum()) / v.numel() for m in (mask, ~mask)]
            print(f"| {key} ({float(mask.float().mean()):.1%} copyable) | {name} | {math.exp(v.mean()):.2f} | "
                  f"{math.exp(v[mask].mean()):.2f} | {math.exp(v[~mask].mean()):.2f} | "
                  f"{excess[0]:.3f} | {excess[1]:.3f} |")


if __name__ == "__main__":
    main()
