"""`gac repair` and `gac inspect` from the command line: smoke runs and user errors as one line, exit 2."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from click.testing import CliRunner

from gac.cli import main
from tests.helpers_tiny import TINY


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def wide_dir(tiny_model_dir, tmp_path_factory):
    """A plain HF directory of a tiny Llama with an irregular MLP width (150), tokenizer copied from the tiny dir."""
    d = tmp_path_factory.mktemp("wide")
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**{**TINY, "intermediate_size": 150})).save_pretrained(d)
    for f in tiny_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, d / f.name)
    return d


def test_repair_then_inspect(wide_dir, tmp_path):
    out = tmp_path / "repaired"
    p = run("repair", wide_dir, "--out", out, "--align", "16", "--prefill-tokens", "16")
    assert p.exit_code == 0, p.output
    assert "padded 2 of 2 dims (mlp_width) to multiples of 16" in p.output
    assert "parameters:" in p.output and "prefill (batch 1, 16 tokens" in p.output
    assert "argmax identical" in p.output
    report = json.loads((out / "repair.json").read_text())
    assert report["overhead"]["params_added"] == 2 * 3 * 10 * TINY["hidden_size"]  # 150 -> 160, 3 linears x 2 layers

    before = run("inspect", wide_dir, "--align", "8,16", "--json", tmp_path / "before.json")
    after = run("inspect", out, "--align", "8,16", "--json", tmp_path / "after.json", "--plot", tmp_path / "d.png")
    assert before.exit_code == 0 and after.exit_code == 0, (before.output, after.output)
    assert "150" in before.output and "misaligned to   8:  21.43%" in before.output  # 3 of 14 dims per layer
    assert "misaligned to  16:   0.00%" in after.output and "every listed dim" in after.output
    assert json.loads((tmp_path / "before.json").read_text())["share_misaligned"]["8"] == pytest.approx(3 / 14)
    assert (tmp_path / "d.png").stat().st_size > 0


def test_repair_strategy_no_latency(tiny_model_dir, tmp_path):
    p = run("repair", tiny_model_dir, "--out", tmp_path / "o", "--strategy", "optimal", "--no-latency")
    assert p.exit_code == 0, p.output
    assert "padded 0 of 2 dims" in p.output and "(optimal)" in p.output and "prefill" not in p.output


def _error_cases(tiny_model_dir, tmp_path):
    exists = tmp_path / "exists"
    exists.mkdir()
    return {
        "repair missing model": (["repair", tmp_path / "no" / "such", "--out", tmp_path / "a"], "not found"),
        "repair out exists": (["repair", tiny_model_dir, "--out", exists, "--no-latency"], "already exists"),
        "repair bad align": (["repair", tiny_model_dir, "--out", tmp_path / "a", "--align", "0"], "bad --align"),
        "repair align not a number": (["repair", tiny_model_dir, "--out", tmp_path / "a", "--align", "x"],
                                      "bad --align"),
        "repair missing profile": (["repair", tiny_model_dir, "--out", tmp_path / "a",
                                    "--profile", tmp_path / "p.json"], "not found"),
        "inspect missing model": (["inspect", "no-such-model"], "unknown model"),
        "inspect bad align": (["inspect", tiny_model_dir, "--align", "8,zero"], "bad --align"),
        "inspect zero align": (["inspect", tiny_model_dir, "--align", "0,8"], "bad --align"),
    }


@pytest.mark.parametrize("case", ["repair missing model", "repair out exists", "repair bad align",
                                  "repair align not a number", "repair missing profile", "inspect missing model",
                                  "inspect bad align", "inspect zero align"])
def test_user_errors_are_one_line(tiny_model_dir, tmp_path, case):
    args, expected = _error_cases(tiny_model_dir, tmp_path)[case]
    p = run(*args)
    assert p.exit_code == 2, p.output
    assert p.exception is None or isinstance(p.exception, SystemExit)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0], p.stderr
    assert not (tmp_path / "a").exists()
    assert list((tmp_path / "exists").iterdir()) == []
