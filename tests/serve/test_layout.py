"""What an engine must build, read off a saved config (gac.serve.layout), and the tensor-parallel rules: no vLLM."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import AutoConfig

from gac.errors import GacError
from gac.serve.layout import check_tensor_parallel, layer_layouts


def layouts(d):
    return layer_layouts(AutoConfig.from_pretrained(d))


@pytest.mark.subprocess
def test_original_is_every_layer_at_full_size(serve_dirs):
    for lay in layouts(serve_dirs["original"]):
        assert (lay.num_heads, lay.num_kv_heads, lay.head_dim, lay.width) == (4, 2, 32, 320)
        assert all(p.dense for p in lay.projections)
        assert [(p.out_features, p.in_features) for p in lay.projections] == [
            (128, 128), (64, 128), (64, 128), (128, 128), (320, 128), (320, 128), (128, 320)]


@pytest.mark.subprocess
def test_resized_layers_keep_their_own_heads_and_widths(serve_dirs):
    lays = layouts(serve_dirs["resized"])
    assert [(x.num_heads, x.num_kv_heads) for x in lays] == [(4, 2), (2, 1), (2, 2), (4, 2)]
    assert [x.width for x in lays] == [157, 320, 320, 200]
    assert lays[1].o.in_features == 2 * 32 and lays[1].qkv[1].out_features == 32
    assert lays[0].consumers[0].in_features == 157


@pytest.mark.subprocess
@pytest.mark.parametrize("name, key", [("asvd", "lowrank"), ("palu", "grouped_lowrank")])
def test_factorized_projections_carry_their_ranks(serve_dirs, name, key):
    config = AutoConfig.from_pretrained(serve_dirs[name])
    saved = config.gac_structure[key]
    assert saved
    read = {f"model.layers.{lay.index}": lay for lay in layouts(serve_dirs[name])}
    for module, rank in saved.items():
        block, _, proj = module.rpartition(".")
        lay = read[block.rpartition(".")[0]]
        (p,) = [p for p in lay.projections if p.name == proj]
        assert (p.ranks == tuple(rank)) if key == "grouped_lowrank" else (p.rank == rank)


@pytest.mark.subprocess
def test_tensor_parallel_refusals_name_the_layer_and_the_fix(serve_dirs):
    check_tensor_parallel(layouts(serve_dirs["original"]), 2)
    check_tensor_parallel(layouts(serve_dirs["original"]), 4)  # 2 dense KV heads over 4 ranks: replicated
    with pytest.raises(GacError, match=r"layer 0 keeps MLP width 157, not divisible by tensor parallel size 2: "
                                       r"compress with --target vllm:tp2"):
        check_tensor_parallel(layouts(serve_dirs["resized"]), 2)
    with pytest.raises(GacError, match="layer 0 keeps 4 query heads and 2 KV heads"):
        check_tensor_parallel(layouts(serve_dirs["original"]), 3)
    factored_kv = [lay for lay in layouts(serve_dirs["palu"])]
    with pytest.raises(GacError, match="2 KV heads"):  # factorized K/V cannot be replicated over 4 ranks
        check_tensor_parallel(factored_kv, 4)
    with pytest.raises(GacError, match="not valid"):
        check_tensor_parallel(factored_kv, 0)


@pytest.mark.subprocess
def test_a_vllm_tp2_target_gives_a_model_two_ranks_split(serve_dirs, tmp_path):
    """prune under --target vllm:tp2, same budget: every width splits into two shards of a multiple of 8, every
    head count splits, so the saved model passes the plan's check at TP=2 (the unaligned prune need not)."""
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig

    out = tmp_path / "tp2"
    compress(CompressConfig(model=str(serve_dirs["original"]), compressor="prune", ratio=0.3, out=str(out),
                            target="vllm:tp2", evaluate=False, progress=False, compressor_options={"layers": "all"},
                            text=TextConfig(seq_len=32, calib_windows=2, eval_windows=1)))
    lays = layouts(out)
    assert any(x.width < 320 for x in lays)
    assert all(x.width % 16 == 0 and x.num_heads % 2 == 0 for x in lays)
    check_tensor_parallel(lays, 2)


@pytest.mark.slow
def test_fused_projections_and_expert_widths_are_read_per_layer(family_dirs):
    """Phi-3: one fused qkv linear (factorized whole in layer 0) and a gate_up twice the MLP width; Qwen3-MoE: the
    experts' saved width per sparse layer, a dense width for its mlp_only layer; TP needs the expert width split."""
    phi3 = layouts(family_dirs["phi3-fused"])
    assert [len(x.qkv) for x in phi3] == [1] * 4 and phi3[0].qkv[0].rank == 32 and phi3[1].qkv[0].dense
    assert [x.width for x in phi3] == [320, 200, 320, 320] and phi3[0].producers[0].rank == 32
    moe = layouts(family_dirs["qwen3_moe-prune"])
    config = AutoConfig.from_pretrained(family_dirs["qwen3_moe-prune"])
    saved = {n.split(".")[2]: s[2] for n, s in config.gac_structure["parameter"].items() if n.endswith("down_proj")}
    assert [x.expert_width for x in moe[:3]] == [saved.get(str(i), 96) for i in range(3)]
    assert moe[3].expert_width is None and moe[3].width == 320 and not moe[0].producers
    assert [x.mlp_width for x in moe] == [x.expert_width or x.width for x in moe]
    check_tensor_parallel(moe, 2)
    with pytest.raises(GacError, match=r"layer 0 keeps .*expert width \d+, not divisible by tensor parallel size 3"):
        check_tensor_parallel([replace(moe[0], num_heads=3, num_kv_heads=3, expert_width=40)], 3)
