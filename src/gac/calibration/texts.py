"""Calibration and evaluation text: Python's own documentation by default (disjoint parts), or user files;
the standard library's sources, which healing trains on beside the docs; the texts unlike them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gac.errors import ConfigError, literal
from gac.io.validate import field_integer
from gac.io.validate import read_text as checked_text

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

EVAL_EVERY = 5  # every 5th pydoc topic (sorted by name) is held out for evaluation
# calibration windows besides those that calibrate, on which --compressor auto and the --speedup guard compare models
HELD_BACK_WINDOWS = 8


def pydoc_split() -> tuple[str, str]:
    """(calibration text, held-out evaluation text) from `pydoc_data.topics`, deterministic and disjoint."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    held_out = [topics[k] for i, k in enumerate(keys) if i % EVAL_EVERY == 0]
    # Topics repeat each other's text (`else` is `if`, `customization` sits inside `specialnames`): drop from
    # the calibration part every paragraph that also appears in the held-out part, so evaluation is unseen text.
    held_paragraphs = {p.strip() for t in held_out for p in t.split("\n\n") if p.strip()}
    calib = [
        "\n\n".join(p for p in topics[k].split("\n\n") if p.strip() not in held_paragraphs)
        for i, k in enumerate(keys)
        if i % EVAL_EVERY != 0
    ]
    return "\n\n".join(c for c in calib if c), "\n\n".join(held_out)


UNLIKE = {  # id -> (name, path under the standard library, required): prose unlike the default calibration text
    "licence": ("Python licence (LICENSE.txt)", "LICENSE.txt", True),  # legal English: no code, no API reference
    "release_notes": ("IDLE release notes (idlelib/NEWS.txt)", "idlelib/NEWS.txt", False),  # terse change notes;
    # some distributions ship IDLE apart (Debian's idle-python3.x), so it is measured where it is there
}


def unlike_texts() -> dict[str, tuple[str, str]]:
    """{id: (name, text)} of the texts unlike the default calibration text that this Python distribution carries
    (UNLIKE): its licence, always, and IDLE's release notes where IDLE is installed."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = {}
    for key, (name, relative, required) in UNLIKE.items():
        path = stdlib / relative
        if path.is_file():
            out[key] = (name, path.read_text(encoding="utf-8", errors="replace"))
        elif required:
            raise ConfigError(
                f"this Python distribution carries no {path}: pass a text unlike the calibration text "
                "with {unlike_file}"
            )
    return out


SOURCES_LEFT_OUT = {"site-packages", "test", "tests", "idle_test"}  # standard-library folders not of its modules


def stdlib_sources(tokenizer: PreTrainedTokenizerBase, tokens: int, seed: int = 0) -> str:
    """Whole source files of the standard library's modules (no tests, no site-packages) in a seeded order, until
    they hold `tokens` tokens: code, its comments and docstrings, and the licence notices some modules carry, a kind
    of text the documentation lacks. The files differ between Python versions, the order never within one."""
    import random
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if not SOURCES_LEFT_OUT & set(p.relative_to(stdlib).parts))
    random.Random(seed).shuffle(files)
    parts, n = [], 0
    for path in files:
        if n >= tokens:
            break
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        n += len(tokenizer(parts[-1], add_special_tokens=False, verbose=False)["input_ids"])
    return "\n\n".join(parts)


def read_text(path: str | Path, flag: str = "--calib-file/--eval-file") -> str:
    """A user's text file: bounded, UTF-8 (or UTF-16/32 with a BOM), refused when binary (see gac.io.validate)."""
    return checked_text(path, "text file", flag)


@dataclass(frozen=True)
class TextConfig:
    calib_file: str | None = None
    eval_file: str | None = None
    seq_len: int = 512
    calib_windows: int = 16
    eval_windows: int = 24

    def __post_init__(self) -> None:
        field_integer(self.seq_len, "seq_len", example=512)
        field_integer(self.calib_windows, "calib_windows", example=16)
        field_integer(self.eval_windows, "eval_windows", example=24)


def token_windows(
    tokenizer: PreTrainedTokenizerBase, text: str, seq_len: int, max_windows: int, *, what: str
) -> torch.Tensor:
    """Non-overlapping [n, seq_len] token windows from the start of `text` (n <= max_windows). Where the tokenizer
    starts a sequence with BOS, so does every window (BOS, then seq_len - 1 tokens of text), as llama.cpp's
    perplexity and lm-evaluation-harness's rolling windows do: a model trained with BOS first (Gemma) computes
    otherwise far from how it runs, and every text token is still predicted once."""
    import torch

    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    bos = start_token(tokenizer)
    step = seq_len - (bos is not None)
    n = min(len(ids) // step, max_windows) if step else 0
    if n == 0:
        raise ConfigError(
            f"{literal(what)} text has {len(ids)} tokens, fewer than one window of {seq_len}: "
            "pass a longer file or a smaller {seq_len}"
        )
    windows = torch.tensor(ids[: n * step], dtype=torch.long).view(n, step)  # [n, step]
    if bos is None:
        return windows  # [n, seq_len]
    return torch.cat([torch.full((n, 1), bos, dtype=torch.long), windows], dim=1)  # [n, seq_len]


def start_token(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The BOS id the tokenizer puts before a text it encodes, or None where it puts none (found by encoding one:
    the flag's name and the post-processor differ between tokenizer classes)."""
    bos = tokenizer.bos_token_id
    with_specials = tokenizer("a", verbose=False)["input_ids"]
    return bos if bos is not None and with_specials[:1] == [bos] else None


def spread(total: int, n: int) -> torch.Tensor:
    """Indices [min(n, total)] of `n` of `total` windows spread evenly from the first to the last, in order."""
    import torch

    return torch.linspace(0, total - 1, n).round().long() if total > n else torch.arange(total)


def calibration_windows(tokenizer: PreTrainedTokenizerBase, cfg: TextConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibrating windows, the rest) [n, seq_len] and [N - n, seq_len]: every window of the calibration text
    (cfg.calib_file, or the docs' calibration part), cfg.calib_windows of them spread evenly over it. Windows spread
    over the whole text fit it less narrowly than its first pages: a compressor calibrated on them loses less on
    text unlike it, and healing takes the docs back."""
    import torch

    text = read_text(cfg.calib_file, "--calib-file") if cfg.calib_file else pydoc_split()[0]
    every = token_windows(tokenizer, text, cfg.seq_len, 1 << 30, what="calibration")  # [N, seq_len]
    chosen = torch.zeros(every.shape[0], dtype=torch.bool)
    chosen[spread(every.shape[0], cfg.calib_windows)] = True
    return every[chosen], every[~chosen]


def held_back_windows(tokenizer: PreTrainedTokenizerBase, cfg: TextConfig, n: int = HELD_BACK_WINDOWS) -> torch.Tensor:
    """Up to `n` calibration windows [k, seq_len] apart from the cfg.calib_windows that calibrate, spread evenly over
    the rest: calibration text that the analysis never saw, to compare models on without touching the evaluation
    text."""
    rest = calibration_windows(tokenizer, cfg)[1]
    if len(rest) == 0:
        raise ConfigError(
            f"the calibration text has no window of {cfg.seq_len} tokens beside the {cfg.calib_windows} "
            "that calibrate, to compare models on ({compressor:auto}, and the {speedup} guard): pass a "
            "longer {calib_file} or fewer {calib_windows} (or {guard:False} with {speedup})"
        )
    return rest[spread(rest.shape[0], n)]


def load_windows(tokenizer: PreTrainedTokenizerBase, cfg: TextConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(calibration windows spread over the calibration text, evaluation windows from the start of the held-out
    text) as LongTensors [n, seq_len]."""
    held_out = read_text(cfg.eval_file, "--eval-file") if cfg.eval_file else pydoc_split()[1]
    return (
        calibration_windows(tokenizer, cfg)[0],
        token_windows(tokenizer, held_out, cfg.seq_len, cfg.eval_windows, what="evaluation"),
    )
