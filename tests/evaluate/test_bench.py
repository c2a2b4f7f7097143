"""gac bench on two tiny models: every point and the decode figure for every model, ratios vs the first, plot."""

import dataclasses
import math

import pytest

from gac.errors import GacError
from gac.evaluate.bench import BenchConfig, bench, bench_table_markdown, plot_latency_vs_seq, ratios_vs_first
from gac.hw.timing import cpu_threads
from tests.helpers_tiny import tiny_model

TINY_BENCH = BenchConfig(points=((1, 8), (1, 32), (2, 16)), decode_context=8, warmup=1, rounds=5, decode_rounds=5)


@pytest.fixture(scope="module")
def result():
    # One thread: on a busy 2-core machine two OpenMP threads can make even building a tiny model take seconds.
    with cpu_threads(1):
        model = tiny_model()
        # the same model twice: the ratio of a model vs itself
        return bench({"base": model, "same": model, "other": tiny_model(seed=1)}, TINY_BENCH)


def test_every_point_and_model_has_positive_figures(result):
    assert [(p["batch"], p["seq"]) for p in result["points"]] == list(TINY_BENCH.points)
    assert result["models"] == ["base", "same", "other"]
    for row in [p["results"] for p in result["points"]] + [result["decode"]]:
        assert set(row) == {"base", "same", "other"}
        for t in row.values():
            assert {"median_ms", "p10_ms", "p90_ms", "method"} <= set(t) and t["method"] == "wall"
            assert 0 < t["p10_ms"] <= t["median_ms"] <= t["p90_ms"]
    for key in ("device", "device_name", "dtype", "torch", "threads", "date"):
        assert result[key], key
    assert result["device"] == "cpu" and result["dtype"] == "float32"
    assert result["placement"] == {"base": None, "same": None, "other": None} and result["eager_note"] is None


def test_ratios_vs_first(result):
    ratios = result["ratios_vs_first"]
    assert set(ratios) == {"base", "same", "other"}
    assert ratios["base"]["decode"] == 1.0 and set(ratios["base"]["prefill"].values()) == {1.0}
    assert set(ratios["same"]["prefill"]) == {"1x8", "1x32", "2x16"}
    for name in ("same", "other"):
        r = ratios[name]
        values = [*r["prefill"].values(), r["decode"]]
        assert all(math.isfinite(v) and v > 0 for v in values)
        for p in result["points"]:
            key = f"{p['batch']}x{p['seq']}"
            medians = {n: t["median_ms"] for n, t in p["results"].items()}
            assert r["prefill"][key] == pytest.approx(medians[name] / medians["base"])
        assert r["decode"] == pytest.approx(result["decode"][name]["median_ms"] / result["decode"]["base"]["median_ms"])
    # No bound on how near 1 the timed "same" ratio is: on a shared 2-core CPU a 1 ms call varies several-fold.


def test_ratios_of_equal_medians_are_one():
    t = {"median_ms": 4.0, "p10_ms": 3.0, "p90_ms": 5.0}
    slow = {"median_ms": 8.0, "p10_ms": 7.0, "p90_ms": 9.0}
    fake = {"points": [{"batch": 1, "seq": 16, "results": {"a": t, "a#2": t, "b": slow}}],
            "decode": {"a": t, "a#2": t, "b": slow}}
    ratios = ratios_vs_first(fake)
    assert ratios["a#2"] == {"prefill": {"1x16": 1.0}, "decode": 1.0, "decode_by_batch": {"1": 1.0}}
    assert ratios["b"] == {"prefill": {"1x16": 2.0}, "decode": 2.0, "decode_by_batch": {"1": 2.0}}


def test_markdown_and_plot(result, tmp_path):
    md = bench_table_markdown(result)
    assert "| base |" in md and "| other |" in md and "prefill 2x16 ms" in md and "Latency ratio vs base" in md
    path = plot_latency_vs_seq(result, tmp_path / "plots" / "lat.png")
    assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


@pytest.mark.parametrize("kwargs", [{"points": ()}, {"points": ((1, 0),)}, {"points": ((1, 2, 3),)},
                                    {"rounds": 0}, {"warmup": -1}, {"decode_context": 0}])
def test_bad_config_is_a_user_error(kwargs):
    with pytest.raises(GacError):
        BenchConfig(**kwargs)


def test_mixed_dtypes_are_refused():
    import torch

    with cpu_threads(1), pytest.raises(GacError, match="on one device in one dtype"):
        bench({"a": tiny_model(), "b": tiny_model().to(torch.bfloat16)}, TINY_BENCH)


def test_aa_control_and_decode_batches():
    with cpu_threads(1):
        model = tiny_model()
        cfg = BenchConfig(points=((1, 8),), decode_context=8, decode_batches=(1, 3), warmup=1, rounds=3,
                          decode_rounds=3)
        result = bench({"base": model, "other": tiny_model(seed=1)}, cfg)
    assert result["models"] == ["base", "other"] and set(result["decode"]) == {"base", "other"}
    assert [d["batch"] for d in result["decode_points"]] == [1, 3]
    for p in [*result["points"], *result["decode_points"]]:
        assert set(p["results"]) == {"base", "other"}  # the A/A twin is kept apart from the models
        assert p["aa"]["a"] == p["results"]["base"] and p["aa"]["b"]["median_ms"] > 0
    pairs = [p["aa"] for p in [*result["points"], *result["decode_points"]]]
    assert result["aa_floor_pct"] == pytest.approx(
        max(abs(a["b"]["median_ms"] / a["a"]["median_ms"] - 1) * 100 for a in pairs))
    assert set(result["ratios_vs_first"]["other"]["decode_by_batch"]) == {"1", "3"}
    md = bench_table_markdown(result)
    assert "A/A control" in md and "decode b3" in md
    without = bench({"base": model}, dataclasses.replace(cfg, aa=False, decode_batches=(1,)))
    assert without["aa_floor_pct"] is None and "aa" not in without["points"][0]


@pytest.mark.parametrize("bad", [(), (0,), (1, -2)])
def test_bad_decode_batches(bad):
    with pytest.raises(GacError, match="decode batches"):
        BenchConfig(decode_batches=bad)
