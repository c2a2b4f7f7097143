"""The speedup ceiling of each compressor: the original timed side by side with a copy in which every linear the
compressor may shrink is free (it returns a zero tensor of its output shape, kept from the first call). No choice of
that compressor's dims can run faster than this copy: a low-rank pair or a narrower GEMM still costs something, and
the ops around it are unchanged. A `--speedup` target above the ceiling cannot be met by any allocation.

  python benchmarks/ceiling.py                                  # embedded SmolLM2-135M, prefill 1x512 and decode 1x512
  python benchmarks/ceiling.py --compressors palu --phases prefill --shape 1x512 --rounds 30
Prints one row per compressor and phase: the share of the layers' linear FLOPs those linears hold, the baseline, the
ceiling copy and the A/A floor of that timing.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing


class Free(torch.nn.Module):
    """A linear at no cost: the zeros of its output shape, allocated at the first call of each input shape."""

    def __init__(self, out_features: int):
        super().__init__()
        self.out_features = out_features
        self.outputs = {}

    def forward(self, x):
        shape = (*x.shape[:-1], self.out_features)
        if shape not in self.outputs:
            self.outputs[shape] = x.new_zeros(shape)
        return self.outputs[shape]


def ceiling_copy(model, linears: list[str]):
    free = copy.deepcopy(model)
    for name in linears:
        parent, _, child = name.rpartition(".")
        setattr(free.get_submodule(parent), child, Free(free.get_submodule(name).out_features))
    return free


def flop_share(model, linears: list[str]) -> float:
    """The linears' share of the decoder layers' linear weights (their FLOPs per token), the logits head left out
    (prefill computes one position's logits)."""
    layer = {n: m.weight.numel() for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"}
    return sum(layer[n] for n in linears) / sum(layer.values())


def main() -> None:
    from gac.errors import GacError

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--compressors", nargs="+", default=["asvd", "svd_llm", "palu", "prune"])
    p.add_argument("--phases", nargs="+", default=["prefill", "decode"], choices=["prefill", "decode"])
    p.add_argument("--shape", default="1x512", help="BxS: prefill tokens, or the decode KV-cache length")
    p.add_argument("--rounds", type=int, default=20, help="interleaved calls per model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    try:
        run(args)
    except GacError as e:
        sys.exit(f"error: {e}")


def run(args) -> None:
    from gac.checkpoint.loading import load_model
    from gac.compressors import make_compressor
    from gac.models.groups import linears_of
    from gac.objectives.latency.config import SpeedupConfig, parse_shape
    from gac.objectives.latency.steps import time_beside

    batch, seq = parse_shape(args.shape)
    model = load_model(args.model, dtype=args.dtype, device=args.device).model
    linears = {name: linears_of(make_compressor(name).groups(model)) for name in args.compressors}
    free = {name: ceiling_copy(model, linears[name]) for name in args.compressors}
    shares = {name: flop_share(model, linears[name]) for name in args.compressors}
    print(f"{torch.__version__}, {args.device}, {args.dtype}, {torch.get_num_threads()} threads, {args.model}")
    print("| compressor | phase, shape | share of layer FLOPs | baseline ms | ceiling ms | ceiling speedup | A/A floor |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for phase in args.phases:
        cfg = SpeedupConfig(phase=phase, batch=batch, seq=seq, timing_rounds=args.rounds)
        base, floor, t = time_beside(model, free, cfg)  # timed in inference mode
        for name in args.compressors:
            ms = t[name].median_ms
            print(f"| {name} | {phase} {args.shape} | {100 * shares[name]:.1f}% | {base:.2f} | {ms:.2f} | "
                  f"{base / ms:.3f}x | {100 * floor:.1f}% |", flush=True)


if __name__ == "__main__":
    main()
