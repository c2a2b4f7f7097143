"""The DeciLM configuration and modeling code gac writes into a DeciLM directory: blocks as objects with attributes
(as the engines ask them) and back to the same dicts, Llama's layers built at each layer's sizes, and imports of
torch and transformers only."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from gac.models.configuration_decilm import BlockConfig, DeciLMConfig, ffn_mult_width
from gac.models.modeling_decilm import DeciLMForCausalLM, DeciLMModel
from tests.helpers_tiny import TINY

BLOCKS = [
    {"attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": 2},
     "ffn": {"no_op": False, "replace_with_linear": False, "intermediate_size": 100}},
    {"attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": 4},
     "ffn": {"no_op": False, "replace_with_linear": False, "ffn_mult": 6.0}},  # 2 * 6 * 64 / 3 = 256
]


def _config(blocks=BLOCKS) -> DeciLMConfig:
    return DeciLMConfig(**TINY, block_configs=copy.deepcopy(blocks))


def test_blocks_are_objects_with_the_files_keys_and_serialize_back():
    config = _config()
    first, second = config.block_configs
    assert isinstance(first, BlockConfig) and first.attention.n_heads_in_group == 2 and not first.ffn.no_op
    assert not hasattr(first.ffn, "ffn_mult") and first.ffn.intermediate_size == 100  # vLLM's hasattr test
    assert second.ffn.ffn_mult == 6.0 and not hasattr(second.ffn, "intermediate_size")
    assert (first.mlp_width(64), second.mlp_width(64)) == (100, ffn_mult_width(6.0, 64)) == (100, 256)
    assert (first.kv_heads(4), second.kv_heads(4)) == (2, 1)
    assert config.to_dict()["block_configs"] == BLOCKS
    again = DeciLMConfig.from_dict(config.to_dict())
    assert again.block_configs == config.block_configs and again.model_type == "nemotron-nas"


def test_each_layer_is_llamas_at_its_width_and_kv_heads():
    torch.manual_seed(0)
    model = DeciLMForCausalLM(_config()).eval()
    assert isinstance(model.model, DeciLMModel) and len(model.model.layers) == 2
    shapes = [(layer.mlp.down_proj.in_features, layer.self_attn.k_proj.out_features) for layer in model.model.layers]
    assert shapes == [(100, 2 * 16), (256, 1 * 16)]
    assert all(layer.self_attn.q_proj.out_features == 64 for layer in model.model.layers)  # query heads global
    assert model.config.intermediate_size == 160 and model.config.num_key_value_heads == 2  # restored after build
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    ids = torch.arange(12)[None]
    with torch.inference_mode():
        full = model(ids).logits  # [1, 12, V]
        out = model.generate(ids[:, :6], max_new_tokens=6, do_sample=False)
        assert torch.equal(out[0, :6], ids[0, :6])
    assert full.shape == (1, 12, TINY["vocab_size"])
    model.set_attn_implementation("eager")  # the layers share the model's config: the change reaches them
    assert all(layer.self_attn.config._attn_implementation == "eager" for layer in model.model.layers)
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, full, atol=1e-5, rtol=1e-5)


def test_blocks_it_cannot_build_are_refused():
    bad = copy.deepcopy(BLOCKS)
    bad[1]["ffn"]["no_op"] = True
    with pytest.raises(ValueError, match="block"):
        DeciLMForCausalLM(_config(bad))
    with pytest.raises(ValueError, match="block_configs has 1 entries for 2 layers"):
        _config(BLOCKS[:1])


@pytest.mark.parametrize("name", ["configuration_decilm.py", "modeling_decilm.py"])
def test_the_code_imports_torch_and_transformers_only(name):
    from gac.models import modeling_decilm

    tree = ast.parse((Path(modeling_decilm.__file__).parent / name).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            roots.add(node.module.split(".")[0])
    assert roots <= {"torch", "transformers", "typing", "contextlib", "collections"}, roots
