"""Model-level latency: prefill (batch x sequence) and decode per token, every model timed side by side."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gac.hw.timing import Timing, time_interleaved


@dataclass(frozen=True)
class LatencyConfig:
    prefill_tokens: int = 512
    batch: int = 1
    decode_context: int = 128  # tokens in the KV cache before decode steps are timed
    warmup: int = 2
    prefill_rounds: int = 10
    decode_rounds: int = 32
    seed: int = 0

    def __post_init__(self):
        from gac.validate import integer

        integer(self.prefill_tokens, "--prefill-tokens", example=512)
        for name in ("batch", "decode_context", "prefill_rounds", "decode_rounds"):
            integer(getattr(self, name), name, example=getattr(LatencyConfig, name))
        integer(self.warmup, "warmup", minimum=0, example=2)


def _tokens(model, batch: int, seq: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    return torch.randint(0, vocab, (batch, seq), generator=g)  # [B, S], the same for every model


def prefill_call(model, batch: int, seq: int, seed: int = 0) -> Callable[[], object]:
    """One forward pass over [batch, seq] tokens without a cache."""
    device = next(model.parameters()).device
    ids = _tokens(model, batch, seq, seed).to(device)
    return lambda: model(ids, use_cache=False)


def decode_call(model, batch: int, context: int, seed: int = 0) -> Callable[[], object]:
    """One decode step per call: the KV cache is prefilled once, then each call appends one token."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids = _tokens(model, batch, context + 1, seed).to(device)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(ids[:, :context], past_key_values=cache, use_cache=True)
    step = ids[:, context:]  # [B, 1]
    return lambda: model(step, past_key_values=cache, use_cache=True)


def prefill_timings(models: dict, batch: int, seq: int, cfg: LatencyConfig) -> dict[str, Timing]:
    device = next(iter(models.values())).device
    calls = {name: prefill_call(m, batch, seq, cfg.seed) for name, m in models.items()}
    return time_interleaved(calls, device=device, warmup=cfg.warmup, rounds=cfg.prefill_rounds)


def decode_timings(models: dict, cfg: LatencyConfig) -> dict[str, Timing]:
    device = next(iter(models.values())).device
    calls = {name: decode_call(m, cfg.batch, cfg.decode_context, cfg.seed) for name, m in models.items()}
    return time_interleaved(calls, device=device, warmup=cfg.warmup, rounds=cfg.decode_rounds)


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
