"""A DeciLM export (`gac export --format deci`) served by a stock vLLM: gac's plugin off and gac not importable in
the serving process, vLLM's own DeciLMForCausalLM builds each layer's width and KV heads from block_configs (an
ffn_mult in one layer, intermediate_size in the others) and computes what transformers computes from the same
directory with gac's modeling code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.helpers import gac_cli
from tests.helpers_serve import LOGPROB_TOL, serve_tiny_model
from tests.helpers_tiny import tiny_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.subprocess]

SERVE = """
import json, os, sys
sys.modules["gac"] = None  # `import gac` fails: the stock engine alone
os.environ["VLLM_PLUGINS"] = ""
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
if __name__ == "__main__":
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams

    d, prompt = sys.argv[1], json.loads(sys.argv[2])
    llm = LLM(model=d, trust_remote_code=True, dtype="float32", max_model_len=128, enforce_eager=True)
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
    served = [p[token].logprob for p, token in zip(out[0].prompt_logprobs[1:], prompt[1:])]
    model = AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True).eval()
    with torch.inference_mode():
        logp = model(torch.tensor([prompt])).logits[0].log_softmax(-1)  # [S, V]
    reference = [logp[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]
    print("RESULT", json.dumps({"served": served, "reference": reference,
                                "architectures": llm.llm_engine.model_config.architectures}))
"""


def test_stock_vllm_serves_a_deci_export_as_transformers_computes_it(vllm, tmp_path):
    from gac.checkpoint.gac_dir import plan_record, save
    from gac.models import surgery
    from gac.models.groups import groups_of

    model = serve_tiny_model()  # head_dim 32 (vLLM's CPU attention); MLP 320, 4 query heads in 2 KV groups
    heads = groups_of(model, "heads", layers=[1])[0]
    cuts = [(heads, surgery.KeepHeads(torch.arange(4), torch.tensor([1])))]  # one KV head, every query head
    cuts += [(g, surgery.Keep(torch.arange(w))) for g, w in zip(groups_of(model, "mlp", layers=[0, 2, 3]),
                                                                  (157, 256, 200))]
    surgery.apply(model, cuts)
    pruned = save(model, tiny_tokenizer(), tmp_path / "pruned",
                  plan=plan_record(variant="unaligned", source_model="tiny", alignment=None, dims={}))
    out = tmp_path / "deci"
    assert gac_cli("export", pruned, "--format", "deci", "--out", out, "--quiet").returncode == 0
    blocks = json.loads((out / "config.json").read_text())["block_configs"]
    assert "ffn_mult" in blocks[2]["ffn"] and blocks[1]["attention"]["n_heads_in_group"] == 4
    prompt = torch.randint(1, 320, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules")}
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent(SERVE))
    proc = subprocess.run([sys.executable, str(script), str(out), json.dumps(prompt)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert result["architectures"] == ["DeciLMForCausalLM"]
    diff = max(abs(a - b) for a, b in zip(result["served"], result["reference"]))
    assert len(result["served"]) == len(prompt) - 1 and diff <= LOGPROB_TOL, diff
