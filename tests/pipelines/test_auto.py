"""`--compressor auto` (gac.pipelines.auto) on a tiny 4-layer random model: one calibration for every compressor, the
kept one the best measured (a stand-in measurement decides, so a choice by prediction alone fails), the report listing
every compressor, the output loading as the kept compressor's, and its refusals in one line."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

import gac.pipelines.auto
from gac.api import CompressConfig, compress
from gac.compressors import AUTO_BUILT, AUTO_CANDIDATES
from gac.errors import GacError
from tests.helpers import assert_names_a_fix, assert_one_error_line, gac_cli
from tests.helpers_compress import fast_config


@pytest.fixture(scope="module")
def tiny4_dir(tmp_path_factory):
    """A tiny random Llama with 4 layers: prune's default layers (all but the first and last) exist."""
    import torch
    import transformers

    from tests.helpers_tiny import TINY, tiny_tokenizer

    d = tmp_path_factory.mktemp("tiny4")
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{**TINY, "num_hidden_layers": 4})) \
        .save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


class Sequence:
    """mean_loss stand-in (the held-back loss): the original first (10 nats), then each model measured `step` nats
    from the one before, so the last built candidate measures best (step < 0) or worst (step > 0) whatever its
    prediction."""

    def __init__(self, step: float):
        self.step, self.calls = step, 0

    def __call__(self, model, windows):
        self.calls += 1
        return 10.0 + self.step * (self.calls - 1)


def test_a_candidate_s_figures_are_written_as_report_json_had_them():
    """Predicted and Measured: typed while auto runs, today's keys (in today's order) in report.json's "auto"."""
    from gac.pipelines.auto import LOSS_MODEL, Measured, Predicted

    assert Predicted.of(0.1, LOSS_MODEL, 10, {}).to_dict() == {"loss": 0.1, "loss_from": LOSS_MODEL, "params": 10}
    timed = Predicted.of(0.1, LOSS_MODEL, 10, {"ms": 2.0, "speedup": 1.5}).to_dict()
    assert list(timed) == ["loss", "loss_from", "params", "ms", "speedup"]
    assert Measured.of(0.2, 10, {}).to_dict() == {"loss": 0.2, "params": 10}
    looped = Measured.of(0.2, 10, {"speedup": 1.3, "reached": False, "streams": {}}).to_dict()
    assert looped == {"loss": 0.2, "params": 10, "speedup": 1.3, "reached": False, "streams": {}}


@pytest.mark.slow
@pytest.mark.parametrize("step, kept_built", [(-0.1, 1), (0.1, 0)])
def test_auto_keeps_the_best_measured(tiny4_dir, tmp_path, monkeypatch, step, kept_built):
    """Falling losses make the second-best predicted measure best, rising ones the best predicted: keeping by
    prediction, or the first or last built, fails one of the two."""
    from gac.checkpoint.gac_dir import load, read_plan
    from gac.models.structure import structure_of

    monkeypatch.setattr(gac.pipelines.auto, "mean_loss", Sequence(step))
    out = tmp_path / "out"
    result = compress(fast_config(tiny4_dir, compressor="auto", ratio=0.3, out=str(out)))
    a = result.report.auto
    assert set(a["candidates"]) == set(AUTO_CANDIDATES) and len(a["built"]) == AUTO_BUILT
    predicted = {n: c["predicted"]["loss"] for n, c in a["candidates"].items() if c["status"] != "skipped"}
    assert a["built"] == sorted(predicted, key=predicted.get)[:AUTO_BUILT]  # the best predicted are built
    assert a["kept"] == a["built"][kept_built]
    measured = {n: a["candidates"][n]["measured"]["loss"] for n in a["built"]}
    assert a["kept"] == min(measured, key=measured.get)
    for name, c in a["candidates"].items():  # every compressor: predicted figures, or why it could not run
        if c["status"] == "skipped":
            assert_names_a_fix(c["why"])
            continue
        assert c["predicted"]["params"] > 0 and c["predicted"]["loss_from"] in (gac.pipelines.auto.LOSS_MODEL,
                                                                               gac.pipelines.auto.MEASURED_AT_PREDICTED)
        assert (c["measured"] is not None) == (name in a["built"])
        if c["measured"]:  # timed beside the original at prefill (reported; at equal parameters the loss decides)
            assert c["measured"]["speedup"] > 0 and "reached" not in c["measured"]
        assert c["status"] == ("kept" if name == a["kept"] else "built" if name in a["built"] else "predicted")
    # every compressor removes the same parameters of the common ones, each at its own ratio
    assert a["removed_params"] == a["compressible_params"] - int((1 - 0.3) * a["compressible_params"])
    for name in predicted:  # the same parameters removed from the weights any compressor may touch, each its way
        assert a["candidates"][name]["predicted"]["params"] <= a["compressible_params"] - a["removed_params"] + 1
    # the run continues as the kept compressor's: report, plan and the saved model agree
    r = json.loads((out / "report.json").read_text())
    assert r == json.loads(json.dumps(result.report.to_dict()))
    assert r["compressor"] == a["kept"] and r["ratio"] == a["candidates"][a["kept"]]["ratio"]
    plan = read_plan(out)
    assert plan["compressor"]["name"] == a["kept"] and plan["dims"] == r["dims"]["gac"]
    assert structure_of(load(out).model) == structure_of(result.models["gac"])
    md = (out / "report.md").read_text()
    assert f"Compressor auto: kept {a['kept']}" in md
    assert all(f"| {name} |" in md for name in AUTO_CANDIDATES) and "prefill speedup" in md


@pytest.mark.slow
def test_auto_calibrates_once_and_keeps_what_the_single_run_builds(tiny4_dir, monkeypatch):
    """One calibration pass and one output-gradient pass for all compressors; the kept model's dims are those a
    single run of the kept compressor at its own ratio chooses."""
    import gac.calibration.stats
    import gac.calibration.importance

    counts = {"calibrate": 0, "output_fisher": 0}

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kw):
            counts[name] += 1
            return real(*args, **kw)

        gac_modules = [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "gac"]
        for importer in [m for m in gac_modules if getattr(m, name, None) is real]:
            monkeypatch.setattr(importer, name, wrapper)  # every module that imported it, at its top or not

    counted(gac.calibration.stats, "calibrate")
    counted(gac.calibration.importance, "output_fisher")
    auto = compress(fast_config(tiny4_dir, compressor="auto", ratio=0.2, evaluate=False))
    assert counts == {"calibrate": 1, "output_fisher": 1}
    kept = auto.report.compressor
    monkeypatch.undo()
    single = compress(fast_config(tiny4_dir, compressor=kept, ratio=auto.report.ratio, evaluate=False))
    assert auto.report.dims == single.report.dims


@pytest.mark.slow
def test_auto_under_speedup_keeps_the_best_reaching(tiny4_dir, tmp_path):
    """--speedup: each compressor's prediction from its fitted latency tables (no round timed), the best two through
    their closed loops, the lower measured loss of those that reached kept (stand-in timer and tables; the guard's
    loss, which auto reuses, falls with every model measured: the second built is kept)."""
    from tests.helpers_latency import ShortThenReached, objective

    result = compress(fast_config(tiny4_dir, compressor="auto", out=str(tmp_path / "out"),
                                  speedup=objective(ShortThenReached(), loss=Sequence(-0.1))))
    a = result.report.auto
    for name, c in a["candidates"].items():
        if c["status"] != "skipped":
            assert c["predicted"]["ms"] > 0 and c["predicted"]["speedup"] > 1.0, name
    built = {n: a["candidates"][n]["measured"] for n in a["built"]}
    assert all(m["reached"] and set(m["streams"]) == {"latency", "parameter"} for m in built.values())
    assert a["kept"] == a["built"][1] == min(built, key=lambda n: built[n]["loss"])
    assert result.report.compressor == a["kept"] and result.report.latency_objective["reached"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "measured speedup" in md and "(reached)" in md and "(latency " in md


class BySize:
    """Timer stand-in: a model's ms in proportion to its parameters (the original at 2 ms, its A/A twin 1% slower),
    so the same model times the same in every run, whichever compressor or run built it."""

    def __call__(self, models, cfg, aa=True):
        from gac.hw.timing import Timing

        size = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
        ms = {name: 2.0 * n / size["baseline"] for name, n in size.items()}
        if aa:
            ms["baseline (A/A)"] = 2.02
        return {name: Timing(t, t, t, t, 1) for name, t in ms.items()}


@pytest.mark.slow
def test_auto_under_speedup_keeps_the_best_of_what_the_single_runs_keep(tiny4_dir):
    """Given the same timings, each compressor auto builds is the model its single `--speedup` run keeps (the same
    closed loop, the guard on the same held-back windows, by the same loss), and the kept one is the lowest loss of
    every reaching stream of every compressor built: never worse on those windows than the best single run. (Timed
    by size, palu's K and V cannot reach the target: a built compressor that does not reach is not kept.)"""
    from tests.helpers_latency import objective

    target = objective(BySize(), rounds=4)  # the kept one's parameter stream reaches in its fourth round
    auto = compress(fast_config(tiny4_dir, compressor="auto", evaluate=False, speedup=target)).report.to_dict()
    a = auto["auto"]
    streams = {}
    for name in a["built"]:
        single = compress(fast_config(tiny4_dir, compressor=name, evaluate=False, speedup=target)).report.to_dict()
        guard = single["latency_objective"]["guard"]
        measured = a["candidates"][name]["measured"]
        assert measured["reached"] == guard[guard["kept"]]["reached"]
        assert measured["streams"] == pytest.approx({s: guard[s]["loss"] - a["baseline_loss"] for s in
                                                     ("latency", "parameter") if guard[s]["loss"] is not None})
        streams.update({(name, s): loss for s, loss in measured["streams"].items()})
        if name == a["kept"]:
            assert auto["dims"] == single["dims"] and auto["latency_objective"]["guard"] == guard
    assert {(a["kept"], "latency"), (a["kept"], "parameter")} <= set(streams)  # both of its streams reached
    assert a["candidates"][a["kept"]]["measured"]["loss"] == min(streams.values())


class NoisyBySize(BySize):
    """BySize with every figure scattered by up to 3% at random, as a shared CPU times."""

    def __init__(self):
        import random

        self.rng = random.Random(0)

    def __call__(self, models, cfg, aa=True):
        from gac.hw.timing import Timing

        return {name: Timing(*4 * [t.median_ms * self.rng.uniform(0.97, 1.03)], 1)
                for name, t in super().__call__(models, cfg, aa).items()}


@pytest.mark.slow
@pytest.mark.parametrize("auto_first", [True, False])
def test_auto_and_the_single_run_keep_one_model_through_the_timing_journal(tiny4_dir, tmp_path, auto_first):
    """On a noisy clock the single run of the compressor auto keeps replays the timings auto's loop of it recorded
    on this machine, or auto's loop replays the single run's: both keep the same dims by the same guard, whichever
    ran first."""
    from gac.objectives.latency.journal import TimingJournal
    from tests.helpers_latency import objective

    def run(compressor):
        cfg = objective(NoisyBySize(), rounds=4)
        cfg = dataclasses.replace(cfg, instruments=dataclasses.replace(
            cfg.instruments, journal=TimingJournal(path=tmp_path / "journal.json")))
        return compress(fast_config(tiny4_dir, compressor=compressor, evaluate=False, speedup=cfg)).report.to_dict()

    if auto_first:
        auto = run("auto")
        single = run(auto["compressor"])
        replayed = single
    else:  # every compressor's single run first: auto's loop of whichever it keeps replays that one's timings
        singles = {}
        for name in AUTO_CANDIDATES:
            try:
                singles[name] = run(name)
            except GacError:  # palu's K and V alone cannot reach the target
                pass
        auto = replayed = run("auto")
        single = singles[auto["compressor"]]
    assert auto["dims"] == single["dims"] and auto["latency_objective"]["guard"] == single["latency_objective"]["guard"]
    journal = replayed["latency_objective"]["journal"]
    assert journal["measured"] == 0 < journal["replayed"]


@pytest.mark.parametrize("kw, expected", [
    ({"compressor_options": {"alpha": 0.5}}, "apply to only some compressors"),
    ({"pipeline": "layerwise"}, "cannot run layer by layer"),
    ({"max_memory": "cpu=8GiB"}, "cannot run layer by layer"),
])
def test_auto_refusals_are_one_line(kw, expected):
    with pytest.raises(GacError, match=expected) as e:
        CompressConfig(compressor="auto", **kw)
    assert_names_a_fix(str(e.value))


@pytest.mark.parametrize("flags, expected", [(["--importance", "taylor"], "apply to only some compressors"),
                                             (["--layerwise"], "cannot run layer by layer")])
def test_auto_refusals_on_the_command_line(tmp_path, flags, expected):
    p = gac_cli("compress", "--compressor", "auto", "--out", tmp_path / "o", *flags)
    assert_one_error_line(p, expected)


def test_auto_is_a_compressor_choice_with_its_help():
    from click.testing import CliRunner

    from gac.cli.compress import command

    help_text = CliRunner().invoke(command, ["--help"]).output
    assert "auto" in help_text and "held-back" in help_text
