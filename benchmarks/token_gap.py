"""Where a compressed (or healed) model loses against its original, token by token, on gac heal's evaluation texts:
tokens a model can copy from earlier in its window (the two tokens before and this one occurred together before)
against fresh ones, and upper-case tokens (letters, none lower-case) against the rest, as the excess NLL over the
original's in nats per token of the whole text (each pair of columns adds up to the log of the perplexity ratio);
the share of the excess the worst 5% of tokens hold; and with --top K, those K tokens in their context.

    python benchmarks/token_gap.py out/asvd-0.15 out/asvd-0.15-healed --top 20    # --original: from the plan
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


def upper_case(windows: torch.Tensor, tokenizer) -> torch.Tensor:
    """[n, seq - 1] bool: whether each predicted token's text has letters and none of them lower-case."""
    def upper(t: int) -> bool:
        text = tokenizer.decode([t])
        return text.upper() == text and text.lower() != text

    table = {t: upper(t) for t in windows.unique().tolist()}
    return torch.tensor([[table[t] for t in row[1:]] for row in windows.tolist()], dtype=torch.bool)


def worst_share(excess: torch.Tensor, share: float = 0.05) -> float:
    """The part of the summed excess [tokens] that its worst `share` of tokens hold (above 1: the rest gained)."""
    worst = excess.flatten().sort(descending=True).values[:max(1, int(share * excess.numel()))]
    return float(worst.sum() / excess.sum())


@torch.inference_mode()
def token_nll(model, windows: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """[n, seq - 1] next-token NLL of `model` on `windows` [n, seq]."""
    out = []
    for chunk in windows.split(batch):
        logits = model(chunk, use_cache=False).logits[:, :-1].float()  # [B, S-1, V]
        out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none"))
    return torch.cat(out)


def main() -> None:
    from gac.checkpoint.gac_dir import load, read_plan
    from gac.checkpoint.loading import load_model
    from gac.heal.run import original_of
    from gac.heal.texts import heal_windows

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="gac output directories")
    ap.add_argument("--original", help="the uncompressed model [default: the first output's gac_plan.json]")
    ap.add_argument("--top", type=int, default=0, help="list each model's K tokens of largest excess, in context")
    args = ap.parse_args()
    original = args.original or original_of(args.models[0], read_plan(args.models[0]))
    reference = load_model(original)
    tokenizer = reference.tokenizer
    texts = heal_windows(tokenizer, heal_file=None, eval_file=None, unlike_file=None, seq_len=512, eval_windows=24)
    models = {"original": reference.model, **{p: load(p).model for p in args.models}}
    print("| text | model | ppl | excess nats/token: copyable | fresh | upper-case | other | worst 5% hold |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    worst = []
    for key, windows in texts.evaluated().items():
        copy, upper = copyable(windows), upper_case(windows, tokenizer)
        nll = {name: token_nll(m, windows) for name, m in models.items()}
        base = nll["original"]
        label = f"{key} ({float(copy.float().mean()):.1%} copyable, {float(upper.float().mean()):.1%} upper-case)"
        for name, v in nll.items():
            excess = v - base
            parts = [float(excess[m].sum()) / v.numel() for m in (copy, ~copy, upper, ~upper)]
            held = f"{worst_share(excess):.0%}" if excess.sum() > 0 else ""  # no loss to share out
            print(f"| {label} | {name} | {math.exp(v.mean()):.2f} | " + " | ".join(f"{p:.3f}" for p in parts)
                  + f" | {held} |")
            for i in excess.flatten().topk(args.top).indices.tolist() if name != "original" else []:
                row, col = divmod(i, excess.shape[1])
                worst.append((key, name, row, col, float(excess[row, col]), float(base[row, col]), windows))
    for key, name, row, col, excess, base_nll, windows in worst:
        context = tokenizer.decode(windows[row, max(0, col - 7):col + 1])
        print(f"{key} {name}: +{excess:.2f} nats (original {base_nll:.2f}) {context!r} -> "
              f"{tokenizer.decode(windows[row, col + 1:col + 2])!r}")


if __name__ == "__main__":
    main()
