"""gac.calibration.importance on the tiny model: every proxy finite, non-negative and discriminating; the gradient pass
exact, leak-free and restoring; svd/asvd take any proxy."""

import pytest
import torch

from gac.calibration.stats import calibrate
from gac.cli.options import in_flags
from gac.compressors import make_compressor
from gac.errors import GacError
from gac.calibration.importance import (
    PROXIES,
    channel_scores,
    collect_gradients,
    frozen_parameters,
    gradient_stats,
    measure,
    weight_scores,
)
from gac.models.adapters import adapter_for


def _windows(vocab, n=4, seq=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, seq), generator=g)  # [n, seq]


@pytest.fixture(scope="module")
def setup():
    from tests.helpers_tiny import tiny_model

    model = tiny_model()
    names = adapter_for(model.config).linear_names(model.config)
    windows = _windows(model.config.vocab_size)
    stats = calibrate(model, windows, names, batch_size=2, progress=False)
    grads = gradient_stats(model, windows, names, batch_size=2, progress=False)
    return model, names, windows, stats, grads


@pytest.mark.parametrize("proxy", PROXIES)
def test_each_proxy_finite_nonnegative_and_discriminating(proxy, setup):
    model, names, _, stats, grads = setup
    scores = channel_scores(proxy, model, names, stats=stats, grads=grads)
    assert set(scores) == set(names)
    for name in names:
        s = scores[name]
        w = model.get_submodule(name).weight
        assert s.out.shape == (w.shape[0],) and s.inp.shape == (w.shape[1],)
        for v in (s.out, s.inp):
            assert v.dtype == torch.float32
            assert bool(torch.isfinite(v).all()) and bool((v >= 0).all())
        assert float(s.inp.std()) > 0, name  # input channels (MLP channels, heads via o_proj) differ
        if proxy != "activation":  # activation is the input norm: the same for every output row by definition
            assert float(s.out.std()) > 0, name
        assert s.total == pytest.approx(float(s.inp.double().sum()), rel=1e-4)  # both views sum the same elements
        assert s.total > 0


def test_proxies_rank_channels_differently(setup):
    model, names, _, stats, grads = setup
    down = [n for n in names if n.endswith("down_proj")][0]
    orders = {p: tuple(channel_scores(p, model, [down], stats=stats, grads=grads)[down].inp.argsort().tolist())
              for p in PROXIES}
    assert len(set(orders.values())) == len(PROXIES)


def test_taylor_and_fisher_match_autograd(setup):
    """One batch: the hooked sums equal |dL/dW * W| and (dL/dW)^2 summed per channel, computed directly."""
    model, names, windows, _, _ = setup
    name = names[5]
    ids = windows[:2]
    got = gradient_stats(model, ids, [name], batch_size=2, progress=False)[name]
    w = model.get_submodule(name).weight
    g = torch.autograd.grad(model(ids, labels=ids, use_cache=False).loss, w)[0]
    torch.testing.assert_close(got.taylor_out, (g * w).abs().sum(1), rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(got.taylor_in, (g * w).abs().sum(0), rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(got.fisher_out, g.square().sum(1), rtol=1e-5, atol=1e-12)
    assert got.batches == 1


def test_gradient_pass_accumulates_batch_by_batch(setup):
    model, names, windows, _, _ = setup
    both = gradient_stats(model, windows, names[:2], batch_size=2, progress=False)[names[0]]
    first = gradient_stats(model, windows[:2], names[:2], batch_size=2, progress=False)[names[0]]
    second = gradient_stats(model, windows[2:], names[:2], batch_size=2, progress=False)[names[0]]
    assert both.batches == 2 and first.batches == 1
    torch.testing.assert_close(both.taylor_out, first.taylor_out + second.taylor_out)
    torch.testing.assert_close(both.fisher_in, first.fisher_in + second.fisher_in)
    assert gradient_stats(model, windows, names[:1], batch_size=1, progress=False)[names[0]].batches == 4


def test_out_of_memory_halves_the_batch_and_rolls_back(setup, caplog):
    """An OOM raised mid-backward (after some weights were folded in) retries at half the batch; the sums equal a
    clean run at that batch size, so nothing of the failed batch is counted twice."""
    model, names, windows, _, _ = setup
    clean = gradient_stats(model, windows, names, batch_size=1, progress=False)
    late = model.get_submodule(names[0]).weight  # layer 0: its gradient comes last, after the others folded in
    failed = []

    def oom_once(w):
        if not failed:
            failed.append(True)
            raise torch.OutOfMemoryError("simulated")

    handle = late.register_post_accumulate_grad_hook(oom_once)
    try:
        got = gradient_stats(model, windows, names, batch_size=2, progress=False)
    finally:
        handle.remove()
    assert failed and "retrying with 1 window" in caplog.text
    for n in names:
        assert got[n].batches == clean[n].batches == len(windows)
        torch.testing.assert_close(got[n].fisher_out, clean[n].fisher_out)
        torch.testing.assert_close(got[n].taylor_in, clean[n].taylor_in)


def test_out_of_memory_at_one_window_is_a_clear_error(setup, monkeypatch):
    model, names, windows, _, _ = setup

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("simulated")

    monkeypatch.setattr(model, "forward", oom)
    with pytest.raises(GacError, match="shorter seq_len") as e:
        gradient_stats(model, windows, names[:1], batch_size=1, progress=False)
    assert "shorter --seq-len, a smaller --dtype, or --importance magnitude" in in_flags(e.value)  # the CLI's words


def test_gradient_pass_leaves_the_model_as_it_was(setup):
    model, names, windows, _, _ = setup
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    gradient_stats(model, windows[:2], names, progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())


def test_gradient_pass_fails_loudly_without_data(setup):
    model, names, _, _, _ = setup
    with pytest.raises(RuntimeError, match="no gradient"):
        with collect_gradients(model, names[:1]):
            pass


def test_weight_scores_are_per_parameter(setup):
    model, names, windows, stats, _ = setup
    for proxy in PROXIES:
        s = weight_scores(proxy, model, names, stats=stats, windows=windows, progress=False)
        assert len(s) == len(names) and all(x >= 0 for x in s) and len(set(s)) > 1
    mag = weight_scores("magnitude", model, names[:1], progress=False)[0]
    assert mag == pytest.approx(float(model.get_submodule(names[0]).weight.detach().float().square().mean()), rel=1e-5)


def test_errors_name_the_fix(setup):
    model, names, _, _, _ = setup
    with pytest.raises(GacError, match="unknown importance 'l2'"):
        measure("l2", model, names)
    with pytest.raises(GacError, match="calibration windows"):
        measure("taylor", model, names, windows=None)
    with pytest.raises(GacError, match="calibration statistics"):
        measure("activation", model, names, stats=None)
    with pytest.raises(GacError, match="unknown importance"):
        make_compressor("asvd", importance="nope")


@pytest.mark.parametrize("name,proxy", [("svd", "taylor"), ("asvd", "fisher"), ("asvd", "activation")])
def test_lowrank_compressors_take_any_proxy(name, proxy, setup):
    model, names, windows, stats, _ = setup
    comp = make_compressor(name, importance=proxy)
    assert comp.needs_windows == (proxy in ("taylor", "fisher"))
    analyses = comp.analyze(model, comp.groups(model), stats, windows=windows, progress=False)
    scores = torch.tensor([a.score for a in analyses], dtype=torch.float64)
    assert float(scores.mean()) == pytest.approx(1.0, rel=1e-9)
    expected = torch.tensor(weight_scores(proxy, model, names, stats=stats, windows=windows, progress=False),
                            dtype=torch.float64)
    torch.testing.assert_close(scores, expected / expected.mean(), rtol=1e-4, atol=0)
    other = "magnitude" if proxy != "magnitude" else "activation"
    other_comp = make_compressor(name, importance=other)
    default = other_comp.analyze(model, other_comp.groups(model), stats, windows=windows, progress=False)
    assert [a.score for a in default] != [a.score for a in analyses]  # the proxy replaced the other score


def test_output_fisher_matches_autograd_and_restores_the_model(setup):
    """E[(dl/dy_j)^2] per output channel, l the cross-entropy against labels drawn from the model's own softmax: the
    hooked pass equals the gradients of the output taken one drawn label at a time, with the same seeded draws."""
    import torch.nn.functional as F

    from gac.calibration.importance import FISHER_SAMPLES, FISHER_SEED, output_fisher

    model, names, windows, _, _ = setup
    name = names[5]
    ids = windows[:2]
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    got = output_fisher(model, ids, [name], batch_size=2, progress=False)[name]
    captured = {}
    handle = model.get_submodule(name).register_forward_hook(lambda m, i, o: captured.setdefault("y", o))
    try:
        with torch.enable_grad():
            logits = model(ids, use_cache=False).logits[:, :-1].reshape(-1, model.config.vocab_size).float()
            generator = torch.Generator().manual_seed(FISHER_SEED)
            labels = torch.multinomial(logits.detach().log_softmax(-1).exp(), FISHER_SAMPLES, replacement=True,
                                       generator=generator)
            expected = 0
            for k in range(FISHER_SAMPLES):
                loss = F.cross_entropy(logits, labels[:, k], reduction="sum")
                g = torch.autograd.grad(loss, captured["y"], retain_graph=True)[0]  # [b, seq, out]
                expected = expected + g.double().square().reshape(-1, g.shape[-1]).sum(0)
    finally:
        handle.remove()
    expected = expected / (logits.shape[0] * FISHER_SAMPLES)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-12 * float(expected.max()))
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])])
def test_the_fisher_labels_do_not_depend_on_the_device(device):
    """The same logits draw the same labels on any device (a CPU generator draws them), so the output Fisher, and
    the dims chosen from it, are the same on a CPU and a GPU; a GPU's own generator draws other numbers."""
    from gac.calibration.importance import drawn_label_losses, fisher_generator

    assert fisher_generator().device.type == "cpu"
    logits = torch.randn(2, 9, 50, generator=torch.Generator().manual_seed(1)) * 3
    on_cpu = drawn_label_losses(logits, fisher_generator())
    on_device = drawn_label_losses(logits.to(device), fisher_generator())
    assert all(t.device.type == device for t in on_device)
    torch.testing.assert_close(torch.stack(on_device).cpu(), torch.stack(on_cpu), rtol=1e-5, atol=1e-5)
    reseeded = drawn_label_losses(logits, torch.Generator().manual_seed(1))
    assert not torch.allclose(torch.stack(reseeded), torch.stack(on_cpu))  # the losses do depend on the labels


def test_output_fisher_is_the_models_own_not_the_texts(setup):
    """At the logits z, dl/dz = p - onehot(label): with labels drawn from p, E[sum_j (dl/dz_j)^2] = 1 - sum_j p_j^2
    per token, whatever the text says next; the text's own labels give sum_j p_j^2 - 2 p_label + 1 instead."""
    import copy

    from gac.calibration.importance import output_fisher

    model, _, windows, _, _ = setup
    model = copy.deepcopy(model)  # peaked predictions (the tiny model's are near uniform, where both agree)
    with torch.no_grad():
        model.lm_head.weight.mul_(4)
    got = float(output_fisher(model, windows, ["lm_head"], batch_size=2, progress=False)["lm_head"].sum())
    with torch.no_grad():
        p = model(windows, use_cache=False).logits[:, :-1].double().softmax(-1)  # [n, seq - 1, V]
    own = float((1 - p.square().sum(-1)).mean())
    text = float((p.square().sum(-1) - 2 * p.gather(-1, windows[:, 1:, None]).squeeze(-1) + 1).mean())
    assert abs(got - own) < 0.05 * own  # Monte-Carlo error over the windows' tokens and draws
    assert abs(text - own) > 4 * abs(got - own)  # nearer the model's own figure than the text's, by far


def test_output_loss_model_allocates_within_budget(setup):
    """importance "output" (the default of asvd): curves per weight, ranks within the budget, knapsack slopes."""
    model, names, windows, _, _ = setup
    comp = make_compressor("asvd")
    assert comp.needs_xtx and comp.needs_windows
    stats = calibrate(model, windows, names, batch_size=2, xtx=True, progress=False)
    units = comp.analyze(model, comp.groups(model), stats, windows=windows, progress=False)
    assert all(u.curve is not None and len(u.curve) == u.max_dim + 1 for u in units)
    budget = int(0.7 * sum(u.numel for u in units))
    ranks = comp.allocate(units, budget)
    assert sum(u.params(ranks[u.name]) for u in units) <= budget
    assert all(r is None or 1 <= r <= u.max_dim for u, r in zip(units, ranks.values()))
    assert all(u.marginal_score(u.max_dim // 2) >= 0 for u in units)
    with pytest.raises(GacError, match="unknown importance"):
        make_compressor("prune", importance="output")


def test_frozen_parameters_restores_each_flag_even_on_error():
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    module[1].bias.requires_grad_(False)  # a mixed starting state
    before = [p.requires_grad for p in module.parameters()]
    with pytest.raises(KeyError), frozen_parameters(module) as params:
        assert len(params) == 4 and not any(p.requires_grad for p in params)
        params[0].requires_grad_(True)  # the block may turn some back on
        raise KeyError("boom")
    assert [p.requires_grad for p in module.parameters()] == before == [True, True, True, False]
