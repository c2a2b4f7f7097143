"""gac outputs served by vLLM (CPU build) through gac's plugin: every structure kind loads and computes the model
gac saved (greedy tokens and prompt log-probabilities against transformers), at tensor parallel size 1 and 2; what
vLLM cannot serve is refused in one line before vLLM starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import assert_one_error_line, gac_cli
from tests.helpers_serve import LOGPROB_TOL, TP2_LLAMA, serve_check, served_set

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def served(vllm, serve_dirs, tmp_path_factory):
    """serve-check at TP=1 on every served directory but the Llamas served at TP=2 (each structure kind they hold is
    also served here: factor pairs unaligned and repaired, PaLU groups quantized, per-layer widths and heads
    resized)."""
    dirs = served_set({name: d for name, d in serve_dirs.items() if name not in TP2_LLAMA})
    return serve_check(dirs, tmp_path_factory.mktemp("served") / "tp1.json")


@pytest.mark.parametrize("name", ["original", "asvd-unaligned", "repaired", "resized"])
def test_vllm_serves_the_saved_model(served, serve_dirs, name):
    r = served[str(serve_dirs[name])]
    assert r["positions"] == 8 * 32
    assert r["token_agreement"] >= 0.95 and r["teacher_forced_agreement"] >= 0.95
    assert r["prompt_logprob_max_abs_diff"] <= LOGPROB_TOL


def test_tensor_parallel_2_serves_factorized_and_pruned_models(served_tp2, serve_dirs):
    for name in TP2_LLAMA:
        r = served_tp2[str(serve_dirs[name])]
        assert r["token_agreement"] >= 0.95 and r["prompt_logprob_max_abs_diff"] <= LOGPROB_TOL, name


QUANTIZED = {"structures-w8a8": "CPUInt8ScaledMMLinearKernel", "original-w8a8": "CPUInt8ScaledMMLinearKernel",
             "structures-w4a16": "CPUWNA16LinearKernel", "unfit-w4a16-skip": "CPUWNA16LinearKernel"}


@pytest.mark.parametrize("name", list(QUANTIZED))
def test_vllm_runs_every_quantized_linear_with_its_quantized_kernel(served, serve_dirs, name):
    """Every linear of a quantized checkpoint, the factor pairs and PaLU's up-projections included, runs on vLLM's
    quantized kernel (as quantize.json plans), and vLLM computes what transformers computes from the checkpoint
    (int8 activations rounded per token on both sides; random tiny weights leave near-ties, hence teacher-forced).
    Where vLLM's CPU build has no int4 GEMM, the W4A16 checkpoint is refused before vLLM starts instead."""
    from gac.serve.agreement import kernel_counts

    if f"{name}-refused" in serve_dirs:
        p = gac_cli("serve-check", serve_dirs[f"{name}-refused"])
        assert_one_error_line(p, "holds int4 (W4A16) weights, and vLLM's CPU build has its int4 GEMM")
        return
    r = served[str(serve_dirs[name])]
    unfit = 2 if name == "unfit-w4a16-skip" else 0  # --skip-unfit: the pruned layer's gate_up and down, unquantized
    assert kernel_counts(r["kernels"]) == r["kernels_planned"]
    assert r["kernels_planned"] == {QUANTIZED[name]: len(r["kernels"]) - unfit,
                                    **({"UnquantizedLinearMethod": unfit} if unfit else {})}
    if name.startswith("structures"):  # pairs and groups run on the quantized kernel too
        assert {"model.layers.0.self_attn.qkv_proj.q_proj.a", "model.layers.3.self_attn.qkv_proj.k_proj.b.1",
                "model.layers.2.mlp.down_proj.b"} <= set(r["kernels"])
    assert r["teacher_forced_agreement"] >= 0.9 and r["token_agreement"] >= 0.8, r["token_agreement"]


def test_tensor_parallel_2_shards_quantized_factor_pairs(served_tp2, serve_dirs):
    from gac.serve.agreement import kernel_counts

    r = served_tp2[str(serve_dirs["structures-w8a8"])]
    assert kernel_counts(r["kernels"]) == r["kernels_planned"]
    assert r["teacher_forced_agreement"] >= 0.9 and r["token_agreement"] >= 0.8, r["token_agreement"]


def test_refusals_are_one_line_before_vllm_starts(vllm, serve_dirs, tmp_path):
    p = gac_cli("serve-check", str(serve_dirs["resized"]), "--tp", "2")
    assert p.returncode == 2
    assert p.stderr.strip() == ("error: layer 0 keeps MLP width 157, not divisible by tensor parallel size 2: "
                                "compress with --target vllm:tp2, or serve with a tensor parallel size that divides it")
    p = gac_cli("serve-check", str(tmp_path))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no config.json" in p.stderr


def test_a_head_size_vllms_cpu_attention_does_not_run_is_one_line_before_vllm_starts(vllm, tiny_model_dir):
    p = gac_cli("serve-check", tiny_model_dir)
    assert_one_error_line(p, "has head_dim 16, which vLLM's CPU attention does not run (it runs 32, 64")


def test_vllm_building_its_config_refuses_a_release_outside_the_range_in_one_line(vllm, serve_dirs, monkeypatch):
    """On a vLLM outside gac's range (its version monkeypatched), vLLM's own config building (what `LLM(...)` and the
    OpenAI server do first) stops at the plugin's check, before any engine or worker exists, with one GacError line;
    a model that is not gac's is left to vLLM."""
    from vllm.engine.arg_utils import EngineArgs

    from gac.errors import GacError
    from gac.serve import vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_version", lambda: "0.33.0")
    args = dict(dtype="float32", max_model_len=128, enforce_eager=True)
    with pytest.raises(GacError) as e:
        EngineArgs(model=str(serve_dirs["asvd"]), **args).create_engine_config()
    assert str(e.value).startswith("vLLM 0.33.0 is outside gac's supported range ") and "\n" not in str(e.value)
    EngineArgs(model=str(serve_dirs["original"]), **args).create_engine_config()


OUTSIDE_THE_RANGE = """
import runpy, sys
from gac.serve import vllm_engine
vllm_engine.vllm_version = lambda: "0.33.0"  # a release outside the range, in this process
sys.argv = ["api_server", *sys.argv[1:]]
runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
"""


def test_the_openai_server_on_a_release_outside_the_range_ends_in_one_line(vllm, serve_dirs, tmp_path):
    """vLLM's OpenAI server builds its configuration outside any handler: on a release outside the range it stops
    there, before an engine starts, with the plugin's one `error:` line and no traceback."""
    script = tmp_path / "server.py"
    script.write_text(OUTSIDE_THE_RANGE)
    p = subprocess.run([sys.executable, str(script), "--model", str(serve_dirs["asvd"]), "--dtype", "float32",
                        "--max-model-len", "128", "--host", "127.0.0.1", "--port", "0"], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    out = p.stdout + p.stderr
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert p.returncode == 1 and "Traceback" not in out and "EngineCore" not in out, out[-3000:]
    assert len(errors) == 1 and errors[0].startswith("error: vLLM 0.33.0 is outside gac's supported range "), out


START_VLLM = """
import json, sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    for model, kwargs in json.loads(sys.argv[1]):
        try:
            llm = LLM(model=model, dtype="float32", max_model_len=128, enforce_eager=True, **kwargs)
            out = llm.generate(["The"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
            print("LOADED", model, "generated", len(out[0].outputs[0].token_ids))
            del llm
        except Exception as e:
            print("REFUSED", model, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
"""


def start_vllm(tmp_path, cases) -> str:
    """Start vllm.LLM directly (as a user does, no gac wrapper) on each (model, kwargs); its report lines."""
    script = tmp_path / "start.py"
    script.write_text(START_VLLM)
    p = subprocess.run([sys.executable, str(script), json.dumps(cases)], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    return p.stdout + p.stderr


def test_vllm_started_directly_refuses_what_it_cannot_serve_right(vllm, serve_dirs, tmp_path):
    """Started directly, at vLLM's defaults (its engine core in a process vLLM spawns, where gac's plugin must load
    too, as in the workers it spawns at TP > 1; serve-check runs its engines in processes of its own): a size the
    ranks cannot split and an output saved under the family's own class are refused by the plugin's config check
    before an engine starts; vLLM's Transformers backend refuses to build a factorized model; nothing loads wrong.
    (That the plugin serves a factorized model from such a spawned engine core, test_openai_server shows.)"""
    old = tmp_path / "old-asvd"
    shutil.copytree(serve_dirs["asvd"], old)
    config = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    resized, asvd = str(serve_dirs["resized"]), str(serve_dirs["asvd"])
    tp2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    out = start_vllm(tmp_path, [[resized, tp2], [str(old), {}],
                                [asvd, {"model_impl": "transformers", "trust_remote_code": True}]])
    assert (f"REFUSED {resized} GacError layer 0 keeps MLP width 157, not divisible by tensor parallel size 2"
            in out)
    assert f"REFUSED {old} GacError {old} is a gac output saved under LlamaForCausalLM" in out
    assert f"REFUSED {asvd}" in out and "vLLM's Transformers backend cannot build" in out
    assert "LOADED" not in out
