"""The kernels' shape contract: every linear vLLM builds (per rank, fused shards summed, factor pairs and PaLU's
groups included), each rule refusing on its own, the plan's refusal in one line and --skip-unfit's ignore list, and
the vllm:w4a16 target composing with vllm:tpN. Config-only: no weights quantized, no engine."""

from __future__ import annotations

import pytest

from gac.cli.options import in_flags
from gac.errors import GacError
from gac.quantize.kernels import CHANNEL, RULES, EngineLinear, engine_linears, unfit
from gac.quantize.plan import plan
from gac.quantize.schemes import QuantizeConfig
from tests.helpers_quantize import UNFIT_WIDTH, structures

W4_CPU, W8_CPU, W4_GPU = RULES[("w4a16", "cpu")], RULES[("w4a16", "cuda")], RULES[("w4a16", "cuda")]


def config_of(model):
    from gac.models.structure import structure_of

    model.config.gac_structure = structure_of(model)
    return model.config


@pytest.fixture(scope="module")
def config():
    return config_of(structures())


def by_name(linears):
    return {lin.name: lin for lin in linears}


def test_engine_linears_are_what_vllm_builds(config):
    lins = by_name(engine_linears(config))
    a, b = lins["model.layers.0.self_attn.q_proj.a"], lins["model.layers.0.self_attn.q_proj.b"]
    assert (a.k, a.n, b.k, b.n) == (128, 32, 32, 128)  # the pair: a [32, 128], b [128, 32]
    assert (lins["model.layers.0.self_attn.k_proj"].n, lins["model.layers.0.self_attn.v_proj"].n) == (64, 64)
    qkv = lins["model.layers.1.self_attn.{q_proj,k_proj,v_proj}"]  # dense q/k/v: one fused linear, N summed
    assert (qkv.k, qkv.n) == (128, 128 + 64 + 64)
    gate_up = lins["model.layers.1.mlp.{gate_proj,up_proj}"]
    assert gate_up.n == 2 * 288 and lins["model.layers.1.mlp.down_proj"].k == 288
    assert (lins["model.layers.2.mlp.down_proj.a"].k, lins["model.layers.2.mlp.down_proj.a"].n) == (320, 64)
    palu = [lins[f"model.layers.3.self_attn.k_proj.{p}"] for p in ("a", "b.0", "b.1")]
    assert [(x.k, x.n) for x in palu] == [(128, 64), (32, 32), (32, 32)]  # one a [sum r_g, in], a b per KV head
    # 4 linears a layer (qkv, o, gate_up, down); q/k/v apart where one is factorized (+2 in layers 0 and 3), a pair
    # one more (q, o, down), PaLU's k and v two more each (their a, then a b per group)
    assert len(lins) == 4 * 4 + 2 * 2 + 3 + 2 * 2


def test_tensor_parallel_ranks_see_their_shards(config):
    lins = by_name(engine_linears(config, tp=2))
    assert lins["model.layers.1.mlp.down_proj"].k == 144  # row-parallel: the input split
    assert lins["model.layers.1.mlp.{gate_proj,up_proj}"].n == 288  # column-parallel: the output split
    o_a = lins["model.layers.0.self_attn.o_proj.a"]
    assert (o_a.k, o_a.n, o_a.full_k) == (64, 32, 128)  # a pair's a row-parallel, its rank whole
    assert lins["model.layers.0.self_attn.q_proj.b"].n == 64  # b column-parallel
    # 4 ranks, 2 KV heads: each rank holds 1 query head and one (replicated) KV head of each of k and v
    assert by_name(engine_linears(config, tp=4))["model.layers.1.self_attn.{q_proj,k_proj,v_proj}"].n == 3 * 32


@pytest.mark.parametrize("linear, group, why", [
    (EngineLinear(("x",), 48, 64, 48), 16, "input width K = 48 is not a multiple of 32"),
    (EngineLinear(("x",), 64, 48, 64), 16, "output width N = 48 is not a multiple of 32"),
    (EngineLinear(("x",), 96, 64, 96), 64, "input width K = 96 does not split into groups of 64"),
])
def test_cpu_int4_rule_refuses_each_condition_on_its_own(linear, group, why):
    assert [u.why for u in unfit([linear], W4_CPU, group)] == [f"its {why}"]
    assert unfit([EngineLinear(("x",), 96, 64, 96)], W4_CPU, 32) == []  # the same kernel takes a fitting one


def test_group_rules():
    assert "odd" in W4_CPU.group_problem(7) and W4_CPU.group_problem(16) is None
    assert W4_CPU.group_problem(CHANNEL) is None
    assert "not one MarlinLinearKernel takes" in W4_GPU.group_problem(16) and W4_GPU.group_problem(128) is None
    assert unfit([EngineLinear(("x",), 96, 64, 96)], W4_CPU, CHANNEL) == []  # per channel: no group to divide K


def test_int8_and_marlin_take_any_shape():
    odd = EngineLinear(("x",), 7, 5, 7)
    assert unfit([odd], RULES[("w8a8", "cpu")], CHANNEL) == [] and unfit([odd], RULES[("w8a8", "cuda")], CHANNEL) == []
    assert unfit([odd], W4_GPU, CHANNEL) == []  # Marlin zero-pads its tiles; only the group must divide K


def test_plan_refuses_in_one_line_naming_the_linear_the_rule_and_the_target():
    config = config_of(structures(UNFIT_WIDTH))
    with pytest.raises(GacError) as e:
        plan(config, QuantizeConfig("w4a16"))
    assert in_flags(e.value) == (
        "model.layers.1.mlp.{gate_proj,up_proj}: its output width N = 560 is not a multiple of 32, which vLLM's cpu "
        "w4a16 kernel (CPUWNA16LinearKernel) needs (and 1 more linears): compress with --target vllm:w4a16 so every "
        "linear fits, or pass --skip-unfit to leave such linears unquantized")
    assert str(e.value).endswith("compress with target=vllm:w4a16 so every linear fits, or pass skip_unfit=True to "
                                 "leave such linears unquantized")  # the library's words: its config fields
    with pytest.raises(GacError, match="target=vllm:w4a16,vllm:tp2"):
        plan(config, QuantizeConfig("w4a16", tp=2))
    plan(config, QuantizeConfig("w8a8"))  # int8 takes it as it is


def test_skip_unfit_leaves_every_shard_of_a_refused_linear_unquantized():
    p = plan(config_of(structures(UNFIT_WIDTH)), QuantizeConfig("w4a16", skip_unfit=True))
    assert p.ignore == ["lm_head", "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj",
                        "model.layers.1.mlp.down_proj"]
    report = p.report()
    assert report["unquantized"] == 2 and report["quantized"] == len(p.linears) - 2
    assert {x["name"] for x in report["linears"] if not x["quantized"]} == {
        "model.layers.1.mlp.{gate_proj,up_proj}", "model.layers.1.mlp.down_proj"}


@pytest.mark.parametrize("group, message", [(0, "group 0 is not a group size"), (7, "group 7 is odd")])
def test_bad_groups_are_refused(config, group, message):
    with pytest.raises(GacError, match=message):
        plan(config, QuantizeConfig("w4a16", group=group))


def test_w8a8_takes_no_group():
    with pytest.raises(GacError, match="w8a8 quantizes weights per output channel"):
        QuantizeConfig("w8a8", group=32)


def test_w4a16_target_combines_with_tensor_parallelism():
    from gac.align.targets import get_target

    t = get_target("vllm:w4a16,vllm:tp2")
    assert t.tp == 2 and t.multiple("mlp") == 32 and t.out_multiple("rank") == 32
    assert get_target("vllm:marlin,vllm:w4a16").multiple("rank") == 128  # the least common multiple per side
    with pytest.raises(GacError, match="give one vllm:tpN"):
        get_target("vllm:tp2,vllm:tp4")
    with pytest.raises(GacError, match="unknown target 'vllm:w3'"):
        get_target("vllm:w4a16,vllm:w3")


def test_a_mixture_of_experts_is_refused_in_one_line():
    from tests.helpers_serve import serve_tiny_family

    with pytest.raises(GacError, match="quantizing a mixture of experts is not supported yet"):
        plan(serve_tiny_family("qwen3_moe").config, QuantizeConfig("w8a8"))
