"""What several test files share: running the `gac` command, what a user-facing error must look like, the head
of a fresh-process script that reads its resident size, and importing an engine the test set-up installs. (Shared
helpers of one kind have their own tests/helpers_*.py; a test module never imports another, nor a conftest:
tests/test_layout.py.)"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys

import pytest

# an error names its fix with one of these (the `error: <problem>: <fix>` rule)
FIX_WORDS = ("pass ", "use ", "run ", "put ", "choose ", "give ", "check ", "convert", "re-run", "re-measure",
             "re-download", "re-save", "restore", "remove ", "fix ", "make it", "measure ", "free space",
             "see `", "leave it out", "copy ", "download ", "export ", "serve ", "install ",
             "drop ", "e.g. ")


# the head of a script run in a fresh process to read its own resident size: glibc's heap settings are process-wide
RSS_SCRIPT = """
import sys, torch
def rss():
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS")) * 1024
"""


def run_gac(*args, timeout: float = 600, env: dict | None = None, preexec_fn=None) -> subprocess.CompletedProcess:
    """`python -m gac ARGS` in a fresh process, output captured, never raising on a non-zero exit."""
    return subprocess.run([sys.executable, "-m", "gac", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False, preexec_fn=preexec_fn)


def torchrun_env() -> dict:
    """This process's environment for a torchrun launch: no rank variables of its own, one thread a rank, a short
    collective timeout."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "OMP_NUM_THREADS": "1", "GAC_DIST_TIMEOUT": "60"}


def torchrun(*args, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node NPROC ARGS` (torch.distributed.run), output captured, never raising on
    a non-zero exit."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=torchrun_env(), timeout=timeout, check=False)


def error_lines(stderr: str) -> list[str]:
    """The `error:` lines of a run's stderr (one a failed rank)."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def assert_cuda_ranks_refused(p: subprocess.CompletedProcess, out) -> None:
    """A two-rank `--device cuda` launch on a machine without CUDA: each rank refused in one line naming the fix,
    exit 2, nothing written."""
    errors = error_lines(p.stderr)
    assert sorted(e.split(":")[1] for e in errors) == [" rank 0", " rank 1"], p.stderr[-2000:]
    assert all("--device cpu" in e for e in errors)
    assert "exitcode  : 2" in p.stderr and not out.exists()


def gac_cli(*args) -> subprocess.CompletedProcess:
    """`gac ARGS` run in this process (click's CliRunner: the same command object, error handling and exit codes),
    output captured as run_gac's. For refusals and dry runs, which a fresh process would spend most of its 5 s on
    importing torch and transformers for; run_gac where the process is the point (signals, imports, a real run end
    to end)."""
    from click.testing import CliRunner

    from gac.cli import main

    args = [str(a) for a in args]
    environ = dict(os.environ)  # what the command sets for its own process (vLLM's settings) stays with it
    try:
        r = CliRunner().invoke(main, args, prog_name="gac")
    finally:
        os.environ.clear()
        os.environ.update(environ)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception  # gac's own handler turns every exception into an exit: this is the test's fault
    return subprocess.CompletedProcess(["gac", *args], r.exit_code, r.stdout, r.stderr)


def limit_file_size(nbytes: int) -> None:
    """From now on, in this process, a write that takes a file past `nbytes` fails in the kernel (EFBIG, "File too
    large") as a write to a full disk does (ENOSPC): a real failed write through every library, not a stand-in.
    (Python ignores SIGXFSZ, so the write fails instead of the process being killed.) POSIX only."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """limit_file_size(nbytes) inside the with block, the limit before it after."""
    import resource

    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit_file_size(nbytes)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)


def assert_one_error_line(p: subprocess.CompletedProcess, expected: str = "") -> str:
    """The command failed with exit 2 and one `error: <problem>: <fix>` line containing `expected`, no traceback."""
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], p.stderr
    assert_names_a_fix(lines[0])
    return lines[0]


def assert_names_a_fix(message: str) -> None:
    """One line, a problem and a fix after `: `, and the fix is said with a verb a user can act on."""
    assert message and "\n" not in message, message
    problem, _, fix = message.removeprefix("error: ").partition(": ")
    assert problem and fix, message
    assert any(w in message for w in FIX_WORDS), f"no fix named: {message}"


def sentencepiece_bpe_tokenizer():
    """A tiny tokenizer.json of Gemma's kind: spaces as '▁' (no prefix), BPE merges, unknown bytes as <0xXX>."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{b:02X}>" for b in range(256))]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=specials, show_progress=False,
                                  initial_alphabet=[chr(c) for c in range(32, 127) if c != 32] + ["▁", "\n"])
    tok.train_from_iterator([topics[k] for k in sorted(topics)[:40]], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                   pad_token="<pad>")


def installed_for_ci(module: str, package: str, setup_arg: str):
    """Import `module` (an engine the test set-up installs: `bash scripts/setup.sh llamacpp vllm`); where it is
    missing, fail under CI and skip elsewhere, so CI never passes by skipping."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"{package} is not installed: CI's set-up is `bash scripts/setup.sh llamacpp vllm`")
        pytest.skip(f"{package} is not installed: bash scripts/setup.sh {setup_arg}")
