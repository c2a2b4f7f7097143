"""Perplexity equals exp(mean next-token NLL) computed by hand; model latency reports every key per model."""

import math

import pytest
import torch

from gac.evaluate.latency import LatencyConfig, measure_latency
from gac.evaluate.perplexity import perplexity
from tests.helpers_tiny import tiny_model

TINY_LATENCY = LatencyConfig(prefill_tokens=16, decode_context=8, warmup=1, prefill_rounds=2, decode_rounds=3)
KEYS = {"prefill_ms", "prefill_spread_pct", "decode_ms_per_token", "decode_spread_pct"}


def _windows(vocab, n=5, seq=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, seq), generator=g)  # [n, seq]


def _manual_nll(model, windows):
    """Mean NLL of every next token, one window at a time, from log-softmax in float64."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for w in windows:
            logp = model(w[None], use_cache=False).logits[0, :-1].double().log_softmax(-1)  # [S-1, V]
            total -= float(logp.gather(1, w[1:, None]).sum())
            count += w.numel() - 1
    return total / count


def test_perplexity_is_exp_of_mean_token_nll(tiny):
    windows = _windows(tiny.config.vocab_size)
    ppl = perplexity(tiny, windows, batch_size=2, progress=False)  # 5 windows: a ragged last batch
    assert math.isfinite(ppl) and ppl > 1
    assert ppl == pytest.approx(math.exp(_manual_nll(tiny, windows)), rel=1e-5)
    # a random-init model on random tokens is close to uniform over the vocabulary
    assert 0.5 * tiny.config.vocab_size < ppl < 2 * tiny.config.vocab_size


def test_perplexity_independent_of_batch_size(tiny):
    windows = _windows(tiny.config.vocab_size, seed=1)
    ppls = [perplexity(tiny, windows, batch_size=b, progress=False) for b in (1, 2, 5)]
    assert ppls[1] == pytest.approx(ppls[0], rel=1e-5)
    assert ppls[2] == pytest.approx(ppls[0], rel=1e-5)


def test_perplexity_near_one_when_every_token_is_predicted(tiny):
    """A head that always predicts token 7 with near certainty: perplexity ~1 on sevens, huge on anything else."""
    windows = _windows(tiny.config.vocab_size, n=2, seq=10, seed=2)
    head = torch.nn.Linear(tiny.config.hidden_size, tiny.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[7] = 30.0
    tiny.lm_head = head
    sevens = torch.full((2, 10), 7)
    ppl = perplexity(tiny, sevens, progress=False)
    assert 1.0 <= ppl < 1.0 + 1e-6
    no_sevens = windows + (windows == 7)  # [2, 10]: every 7 bumped to 8
    ppl_other = perplexity(tiny, no_sevens, progress=False)
    assert ppl_other > 1e10  # each token costs about 30 nats
    assert ppl_other == pytest.approx(math.exp(_manual_nll(tiny, no_sevens)), rel=1e-5)


def test_measure_latency_reports_every_key_for_every_model(tiny):
    models = {"base": tiny, "other": tiny_model(seed=1)}
    result = measure_latency(models, TINY_LATENCY)
    assert set(result) == set(models)
    for name, row in result.items():
        assert set(row) == KEYS, name
        assert all(math.isfinite(v) for v in row.values())
        assert row["prefill_ms"] > 0 and row["decode_ms_per_token"] > 0
        assert row["prefill_spread_pct"] >= 0 and row["decode_spread_pct"] >= 0


@pytest.mark.parametrize("model_type", ["llama", "phi"])
def test_decode_step_is_the_same_token_at_the_same_position_every_call(model_type):
    """The timed decode step appends one token at position `context` of a static cache, every call alike, and its
    logits equal a full forward's at that position; prefill keeps the last position's logits only."""
    from gac.evaluate.latency import _tokens, decode_call, prefill_call

    model = tiny_model(model_type)
    batch, context = 2, 8
    call = decode_call(model, batch, context, seed=3)
    ids = _tokens(model, batch, context + 1, 3)  # the tokens decode_call uses
    with torch.inference_mode():
        first, second = call().logits, call().logits  # [B, 1, V]
        ref = model(ids, use_cache=False).logits[:, -1:]  # [B, 1, V]
        pre = prefill_call(model, batch, context + 1, seed=3)().logits
    assert first.shape == (batch, 1, model.config.vocab_size)
    assert torch.equal(first, second)
    scale = float(ref.abs().max())
    assert torch.allclose(first, ref, rtol=1e-4, atol=1e-4 * scale)
    assert pre.shape == (batch, 1, model.config.vocab_size)
    assert torch.allclose(pre, ref, rtol=1e-4, atol=1e-4 * scale)


def test_decode_passes_the_cache_by_the_name_the_forward_takes():
    """transformers 5.x renamed `past_key_values` to `cache` (the old name warns on every compress); older forwards
    know only the old name."""
    import inspect

    from gac.evaluate.latency import cache_argument

    for model_type in ("llama", "phi"):
        model = tiny_model(model_type)
        name = cache_argument(model)
        assert name in inspect.signature(model.forward).parameters
        assert name == "cache" or "cache" not in inspect.signature(model.forward).parameters

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, **kwargs):
            return input_ids

    assert cache_argument(Old()) == "past_key_values"
