"""What hostile-input tests cannot show by exit codes: accepted inputs (decisions), signal safety of every write,
permissions of outputs, quiet progress off a terminal, and the profile schema on good profiles."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gac.errors import GacError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------------------------ decisions: what is accepted

@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-32"])
def test_text_in_utf8_or_with_a_bom_is_accepted(tmp_path, encoding):
    from gac.io.validate import read_text

    text = "Größe: naïve café, 東京 ✓\n" * 10
    p = tmp_path / "t.txt"
    p.write_bytes(text.encode(encoding))
    assert read_text(p) == text


def test_latin1_is_refused_with_the_conversion_command(tmp_path):
    from gac.io.validate import read_text

    p = tmp_path / "t.txt"
    p.write_bytes("Größe".encode("latin-1"))
    with pytest.raises(GacError, match="iconv -f LATIN1 -t UTF-8"):
        read_text(p)


def test_text_over_the_limit_is_refused_without_reading_it_all(tmp_path):
    from gac.io.validate import read_text

    p = tmp_path / "big.txt"
    p.write_text("a" * 2000)
    with pytest.raises(GacError, match="larger than"):
        read_text(p, limit=1000)


def test_pickle_checkpoint_of_plain_tensors_loads_weights_only(tmp_path, tiny_model_dir):
    import shutil

    from safetensors.torch import load_file

    from gac.checkpoint.loading import load_model

    d = tmp_path / "bin"
    shutil.copytree(tiny_model_dir, d)
    state = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    torch.save(state, d / "pytorch_model.bin")
    model = load_model(str(d)).model
    for name, t in model.state_dict().items():
        if name in state:
            assert torch.equal(t, state[name]), name


def test_profile_mismatch_is_a_warning_naming_both_when_allowed(caplog):
    from gac.hw.profile_schema import check_profile_matches

    profile = {"dtype": "bfloat16", "device": "cuda"}
    with pytest.raises(GacError, match="--allow-profile-mismatch"):
        check_profile_matches(profile, "p.json", device="cpu", dtype="float32")
    with caplog.at_level(logging.WARNING):
        check_profile_matches(profile, "p.json", device="cpu", dtype="float32", allow=True)
    assert "bfloat16" in caplog.text and "float32" in caplog.text and "cuda" in caplog.text and "cpu" in caplog.text
    check_profile_matches({"dtype": "float32", "device": "cuda"}, "p.json", device="cuda:1", dtype="float32")


def test_a_measured_profile_passes_the_schema(tmp_path):
    from gac.hw.profile import FixedSizes, SweepSpec, load_profile, run_profile, save_profile

    spec = SweepSpec(ops=("lowrank",), dims=(8, 9), m_values=(4,), head_dims=(8,), repeats=1, warmup=0,
                     sizes=FixedSizes(hidden=16, lowrank_in=16, lowrank_out=16, heads=1, batch=1, context=8))
    path = save_profile(run_profile(spec, progress=False), tmp_path / "p.json")
    assert load_profile(path)["ops"][0]["dims"] == [8, 9]
    assert (path.stat().st_mode & 0o777) == 0o666 & ~_umask()


# -------------------------------------------------------------------------------------------- signals and writes

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_during_a_directory_write_leaves_nothing(tmp_path, signum):
    from gac.io.atomic import atomic_dir, terminate_as_interrupt

    out = tmp_path / "out"
    # Python's own SIGINT handler, as in a terminal: a job started in the background (`cmd &`, some CI runners)
    # inherits SIGINT ignored, and Python then keeps it ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
            with atomic_dir(out) as tmp:
                (tmp / "model.safetensors").write_bytes(b"x" * 1000)
                os.kill(os.getpid(), signum)
                time.sleep(2)  # the signal arrives before this ends
    finally:
        signal.signal(signal.SIGINT, previous)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_signal_during_a_force_swap_is_held_until_the_swap_is_done(tmp_path, monkeypatch, signum):
    from gac.io import atomic

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    real_replace = os.replace
    calls = []

    def replace(src, dst):  # the signal lands between moving the old output aside and moving the new one in
        real_replace(src, dst)
        calls.append(dst)
        if len(calls) == 1:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(atomic.os, "replace", replace)
    with atomic.terminate_as_interrupt(), pytest.raises(atomic.Terminated):
        with atomic.atomic_dir(out, force=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .out.old-PID, no .partial
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]


def test_output_directories_have_the_usual_permissions(tmp_path):
    from gac.io.atomic import atomic_dir, write_text

    with atomic_dir(tmp_path / "out") as d:
        (d / "f").write_text("x")
        (d / "private").write_text("as safetensors writes it")
        os.chmod(d / "private", 0o600)
        (d / "sub").mkdir(mode=0o700)
        (d / "sub" / "g").write_text("y")
    assert ((tmp_path / "out").stat().st_mode & 0o777) == 0o777 & ~_umask()
    assert ((tmp_path / "out" / "sub").stat().st_mode & 0o777) == 0o777 & ~_umask()
    for name in ("f", "private", "sub/g"):
        assert ((tmp_path / "out" / name).stat().st_mode & 0o777) == 0o666 & ~_umask(), name
    p = write_text(tmp_path / "r.json", "{}")
    assert (p.stat().st_mode & 0o777) == 0o666 & ~_umask()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid  # reaped: no process has it now (reuse within the test is vanishingly unlikely)


@pytest.mark.subprocess
def test_stale_partials_of_dead_writers_are_named_and_removed(tmp_path, caplog):
    """The next atomic_dir into a parent removes what killed runs of this host left there, and names (only) what
    it cannot judge: a live writer's, another host's, an earlier gac's without a writer in its name."""
    from gac.io.atomic import _writer, atomic_dir

    host = _writer().rpartition("-")[0]
    dead = tmp_path / f".a.abcd1234.{host}-{_dead_pid()}.partial"
    live = tmp_path / f".b.abcd1234.{host}-{os.getpid()}.partial"
    other = tmp_path / ".c.v1.2.abcd1234.elsewhere-1.partial"
    old = tmp_path / ".d.abcd1234.partial"
    for d in (dead, live, other, old):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 1000)
    with caplog.at_level(logging.INFO, logger="gac.io.atomic"), atomic_dir(tmp_path / "out") as t:
        (t / "f").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, old.name, "out"])
    assert f"removed {dead}, left by a killed run" in caplog.text
    assert f"{live}: left, its writer (pid {os.getpid()}) is running" in caplog.text
    assert f"{other}: left, written by host elsewhere" in caplog.text
    assert f"{old}: left by an earlier interrupted run" in caplog.text


def test_a_temporary_directory_names_its_writer(tmp_path):
    from gac.io.atomic import _writer, _writer_of, atomic_dir

    with atomic_dir(tmp_path / "my.model") as t:
        assert t.name.startswith(".my.model.") and t.name.endswith(f".{_writer()}.partial")
        assert _writer_of(t.name) == (_writer().rpartition("-")[0], os.getpid())


def test_write_failure_leaves_nothing_and_is_one_line(tmp_path):
    from gac.io.atomic import write_file

    def fail(p):
        p.write_text("partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(GacError, match=r"No space left on device\): free space or choose another --out"):
        write_file(tmp_path / "r.json", fail)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.subprocess
def test_a_write_failing_while_the_model_is_saved_is_one_line_and_leaves_nothing(tmp_path, tiny_model_dir):
    """A real process whose writes fail past 100 kB (as on a full disk) while safetensors writes the model: one
    `cannot write` line naming the operating system's reason and the fix, exit 2, no output, no temporary."""
    from functools import partial

    from tests.helpers import assert_one_error_line, limit_file_size, run_gac

    out = tmp_path / "runs" / "m"
    p = run_gac("compress", "--model", tiny_model_dir, "--out", out, "--ratio", "0.2", "--whole-model", "--seq-len",
                "32", "--calib-windows", "2", "--no-eval", "--quiet", preexec_fn=partial(limit_file_size, 100_000),
                env={**os.environ, "GAC_CACHE_DIR": str(tmp_path / "cache")})
    assert_one_error_line(p, f"cannot write {out} (File too large): free space or choose another --out")
    assert list((tmp_path / "runs").iterdir()) == []


@pytest.mark.subprocess
def test_sigterm_to_a_running_compress_is_one_line_and_leaves_nothing(tmp_path, tiny_model_dir):
    """A real process: SIGTERM while calibrating -> exit 143, one `interrupted` line, no output, no temp."""
    out = tmp_path / "runs" / "m"
    env = {**os.environ, "GAC_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.Popen([sys.executable, "-m", "gac", "compress", "--model", str(tiny_model_dir), "--out", str(out),
                          "--seq-len", "256", "--calib-windows", "100000", "--eval-windows", "1", "--no-eval",
                          "--whole-model"],  # 100000 windows would make the forecast choose layer by layer
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen = ""
    deadline = time.time() + 120
    while "calibrating" not in seen and time.time() < deadline:  # the command is running, handlers installed
        ch = p.stderr.read(1)
        if not ch:
            break
        seen += ch
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    _, rest = p.communicate(timeout=120)
    err = seen + rest
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "interrupted (SIGTERM): no partial output was left"
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


# ------------------------------------------------------------------------------------------------------ logs

@pytest.mark.subprocess
def test_progress_is_throttled_off_a_terminal():
    """With stderr a pipe (CI, `> run.log 2>&1`): tqdm bars redraw at most every 30 s, transformers' are off."""
    code = ("import sys; from gac.cli.output import quiet_progress_when_redirected as q; q()\n"
            "from tqdm.auto import tqdm; from transformers.utils import logging as h\n"
            "print(tqdm(total=1).mininterval, h.is_progress_bar_enabled())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["30.0", "False"], p.stderr


@pytest.mark.subprocess
def test_quiet_turns_off_the_bars_other_libraries_draw():
    """--quiet: every bar is off, even one a library asks for with disable=False (llm-compressor's); bars after a
    set-up without --quiet are as asked."""
    code = ("from gac.cli.output import quiet_progress_when_redirected as q; from tqdm.auto import tqdm\n"
            "q(quiet=True); a, b = tqdm(total=1), tqdm(total=1, disable=False)\n"
            "q(quiet=False); c = tqdm(total=1)\n"
            "print(a.disable, b.disable, c.disable)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["True", "True", "False"], p.stderr


def test_a_full_disk_is_refused_before_the_work(tmp_path, tiny_model_dir, monkeypatch):
    import shutil as sh

    from gac.io import validate

    monkeypatch.setattr(validate.shutil, "disk_usage", lambda p: sh._ntuple_diskusage(10**9, 10**9, 1000))
    with pytest.raises(GacError, match="not enough space .* free space or choose another --out"):
        validate.enough_space(tmp_path / "out", validate.weights_size(str(tiny_model_dir)))


def test_bare_gac_prints_the_help():
    from click.testing import CliRunner

    from gac.cli import main

    result = CliRunner().invoke(main, [], prog_name="gac")
    assert result.exit_code == 0 and "Usage: gac" in result.stdout and not result.stderr


def test_a_bug_is_still_one_line_with_exit_1(monkeypatch):
    from click.testing import CliRunner

    import gac.align.plan
    from gac.cli import main

    def boom(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("gac.cli.select.select", boom)
    monkeypatch.delenv("GAC_TRACEBACK", raising=False)
    plan = Path(gac.align.plan.__file__)  # any readable file: the plan is read as JSON before select() runs
    result = CliRunner().invoke(main, ["select", str(plan)], prog_name="gac")
    assert result.exit_code == 2  # not JSON: refused before the bug is reached
    runner_plan = Path(__file__).parent / "data" / "legacy-0.1.0" / "gac_plan.json"
    result = CliRunner().invoke(main, ["select", str(runner_plan)], prog_name="gac")
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: unexpected ZeroDivisionError: division by zero: this is a gac bug")
