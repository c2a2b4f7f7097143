"""`gac compress` under torchrun (gac.distributed): the split helpers in one process, and two gloo ranks on a tiny
model against one process (same dims and parameters, rank 0 alone writing, a killed rank stopping the others)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from gac import distributed
from gac.distributed import World
from tests.helpers import assert_cuda_ranks_refused, error_lines, run_gac, torchrun, torchrun_env

# --- the helpers, in one process ---------------------------------------------------------------------------------


def test_one_process_is_a_world_of_one(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.from_env() == (0, 1, 0)
    with distributed.session("cpu") as w:
        assert not w.active and w.is_main
        windows = torch.arange(12).reshape(6, 2)
        assert distributed.windows_share(windows) is windows
        assert distributed.batches_share(windows, 2) is windows
        t = torch.ones(3)
        assert distributed.all_reduce_sum(t) is t and t.tolist() == [1.0, 1.0, 1.0]
        assert distributed.sum_numbers([1.5, 2]) == [1.5, 2]
        assert distributed.broadcast_object({"a": 1}) == {"a": 1}
        distributed.barrier()  # nothing to wait for


def test_env_and_timeout(monkeypatch):
    assert distributed.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == (3, 4, 1)
    monkeypatch.delenv("GAC_DIST_TIMEOUT", raising=False)
    assert distributed.timeout_from_env() == distributed.DEFAULT_TIMEOUT_S
    assert distributed.timeout_from_env(12) == 12.0
    monkeypatch.setenv("GAC_DIST_TIMEOUT", "45")
    assert distributed.timeout_from_env() == 45.0
    monkeypatch.setenv("GAC_DIST_TIMEOUT", "soon")
    with pytest.raises(distributed.GacError, match="GAC_DIST_TIMEOUT=300"):
        distributed.timeout_from_env()


def test_assign_by_cost_balances_the_largest_first():
    costs = [1, 9, 4, 4, 2, 8]
    owners = distributed.assign_by_cost(costs, 2)
    loads = [sum(c for c, r in zip(costs, owners) if r == rank) for rank in range(2)]
    assert owners[1] == 0 and owners[5] == 1  # the two largest to the two ranks
    assert sorted(loads) == [14, 14]
    assert distributed.assign_by_cost(costs, 1) == [0] * len(costs)
    assert len(set(distributed.assign_by_cost([1.0] * 5, 8))) == 5  # fewer items than ranks: one each


def test_shares_of_windows_and_batches(monkeypatch):
    windows = torch.arange(7)[:, None].expand(7, 3)  # window i is all i
    monkeypatch.setattr(distributed, "_WORLD", World(rank=1, size=2))
    assert distributed.share(7) == [1, 3, 5]
    assert distributed.windows_share(windows)[:, 0].tolist() == [1, 3, 5]
    assert distributed.batches_share(windows, 2)[:, 0].tolist() == [2, 3, 6]  # batches [2, 3] and [6]
    monkeypatch.setattr(distributed, "_WORLD", World(rank=0, size=2))
    assert distributed.batches_share(windows, 2)[:, 0].tolist() == [0, 1, 4, 5]


def test_map_tensors_reaches_dataclasses_and_containers():
    from gac.compressors.linalg import ScaledSVD

    svd = ScaledSVD(torch.ones(2, 1), torch.ones(1), None, torch.ones(2))
    doubled = distributed.map_tensors({"x": (svd, [torch.ones(1)]), "n": 3}, lambda t: t * 2)
    assert doubled["n"] == 3 and doubled["x"][1][0].item() == 2.0
    assert doubled["x"][0].U.sum().item() == 4.0 and doubled["x"][0].Vh is None


class _Store:
    """torchrun's store as run_on_main's waiting ranks read it: rank 0's heartbeat and done keys."""

    def __init__(self, beats: list, done_after: int | None = None):
        self.beats, self.done_after, self.reads = beats, done_after, 0

    def check(self, keys):
        if keys[0].endswith("/done"):
            self.reads += 1
            return self.done_after is not None and self.reads > self.done_after
        return bool(self.beats)

    def get(self, key):
        return self.beats[min(self.reads, len(self.beats)) - 1]


def test_waiting_ranks_follow_rank_0s_heartbeat(monkeypatch):
    from gac.errors import GacError

    monkeypatch.setattr(distributed, "BEAT_S", 0.04)
    monkeypatch.setattr(distributed, "_BROKEN", False)  # restored after: a broken group makes the CLI exit at once
    w = World(rank=1, size=2, backend="gloo", timeout_s=0.2)
    beating = _Store([b"1", b"2", b"3", b"4", b"5", b"6"] * 10, done_after=40)  # moving, then done: no error
    distributed._wait_for(beating, "x/beat", "x/done", w, "selecting")
    assert beating.reads == 41
    with pytest.raises(GacError, match=r"rank 1 of 2: selecting failed \(rank 0's heartbeat stopped\)"):
        distributed._wait_for(_Store([b"7"]), "x/beat", "x/done", w, "selecting")  # silent past the timeout


def test_on_main_and_run_on_main_in_one_process_call_through():
    assert distributed.on_main(lambda: 3, "x") == 3 and distributed.run_on_main(lambda: 4, "y") == 4
    before = distributed.world()
    with distributed.alone():
        assert not distributed.world().active
    assert distributed.world() is before


def test_stage_clock_and_amdahl():
    from gac.pipelines.stages import StageClock, amdahl

    clock = StageClock()
    for _ in range(2):
        with clock.stage("analyze"):
            pass
    assert list(clock.to_dict()) == ["analyze"] and clock.seconds["analyze"] >= 0
    stages = {"open": 10.0, "analyze": 60.0, "select": 5.0, "materialize": 10.0, "perplexity": 10.0, "timing": 5.0}
    assert amdahl(stages, 100.0, 1) == 1.0
    assert amdahl(stages, 100.0, 8) == pytest.approx(100 / (30 + 70 / 8))  # analyze and perplexity split
    assert amdahl(stages, 100.0, 10**9) < 100 / 30


def test_ledger_summary():
    w = World(rank=0, size=2, backend="gloo")
    w.record_shares("windows_calibration", 3)
    w.record("factorized", {0: ["a"], 1: ["b", "c"]})
    w.record("factorized", {0: ["d"]})
    w.record_batches("windows_gradients", 5, 2)
    assert w.ledger["windows_gradients"] == {0: [0, 1, 4], 1: [2, 3]}
    del w.ledger["windows_gradients"]
    ranks = w.summary()["ranks"]
    assert ranks[0] == {"rank": 0, "factorized": ["a", "d"], "windows_calibration": [0, 2]}
    assert ranks[1] == {"rank": 1, "factorized": ["b", "c"], "windows_calibration": [1]}


def test_skipped_draws_give_each_window_its_one_process_labels():
    """The output Fisher's labels: drawn per rank with the other ranks' windows skipped, each window's losses are
    those one process draws, so the summed Fisher is the same."""
    from gac.calibration.importance import drawn_label_losses, fisher_generator

    torch.manual_seed(0)
    logits = torch.randn(4, 6, 11)  # [windows, seq, V]
    whole = drawn_label_losses(logits, fisher_generator())
    parts = [torch.zeros(()) for _ in whole]
    for rank in range(2):
        ids = [rank, rank + 2]
        skipped = [ids[0], ids[1] - ids[0] - 1]
        for k, loss in enumerate(drawn_label_losses(logits[ids], fisher_generator(), skipped)):
            parts[k] = parts[k] + loss
    for a, b in zip(whole, parts):
        torch.testing.assert_close(a, b)


# --- two gloo ranks under torchrun ---------------------------------------------------------------------------------

TINY_RUN = ("--calib-windows", "5", "--eval-windows", "3", "--seq-len", "32", "--quiet", "--ratio", "0.15")
KILL_RANK_1 = """
import importlib, os, signal, sys
module = importlib.import_module("{module}")
real = getattr(module, "{function}")
def killed(*args, **kwargs):
    if os.environ.get("RANK") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
setattr(module, "{function}", killed)
from gac.cli import main
sys.argv[0] = "gac"
main()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(*args, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Two torchrun launches of one rank each, as nodes 0 and 1 of a c10d rendezvous on localhost."""
    rdzv = ("--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "gac-test")
    rdzv = (*rdzv, "--rdzv-endpoint", f"127.0.0.1:{_free_port()}")
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *rdzv, "--node-rank", str(node), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=torchrun_env(),
        )
        for node in (0, 1)
    ]
    done = []
    for node in nodes:
        out, err = node.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(node.args, node.returncode, out, err))
    return done


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["--whole-model", "--layerwise"])
@pytest.mark.parametrize("compressor,extra", [("asvd", ()), ("prune", ("--prune-layers", "all"))])
def test_two_ranks_choose_the_dims_of_one_process(tiny_model_dir, tmp_path, compressor, extra, pipeline):

    args = ("compress", "--model", tiny_model_dir, "--compressor", compressor, *TINY_RUN, *extra, pipeline)
    one = run_gac(*args, "--out", tmp_path / "one", env=torchrun_env(), timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = torchrun("-m", "gac", *args, "--out", tmp_path / "two")
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("one", "two"))
    assert a["dims"] == b["dims"]
    for variant, figures in a["variants"].items():
        assert b["variants"][variant]["params"] == figures["params"]
        assert b["variants"][variant]["ppl"] == pytest.approx(figures["ppl"], rel=1e-3)
    assert "distributed" not in a
    ranks = b["distributed"]["ranks"]
    assert b["distributed"]["world_size"] == 2 and [r["rank"] for r in ranks] == [0, 1]
    assert a["pipeline_choice"]["pipeline"] == b["pipeline_choice"]["pipeline"] == pipeline.strip("-").split("-")[0]
    if pipeline == "--whole-model":  # window by window
        assert ranks[0]["windows_calibration"] == [0, 2, 4] and ranks[1]["windows_calibration"] == [1, 3]
    else:  # each rank carries whole gradient batches of two through the layers
        assert ranks[0]["windows_calibration"] == [0, 1, 4] and ranks[1]["windows_calibration"] == [2, 3]
    assert ranks[0]["windows_held_out"] == [0, 2] and ranks[1]["windows_held_out"] == [1]
    if compressor == "prune":  # the taylor gradients in batches of two: batches 0 and 2 to rank 0
        assert ranks[0]["windows_gradients"] == [0, 1, 4] and ranks[1]["windows_gradients"] == [2, 3]
    if compressor == "asvd":  # every weight factorized once, by one rank
        done = ranks[0]["factorized"] + ranks[1]["factorized"]
        assert ranks[0]["factorized"] and ranks[1]["factorized"] and len(done) == len(set(done))
    # rank 0 alone wrote, and printed the report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]
    assert two.stdout.count("saved gac model") == 1


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["--whole-model", "--layerwise"])
@pytest.mark.parametrize("compressor,extra", [("asvd", ()), ("prune", ("--prune-layers", "all"))])
def test_a_rank_without_windows_adds_nothing(tiny_model_dir, tmp_path, compressor, extra, pipeline):
    """One calibration and one evaluation window for two ranks: rank 1 runs none of its own (its passes run the first
    window to shape their sums, then count nothing), and the result is one process's."""
    args = ("compress", "--model", tiny_model_dir, "--compressor", compressor, "--seq-len", "32", "--quiet", *extra)
    args = (*args, pipeline)
    args = (*args, "--calib-windows", "1", "--eval-windows", "1", "--no-align")
    one = run_gac(*args, "--out", tmp_path / "one", env=torchrun_env(), timeout=300)
    two = torchrun("-m", "gac", *args, "--out", tmp_path / "two")
    assert one.returncode == 0 and two.returncode == 0, (one.stderr + two.stderr)[-2000:]
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("one", "two"))
    assert a["dims"] == b["dims"]
    assert b["variants"]["unaligned"]["ppl"] == pytest.approx(a["variants"]["unaligned"]["ppl"], rel=1e-6)
    assert b["distributed"]["ranks"][1]["windows_calibration"] == []


@pytest.mark.subprocess
@pytest.mark.slow
def test_two_nodes_choose_the_dims_of_one_process(tiny_model_dir, tmp_path):
    """Two torchrun launches as two nodes (c10d rendezvous on localhost), one rank each: one process's dims and
    perplexity; node 0's rank 0 alone writes."""
    args = ("compress", "--model", tiny_model_dir, "--compressor", "asvd", *TINY_RUN)
    one = run_gac(*args, "--out", tmp_path / "one", env=torchrun_env(), timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    nodes = _two_nodes("-m", "gac", *args, "--out", tmp_path / "two")
    assert [n.returncode for n in nodes] == [0, 0], "".join(n.stderr for n in nodes)[-3000:]
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("one", "two"))
    assert a["dims"] == b["dims"] and b["distributed"]["world_size"] == 2
    assert b["variants"]["gac"]["ppl"] == pytest.approx(a["variants"]["gac"]["ppl"], rel=1e-3)
    assert nodes[0].stdout.count("saved gac model") == 1 and "saved gac model" not in nodes[1].stdout


@pytest.mark.subprocess
@pytest.mark.slow
def test_speedup_selected_by_rank_0_is_cut_alike_on_every_rank(tiny_model_dir, tmp_path):
    """--speedup under torchrun: rank 0 alone runs the timed loop; every rank cuts its selection, so the perplexity
    summed over both ranks' windows is the saved model's own, evaluated in one process."""
    from gac import load
    from gac.calibration.texts import TextConfig, load_windows
    from gac.evaluate.perplexity import perplexity

    out = tmp_path / "out"
    args = ("compress", "--model", tiny_model_dir, "--compressor", "prune", "--prune-layers", "all", *TINY_RUN[:-2])
    p = torchrun("-m", "gac", *args, "--speedup", "1.03", "--out", out)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["objective"]["kind"] == "latency" and report["distributed"]["world_size"] == 2
    loaded = load(out)
    _, held_out = load_windows(loaded.tokenizer, TextConfig(calib_windows=5, eval_windows=3, seq_len=32))
    saved_ppl = perplexity(loaded.model, held_out, progress=False)
    assert saved_ppl == pytest.approx(report["variants"]["gac"]["ppl"], rel=1e-4)


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize(
    "module,function",
    [("gac.calibration.stats", "calibrate"), ("gac.hw.threads", "map_side_by_side")],
    ids=["calibration", "factorization"],
)
def test_a_killed_rank_stops_the_others_with_one_error_line(tiny_model_dir, tmp_path, module, function):
    script = tmp_path / "kill_rank_1.py"
    script.write_text(KILL_RANK_1.format(module=module, function=function))
    out = tmp_path / "out"
    p = torchrun(script, "compress", "--model", tiny_model_dir, *TINY_RUN, "--out", out, timeout=120)
    assert p.returncode != 0
    errors = error_lines(p.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: rank 0 of 2"), p.stderr[-2000:]
    assert not out.exists() and sorted(x.name for x in tmp_path.iterdir()) == ["kill_rank_1.py"]


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of CUDA ranks on a machine without CUDA")
def test_cuda_ranks_without_cuda_refused_per_rank(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    p = torchrun("-m", "gac", "compress", "--model", tiny_model_dir, "--device", "cuda", *TINY_RUN, "--out", out)
    assert_cuda_ranks_refused(p, out)


def test_a_rank_s_config_and_heal_ranks_checked_first():
    from gac.config import CompressConfig
    from gac.errors import ConfigError
    from gac.heal.distill import DistillConfig
    from gac.heal.run import HealConfig
    from gac.pipelines.run import _for_rank

    w = World(rank=1, size=2, backend="gloo")
    cfg = _for_rank(CompressConfig(pipeline="layerwise"), w)
    assert cfg.progress is False and cfg.pipeline == "layerwise"
    assert _for_rank(CompressConfig(compressor="auto"), w).compressor.name == "auto"  # runs under torchrun now
    one_a_step = HealConfig(distill=DistillConfig(batch=1))
    with pytest.raises(ConfigError, match="--heal-batch 2"):  # before any rank loads the model
        _for_rank(CompressConfig(heal=one_a_step), w)


@pytest.mark.subprocess
@pytest.mark.slow
def test_auto_under_torchrun_keeps_one_process_s_choice(tiny_model_dir, tmp_path):
    """--compressor auto on two ranks: rank 0 compares the compressors as one process does, and the ranks cut its
    choice; the same kept compressor, dims and parameters, the perplexity within rounding."""
    args = ("compress", "--model", tiny_model_dir, "--compressor", "auto", *TINY_RUN)
    one = run_gac(*args, "--out", tmp_path / "one", env=torchrun_env(), timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = torchrun("-m", "gac", *args, "--out", tmp_path / "two")
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("one", "two"))
    assert a["auto"]["kept"] == b["auto"]["kept"] and a["compressor"] == b["compressor"]
    assert a["dims"] == b["dims"] and b["distributed"]["world_size"] == 2
    assert b["variants"]["gac"]["params"] == a["variants"]["gac"]["params"]
    assert b["variants"]["gac"]["ppl"] == pytest.approx(a["variants"]["gac"]["ppl"], rel=1e-3)
    assert two.stdout.count("saved gac model") == 1


@pytest.fixture(scope="module")
def serve_tiny_dir(tmp_path_factory):
    """A tiny Llama whose widths meet the int4 kernel's multiples once aligned (head_dim 32)."""
    from tests.helpers_serve import serve_tiny_model
    from tests.helpers_tiny import tiny_tokenizer

    d = tmp_path_factory.mktemp("serve-tiny")
    serve_tiny_model().save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


@pytest.mark.subprocess
@pytest.mark.slow
def test_heal_and_quantize_under_torchrun(serve_tiny_dir, tmp_path):
    """`compress --heal --quantize` on two ranks: every rank heals its share of each step (DDP), rank 0 alone runs
    GPTQ (llm-compressor as one process) and writes; healing ends within 2% of one process's, the same
    quantization."""
    args = ("compress", "--model", serve_tiny_dir, "--compressor", "prune", "--ratio", "0.3", "--target",
            "vllm:w4a16", "--heal", "--heal-tokens", "256", "--quantize", "w4a16", "--method", "gptq",
            "--seq-len", "32", "--calib-windows", "4", "--eval-windows", "2", "--quiet")
    one = run_gac(*args, "--out", tmp_path / "one", env=torchrun_env(), timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = torchrun("-m", "gac", *args, "--out", tmp_path / "two")
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("one", "two"))
    assert a["dims"] == b["dims"] and b["distributed"]["world_size"] == 2
    assert b["heal"]["run"]["tokens"] == a["heal"]["run"]["tokens"]
    for text, ppl in a["heal"]["ppl"]["after"].items():
        assert b["heal"]["ppl"]["after"][text] == pytest.approx(ppl, rel=2e-2)
    assert b["quantization"]["label"] == a["quantization"]["label"]
    assert b["quantization"]["quantized"] == a["quantization"]["quantized"] == len(a["quantization"]["linears"])
    assert json.loads((tmp_path / "two" / "config.json").read_text())["quantization_config"]
    assert two.stdout.count("saved gac model") == 1
