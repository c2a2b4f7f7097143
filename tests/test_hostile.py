"""Hostile and bad inputs, table-driven, for all six verbs: each must end with exit code 2, exactly one stderr
line `error: <problem>: <fix>`, no traceback, nothing on stdout, and nothing written anywhere (no output, no
hidden temporary). Run in-process through click's runner (torch is imported once), on the tiny test model."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from gac.cli import main
from tests.helpers import FIX_WORDS

LEGACY = Path(__file__).parent / "data" / "legacy-0.1.0"  # a tiny gac output with every structure kind
FAST = ["--seq-len", "32", "--calib-windows", "2", "--eval-windows", "1", "--prefill-tokens", "16", "--no-eval",
        "--quiet"]
PWNED = Path("/tmp/gac-hostile-pickle-ran")


# ------------------------------------------------------------------------------------------ hostile artefacts

def _copy_model(base: Path, tmp: Path, name: str) -> Path:
    d = tmp / name
    shutil.copytree(base, d)
    return d


def _edit_config(d: Path, **changes) -> Path:
    config = json.loads((d / "config.json").read_text())
    config.update(changes)
    (d / "config.json").write_text(json.dumps(config))
    return d


def _state(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(d / "model.safetensors")


def _save_state(d: Path, state: dict) -> None:
    from safetensors.torch import save_file

    save_file(state, d / "model.safetensors", metadata={"format": "pt"})


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {PWNED}",))


def make_model(kind: str, base: Path, tmp: Path) -> Path:
    """A broken copy of the tiny HF model directory `base`."""
    d = _copy_model(base, tmp, kind)
    w = d / "model.safetensors"
    if kind == "truncated":
        data = w.read_bytes()
        w.write_bytes(data[: len(data) // 2])
    elif kind == "garbage":
        w.write_bytes(os.urandom(4096))
    elif kind == "header-lies":  # a header claiming a huge length
        w.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    elif kind == "no-weights":
        w.unlink()
    elif kind == "evil-pickle":
        state = _state(d)
        w.unlink()
        torch.save({**state, "evil": _Evil()}, d / "pytorch_model.bin")
    elif kind == "garbage-pickle":
        w.unlink()
        (d / "pytorch_model.bin").write_bytes(b"\x80\x04garbage" * 100)
    elif kind == "hidden-mismatch":
        _edit_config(d, intermediate_size=128)
    elif kind == "heads-mismatch":
        _edit_config(d, num_key_value_heads=3)
    elif kind == "hidden-not-divisible":
        _edit_config(d, num_attention_heads=5, num_key_value_heads=5)
    elif kind == "small-vocab":
        state = _state(d)
        state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][:100].clone()
        _save_state(d, state)
        _edit_config(d, vocab_size=100)
    elif kind == "unknown-activation":
        _edit_config(d, hidden_act="wiggle")
    elif kind == "missing-tensor":
        state = _state(d)
        del state["model.layers.0.mlp.down_proj.weight"]
        _save_state(d, state)
    elif kind == "sharded-missing-shard":
        w.rename(d / "model-00001-of-00002.safetensors")
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors"}}))
    elif kind == "garbage-tokenizer":
        (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    elif kind == "invalid-config":
        (d / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    elif kind == "nested-config":
        (d / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif kind == "string-hidden":
        _edit_config(d, hidden_size="64")
    elif kind == "int-weights":
        state = {k: (v * 100).to(torch.int32) for k, v in _state(d).items()}
        _save_state(d, state)
    elif kind == "nan-weights":
        state = _state(d)
        state["model.layers.0.mlp.down_proj.weight"][0, 0] = float("nan")
        _save_state(d, state)
    else:
        raise ValueError(kind)
    return d


def make_gac(kind: str, tmp: Path) -> Path:
    """A damaged copy of the tiny gac output."""
    d = _copy_model(LEGACY, tmp, f"gac-{kind}")
    (d / "expected_logits.safetensors").unlink()
    config = json.loads((d / "config.json").read_text())
    if kind == "no-plan":
        (d / "gac_plan.json").unlink()
    elif kind == "no-structure":
        del config["gac_structure"]
    elif kind == "tampered-rank":
        name, rank = next(iter(config["gac_structure"]["lowrank"].items()))
        config["gac_structure"]["lowrank"][name] = rank + 3
    elif kind == "unknown-module":
        config["gac_structure"]["lowrank"]["model.layers.0.self_attn.nope"] = 4
    elif kind == "bad-structure-type":
        config["gac_structure"]["lowrank"] = ["q_proj"]
    elif kind == "missing-tensor":
        state = _state(d)
        del state[sorted(k for k in state if k.endswith(".a"))[0] if any(k.endswith(".a") for k in state)
                   else sorted(state)[3]]
        _save_state(d, state)
    elif kind == "plan-nested":
        (d / "gac_plan.json").write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "edited-code":  # what trust_remote_code users would run, changed after gac wrote it
        plan = json.loads((d / "gac_plan.json").read_text())
        plan["modeling_sha256"] = hashlib.sha256((d / "modeling_gac.py").read_bytes()).hexdigest()
        (d / "gac_plan.json").write_text(json.dumps(plan))
        with open(d / "modeling_gac.py", "a") as f:
            f.write(f"\nopen({str(PWNED)!r}, 'w').write('the directory code ran')\n")
    elif kind == "unknown-model-type":
        config["model_type"] = "gac_gpt9"
    elif kind != "ok":
        raise ValueError(kind)
    (d / "config.json").write_text(json.dumps(config))
    return d


def valid_profile(**changes) -> dict:
    entry = {"op": "lowrank", "shape": {"m": 512, "in": 64, "out": 64}, "m": 512, "dims": [8, 16, 24],
             "ms": [0.1, 0.2, 0.3], "p10_ms": [0.1, 0.2, 0.3], "p90_ms": [0.1, 0.2, 0.3]}
    profile = {"gac_profile": 1, "device": "cpu", "device_name": "test cpu", "torch": torch.__version__,
               "dtype": "float32", "threads": 1, "date": "2026-01-01T00:00:00+00:00", "spec": {}, "ops": [entry]}
    for key, value in changes.items():
        if key.startswith("op_"):
            entry[key[3:]] = value
        else:
            profile[key] = value
    return profile


def make_profile(kind: str, tmp: Path) -> Path:
    p = tmp / f"profile-{kind}.json"
    if kind == "truncated":
        p.write_text(json.dumps(valid_profile())[:50])
    elif kind == "negative":
        p.write_text(json.dumps(valid_profile(op_ms=[0.1, -0.2, 0.3])))
    elif kind == "nan":
        p.write_text(json.dumps(valid_profile(op_ms=[0.1, float("nan"), 0.3])))
    elif kind == "string-ms":
        p.write_text(json.dumps(valid_profile(op_ms=[0.1, "fast", 0.3])))
    elif kind == "string-dims":
        p.write_text(json.dumps(valid_profile(op_dims="8,16,24")))
    elif kind == "bfloat16":
        p.write_text(json.dumps(valid_profile(dtype="bfloat16")))
    elif kind == "cuda":
        p.write_text(json.dumps(valid_profile(device="cuda")))
    elif kind == "nested":
        p.write_text('{"gac_profile": 1, "ops": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif kind == "bool-m":
        p.write_text(json.dumps(valid_profile(op_m=True)))
    elif kind == "ops-object":
        p.write_text(json.dumps(valid_profile(ops={"lowrank": 1})))
    else:
        raise ValueError(kind)
    return p


def make_file(kind: str, tmp: Path) -> Path:
    p = tmp / f"file-{kind}"
    if kind == "binary":
        p.write_bytes(bytes(range(256)) * 40)
    elif kind == "latin1":
        p.write_bytes(("Größe und Überlänge, très café. " * 200).encode("latin-1"))
    elif kind == "empty":
        p.write_text(" \n\t\n")
    elif kind == "dir":
        p.mkdir()
    elif kind == "a-file":
        p.write_text("I am a file, not a directory\n")
    elif kind == "bad-json":
        p.write_text('{"budget": 100, "weights": [')
    elif kind == "list-json":
        p.write_text("[1, 2, 3]")
    elif kind == "nested-json":
        p.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "nan-plan":
        p.write_text('{"budget": NaN, "weights": [{"name": "w", "dim": 10, "score": 1, "params_per_dim": 2}]}')
    elif kind == "negative-budget":
        p.write_text(json.dumps({"budget": -5, "weights": [{"name": "w", "dim": 10, "score": 1,
                                                              "params_per_dim": 2}]}))
    elif kind == "plan":
        p.write_text(json.dumps({"budget": 1000, "weights": [{"name": "w", "dim": 100, "score": 1,
                                                                "params_per_dim": 10}]}))
    else:
        raise ValueError(kind)
    return p


# ------------------------------------------------------------------------------------------------- the table
# Each case: (verb, args). Tokens: {model} tiny HF dir, {gac} intact gac output, {out} a fresh output path,
# model:KIND / gac:KIND / profile:KIND / file:KIND the artefacts above, {tmp} the case's directory.

CASES = {
    # ---- compress: options
    "compress seq-len 0": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--seq-len", "0"],
    "compress seq-len negative": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--seq-len", "-5"],
    "compress calib-windows 0": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--calib-windows", "0"],
    "compress eval-windows negative": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                       "--eval-windows", "-1"],
    "compress prefill-tokens 0": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--prefill-tokens", "0"],
    "compress prefill-tokens text": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                     "--prefill-tokens", "many"],
    "compress align 0": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--align", "0"],
    "compress align 100000": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--align", "100000"],
    "compress ratio nan": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--ratio", "nan"],
    "compress ratio 1": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--ratio", "1"],
    "compress alpha inf": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--alpha", "inf"],
    "compress group-size 0": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--compressor", "palu",
                              "--group-size", "0"],
    "compress unknown option": ["compress", "--model", "{model}", "--out", "{out}", "--bogus"],
    "compress missing --out": ["compress", "--model", "{model}"],
    "compress bad compressor": ["compress", "--model", "{model}", "--out", "{out}", "--compressor", "zip"],
    "compress bad dtype": ["compress", "--model", "{model}", "--out", "{out}", "--dtype", "int8"],
    "compress device tpu": ["compress", "--model", "{model}", "--out", "{out}", *FAST, "--device", "tpu"],
    # ---- compress: output locations
    "compress out under a file": ["compress", "--model", "{model}", "--out", "file:a-file/sub", *FAST],
    "compress out under /proc": ["compress", "--model", "{model}", "--out", "/proc/gac-out", *FAST],
    "compress out exists": ["compress", "--model", "{model}", "--out", "{tmp}", *FAST],
    "compress out is a file with force": ["compress", "--model", "{model}", "--out", "file:a-file", *FAST, "--force"],
    # ---- compress: text files
    "compress calib-file missing": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                    "--calib-file", "{tmp}/nope.txt"],
    "compress calib-file /dev/zero": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                      "--calib-file", "/dev/zero"],
    "compress calib-file binary": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                   "--calib-file", "file:binary"],
    "compress calib-file latin-1": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                    "--calib-file", "file:latin1"],
    "compress calib-file directory": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                      "--calib-file", "file:dir"],
    "compress eval-file empty": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                 "--eval-file", "file:empty"],
    # ---- compress: profiles
    "compress profile truncated": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                   "--profile", "profile:truncated"],
    "compress profile negative latency": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                          "--profile", "profile:negative"],
    "compress profile NaN latency": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                     "--profile", "profile:nan"],
    "compress profile string latency": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                        "--profile", "profile:string-ms"],
    "compress profile string dims": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                     "--profile", "profile:string-dims"],
    "compress profile other dtype": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                     "--profile", "profile:bfloat16"],
    "compress profile other device": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                      "--profile", "profile:cuda"],
    "compress profile nested": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                "--profile", "profile:nested"],
    "compress profile bool m": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                "--profile", "profile:bool-m"],
    "compress profile /dev/zero": ["compress", "--model", "{model}", "--out", "{out}", *FAST,
                                   "--profile", "/dev/zero"],
    # ---- compress: models
    "compress a gac output": ["compress", "--model", "{gac}", "--out", "{out}", *FAST],
    "compress truncated safetensors": ["compress", "--model", "model:truncated", "--out", "{out}", *FAST],
    "compress garbage safetensors": ["compress", "--model", "model:garbage", "--out", "{out}", *FAST],
    "compress safetensors header lies": ["compress", "--model", "model:header-lies", "--out", "{out}", *FAST],
    "compress config without weights": ["compress", "--model", "model:no-weights", "--out", "{out}", *FAST],
    "compress malicious pickle": ["compress", "--model", "model:evil-pickle", "--out", "{out}", *FAST],
    "compress garbage pickle": ["compress", "--model", "model:garbage-pickle", "--out", "{out}", *FAST],
    "compress config shapes mismatch": ["compress", "--model", "model:hidden-mismatch", "--out", "{out}", *FAST],
    "compress kv heads mismatch": ["compress", "--model", "model:heads-mismatch", "--out", "{out}", *FAST],
    "compress hidden not divisible": ["compress", "--model", "model:hidden-not-divisible", "--out", "{out}", *FAST],
    "compress vocab smaller than tokenizer": ["compress", "--model", "model:small-vocab", "--out", "{out}", *FAST],
    "compress unknown activation": ["compress", "--model", "model:unknown-activation", "--out", "{out}", *FAST],
    "compress missing tensor": ["compress", "--model", "model:missing-tensor", "--out", "{out}", *FAST],
    "compress missing shard": ["compress", "--model", "model:sharded-missing-shard", "--out", "{out}", *FAST],
    "compress garbage tokenizer": ["compress", "--model", "model:garbage-tokenizer", "--out", "{out}", *FAST],
    "compress invalid config JSON": ["compress", "--model", "model:invalid-config", "--out", "{out}", *FAST],
    "compress deeply nested config": ["compress", "--model", "model:nested-config", "--out", "{out}", *FAST],
    "compress string hidden size": ["compress", "--model", "model:string-hidden", "--out", "{out}", *FAST],
    "compress integer weights": ["compress", "--model", "model:int-weights", "--out", "{out}", *FAST],
    "compress NaN weights": ["compress", "--model", "model:nan-weights", "--out", "{out}", *FAST],
    "compress relative path typo": ["compress", "--model", "models/tiyn", "--out", "{out}", *FAST],
    "compress dotted path typo": ["compress", "--model", "./tiny-lama", "--out", "{out}", *FAST],
    # ---- select
    "select missing plan": ["select", "{tmp}/nope.json"],
    "select plan /dev/zero": ["select", "/dev/zero"],
    "select plan nested": ["select", "file:nested-json"],
    "select plan invalid JSON": ["select", "file:bad-json"],
    "select plan is a list": ["select", "file:list-json"],
    "select plan NaN budget": ["select", "file:nan-plan"],
    "select plan binary": ["select", "file:binary"],
    "select plan latin-1": ["select", "file:latin1"],
    "select plan negative budget": ["select", "file:negative-budget"],
    "select plan is a directory": ["select", "file:dir"],
    "select out under a file": ["select", "file:plan", "--out", "file:a-file/r.json"],
    "select out under /proc": ["select", "file:plan", "--out", "/proc/gac-r.json"],
    "select out is a directory": ["select", "file:plan", "--out", "{tmp}"],
    "select missing argument": ["select"],
    "select unknown option": ["select", "file:plan", "--fast"],
    # ---- profile
    "profile out under a file": ["profile", "--quick", "--out", "file:a-file/p.json"],
    "profile out under /proc": ["profile", "--quick", "--out", "/proc/gac-p.json"],
    "profile hidden 0": ["profile", "--quick", "--hidden", "0"],
    "profile m 0": ["profile", "--quick", "--m", "0"],
    "profile threads 0": ["profile", "--quick", "--threads", "0"],
    "profile heads text": ["profile", "--quick", "--heads", "eight"],
    "profile plan /dev/zero": ["profile", "--plan", "/dev/zero"],
    "profile plan nested": ["profile", "--plan", "file:nested-json"],
    "profile plan is a list": ["profile", "--plan", "file:list-json"],
    "profile device tpu": ["profile", "--device", "tpu"],
    "profile bad dims": ["profile", "--dims", "abc"],
    "profile dims and plan": ["profile", "--dims", "8:16", "--plan", "file:plan"],
    "profile model typo": ["profile", "--model", "./no-such-model"],
    # ---- bench
    "bench out under a file": ["bench", "{model}", "--out", "file:a-file/b"],
    "bench out under /proc": ["bench", "{model}", "--out", "/proc/gac-bench"],
    "bench points 0x5": ["bench", "{model}", "--points", "0x5"],
    "bench rounds 0": ["bench", "{model}", "--rounds", "0"],
    "bench threads negative": ["bench", "{model}", "--threads", "-1"],
    "bench missing model": ["bench"],
    "bench model typo": ["bench", "{model}", "./no-such-dir/model"],
    "bench truncated safetensors": ["bench", "model:truncated", "--points", "1x8", "--rounds", "1"],
    "bench unknown hub id (offline)": ["bench", "someone/no-such-model"],
    "inspect unknown hub id (offline)": ["inspect", "someone/no-such-model"],
    "bench gac output without plan": ["bench", "gac:no-plan", "--points", "1x8", "--rounds", "1"],
    "bench gac output with edited modeling code": ["bench", "gac:edited-code", "--points", "1x8", "--rounds", "1"],
    # ---- inspect
    "inspect json under a file": ["inspect", "{gac}", "--json", "file:a-file/d.json"],
    "inspect plot under /proc": ["inspect", "{gac}", "--plot", "/proc/gac-d.png"],
    "inspect json is a directory": ["inspect", "{gac}", "--json", "{tmp}"],
    "inspect align 0": ["inspect", "{gac}", "--align", "0"],
    "inspect align 100000": ["inspect", "{gac}", "--align", "8,100000"],
    "inspect limit negative": ["inspect", "{gac}", "--limit", "-1"],
    "inspect gac output without plan": ["inspect", "gac:no-plan"],
    "inspect gac output without structure": ["inspect", "gac:no-structure"],
    "inspect gac output tampered rank": ["inspect", "gac:tampered-rank"],
    "inspect gac output unknown module": ["inspect", "gac:unknown-module"],
    "inspect gac output bad structure type": ["inspect", "gac:bad-structure-type"],
    "inspect gac output missing tensor": ["inspect", "gac:missing-tensor"],
    "inspect gac output nested plan": ["inspect", "gac:plan-nested"],
    "inspect gac output with edited modeling code": ["inspect", "gac:edited-code"],
    "inspect gac output of an unknown model type": ["inspect", "gac:unknown-model-type"],
    "inspect missing tensor": ["inspect", "model:missing-tensor"],
    "inspect model is /dev/zero": ["inspect", "/dev/zero"],
    "inspect NaN weights": ["inspect", "model:nan-weights"],
    "inspect integer weights": ["inspect", "model:int-weights"],
    "inspect model is a text file": ["inspect", "file:a-file"],
    # ---- repair
    "repair out exists": ["repair", "{gac}", "--out", "{tmp}", "--no-latency"],
    "repair out under a file": ["repair", "{gac}", "--out", "file:a-file/r", "--no-latency"],
    "repair out under /proc": ["repair", "{gac}", "--out", "/proc/gac-repair", "--no-latency"],
    "repair align 100000": ["repair", "{gac}", "--out", "{out}", "--align", "100000"],
    "repair prefill-tokens 0": ["repair", "{gac}", "--out", "{out}", "--prefill-tokens", "0"],
    "repair bad strategy": ["repair", "{gac}", "--out", "{out}", "--strategy", "best"],
    "repair profile negative latency": ["repair", "{gac}", "--out", "{out}", "--profile", "profile:negative"],
    "repair profile other dtype": ["repair", "{gac}", "--out", "{out}", "--profile", "profile:bfloat16"],
    "repair profile object ops": ["repair", "{gac}", "--out", "{out}", "--profile", "profile:ops-object"],
    "repair gac output without structure": ["repair", "gac:no-structure", "--out", "{out}", "--no-latency"],
    "repair gac output without plan": ["repair", "gac:no-plan", "--out", "{out}", "--no-latency"],
    "repair gac output tampered rank": ["repair", "gac:tampered-rank", "--out", "{out}", "--no-latency"],
    "repair gac output with edited modeling code": ["repair", "gac:edited-code", "--out", "{out}", "--no-latency"],
    "repair malicious pickle": ["repair", "model:evil-pickle", "--out", "{out}", "--no-latency"],
    # ---- quantize
    "quantize unknown scheme": ["quantize", "{gac}", "--scheme", "int3", "--out", "{out}"],
    "quantize missing scheme": ["quantize", "{gac}", "--out", "{out}"],
    "quantize group 0": ["quantize", "{gac}", "--scheme", "w4a16", "--group", "0", "--out", "{out}"],
    "quantize group 7": ["quantize", "{gac}", "--scheme", "w4a16", "--group", "7", "--out", "{out}"],
    "quantize w8a8 with a group": ["quantize", "{gac}", "--scheme", "w8a8", "--group", "32", "--out", "{out}"],
    "quantize serve-tp 0": ["quantize", "{gac}", "--scheme", "w8a8", "--serve-tp", "0", "--out", "{out}"],
    "quantize not a model directory": ["quantize", "{tmp}", "--scheme", "w8a8", "--out", "{out}"],
    "quantize model is /dev/zero": ["quantize", "/dev/zero", "--scheme", "w8a8", "--out", "{out}"],
    "quantize out under /proc": ["quantize", "{gac}", "--scheme", "w8a8", "--out", "/proc/gac-q"],
    "quantize truncated safetensors": ["quantize", "model:truncated", "--scheme", "w8a8", "--out", "{out}"],
}


def _resolve(arg: str, tmp: Path, model: Path, gac: Path) -> str:
    kind, _, rest = arg.partition(":")
    if kind in ("model", "gac", "profile", "file") and rest and not arg.startswith("/"):
        name, _, sub = rest.partition("/")
        made = {"model": lambda: make_model(name, model, tmp), "gac": lambda: make_gac(name, tmp),
                "profile": lambda: make_profile(name, tmp), "file": lambda: make_file(name, tmp)}[kind]()
        return str(made / sub) if sub else str(made)
    return arg.format(model=model, gac=gac, out=tmp / "out", tmp=tmp)


def _snapshot(root: Path) -> set:
    return {(str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def gac_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gac") / "legacy"
    shutil.copytree(LEGACY, d)
    return d


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input_is_one_clean_line(case, tmp_path, tiny_model_dir, gac_dir, monkeypatch):
    case_dir = tmp_path / "case"
    case_dir.mkdir()
    (case_dir / "models").mkdir()  # for the relative-path typo `models/tiyn`
    monkeypatch.chdir(case_dir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # hermetic: a hub id is never fetched here
    PWNED.unlink(missing_ok=True)
    args = [_resolve(a, case_dir, tiny_model_dir, gac_dir) for a in CASES[case]]
    before, model_before = _snapshot(tmp_path), _snapshot(tiny_model_dir)

    result = CliRunner().invoke(main, args, prog_name="gac")

    assert not PWNED.exists(), "code from a pickle ran"
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    problem, _, fix = lines[0][len("error: "):].partition(": ")
    assert problem and fix, lines[0]
    assert any(w in lines[0] for w in FIX_WORDS), f"no fix named: {lines[0]}"
    assert not result.stdout.strip(), result.stdout
    assert _snapshot(tmp_path) == before, "something was written"
    assert _snapshot(tiny_model_dir) == model_before


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_asked_for_without_cuda_is_one_line_before_any_work(tiny_model_dir, tmp_path):
    """The memory planner asks the device for its free memory: CUDA is checked first, not asserted inside torch."""
    for extra in ([], ["--dry-run"]):
        result = CliRunner().invoke(main, ["compress", "--model", str(tiny_model_dir), "--device", "cuda", "--out",
                                           str(tmp_path / "out"), *extra], prog_name="gac")
        assert result.exit_code == 2, result.stderr
        assert result.stderr.strip() == (f"error: device 'cuda' asked for but CUDA is not available here (torch "
                                         f"{torch.__version__}): use --device cpu")
    assert not (tmp_path / "out").exists()


def test_table_covers_every_verb_with_enough_cases():
    verbs = [args[0] for args in CASES.values()]
    assert len(verbs) >= 60
    verbs_covered = ("compress", "select", "profile", "bench", "inspect", "repair", "quantize")
    assert {v: verbs.count(v) >= 8 for v in verbs_covered} == dict.fromkeys(verbs_covered, True)


# ------------------------------------------------- loading without gac, file modes, what a killed run leaves

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def new_gac_dir(tmp_path_factory):
    """The legacy output saved again by this gac (model type gac_llama, modeling_gac.py's hash in the plan)."""
    from gac.checkpoint.gac_dir import load, read_plan, save

    loaded = load(LEGACY)
    return save(loaded.model, loaded.tokenizer, tmp_path_factory.mktemp("new") / "gac", plan=read_plan(LEGACY))


@pytest.mark.subprocess
def test_transformers_without_gac_raises_instead_of_building_random_weights(new_gac_dir, tmp_path):
    """In a process that never imports gac, without trust_remote_code: transformers raises naming
    trust_remote_code (the model type is gac's), never a LlamaForCausalLM with random factorized projections."""
    script = textwrap.dedent(f"""
        import sys
        from transformers import AutoModelForCausalLM
        try:
            model = AutoModelForCausalLM.from_pretrained({str(new_gac_dir)!r})
        except ValueError as e:
            print("RAISED", " ".join(str(e).split()))
        else:
            print("BUILT", type(model).__name__)
        assert not any(n.split(".")[0] == "gac" for n in sys.modules), "gac was imported"
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "PYTHONPATH": ""}
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "RAISED" in p.stdout and "trust_remote_code=True" in p.stdout and "BUILT" not in p.stdout
    assert json.loads((new_gac_dir / "config.json").read_text())["model_type"] == "gac_llama"


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_every_file_of_every_output_has_the_usual_mode(umask, tmp_path, tiny_model_dir, new_gac_dir):
    """0666 (files) and 0777 (directories) minus the umask, whichever library wrote the file (safetensors writes
    0600): a compressed model (one file, and shards from --layerwise) and a re-saved gac output."""
    runs = {"compress": ["compress", "--model", str(tiny_model_dir), "--out", str(tmp_path / "compress"), *FAST],
            "layerwise": ["compress", "--model", str(tiny_model_dir), "--out", str(tmp_path / "layerwise"),
                          "--layerwise", *FAST],
            "export": ["export", str(new_gac_dir), "--format", "hf", "--out", str(tmp_path / "export")]}
    before = os.umask(umask)
    try:
        for name, args in runs.items():
            result = CliRunner().invoke(main, args, prog_name="gac")
            assert result.exit_code == 0, (name, result.output, result.stderr)
    finally:
        os.umask(before)
    for name in runs:
        out = tmp_path / name
        assert (out / "gac_plan.json").is_file()
        modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]}
        expected = {k: (0o777 if (tmp_path / k).is_dir() else 0o666) & ~umask for k in modes}
        assert modes == expected
    assert any((tmp_path / "layerwise").glob("model-*-of-*.safetensors"))  # the sharded writer's files too


@pytest.mark.subprocess
def test_what_a_killed_run_left_is_named_and_removed_by_the_next_run(tmp_path, new_gac_dir):
    """SIGKILL (no cleanup runs) leaves .NAME.*.partial; the next run into the same parent names it and removes
    it, since its writer is gone, and leaves the one of a writer that is still running."""
    parent = tmp_path / "outs"
    killed = textwrap.dedent(f"""
        import os, signal
        from gac.io.atomic import atomic_dir
        with atomic_dir({str(parent / "model")!r}) as tmp:
            (tmp / "model.safetensors").write_bytes(b"x" * 100_000)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    p = subprocess.run([sys.executable, "-c", killed], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL
    (left,) = parent.glob(".model.*.partial")
    from gac.io.atomic import _writer

    running = parent / f".other.abcd1234.{_writer()}.partial"  # this test's own process: a live writer
    running.mkdir()
    p = subprocess.run([sys.executable, "-m", "gac", "export", str(new_gac_dir), "--format", "hf", "--out",
                        str(parent / "model")], env={**env, "COLUMNS": "1000"},  # log lines unwrapped
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"removed {left}, left by a killed run" in p.stdout + p.stderr
    assert sorted(x.name for x in parent.iterdir()) == sorted([running.name, "model"])
