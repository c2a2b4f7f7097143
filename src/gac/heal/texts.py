"""The token windows healing reads: what it trains on, what it stops on, and what it is judged on, kept apart."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gac.errors import GacError

VAL_WINDOWS = 2  # windows of the healing text set aside for early stopping (never trained on)
MIN_TRAIN_WINDOWS = 4  # fewer left to train on is refused
OVERLAP_TOKENS = 32  # a training window sharing a run this long with an evaluation window is dropped


@dataclass
class HealTexts:
    train: torch.Tensor  # [n, seq] training windows
    val: torch.Tensor  # [VAL_WINDOWS, seq] early-stopping windows from the healing text, never trained on
    held_out: torch.Tensor  # [m, seq] the evaluation windows (held-out calibration-kind text, or --eval-file)
    unlike: torch.Tensor  # [k, seq] windows of a text unlike the calibration text
    names: dict  # {"train": ..., "held_out": ..., "unlike": ...}: what each text is
    dropped: int  # healing windows dropped for sharing text with the evaluation windows


def _runs(windows: torch.Tensor, stride: int) -> set:
    """Every OVERLAP_TOKENS-long token run of each window [n, seq] starting at multiples of `stride`."""
    out = set()
    for row in windows.tolist():
        out.update(tuple(row[i:i + OVERLAP_TOKENS]) for i in range(0, len(row) - OVERLAP_TOKENS + 1, stride))
    return out


def sharing(windows: torch.Tensor, evaluation: list[torch.Tensor]) -> torch.Tensor:
    """[n] bool: which of `windows` [n, seq] contain an OVERLAP_TOKENS run of any evaluation window (runs taken at
    every offset of `windows` against the evaluation windows' runs at a stride of OVERLAP_TOKENS: any shared passage
    of 2 x OVERLAP_TOKENS tokens or more is found)."""
    seen = set().union(*(_runs(e, OVERLAP_TOKENS) for e in evaluation))
    return torch.tensor([bool(_runs(w[None], 1) & seen) for w in windows], dtype=torch.bool)


def heal_windows(tokenizer, *, heal_file: str | None, eval_file: str | None, unlike_file: str | None,
                 seq_len: int, eval_windows: int) -> HealTexts:
    """Windows of the healing text (the default calibration text, or `heal_file`) less any that share text with the
    evaluation windows, its last VAL_WINDOWS set aside for early stopping; the held-out evaluation windows (the
    default held-out docs, or `eval_file`); and a text unlike the calibration text (Python's licence, or
    `unlike_file`). A text too short for this is refused in one line."""
    from gac.data import licence_text, pydoc_split, read_text, token_windows

    calib, docs = pydoc_split()
    train_text = read_text(heal_file, "--heal-file") if heal_file else calib
    held_text = read_text(eval_file, "--eval-file") if eval_file else docs
    unlike_name, unlike_text = (unlike_file, read_text(unlike_file, "--unlike-file")) if unlike_file \
        else licence_text()
    held_out = token_windows(tokenizer, held_text, seq_len, eval_windows, what="evaluation")
    unlike = token_windows(tokenizer, unlike_text, seq_len, eval_windows, what="unlike")
    windows = token_windows(tokenizer, train_text, seq_len, 1 << 30, what="healing")
    shared = sharing(windows, [held_out, unlike])
    windows = windows[~shared]
    need = VAL_WINDOWS + MIN_TRAIN_WINDOWS
    if windows.shape[0] < need:
        raise GacError(f"the healing text gives {windows.shape[0]} windows of {seq_len} tokens apart from the "
                       f"evaluation text, fewer than the {need} healing needs: pass a longer --heal-file or a smaller "
                       "--seq-len")
    names = {"train": heal_file or "calibration text (Python docs)",
             "held_out": eval_file or "held-out Python docs", "unlike": unlike_name}
    return HealTexts(windows[:-VAL_WINDOWS], windows[-VAL_WINDOWS:], held_out, unlike, names, int(shared.sum()))
