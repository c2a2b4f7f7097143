"""The token windows healing reads: what it trains on, what it stops on, and what it is judged on, kept apart."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from gac.calibration.texts import pydoc_split, read_text, stdlib_sources, token_windows, unlike_texts
from gac.distributed import broadcast_object, world
from gac.errors import ConfigError, GacError
from gac.evaluate.perplexity import perplexity
from gac.hw.profile import cache_root
from gac.io.atomic import write_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

VAL_WINDOWS = 2  # windows of the healing text set aside for early stopping (never trained on)
MIN_TRAIN_WINDOWS = 4  # fewer left to train on is refused
OVERLAP_TOKENS = 32  # a training window sharing a run this long with an evaluation window is dropped
SOURCES_SHARE = 1.0  # the default healing text: the docs' calibration part and this many times its tokens of the
# standard library's sources, which heal the texts unlike the docs further


@dataclass
class HealTexts:
    train: torch.Tensor  # [n, seq] training windows
    val: torch.Tensor  # [VAL_WINDOWS, seq] early-stopping windows from the healing text, never trained on
    held_out: torch.Tensor  # [m, seq] the evaluation windows (held-out calibration-kind text, or --eval-file)
    unlike: dict  # {id: [k, seq] windows} of texts unlike the calibration (gac.calibration.texts.UNLIKE or "unlike")
    names: dict  # {"train": ..., "held_out": ..., and each unlike text's id: ...}: what each text is
    dropped: int  # healing windows dropped for sharing text with the evaluation windows
    sampled: int = 0  # of the training windows, how many were sampled from the original (gac.heal.samples)

    def evaluated(self) -> dict:
        """{id: windows} of every evaluation text: the held-out text ("held_out"), then each unlike text."""
        return {"held_out": self.held_out, **self.unlike}

    def perplexities(self, model: nn.Module, who: str = "model", progress: bool = True) -> dict:
        """{id: perplexity of `model`} on every evaluation text (`who` names it in the progress bars); under torchrun
        each rank evaluates its share of each text's windows (the report's ledger names them windows_<id>)."""
        return {
            k: perplexity(model, w, desc=f"perplexity {who} {k}", progress=progress, ledger=f"windows_{k}")
            for k, w in self.evaluated().items()
        }

    def cached_perplexities(self, model: nn.Module, who: str = "model", progress: bool = True) -> dict:
        """perplexities(), measured once for a model's tensors on these windows (with this torch, on this device) and
        then read back from gac's cache: the original's, which every healing of its compressions reports. Under
        torchrun rank 0 alone reads and writes the cache and tells the others whether to measure."""
        path = cache_root() / "perplexity" / f"{_fingerprint(model, self.evaluated())}.json"
        cached = None
        if world().is_main:
            try:
                cached = json.loads(path.read_text())
            except (OSError, ValueError):
                pass
        # ranks on other nodes may hold another cache, or none: they measure together, or not at all
        cached = broadcast_object(cached, what="sharing the cached perplexities")
        if isinstance(cached, dict) and cached.keys() == self.evaluated().keys():
            return cached
        ppl = self.perplexities(model, who, progress)
        if not world().is_main:
            return ppl
        try:
            write_text(path, json.dumps(ppl))
        except GacError as e:
            log.warning("could not cache the perplexities: %s", e)
        return ppl

    def with_samples(self, windows: torch.Tensor) -> HealTexts:
        """These texts with `windows` [n, seq] sampled from the original beside the healing text's (less any that
        share a passage with the evaluation windows, as the healing text's): the last VAL_WINDOWS of them join the
        early-stopping windows, so stopping weighs both."""
        shared = sharing(windows, self.evaluated().values())
        windows = windows[~shared]
        if windows.shape[0] <= VAL_WINDOWS:
            raise ConfigError(
                f"{windows.shape[0]} of the windows sampled from the original are apart from the "
                "evaluation text, too few to heal on: pass {samples:0} or a larger count"
            )
        train, val = windows[:-VAL_WINDOWS], windows[-VAL_WINDOWS:]
        names = {**self.names, "train": f"{self.names['train']} + {train.shape[0]} windows sampled from the original"}
        return replace(
            self,
            train=torch.cat([self.train, train]),
            val=torch.cat([self.val, val]),
            names=names,
            sampled=self.sampled + train.shape[0],
            dropped=self.dropped + int(shared.sum()),
        )


def _fingerprint(model: nn.Module, windows: dict[str, torch.Tensor]) -> str:
    """A hash of the model's tensors, the windows {id: [n, seq]}, the torch version and the device type."""
    h = hashlib.sha256(f"{torch.__version__} {next(model.parameters()).device.type}".encode())
    for name, t in [*model.state_dict().items(), *windows.items()]:
        h.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy())
    return h.hexdigest()[:32]


def _runs(windows: torch.Tensor, stride: int) -> set:
    """Every OVERLAP_TOKENS-long token run of each window [n, seq] starting at multiples of `stride`."""
    out: set[tuple[int, ...]] = set()
    for row in windows.tolist():
        out.update(tuple(row[i : i + OVERLAP_TOKENS]) for i in range(0, len(row) - OVERLAP_TOKENS + 1, stride))
    return out


def sharing(windows: torch.Tensor, evaluation: Iterable[torch.Tensor]) -> torch.Tensor:
    """[n] bool: which of `windows` [n, seq] contain an OVERLAP_TOKENS run of any evaluation window (runs taken at
    every offset of `windows` against the evaluation windows' runs at a stride of OVERLAP_TOKENS: any shared passage
    of 2 x OVERLAP_TOKENS tokens or more is found)."""
    seen = set().union(*(_runs(e, OVERLAP_TOKENS) for e in evaluation))
    return torch.tensor([bool(_runs(w[None], 1) & seen) for w in windows], dtype=torch.bool)


def heal_windows(
    tokenizer: PreTrainedTokenizerBase,
    *,
    heal_file: str | None,
    eval_file: str | None,
    unlike_file: str | None,
    seq_len: int,
    eval_windows: int,
) -> HealTexts:
    """Windows of the healing text (`heal_file`, or by default the standard library's sources then the calibration text,
    SOURCES_SHARE times its tokens of sources) less any that share text with the evaluation windows, its last
    VAL_WINDOWS set aside for early stopping; the held-out evaluation windows (the default held-out docs, or
    `eval_file`); and the texts unlike the calibration text (gac.calibration.texts.unlike_texts, or `unlike_file`). A
    text too short for this is refused in one line."""
    calib, docs = pydoc_split()
    held_text = read_text(eval_file, "--eval-file") if eval_file else docs
    unlike_named = {"unlike": (unlike_file, read_text(unlike_file, "--unlike-file"))} if unlike_file else unlike_texts()
    held_out = token_windows(tokenizer, held_text, seq_len, eval_windows, what="evaluation")
    unlike = {
        key: token_windows(tokenizer, text, seq_len, eval_windows, what=name)
        for key, (name, text) in unlike_named.items()
    }
    train_name = heal_file or "calibration text (Python docs) + standard-library sources"
    if heal_file:
        windows = token_windows(tokenizer, read_text(heal_file, "--heal-file"), seq_len, 1 << 30, what="healing")
    else:  # the sources first, so the early-stopping windows (the last) are the docs', as with the docs alone
        docs_windows = token_windows(tokenizer, calib, seq_len, 1 << 30, what="calibration")
        sources = stdlib_sources(tokenizer, int(SOURCES_SHARE * docs_windows.numel()))
        try:
            windows = torch.cat(
                [token_windows(tokenizer, sources, seq_len, 1 << 30, what="standard-library source"), docs_windows]
            )
        except GacError:  # a distribution without its sources (bytecode only): the docs alone
            log.warning(
                "this Python carries no standard-library sources to heal on beside the docs: healing on the docs alone"
            )
            windows, train_name = docs_windows, "calibration text (Python docs)"
    shared = sharing(windows, [held_out, *unlike.values()])
    windows = windows[~shared]
    need = VAL_WINDOWS + MIN_TRAIN_WINDOWS
    if windows.shape[0] < need:
        raise ConfigError(
            f"the healing text gives {windows.shape[0]} windows of {seq_len} tokens apart from the "
            f"evaluation text, fewer than the {need} healing needs: pass a longer {{heal_file}} or a smaller "
            "{seq_len}"
        )
    names = {
        "train": train_name,
        "held_out": eval_file or "held-out Python docs",
        **{k: name for k, (name, _) in unlike_named.items()},
    }
    return HealTexts(windows[:-VAL_WINDOWS], windows[-VAL_WINDOWS:], held_out, unlike, names, int(shared.sum()))
