"""Per-weight kernels side by side (gac.hw.threads): results in order, costliest started first, errors raised."""

import threading
import time

import pytest
import torch

from gac.hw.threads import map_side_by_side, workers


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(saved)


def test_costliest_start_first_and_results_keep_the_items_order(two_threads):
    assert workers(5) == 2
    started, lock = [], threading.Lock()

    def fn(x):
        with lock:
            started.append(x)
        time.sleep(x / 1000)  # apart in time, so that the order recorded is the order taken from the queue
        return x * x

    items = [3, 50, 7, 20, 1]
    done = []
    assert map_side_by_side(fn, items, cost=lambda x: x, on_done=lambda: done.append(1)) == [9, 2500, 49, 400, 1]
    assert set(started[:2]) == {50, 20}  # the two workers take the two costliest first
    assert started[2:] == [7, 3, 1]  # then the queue in decreasing cost: the cheapest last
    assert len(done) == len(items)


def test_without_cost_items_start_in_order_and_errors_are_raised(two_threads):
    started, lock = [], threading.Lock()

    def fn(x):
        with lock:
            started.append(x)
        time.sleep(0.01 * (x + 1))
        if x == 2:
            raise ValueError("two")
        return x

    with pytest.raises(ValueError, match="two"):
        map_side_by_side(fn, [0, 1, 2, 3])
    assert sorted(started[:2]) == [0, 1] and started[2:] == [2, 3]


def test_one_worker_runs_in_order():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert map_side_by_side(lambda x: -x, [1, 2, 3], cost=lambda x: x) == [-1, -2, -3]
    finally:
        torch.set_num_threads(saved)


def test_on_a_gpu_one_item_at_a_time_in_the_calling_thread(two_threads):
    """CUDA's lazily loaded linalg library fails when two host threads call it first at once (seen on an H100):
    on a GPU device the items run in order on the caller's thread; the device is only named, so this runs on CPU."""
    assert workers(5, "cpu") == 2 and workers(5, "cuda") == workers(5, torch.device("cuda:0")) == 1
    threads = []
    assert map_side_by_side(lambda x: threads.append(threading.get_ident()) or x + 1, [1, 2, 3],
                            cost=lambda x: x, device="cuda") == [2, 3, 4]
    assert threads == [threading.get_ident()] * 3
    side = []
    map_side_by_side(lambda x: side.append(threading.get_ident()), [1, 2, 3], device="cpu")
    assert threading.get_ident() not in side
