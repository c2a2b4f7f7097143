"""`gac compress` from the command line: a smoke run and every user error as one line, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import assert_one_error_line, gac_cli, run_gac
from tests.helpers_compress import FAST_ARGS as FAST


@pytest.mark.subprocess
def test_compress_smoke(tiny_model_dir, tmp_path):
    out = tmp_path / "m"
    p = run_gac("compress", "--model", str(tiny_model_dir), "--compressor", "svd", "--ratio", "0.3",
                "--out", str(out), *FAST)
    assert p.returncode == 0, p.stderr
    assert "gac" in p.stdout and "unaligned" in p.stdout and "baseline" in p.stdout
    for name in ("report.json", "report.md", "gac_plan.json", "config.json", "model.safetensors", "modeling_gac.py"):
        assert (out / name).is_file(), name


def _error_cases(tiny_model_dir, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    exists = tmp_path / "exists"
    exists.mkdir()
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    (no_tok / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    base = ["compress", "--model", str(tiny_model_dir), *FAST]
    return {
        "ratio": ([*base, "--ratio", "1.5", "--out", str(tmp_path / "a")], "ratio"),
        "zero ratio": ([*base, "--ratio", "0", "--out", str(tmp_path / "a")], "ratio"),
        "unknown model": (["compress", "--model", "no-such-model", "--out", str(tmp_path / "b"), *FAST], "unknown model"),
        "missing path": (["compress", "--model", "./no/such/dir", "--out", str(tmp_path / "b"), *FAST], "not found"),
        "missing tokenizer": (["compress", "--model", str(no_tok), "--out", str(tmp_path / "c"), *FAST], "tokenizer"),
        "out exists": ([*base, "--out", str(exists)], "already exists"),
        "empty text": ([*base, "--out", str(tmp_path / "d"), "--calib-file", str(empty)], "empty"),
        "alpha": ([*base, "--compressor", "asvd", "--alpha", "5", "--out", str(tmp_path / "e")], "alpha"),
        "unknown target": ([*base, "--compressor", "prune", "--target", "tensorrt:fp8", "--out", str(tmp_path / "a")],
                           "unknown target"),
        "infeasible budget": ([*base, "--compressor", "svd", "--ratio", "0.99", "--out", str(tmp_path / "a")],
                              "or lower"),  # names the largest feasible ratio
    }


@pytest.mark.parametrize("case", ["ratio", "zero ratio", "unknown model", "missing path", "missing tokenizer",
                                  "out exists", "empty text", "alpha", "unknown target",
                                  "infeasible budget"])
def test_user_errors_are_one_line(tiny_model_dir, tmp_path, case):
    args, expected = _error_cases(tiny_model_dir, tmp_path)[case]
    p = gac_cli(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], p.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists()


def test_unsupported_architecture(tmp_path):
    import transformers

    d = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100).save_pretrained(d)
    p = gac_cli("compress", "--model", str(d), "--out", str(tmp_path / "o"), *FAST)
    assert p.returncode == 2 and "unsupported architecture" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.subprocess
def test_help_does_not_import_torch():
    code = ("import sys; from gac.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_importance_choices_are_the_library_s():
    from gac.calibration.importance import LOWRANK_IMPORTANCE, PROXIES
    from gac.cli.compress import IMPORTANCE

    assert set(IMPORTANCE) == set(LOWRANK_IMPORTANCE) | set(PROXIES)


def test_factorization_choices_are_the_library_s():
    from gac.cli.compress import FACTORIZATIONS as SPELLED
    from gac.compressors.linalg import FACTORIZATIONS

    assert SPELLED == FACTORIZATIONS


def test_compressor_choices_are_the_registry_and_auto():
    from gac.cli.compress import command
    from gac.compressors import AUTO, AUTO_CANDIDATES, REGISTRY

    option = next(p for p in command.params if p.name == "compressor")
    assert list(option.type.choices) == [*REGISTRY, AUTO]
    assert set(AUTO_CANDIDATES) <= set(REGISTRY)


def test_pipeline_choices_are_the_registry_and_auto():
    from gac.cli.compress import PIPELINES as SPELLED
    from gac.config import AUTO_PIPELINE
    from gac.pipelines import PIPELINES

    assert SPELLED == (*PIPELINES, AUTO_PIPELINE)


def test_pipeline_flags_name_a_pipeline():
    """--layerwise / --whole-model are --pipeline's names; two different ones are refused in one line."""
    from tests.helpers_forecast import DOCS

    model = ["compress", "--model", str(DOCS / "llama-3-8b"), "--dry-run"]
    for flag, name in (("--layerwise", "layerwise"), ("--whole-model", "whole")):
        named, flagged = gac_cli(*model, "--pipeline", name), gac_cli(*model, flag)
        assert named.returncode == flagged.returncode == 0, (named.stderr, flagged.stderr)
        assert named.stdout == flagged.stdout and f"pipeline: {name} ({flag} asks for it)" in named.stdout
    assert_one_error_line(gac_cli(*model, "--layerwise", "--pipeline", "whole"), "name two pipelines")
    assert "--pipeline" in gac_cli(*model, "--pipeline", "offloaded").stderr  # click's one-line choice error
