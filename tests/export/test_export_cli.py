"""`gac export` from the command line: a tiny model to GGUF, and every bad input as one line, exit 2, with
nothing written."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_one_error_line, gac_cli, run_gac


@pytest.mark.subprocess
def test_export_f16_smoke(tiny_model_dir, tmp_path):
    out, report = tmp_path / "m.gguf", tmp_path / "m.json"
    p = run_gac("export", str(tiny_model_dir), "--format", "gguf", "--out", str(out), "--report", str(report),
                "--quiet")
    assert p.returncode == 0, p.stderr
    assert "llama GGUF, f16" in p.stdout and "no tensor fell back" in p.stdout
    r = json.loads(report.read_text())
    assert r["arch"] == "llama" and r["bytes"] == out.stat().st_size and r["fallbacks"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "m.json"]  # no temporary left


def test_export_quantized_lists_pruned_width_fallbacks(llama_cpp, tiny_model_dir, tmp_path):
    """A gac output pruned to widths that are not multiples of 32: its down projections fall back, listed."""
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig

    src = tmp_path / "pruned"
    compress(CompressConfig(model=str(tiny_model_dir), compressor="prune", ratio=0.2, out=str(src), align=False,
                            evaluate=False, progress=False, compressor_options={"layers": "all", "head_mode": "none"},
                            text=TextConfig(seq_len=32, calib_windows=2, eval_windows=1)))
    widths = json.loads((src / "report.json").read_text())["dims"]["unaligned"]
    odd = [w for w in widths.values() if w % 32]
    out = tmp_path / "q.gguf"
    p = run_gac("export", str(src), "--out", str(out), "--type", "q4_0", "--quiet")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("(pruned width)") == len(odd), p.stdout
    assert ("deci" if len(set(widths.values())) > 1 else "llama") in p.stdout


@pytest.fixture(scope="module")
def lowrank_dir(tiny_model_dir, tmp_path_factory):
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig

    out = tmp_path_factory.mktemp("lowrank") / "svd"
    compress(CompressConfig(model=str(tiny_model_dir), compressor="svd", ratio=0.3, out=str(out), evaluate=False,
                            progress=False, text=TextConfig(seq_len=32, calib_windows=2, eval_windows=1)))
    return out


def test_bad_inputs_are_one_line_and_write_nothing(tiny_model_dir, lowrank_dir, tmp_path):
    not_model = tmp_path / "not-a-model"
    not_model.mkdir()
    (not_model / "notes.txt").write_text("hello")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    outs = tmp_path / "outs"
    outs.mkdir()
    cases = {
        "low-rank": ([str(lowrank_dir), "--out", str(outs / "a.gguf")], "low-rank"),
        "non-gac dir": ([str(not_model), "--out", str(outs / "b.gguf")], "neither a gac output"),
        "unknown type": ([str(tiny_model_dir), "--out", str(outs / "c.gguf"), "--type", "q3_x"], "unknown GGUF type"),
        "unwritable": ([str(tiny_model_dir), "--out", str(a_file / "d.gguf")], "is a file, not a directory"),
        "unwritable fs": ([str(tiny_model_dir), "--out", "/proc/gac-export-test.gguf"], "not writable"),
        "not .gguf": ([str(tiny_model_dir), "--out", str(outs / "e.bin")], "must end in .gguf"),
        "format": ([str(tiny_model_dir), "--out", str(outs / "f.gguf"), "--format", "onnx"], "--format"),
    }
    for case, (args, expected) in cases.items():
        p = gac_cli("export", *args)
        assert_one_error_line(p, expected)
        assert list(outs.iterdir()) == [], case  # nothing half-written
    assert a_file.read_text() == "x"


def test_existing_output_needs_force(tiny_model_dir, tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"old")
    assert_one_error_line(gac_cli("export", str(tiny_model_dir), "--out", str(out)), "already exists")
    assert out.read_bytes() == b"old"
    assert gac_cli("export", str(tiny_model_dir), "--out", str(out), "--force", "--quiet").returncode == 0
    assert out.read_bytes()[:4] == b"GGUF"


@pytest.mark.subprocess
def test_export_hf_writes_the_families_own_class_or_keeps_the_gac_structure(tiny_model_dir, lowrank_dir, tmp_path):
    """--format hf: a plain model becomes an HF directory of its own class (engines load it natively, same
    logits); a gac output keeps its structure and plan, under the architecture name gac's vLLM plugin serves."""
    import torch
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.loading import load_model

    plain, kept = tmp_path / "plain", tmp_path / "kept"
    p = run_gac("export", str(tiny_model_dir), "--format", "hf", "--out", str(plain), "--quiet")
    assert p.returncode == 0, p.stderr
    config = json.loads((plain / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "gac_structure" not in config
    assert not (plain / "modeling_gac.py").exists() and (plain / "tokenizer.json").is_file()
    ids = torch.arange(12)[None]
    with torch.inference_mode():
        a = AutoModelForCausalLM.from_pretrained(plain).eval()(ids).logits
        b = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()(ids).logits
    torch.testing.assert_close(a, b)
    assert run_gac("export", str(lowrank_dir), "--format", "hf", "--out", str(kept), "--quiet").returncode == 0
    config = json.loads((kept / "config.json").read_text())
    assert config["architectures"] == ["GacLlamaForCausalLM"] and config["gac_structure"]["lowrank"]
    with torch.inference_mode():
        a = load_model(str(kept)).model(ids).logits
        b = load_model(str(lowrank_dir)).model(ids).logits
    torch.testing.assert_close(a, b)
    outs = tmp_path / "outs"
    outs.mkdir()
    assert_one_error_line(gac_cli("export", str(tiny_model_dir), "--format", "hf", "--out", str(outs / "x"), "--type",
                            "q8_0"), "--type and --report are for --format gguf")
    assert_one_error_line(gac_cli("export", str(tiny_model_dir), "--format", "hf", "--out", str(plain)), "already exists")
    assert list(outs.iterdir()) == []
