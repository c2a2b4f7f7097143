"""What the serving tests share: serve-sized tiny models (head_dim 32, which vLLM's CPU attention runs) of Llama and
the families beyond Llama's layout the plugin serves, the tolerance on vLLM's log-probabilities, and `gac
serve-check` run on a set of directories."""

from __future__ import annotations

import json

import torch

from tests.helpers import run_gac

SERVE_TINY = dict(hidden_size=128, intermediate_size=320, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=320, max_position_embeddings=512, tie_word_embeddings=True)
LOGPROB_TOL = 1e-3  # float32: vLLM and transformers differ only by summation order (measured: about 1e-6)
TP2_LLAMA = ("asvd", "palu", "prune")  # of serve_dirs, served at TP=2 beside every family


def serve_tiny_model():
    import transformers

    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SERVE_TINY)).eval()


# Serve-sized tiny models (head_dim 32) of the families beyond Llama's layout that the plugin serves
FAMILY_CONFIGS = {
    "gemma3_text": dict(intermediate_size=320, head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
                        layer_types=["sliding_attention", "full_attention"] * 2),
    "phi3": dict(intermediate_size=320, pad_token_id=0),
    "qwen3_moe": dict(intermediate_size=320, head_dim=32, moe_intermediate_size=96, num_experts=4,
                      num_experts_per_tok=2, mlp_only_layers=[3]),
    "mixtral": dict(intermediate_size=96, num_local_experts=4, num_experts_per_tok=2),
}


def serve_tiny_family(model_type: str):
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **{**SERVE_TINY, **FAMILY_CONFIGS[model_type]})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def served_set(dirs: dict) -> list:
    """The directories serve-check serves: all but those vLLM cannot run here (they are refused apart)."""
    return [d for name, d in dirs.items() if not name.endswith("-refused")]


def serve_check(dirs, out, *args):
    """`gac serve-check DIRS --out OUT ARGS`: its results, {dir: figures}."""
    p = run_gac("serve-check", *map(str, dirs), "--out", str(out), *args, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())
