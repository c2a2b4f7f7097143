"""Deployment targets: candidates whose row lengths meet the target's multiple, under the same budget, and the
report of which dims were constrained and why."""

from __future__ import annotations

import json

import pytest

from gac.align.targets import TARGETS, Target, get_target
from gac.errors import GacError
from gac.models.groups import HeadGroup, WidthGroup


class _Unit:
    def __init__(self, group):
        self.group = group
        self.name = group.name


def _mlp(dim=1400, full=1536):
    return WidthGroup("l.mlp", dim, block="l.mlp", producers=("g", "u"), consumers=("d",), hidden=576, full=full)


def _heads(kv_heads=3, heads=9, head_dim=64):  # SmolLM2's geometry: KV groups of 3 query heads
    return HeadGroup("l.attn", kv_heads * head_dim, block="l.attn", q="q", k="k", v="v", o="o", hidden=576,
                     num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, live_heads=heads,
                     live_kv_heads=kv_heads)


@pytest.mark.parametrize("name, multiple", [("llama.cpp:q8_0", 32), ("llama.cpp:q4_0", 32),
                                            ("llama.cpp:q4_k_m", 256)])
def test_mlp_candidates_are_multiples_of_the_block(name, multiple):
    cands = get_target(name).candidates_for(8)(_Unit(_mlp()), 1400, 1)
    assert cands and all(c % multiple == 0 for c in cands)
    assert min(cands) <= 1400 < max(cands)  # one allowed width either side of d*


def test_heads_whose_query_width_cannot_meet_256_stay_whole():
    t = TARGETS["llama.cpp:q4_k_m"]
    g = _heads()
    assert g.row_lengths(128) == [384]  # 2 KV groups x 3 query heads x 64
    assert t.allowed_dims(g) == [192]  # the whole block only: 576 is the model's own width
    assert t.candidates_for(8)(_Unit(g), 128, 1) == [192]
    r = t.report([_Unit(g)], {"l.attn": 192})
    assert r["groups"]["l.attn"]["met"] and "unattainable" in r["groups"]["l.attn"]
    assert TARGETS["llama.cpp:q8_0"].allows(g, 128)  # 384 = 12 x 32


def test_report_counts_what_meets_the_target():
    t = TARGETS["llama.cpp:q8_0"]
    units = [_Unit(_mlp()), _Unit(_heads())]
    r = t.report(units, {"l.mlp": 1401, "l.attn": None})  # heads left whole: not constrained
    assert r["constrained"] == 1 and r["met"] == 0 and r["groups"]["l.mlp"]["row_lengths"] == [1401]
    assert t.report(units, {"l.mlp": 1408, "l.attn": None})["met"] == 1


def test_unknown_target_and_target_with_profile_are_one_line():
    from gac.api import CompressConfig

    with pytest.raises(GacError, match="unknown target"):
        CompressConfig(target="tensorrt:fp8")
    with pytest.raises(GacError, match="pass one of them"):
        CompressConfig(target="llama.cpp:q8_0", profile="p.json")


@pytest.mark.slow
def test_compress_with_a_target_meets_it_under_the_same_budget(tiny_model_dir, tmp_path):
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig

    out = tmp_path / "t"
    result = compress(CompressConfig(model=str(tiny_model_dir), compressor="prune", ratio=0.25, out=str(out),
                                     target="llama.cpp:q8_0", evaluate=False, progress=False,
                                     compressor_options={"layers": "all"},
                                     text=TextConfig(seq_len=32, calib_windows=2, eval_windows=1)))
    r = json.loads((out / "report.json").read_text())
    assert r["target"]["name"] == "llama.cpp:q8_0" and r["target"]["constrained"] >= 1
    assert r["target"]["met"] == r["target"]["constrained"]
    assert all(all(x % 32 == 0 for x in g["row_lengths"]) for g in r["target"]["groups"].values())
    assert r["variants"]["gac"]["params"] <= r["budget_params"]
    assert "Target llama.cpp:q8_0" in (out / "report.md").read_text()
    assert json.loads((out / "gac_plan.json").read_text())["target"] == "llama.cpp:q8_0"
    assert result.report.dims["gac"].keys() == result.report.dims["unaligned"].keys()


def test_tensor_parallel_target_asks_each_shard_for_the_multiple():
    t = TARGETS["vllm:tp2"]
    mlp = _mlp()
    assert mlp.shard_row_lengths(1400, 2) == [700] and mlp.shard_row_lengths(1401, 2) is None
    assert t.allows(mlp, 1408) and not t.allows(mlp, 1400)  # 704 = 88 x 8; 700 is not a multiple of 8
    assert t.allows(mlp, 1536)  # the model's own width
    cands = t.candidates_for(8)(_Unit(mlp), 1400, 1)
    assert cands and all(c % 16 == 0 for c in cands)
    assert not TARGETS["vllm:tp4"].allows(mlp, 1400) and TARGETS["vllm:tp4"].allows(mlp, 1408)


def test_tensor_parallel_target_keeps_whole_heads_on_every_rank():
    g = _heads(kv_heads=4, heads=8, head_dim=64)  # group mode: dim = kept KV width
    t2, t4 = TARGETS["vllm:tp2"], TARGETS["vllm:tp4"]
    assert t2.allows(g, 2 * 64) and g.shard_row_lengths(2 * 64, 2) == [128]  # 2 KV, 4 query heads: 2 per rank
    assert not t2.allows(g, 3 * 64)  # 3 KV heads do not split over 2 ranks
    assert t4.allows(g, 2 * 64) and g.shard_row_lengths(2 * 64, 4) == [64]  # 4 query heads, 2 KV replicated
    assert not t4.allows(g, 1 * 64)  # 2 query heads over 4 ranks
    assert TARGETS["llama.cpp:q8_0"].allows(g, 3 * 64)  # tp 1: the old rule, unchanged
    smol = _heads()  # SmolLM2: 9 query heads in 3 KV groups; tp 2 cannot split them, not even the whole block
    assert t2.allowed_dims(smol) == [128] and not t2.allows(smol, smol.full_dim)  # 2 KV groups: 6 and 2 heads


def test_marlin_constrains_input_and_output_widths():
    """vllm:marlin asks K % 128 of every input width and N % 64 of every output width a dim sets: an MLP width of
    1472 feeds gate and up at N = 1472 (23 x 64) but the down projection at K = 1472 (not 128's), and a KV group
    of head_dim 32 feeds o at K = 4 x 32 per group (always 128's) but k and v at N = 32 per group."""
    t = TARGETS["vllm:marlin"]
    mlp = _mlp(full=2048)
    assert mlp.row_lengths(1472) == mlp.out_lengths(1472) == [1472]
    assert not t.allows(mlp, 1472) and t.allows(mlp, 1408)  # the input side refuses; 11 x 128 meets both
    g = _heads(kv_heads=4, heads=16, head_dim=32)  # group mode: dim = kept KV width, 4 query heads per KV head
    assert g.row_lengths(3 * 32) == [384] and g.out_lengths(3 * 32) == [384, 96]  # o's K; q's and k/v's N
    assert not t.allows(g, 3 * 32) and t.allows(g, 2 * 32)  # only the output side refuses 3 KV heads
    assert t.allowed_dims(g) == [64, 128]
    inputs_only = Target("k128", dict(t.multiples))  # the same row without its output rule allows them
    assert inputs_only.allows(g, 3 * 32) and inputs_only.allowed_dims(g) == [32, 64, 96, 128]
    cands = t.candidates_for(8)(_Unit(g), 96, 1)
    assert cands == [64, 128]
    r = t.report([_Unit(g), _Unit(mlp)], {"l.attn": 96, "l.mlp": 1408})
    assert r["out_multiples"]["heads"] == 64 and r["constrained"] == 2 and r["met"] == 1
    assert r["groups"]["l.attn"]["out_lengths"] == [384, 96] and not r["groups"]["l.attn"]["met"]


def test_output_widths_per_tensor_parallel_rank():
    mlp = _mlp()
    assert mlp.shard_out_lengths(1408, 2) == [704] and mlp.shard_out_lengths(1401, 2) is None
    g = _heads(kv_heads=4, heads=8, head_dim=64)
    assert g.shard_out_lengths(2 * 64, 2) == [128, 64]  # 2 query heads and 1 KV head per rank
    assert g.shard_out_lengths(2 * 64, 4) == [64, 64]  # 1 query head; 2 KV heads over 4 ranks: one replicated each
    assert g.shard_out_lengths(3 * 64, 2) is None  # 3 KV heads do not split over 2 ranks
    uniform = HeadGroup("l.attn", 4 * 64, block="l.attn", q="q", k="k", v="v", o="o", hidden=576, num_heads=8,
                        num_kv_heads=4, head_dim=64, mode="uniform", live_heads=8, live_kv_heads=4)
    assert uniform.out_lengths(4 * 64) == [256]  # k and v stay whole in uniform mode: not this dim's to set


def test_every_kind_is_in_every_all_kind_row():
    from gac.models.groups import KINDS

    engines = [t for name, t in TARGETS.items() if name != "deci"]  # deci: a format's rule on its MLP width alone
    assert all(set(t.multiples) == set(KINDS) for t in engines)
    assert set(TARGETS["vllm:marlin"].out_multiples) == set(KINDS)


def test_deci_asks_mlp_widths_in_multiples_of_256_and_keeps_heads_whole():
    t = TARGETS["deci"]
    mlp = _mlp()  # SmolLM2's MLP: 1536
    assert t.allowed_dims(mlp) == list(range(256, 1537, 256))
    assert t.candidates_for(8)(_Unit(mlp), 1400, 1) == [1280, 1536]  # K (down) and N (gate, up) both
    assert not t.allows(mlp, 1408) and mlp.out_lengths(1280) == mlp.row_lengths(1280) == [1280]
    g = _heads()
    assert t.allowed_dims(g) == [g.full_dim] and not t.allows(g, 128)  # no reduced head count: query heads global
    assert t.candidates_for(8)(_Unit(g), 128, 1) == [g.full_dim]
    r = t.report([_Unit(mlp), _Unit(g)], {"l.mlp": 1280, "l.attn": 192})
    assert r["constrained"] == r["met"] == 2 and r["groups"]["l.attn"]["whole"]
    assert "unattainable" not in r["groups"]["l.attn"] and not t.low_rank


def test_deci_composes_with_tensor_parallelism_and_int4():
    t = get_target("deci,vllm:tp2,vllm:w4a16")
    assert t.tp == 2 and t.whole == {"heads"} and not t.low_rank
    assert t.multiples["mlp"] == t.out_multiples["mlp"] == 256  # lcm(256, 8, 32), of each rank's half
    mlp = _mlp(full=2048)
    assert t.allowed_dims(mlp) == [512, 1024, 1536, 2048]  # halves of 256's
    g = _heads(kv_heads=4, heads=8, head_dim=64)
    assert t.allowed_dims(g) == [g.full_dim] and t.allows(g, g.full_dim)  # whole, and split evenly over 2 ranks
    smol = _heads()  # 9 query heads: no rank split; deci keeps them whole all the same (the report says unmet)
    assert t.candidates_for(8)(_Unit(smol), 128, 1) == [smol.full_dim] and not t.allows(smol, smol.full_dim)
    assert TARGETS["vllm:tp2"].low_rank and get_target("vllm:tp2,vllm:w4a16").whole == frozenset()


@pytest.mark.parametrize("compressor", ["asvd", "svd_llm", "svd", "palu", "auto"])
def test_deci_refuses_low_rank_compressors_in_one_line(compressor, tmp_path):
    from gac.api import CompressConfig
    from gac.errors import ConfigError
    from tests.helpers import assert_one_error_line, gac_cli

    with pytest.raises(ConfigError, match="hold no ranks"):
        CompressConfig(compressor=compressor, target="deci")
    with pytest.raises(ConfigError, match="hold no ranks"):
        CompressConfig(compressor=compressor, target="vllm:tp2,deci")
    CompressConfig(compressor="prune", target="deci")
    p = gac_cli("compress", "--compressor", compressor, "--target", "deci", "--out", str(tmp_path / "o"))
    line = assert_one_error_line(p, "--target deci hold no ranks")
    assert "--compressor prune" in line and not (tmp_path / "o").exists()
