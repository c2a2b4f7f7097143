"""Run a GGUF in llama.cpp (llama-cpp-python): logits for given token ids, perplexity on gac's evaluation windows,
and prefill / decode throughput from llama.cpp's own timings (llama_perf_context)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gac.export.quantize import llama_cpp_module

if TYPE_CHECKING:
    from llama_cpp import Llama


@dataclass(frozen=True)
class EngineConfig:
    threads: int = 2
    n_ctx: int = 1024  # context: at least the longest window or prefill + decode


@contextlib.contextmanager
def open_gguf(path: Path, cfg: EngineConfig = EngineConfig(), *, logits_all: bool = True) -> Iterator[Llama]:
    """A llama_cpp.Llama for `path` (closed on exit); logits_all keeps every position's logits."""
    llama_cpp = llama_cpp_module()
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=cfg.n_ctx,
        n_batch=cfg.n_ctx,
        n_ubatch=cfg.n_ctx,
        n_threads=cfg.threads,
        n_threads_batch=cfg.threads,
        logits_all=logits_all,
        verbose=False,
    )
    try:
        yield llm
    finally:
        llm.close()


def logits(llm: Llama, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """llama.cpp's logits [S, V] (float32) for one sequence of token ids, from an empty cache."""
    tokens = [int(t) for t in tokens]
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)  # [S, V]


def perplexity(llm: Llama, windows: Sequence[Sequence[int]] | np.ndarray) -> float:
    """exp(mean next-token NLL) over all predicted tokens of windows [n, seq] (as gac.evaluate.perplexity)."""
    nll, count = 0.0, 0
    for window in np.asarray(windows):
        z = logits(llm, window)[:-1].astype(np.float64)  # [S-1, V]
        target = np.asarray(window[1:], dtype=np.int64)  # [S-1]
        zmax = z.max(axis=1, keepdims=True)
        logsumexp = np.log(np.exp(z - zmax).sum(axis=1)) + zmax[:, 0]  # [S-1]
        nll += float((logsumexp - z[np.arange(len(target)), target]).sum())
        count += len(target)
    return math.exp(nll / count)


def timed_round(llm: Llama, prompt: Sequence[int] | np.ndarray, decode_tokens: int) -> dict:
    """One prefill of `prompt` and `decode_tokens` single-token steps, timed by llama.cpp itself:
    {"prefill_tok_s", "decode_tok_s"} from llama_perf_context (t_p_eval_ms / n_p_eval, t_eval_ms / n_eval)."""
    llama_cpp = llama_cpp_module()
    ctx = llm._ctx.ctx  # the llama_context the bindings hold
    llm.reset()
    llama_cpp.llama_perf_context_reset(ctx)
    llm.eval([int(t) for t in prompt])
    llama_cpp.llama_synchronize(ctx)  # llama.cpp adds a batch to its timings when it synchronizes
    token = int(prompt[-1])
    for _ in range(decode_tokens):
        llm.eval([token])  # the same token: decode cost does not depend on which one
        llama_cpp.llama_synchronize(ctx)
    perf = llama_cpp.llama_perf_context(ctx)
    if perf.n_p_eval <= 0 or perf.n_eval <= 0:
        raise RuntimeError(f"llama.cpp reported no timings (n_p_eval {perf.n_p_eval}, n_eval {perf.n_eval})")
    return {
        "prefill_tok_s": 1000.0 * perf.n_p_eval / perf.t_p_eval_ms,
        "decode_tok_s": 1000.0 * perf.n_eval / perf.t_eval_ms,
    }
