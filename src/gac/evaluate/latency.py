"""Model-level latency: prefill (batch x sequence) and decode per token, every model timed side by side.

Prefill computes logits for the last position only (as a server does before sampling; perplexity keeps all of
them): full-vocabulary logits for every position would dilute the layers' share of the time. Decode appends one
token to a static KV cache of `decode_context` tokens. On CUDA each call is replayed from a CUDA graph so the
events time the GPU, not Python's launches (a call that cannot be captured is timed eagerly and flagged)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gac.checkpoint.placement import input_device
from gac.errors import GacError
from gac.hw.timing import Timing, time_interleaved
from gac.io.validate import field_integer
from gac.models.adapters import text_config

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class LatencyConfig:
    prefill_tokens: int = 512
    batch: int = 1
    decode_context: int = 128  # tokens in the KV cache before decode steps are timed
    warmup: int = 2
    prefill_rounds: int = 10
    decode_rounds: int = 32
    seed: int = 0
    cuda_graphs: bool = True  # on CUDA, time graph replays (False: eager calls, launch-bound for small models)

    def __post_init__(self) -> None:
        for name in ("prefill_tokens", "batch", "decode_context", "prefill_rounds", "decode_rounds"):
            field_integer(getattr(self, name), name, example=getattr(LatencyConfig, name))
        field_integer(self.warmup, "warmup", minimum=0, example=2)


def _tokens(model: PreTrainedModel, batch: int, seq: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vocab = text_config(model.config).vocab_size
    return torch.randint(0, vocab, (batch, seq), generator=g)  # [B, S], the same for every model


def prefill_call(model: PreTrainedModel, batch: int, seq: int, seed: int = 0) -> Callable[[], object]:
    """One forward pass over [batch, seq] tokens without a cache, logits for the last position only."""
    device = input_device(model)
    ids = _tokens(model, batch, seq, seed).to(device)  # [B, S]
    return lambda: model(ids, use_cache=False, logits_to_keep=1)


def cache_argument(model: PreTrainedModel) -> str:
    """The forward's name for the KV cache: `cache` since transformers 5.x renamed it (the old name still works there
    but warns), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def decode_call(model: PreTrainedModel, batch: int, context: int, seed: int = 0) -> Callable[[], object]:
    """One decode step per call at a fixed position: a static KV cache holds `context` tokens (prefilled once) and
    each call writes the next token's keys and values at position `context` (the same work every call)."""
    from transformers import StaticCache

    device = input_device(model)
    ids = _tokens(model, batch, context + 1, seed).to(device)  # [B, context + 1]
    cache = StaticCache(config=model.config, max_cache_len=context + 1)  # per-layer shapes taken at first use
    kw = {cache_argument(model): cache}
    with torch.inference_mode():
        model(ids[:, :context], **kw, use_cache=True, logits_to_keep=1)
    # Each static layer counts the tokens it holds on the device; rewinding the counters before every step keeps
    # the step at position `context` (a device op, so a CUDA graph replays it too).
    counters = [
        c
        for c in (getattr(layer, "cumulative_length", None) for layer in getattr(cache, "layers", ()))
        if isinstance(c, torch.Tensor)
    ]
    if not counters:
        import transformers

        raise GacError(
            f"transformers {transformers.__version__}'s StaticCache keeps no per-layer position counter: "
            "decode timing needs transformers 5.x (pip install -U transformers)"
        )
    step = ids[:, context:]  # [B, 1]
    position = torch.tensor([context], device=device)

    def call() -> object:
        for c in counters:
            c.fill_(context)
        return model(step, **kw, cache_position=position, use_cache=True, logits_to_keep=1)

    return call


def _graph_calls(cfg: LatencyConfig) -> int:
    return 1 if cfg.cuda_graphs else 0  # a forward launches hundreds of kernels: one per replay amortizes them


def prefill_timings(models: dict, batch: int, seq: int, cfg: LatencyConfig) -> dict[str, Timing]:
    device = input_device(next(iter(models.values())))
    calls = {name: prefill_call(m, batch, seq, cfg.seed) for name, m in models.items()}
    return time_interleaved(
        calls, device=device, warmup=cfg.warmup, rounds=cfg.prefill_rounds, graph_calls=_graph_calls(cfg)
    )


def decode_timings(models: dict, cfg: LatencyConfig) -> dict[str, Timing]:
    device = input_device(next(iter(models.values())))
    calls = {name: decode_call(m, cfg.batch, cfg.decode_context, cfg.seed) for name, m in models.items()}
    return time_interleaved(
        calls, device=device, warmup=cfg.warmup, rounds=cfg.decode_rounds, graph_calls=_graph_calls(cfg)
    )


def measure_latency(models: dict, cfg: LatencyConfig = LatencyConfig()) -> dict[str, dict[str, float]]:
    """{name: {prefill_ms, prefill_spread_pct, decode_ms_per_token, decode_spread_pct}} for every model."""
    pre = prefill_timings(models, cfg.batch, cfg.prefill_tokens, cfg)
    dec = decode_timings(models, cfg)
    return {
        name: {
            "prefill_ms": pre[name].median_ms,
            "prefill_spread_pct": pre[name].spread_pct,
            "decode_ms_per_token": dec[name].median_ms,
            "decode_spread_pct": dec[name].spread_pct,
        }
        for name in models
    }
