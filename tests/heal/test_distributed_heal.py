"""`gac heal` under torchrun (gac.heal.parallel): the step split in one process, and two gloo ranks on a tiny model
against one process (the same healed model up to the order of the sums, rank 0 alone writing, a killed or hung rank
stopping the other, bad input refused before a model loads)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from gac import distributed
from gac.api import CompressConfig, compress
from gac.calibration.texts import TextConfig
from gac.distributed import World
from gac.heal.parallel import check_ranks, step_share, taken_by_rank
from tests.helpers import (
    assert_cuda_ranks_refused,
    assert_one_error_line,
    error_lines,
    gac_cli,
    run_gac,
    torchrun,
    torchrun_env,
)
from tests.helpers_tiny import peaked_tiny_llama

TINY_HEAL = ("--seq-len", "32", "--eval-windows", "2", "--heal-tokens", "1536", "--heal-lr", "3e-3", "--quiet")


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """A gac output (asvd at 0.3) of a tiny Llama with peaked logits, its original recorded in gac_plan.json."""
    root = tmp_path_factory.mktemp("heal-ddp")
    original = peaked_tiny_llama(root / "original")
    out = root / "asvd"
    text = TextConfig(seq_len=32, calib_windows=4, eval_windows=2)
    compress(CompressConfig(model=str(original), compressor="asvd", ratio=0.3, out=str(out), text=text,
                            evaluate=False, progress=False))
    return out


# --- the split, in one process -----------------------------------------------------------------------------------


def test_one_process_takes_the_whole_step(monkeypatch):
    monkeypatch.setattr(distributed, "_WORLD", World())
    ids = [4, 1, 7]
    assert step_share(ids) == (ids, 1.0)


@pytest.mark.parametrize("size,ids", [(2, [5, 7]), (2, [5, 7, 9]), (3, [2, 0, 8, 6, 1])])
def test_weighted_shares_average_to_the_steps_mean_loss(monkeypatch, size, ids):
    """DDP averages the ranks' gradients: each rank's mean loss times its weight, averaged over the ranks, is the
    mean over the step's windows, however unevenly they split; every window is taken once."""
    losses = torch.rand(10, dtype=torch.float64)
    parts, weights = [], []
    for rank in range(size):
        monkeypatch.setattr(distributed, "_WORLD", World(rank=rank, size=size))
        mine, weight = step_share(ids)
        parts.append(mine)
        weights.append(weight)
    averaged = sum(w * losses[m].mean() for m, w in zip(parts, weights)) / size
    assert float(averaged) == pytest.approx(float(losses[ids].mean()), rel=1e-12)
    assert sorted(i for part in parts for i in part) == sorted(ids)
    assert taken_by_rank(ids) == dict(enumerate(parts))


def test_a_failed_collective_marks_the_group_broken(monkeypatch):
    """A peer gone at a collective: one line naming the rank, and the process marked to leave without tearing the
    group down; in one process the error passes as it is."""
    monkeypatch.setattr(distributed, "_BROKEN", False)
    monkeypatch.setattr(distributed, "_WORLD", World())
    with pytest.raises(RuntimeError, match="peer"), distributed.collective("a step"):
        raise RuntimeError("peer gone")
    assert not distributed.broken()
    monkeypatch.setattr(distributed, "_WORLD", World(rank=1, size=2, backend="gloo", timeout_s=7))
    failed = r"^rank 1 of 2: a step failed \(peer gone\).* 7 s"
    with pytest.raises(distributed.GacError, match=failed), distributed.collective("a step"):
        raise RuntimeError("peer gone")
    assert distributed.broken()


def test_more_ranks_than_windows_a_step_refused(compressed, tmp_path, monkeypatch):
    """Four ranks for two windows a step: refused in one line by each rank, before it loads a model."""
    import gac.heal.run

    with pytest.raises(distributed.GacError, match="at most 2 ranks"):
        check_ranks(2, 4)
    check_ranks(2, 2)

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(gac.heal.run, "load", loaded)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    p = gac_cli("heal", compressed, "--out", tmp_path / "out", *TINY_HEAL)
    assert_one_error_line(p, "run at most 2 ranks")
    assert "--heal-batch 4" in p.stderr
    assert not (tmp_path / "out").exists()


def test_heal_batch_sets_the_windows_a_step():
    """--heal-batch is the step's batch (the most ranks healing takes), under both commands that heal."""
    from gac.cli.heal import heal_config

    assert heal_config(heal_batch=8).distill.batch == 8 and heal_config().distill.batch == 2
    for command in ("heal", "compress"):
        assert "--heal-batch" in gac_cli(command, "--help").stdout


# --- two gloo ranks under torchrun ---------------------------------------------------------------------------------

# rank 1 stops at its third distillation loss (its early-stopping windows took the first): in a training step
STOP_RANK_1 = """
import os, signal, sys, time
import gac.heal.distill
distill = sys.modules["gac.heal.distill"]  # gac.heal's `distill` is the function
loss, calls = distill.distillation_loss, []
def stopped(*args, **kwargs):
    calls.append(1)
    if os.environ.get("RANK") == "1" and len(calls) == 3:
        if "{how}" == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
    return loss(*args, **kwargs)
distill.distillation_loss = stopped
from gac.cli import main
sys.argv[0] = "gac"
main()
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_two_ranks_heal_as_one_process(compressed, tmp_path):
    from safetensors.torch import load_file

    args = ("heal", compressed, *TINY_HEAL)
    one = run_gac(*args, "--out", tmp_path / "one", env=torchrun_env(), timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = torchrun("-m", "gac", *args, "--out", tmp_path / "two")
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "heal.json").read_text()) for d in ("one", "two"))
    # the same steps on the same tokens, the same decisions, the same losses up to the order of the sums
    for key in ("steps", "tokens", "stopped", "best_step", "backoffs"):
        assert a["run"][key] == b["run"][key], key
    assert a["run"]["steps"] == 24 and a["run"]["tokens"] == 1536
    for curve in ("held_out_loss", "train_loss"):
        steps_a, values_a = zip(*a["run"][curve])
        steps_b, values_b = zip(*b["run"][curve])
        assert steps_a == steps_b and values_b == pytest.approx(values_a, rel=1e-4)
    for when in ("before", "after"):
        assert b["ppl"][when] == pytest.approx(a["ppl"][when], rel=1e-4)
    assert b["ppl"]["after"]["held_out"] < b["ppl"]["before"]["held_out"]  # it healed
    wa, wb = (load_file(tmp_path / d / "model.safetensors") for d in ("one", "two"))
    assert wa.keys() == wb.keys()
    assert any(not torch.equal(wa[k], load_file(compressed / "model.safetensors")[k]) for k in wa)
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-3, atol=1e-4)
    # what each rank computed: every step's windows split between them, the evaluation windows too
    assert "distributed" not in a
    d = b["distributed"]
    assert d["world_size"] == 2 and d["backend"] == "gloo" and [r["rank"] for r in d["ranks"]] == [0, 1]
    r0, r1 = d["ranks"]
    assert len(r0["windows_train"]) == len(r1["windows_train"]) == 24  # one of each step's two windows
    assert r0["windows_val"] == [0] and r1["windows_val"] == [1]
    assert r0["windows_held_out"] == [0] and r1["windows_held_out"] == [1]
    # rank 0 alone wrote, and printed the report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]
    assert two.stdout.count("saved the healed model") == 1


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "hang"])
def test_a_stopped_rank_ends_the_other_with_one_error_line(compressed, tmp_path, how):
    """Rank 1 killed, or hung, in a training step: rank 0 ends at its gradient all-reduce (at once, or within
    --dist-timeout) with one error line naming it, and nothing is written. The hung rank, stopped by torchrun then,
    says so in a line of its own."""
    script = tmp_path / "stop_rank_1.py"
    script.write_text(STOP_RANK_1.replace("{how}", how))
    out = tmp_path / "out"
    start = time.perf_counter()
    p = torchrun(script, "heal", compressed, *TINY_HEAL, "--dist-timeout", "10", "--out", out, timeout=240)
    assert p.returncode != 0
    assert time.perf_counter() - start < 180  # not the hung rank's sleep
    errors = error_lines(p.stderr)
    assert len(errors) == (1 if how == "kill" else 2), p.stderr[-3000:]
    assert errors[0].startswith("error: rank 0 of 2: averaging the gradients") and "--dist-timeout" in errors[0]
    if how == "hang":
        assert errors[1].startswith("error: rank 1 of 2 stopped (SIGTERM")
    assert not out.exists() and sorted(x.name for x in tmp_path.iterdir()) == ["stop_rank_1.py"]


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of CUDA ranks on a machine without CUDA")
def test_cuda_ranks_without_cuda_refused_per_rank(compressed, tmp_path):
    out = tmp_path / "out"
    p = torchrun("-m", "gac", "heal", compressed, "--device", "cuda", *TINY_HEAL, "--out", out)
    assert_cuda_ranks_refused(p, out)
