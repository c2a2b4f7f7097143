"""Timing helpers on CPU: sleep-calibrated medians, round-robin interleaving, thread count restored."""

import time

import pytest
import torch

from gac.hw.timing import Timing, cpu_threads, time_callable, time_interleaved


def test_sleep_median_close_to_sleep():
    t = time_callable(lambda: time.sleep(0.005), warmup=1, repeats=7)
    assert t.n == 7
    assert 4.9 <= t.median_ms < 25  # sleep never returns early; a busy machine may add a little
    assert t.min_ms <= t.p10_ms <= t.median_ms <= t.p90_ms


def test_from_samples_percentiles_and_spread():
    t = Timing.from_samples([float(x) for x in range(1, 12)])  # 1..11 ms
    assert (t.median_ms, t.min_ms, t.n) == (6.0, 1.0, 11)
    assert t.p10_ms == pytest.approx(2.0) and t.p90_ms == pytest.approx(10.0)
    assert t.spread_pct == pytest.approx((10.0 - 2.0) / 6.0 * 100)
    with pytest.raises(ValueError):
        Timing.from_samples([])


def test_interleaved_round_robin_all_keys():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    result = time_interleaved(fns, warmup=2, rounds=4)
    assert set(result) == {"a", "b", "c"}
    assert all(t.n == 4 for t in result.values())
    assert calls == ["a", "b", "c"] * 6  # 2 warm-up rounds + 4 timed rounds, one call of each per round


def test_runs_under_inference_mode():
    seen = []
    time_callable(lambda: seen.append(torch.is_inference_mode_enabled()), warmup=1, repeats=2)
    assert seen and all(seen)


def test_cpu_threads_restores_even_on_error():
    before = torch.get_num_threads()
    with cpu_threads(1) as n:
        assert n == torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), cpu_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with cpu_threads(None) as n:
        assert n == before
    with pytest.raises(ValueError):
        with cpu_threads(0):
            pass


def test_launch_bound_only_for_eager_cuda_timings_the_host_kept_up_with():
    assert Timing(1.0, 0.9, 1.1, 0.9, 5, "events", host_ms=0.95).launch_bound
    assert not Timing(1.0, 0.9, 1.1, 0.9, 5, "events", host_ms=0.2).launch_bound
    assert not Timing(1.0, 0.9, 1.1, 0.9, 5, "graph").launch_bound
    assert not Timing(1.0, 0.9, 1.1, 0.9, 5, "wall").launch_bound


def test_graph_calls_ignored_on_cpu():
    calls = []
    t = time_callable(lambda: calls.append(1), warmup=1, repeats=3, graph_calls=8)
    assert t.method == "wall" and t.n == 3 and len(calls) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("graph_calls", [0, 16])
def test_cuda_graph_timing_amortizes_launches(graph_calls):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = torch.randn(64, 64, device="cuda")
    t = time_callable(lambda: x @ x, device="cuda", warmup=2, repeats=10, graph_calls=graph_calls)
    assert t.method == ("graph" if graph_calls else "events") and t.median_ms > 0
    if graph_calls:
        assert t.host_ms is None
    else:
        assert t.host_ms is not None and t.launch_bound  # a 64x64 matmul is far faster than its launch


@pytest.mark.gpu
def test_uncapturable_callable_falls_back_to_events():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = torch.randn(8, device="cuda")
    t = time_callable(lambda: float(x.sum()), device="cuda", warmup=1, repeats=3, graph_calls=4)  # host sync
    assert t.method == "events" and t.n == 3
    y = torch.ones(32, 32, device="cuda")  # no CUDA RNG: torch leaves it unusable after a failed capture
    assert time_callable(lambda: y @ y, device="cuda", warmup=1, repeats=3, graph_calls=4).method == "graph"
