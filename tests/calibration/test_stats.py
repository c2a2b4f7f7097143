"""Calibration hooks: statistics match a hand-written hook, X^T X on request, hooks always removed."""

import pytest
import torch

from gac.calibration.stats import calibrate, collect_stats
from gac.models.adapters import adapter_for


def _windows(vocab, n=3, seq=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, seq), generator=g)  # [n, seq]


def _manual_inputs(model, names, windows):
    """Every input each linear sees, captured by plain forward hooks: {name: X [tokens, in]} in float64."""
    seen = {n: [] for n in names}
    handles = [model.get_submodule(n).register_forward_hook(
        lambda _m, inputs, _o, n=n: seen[n].append(inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()))
        for n in names]
    try:
        with torch.inference_mode():
            model(windows, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(xs) for n, xs in seen.items()}


@pytest.fixture()
def names(tiny):
    return adapter_for(tiny.config).linear_names(tiny.config)


def _no_hooks(model, names):
    return all(not model.get_submodule(n)._forward_hooks for n in names)


def test_mean_abs_matches_manual_hook(tiny, names):
    windows = _windows(tiny.config.vocab_size)
    expected = _manual_inputs(tiny, names, windows)
    stats = calibrate(tiny, windows, names, batch_size=2, progress=False)
    assert set(stats) == set(names)
    for n in names:
        X = expected[n]
        assert stats[n].tokens == X.shape[0] == windows.numel()
        assert stats[n].xtx is None
        assert stats[n].abs_sum.dtype == torch.float32
        torch.testing.assert_close(stats[n].mean_abs.double(), X.abs().mean(0), rtol=1e-5, atol=1e-5)
    assert _no_hooks(tiny, names)


def test_xtx_when_asked(tiny, names):
    windows = _windows(tiny.config.vocab_size, seed=1)
    subset = [names[0], names[-1]]  # an attention input and an MLP input ([in] differs)
    expected = _manual_inputs(tiny, subset, windows)
    stats = calibrate(tiny, windows, subset, batch_size=1, xtx=True, progress=False)
    for n in subset:
        X = expected[n]
        xtx = stats[n].xtx.matrix()
        assert xtx.dtype == torch.float64
        assert xtx.shape == (X.shape[1], X.shape[1])
        torch.testing.assert_close(xtx, X.T @ X, rtol=1e-5, atol=1e-5)


def test_batch_size_does_not_change_statistics(tiny, names):
    windows = _windows(tiny.config.vocab_size, n=4, seed=2)
    one = calibrate(tiny, windows, names, batch_size=1, progress=False)
    four = calibrate(tiny, windows, names, batch_size=4, progress=False)
    for n in names:
        assert one[n].tokens == four[n].tokens
        torch.testing.assert_close(one[n].mean_abs, four[n].mean_abs, rtol=1e-4, atol=1e-5)


def test_hooks_removed_after_context(tiny, names):
    windows = _windows(tiny.config.vocab_size)
    with collect_stats(tiny, names) as stats:
        assert all(len(tiny.get_submodule(n)._forward_hooks) == 1 for n in names)
        with torch.inference_mode():
            tiny(windows, use_cache=False)
    assert _no_hooks(tiny, names)
    tokens = {n: s.tokens for n, s in stats.items()}
    with torch.inference_mode():
        tiny(windows, use_cache=False)
    assert {n: s.tokens for n, s in stats.items()} == tokens  # nothing recorded after exit


def test_hooks_removed_when_the_block_raises(tiny, names):
    with pytest.raises(KeyError, match="boom"):
        with collect_stats(tiny, names):
            raise KeyError("boom")
    assert _no_hooks(tiny, names)


def test_name_that_sees_no_input_raises(tiny, names):
    seen, unseen = names[0], names[1]
    linear = tiny.get_submodule(seen)
    with pytest.raises(RuntimeError, match=unseen):
        with collect_stats(tiny, [seen, unseen]):
            linear(torch.randn(5, linear.in_features))  # only `seen` runs
    assert _no_hooks(tiny, names)
    with pytest.raises(RuntimeError, match="no input"):
        with collect_stats(tiny, names):
            pass


def test_linears_fed_by_one_input_share_one_xtx(tiny):
    """q, k and v (and gate and up) read the same activation: one X^T X accumulator serves them all, equal to the
    sum over every batch of that input's X^T X."""
    layer = adapter_for(tiny.config).layer(tiny.config, 0)
    windows = _windows(tiny.config.vocab_size, n=4)
    stats = calibrate(tiny, windows, layer.linears, batch_size=2, xtx=True, progress=False)
    assert stats[layer.k].xtx is stats[layer.q].xtx and stats[layer.v].xtx is stats[layer.q].xtx
    assert stats[layer.producers[1]].xtx is stats[layer.producers[0]].xtx
    assert stats[layer.o].xtx is not stats[layer.q].xtx
    inputs = _manual_inputs(tiny, [layer.k, layer.producers[1], layer.o], windows)
    for name, x in inputs.items():  # the shared sums are their input's, and a linear of its own keeps its own
        expected = x.T @ x  # [in, in] float64
        torch.testing.assert_close(stats[name].xtx.matrix(), expected, rtol=1e-10,
                                   atol=1e-12 * float(expected.abs().max()))
        assert stats[name].tokens == x.shape[0]
