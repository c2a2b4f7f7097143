"""DeciLM directories' pure parts: the ffn_mult of a width as every engine reads it back, each layer's block, the
gac structure rebuilt from the blocks, and what a live model DeciLM cannot hold."""

from __future__ import annotations

import json

import pytest
import torch

from gac.checkpoint import deci
from gac.errors import GacError
from gac.models import surgery
from gac.models.groups import groups_of
from gac.models.structure import structure_of
from tests.helpers_deci import ENGINE_RULES, sglang_width

# hidden sizes of real Llama-layout models (SmolLM2 135M/360M/1.7B, Llama 3 1B/3B/8B/70B, Mistral 7B, Nemotron 51B)
HIDDEN = (576, 960, 2048, 3072, 4096, 8192, 5120, 7168, 64)


@pytest.mark.parametrize("hidden", HIDDEN)
def test_every_multiple_of_256_gets_an_ffn_mult_the_engines_read_back_exactly(hidden):
    for width in range(256, 8 * max(hidden, 256) + 1, 256):
        mult = deci.ffn_mult_for(width, hidden)
        assert mult is not None, (width, hidden)
        written = json.loads(json.dumps({"ffn_mult": mult}))["ffn_mult"]  # as config.json holds it
        assert written == mult
        for engine, rule in ENGINE_RULES.items():
            assert rule(written, hidden) == width, (engine, width, hidden, written)


def test_widths_off_256_get_no_ffn_mult_and_are_written_as_intermediate_size():
    assert deci.ffn_mult_for(1400, 576) is None and deci.ffn_mult_for(1280 + 8, 576) is None
    block = deci.block_config(deci.DeciLayer(1400, 1), hidden=576, heads=9)
    assert block == {"attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": 9},
                     "ffn": {"no_op": False, "replace_with_linear": False, "intermediate_size": 1400}}
    block = deci.block_config(deci.DeciLayer(1280, 3), hidden=576, heads=9)
    assert set(block["ffn"]) == {"no_op", "replace_with_linear", "ffn_mult"}  # ffn_mult alone: no intermediate_size
    assert sglang_width(block["ffn"]["ffn_mult"], 576) == 1280 and block["attention"]["n_heads_in_group"] == 3


def test_a_ratio_that_lands_under_the_width_still_rounds_back_to_it():
    """3w / 2h is not exact in floating point for most widths: int() may land one under the width, and the rounding
    up to 256 takes it back (SmolLM2: 1280 / 576 gives 3.3333333333333335, and int(1279.9999999999998) = 1279)."""
    mult = deci.ffn_mult_for(1280, 576)
    assert int(2 * mult * 576 / 3) in (1279, 1280) and sglang_width(mult, 576) == 1280


def _cut(model):
    """Layer 0: MLP cut to 100 channels; layer 1: one of two KV heads kept (with all four query heads)."""
    heads = groups_of(model, "heads", layers=[1])[0]
    surgery.apply(model, [(groups_of(model, "mlp", layers=[0])[0], surgery.Keep(torch.arange(100))),
                          (heads, surgery.KeepHeads(torch.arange(4), torch.tensor([1])))])
    return model


def test_blocks_rebuild_the_structure_gac_reads_off_the_live_model(tiny):
    from gac.models.configuration_decilm import BlockConfig

    model = _cut(tiny)
    layers = deci.layers_of(model)
    assert layers == [deci.DeciLayer(100, 2), deci.DeciLayer(160, 1)]
    config = deci.deci_config(model.config, layers)
    assert config.architectures == ["DeciLMForCausalLM"] and config.model_type == "nemotron-nas"
    assert config.auto_map == deci.AUTO_MAP and "gac_structure" not in config.to_dict()
    blocks = [BlockConfig(**b) for b in config.to_dict()["block_configs"]]
    assert deci.structure_of_blocks(model.config, blocks) == structure_of(model)


def test_a_layer_with_fewer_query_heads_is_refused(tiny):
    groups_of(tiny, "heads", layers=[1])[0].cut(tiny, surgery.KeepHeads(torch.tensor([2, 3]), torch.tensor([1])))
    with pytest.raises(GacError, match="layer 1 keeps 2 of 4 query heads"):
        deci.layers_of(tiny)


def test_a_low_rank_model_is_refused(tiny):
    w = tiny.model.layers[0].mlp.down_proj.weight.detach()
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    surgery.factorize(tiny, "model.layers.0.mlp.down_proj", vh[:8], u[:, :8] * s[:8])
    with pytest.raises(GacError, match="low-rank"):
        deci.layers_of(tiny)
