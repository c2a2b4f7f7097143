"""Families beyond Llama's layout served by vLLM (CPU build) through gac's plugin, each with vLLM's own class for it
and every layer at its saved sizes: Gemma 3 (per-head q/k norms, sliding-window layers) with factorized
projections; Phi-3's fused qkv_proj and gate_up_proj factorized whole, which vLLM's fused linears split by head and
by half; Qwen3-MoE (a quarter of its experts dropped) and Mixtral with one expert width a layer in vLLM's fused MoE. Each computes the model gac saved
(greedy tokens and prompt log-probabilities against transformers), at tensor parallel size 2."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from tests.helpers_serve import LOGPROB_TOL

pytestmark = pytest.mark.vllm


def saved_structure(d) -> dict:
    return json.loads((d / "config.json").read_text())["gac_structure"]


def test_the_fixtures_hold_the_structures_served(family_dirs):
    assert any(".self_attn." in n for n in saved_structure(family_dirs["gemma3_text-asvd"])["lowrank"])
    phi3 = saved_structure(family_dirs["phi3-fused"])
    assert set(phi3["lowrank"]) == {"model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"}
    assert phi3["linear"]["model.layers.1.mlp.gate_up_proj"] == [400, 128]
    assert AutoConfig.from_pretrained(family_dirs["qwen3_moe-prune"]).num_experts == 3  # of 4
    for moe in ("qwen3_moe-prune", "mixtral-prune"):
        downs = {n: s for n, s in saved_structure(family_dirs[moe])["parameter"].items() if n.endswith("down_proj")}
        assert downs and all(s[2] < 96 and s[2] % 8 == 0 for s in downs.values())  # cut, aligned, one a layer


def test_vllm_serves_each_family_as_saved_at_tensor_parallel_2(served_tp2, family_dirs):
    """One vLLM engine per family, at TP=2 (the sharding included; TP=1 builds the same layers unsharded, which
    tests/serve/test_vllm.py serves for Llama)."""
    for d in family_dirs.values():
        r = served_tp2[str(d)]
        assert r["positions"] == 8 * 32
        assert r["token_agreement"] >= 0.95 and r["teacher_forced_agreement"] >= 0.95, d
        assert r["prompt_logprob_max_abs_diff"] <= LOGPROB_TOL, d
