"""gac outputs served by vLLM (CPU build) through gac's plugin: every structure kind loads and computes the model
gac saved (greedy tokens and prompt log-probabilities against transformers), at tensor parallel size 1 and 2; what
vLLM cannot serve is refused in one line before vLLM starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.serve.conftest import run_gac

pytestmark = pytest.mark.vllm
LOGPROB_TOL = 1e-3  # float32: vLLM and transformers differ only by summation order (measured: about 1e-6)


def serve_check(dirs, out, *args):
    p = run_gac("serve-check", *map(str, dirs), "--out", str(out), *args)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def served(vllm, serve_dirs, tmp_path_factory):
    return serve_check(serve_dirs.values(), tmp_path_factory.mktemp("served") / "tp1.json")


@pytest.mark.parametrize("name", ["original", "asvd", "palu", "prune", "asvd-unaligned", "repaired", "resized"])
def test_vllm_serves_the_saved_model(served, serve_dirs, name):
    r = served[str(serve_dirs[name])]
    assert r["positions"] == 8 * 32
    assert r["token_agreement"] >= 0.95 and r["teacher_forced_agreement"] >= 0.95
    assert r["prompt_logprob_max_abs_diff"] <= LOGPROB_TOL


def test_tensor_parallel_2_serves_factorized_and_pruned_models(vllm, serve_dirs, tmp_path):
    dirs = [serve_dirs[n] for n in ("asvd", "palu", "prune")]
    result = serve_check(dirs, tmp_path / "tp2.json", "--tp", "2")
    for d in dirs:
        r = result[str(d)]
        assert r["token_agreement"] >= 0.95 and r["prompt_logprob_max_abs_diff"] <= LOGPROB_TOL, d


def test_refusals_are_one_line_before_vllm_starts(vllm, serve_dirs, tmp_path):
    p = run_gac("serve-check", str(serve_dirs["resized"]), "--tp", "2", timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip() == ("error: layer 0 keeps MLP width 157, not divisible by tensor parallel size 2: "
                                "compress with --target vllm:tp2, or serve with a tensor parallel size that divides it")
    p = run_gac("serve-check", str(tmp_path), timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no config.json" in p.stderr


TRANSFORMERS_BACKEND = """
import sys
from vllm import LLM
if __name__ == "__main__":
    try:
        LLM(model=sys.argv[1], model_impl="transformers", trust_remote_code=True, dtype="float32",
            max_model_len=128, enforce_eager=True)
    except Exception:
        sys.exit(3)
"""


def test_vllm_transformers_backend_refuses_instead_of_loading_wrong(vllm, serve_dirs, tmp_path):
    script = tmp_path / "backend.py"
    script.write_text(TRANSFORMERS_BACKEND)
    p = subprocess.run([sys.executable, str(script), str(serve_dirs["asvd"])], capture_output=True, text=True,
                       timeout=600, env={**__import__("os").environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert p.returncode == 3
    assert "vLLM's Transformers backend cannot build" in p.stdout + p.stderr
