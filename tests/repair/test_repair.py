"""repair() on tiny models with irregular ranks and an irregular MLP width: aligned afterwards, same logits,
overhead counted right, and the saved directory loads with gac and with plain transformers."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers

from gac.checkpoint import gac_dir
from gac.compressors import make_compressor
from gac.errors import GacError
from gac.evaluate.latency import LatencyConfig
from gac.models.adapters import adapter_for
from gac.models.dims import inspect_model
from gac.models.groups import linears_of
from gac.models.modeling_gac import LowRankLinear
from gac.repair import repair, repair_dir
from gac.repair.repair import resolve_alignment
from tests.helpers_tiny import TINY, tiny_tokenizer

IRREGULAR_WIDTH = 150


def irregular_model(seed: int = 0):
    """Tiny Llama with MLP width 150, every linear factorized by svd at rank 13 or 27 except one left dense."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**{**TINY, "intermediate_size": IRREGULAR_WIDTH})).eval()
    names = adapter_for(model.config).linear_names(model.config)
    comp = make_compressor("svd")
    analyses = comp.analyze(model, comp.groups(model), {}, progress=False)
    ranks = {a.name: (13, 27)[k % 2] for k, a in enumerate(analyses)}
    ranks[names[4]] = None  # layer 0 gate_proj stays dense
    structure = comp.materialize(model, analyses, ranks)
    return model, structure


def _ids(seed=1, shape=(2, 24)):
    return torch.randint(0, TINY["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits


def _assert_same_outputs(got, expected):
    rel = (got - expected).abs().max() / expected.abs().max()
    assert rel <= 1e-5, rel
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize(("align", "strategy", "expected"), [(8, None, 8), (None, "optimal", 16), (32, None, 32),
                                                             (None, None, 8)])
def test_every_dim_aligned_and_outputs_equal(align, strategy, expected):
    model, _ = irregular_model()
    ids = _ids()
    before = _logits(model, ids)
    result = repair(model, align=align, strategy=strategy)
    assert result.alignment == expected
    _assert_same_outputs(_logits(model, ids), before)
    lowrank = [m for m in model.modules() if isinstance(m, LowRankLinear)]
    assert len(lowrank) == 13 and all(m.rank % expected == 0 and m.a.weight.shape[0] == m.rank for m in lowrank)
    for i in range(TINY["num_hidden_layers"]):
        mlp = model.model.layers[i].mlp
        assert mlp.gate_proj.out_features == mlp.up_proj.out_features == mlp.down_proj.in_features
        assert mlp.gate_proj.out_features % expected == 0
    assert inspect_model(model, (expected,)).share_misaligned[expected] == 0.0
    kinds = {d.kind for d in result.changed}
    assert kinds == {"rank", "mlp_width"}


def _dense_or_lowrank_params(in_f, out_f, rank):
    return in_f * out_f if rank is None else rank * (in_f + out_f)


def test_overhead_figures():
    model, structure = irregular_model()
    total_before = sum(p.numel() for p in model.parameters())
    result = repair(model, align=8)
    # expected, from the shapes alone: every linear of every layer before and after
    names = adapter_for(model.config).linear_names(model.config)
    hidden, kv = TINY["hidden_size"], TINY["hidden_size"] // 2

    def shapes(width, rank_of):
        io_ = {"q_proj": (hidden, hidden), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (hidden, hidden),
               "gate_proj": (hidden, width), "up_proj": (hidden, width), "down_proj": (width, hidden)}
        return sum(_dense_or_lowrank_params(*io_[n.rsplit(".", 1)[1]], rank_of(n)) for n in names)

    before = shapes(150, lambda n: structure["lowrank"].get(n))
    after = shapes(152, lambda n: {13: 16, 27: 32}[structure["lowrank"][n]] if n in structure["lowrank"] else None)
    o = result.overhead
    assert (o["compressible_params_before"], o["compressible_params_after"]) == (before, after)
    assert o["params_added"] == after - before == o["params_after"] - o["params_before"]
    assert o["params_before"] == total_before
    assert o["params_after"] == sum(p.numel() for p in model.parameters())
    assert o["bytes_added"] == 4 * (after - before)  # fp32
    assert o["params_added_pct"] == pytest.approx(100 * (after - before) / total_before)
    changes = {(d.kind, d.before, d.after) for d in result.changed}
    assert changes == {("rank", 13, 16), ("rank", 27, 32), ("mlp_width", 150, 152)}


def test_structure_rebuilds_the_repaired_model():
    model, _ = irregular_model()
    result = repair(model, align=16)
    assert model.config.gac_structure == result.structure
    for name, rank in result.structure["lowrank"].items():
        assert model.get_submodule(name).rank == rank
    for name, (out_f, in_f) in result.structure["linear"].items():
        m = model.get_submodule(name)
        assert (m.out_features, m.in_features) == (out_f, in_f)
    assert len(result.structure["linear"]) == 3 * TINY["num_hidden_layers"]


def test_structure_of_a_model_pruned_in_memory(tmp_path):
    """No config.gac_structure at all: the saved structure is read off the live modules (pruned heads included)."""
    model, _ = irregular_model()
    attn = model.model.layers[1].self_attn  # keep KV group 0 and its 2 query heads (head_dim 16)

    def dense(m):
        return m.b.weight @ m.a.weight if isinstance(m, LowRankLinear) else m.weight  # [out, in]

    with torch.no_grad():
        for proj, rows, cols in (("q_proj", 32, None), ("k_proj", 16, None), ("v_proj", 16, None),
                                 ("o_proj", None, 32)):
            w = dense(getattr(attn, proj))[:rows, :cols]
            new = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            new.weight.copy_(w)
            setattr(attn, proj, new)
    assert getattr(model.config, "gac_structure", None) is None
    ids = _ids()
    before = _logits(model, ids)
    result = repair(model, align=8)
    assert result.structure["attention"] == {"model.layers.1.self_attn": {"num_heads": 2, "num_kv_heads": 1}}
    assert result.structure["linear"]["model.layers.1.self_attn.o_proj"] == [TINY["hidden_size"], 32]
    out = gac_dir.save(model, tiny_tokenizer(), tmp_path / "m", plan={"gac_plan": 1})
    _assert_same_outputs(_logits(gac_dir.load(out).model, ids), before)


def test_width_padded_back_to_the_config_leaves_no_stale_entry(tmp_path):
    """MLP pruned 160 -> 150 in layer 0 (recorded in config.gac_structure), padded to 160 at alignment 32."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**TINY)).eval()
    mlp = model.model.layers[0].mlp
    with torch.no_grad():
        for proj, rows, cols in (("gate_proj", 150, None), ("up_proj", 150, None), ("down_proj", None, 150)):
            w = getattr(mlp, proj).weight[:rows, :cols]
            setattr(mlp, proj, torch.nn.Linear(w.shape[1], w.shape[0], bias=False))
            getattr(mlp, proj).weight.copy_(w)
    recorded = {"linear": {"model.layers.0.mlp.gate_proj": [150, 64], "model.layers.0.mlp.up_proj": [150, 64],
                           "model.layers.0.mlp.down_proj": [64, 150]}, "custom": {"kept": 1}}
    model.config.gac_structure = recorded
    ids = _ids()
    before = _logits(model, ids)
    result = repair(model, align=32)
    assert result.structure == {"custom": {"kept": 1}}  # 160 is the config's own width again; unknown keys kept
    out = gac_dir.save(model, tiny_tokenizer(), tmp_path / "m", plan={"gac_plan": 1})
    _assert_same_outputs(_logits(gac_dir.load(out).model, ids), before)


def test_aligned_model_is_left_alone():
    model, _ = irregular_model()
    repair(model, align=8)
    ids = _ids()
    before = _logits(model, ids)
    again = repair(model, align=8)
    assert again.changed == [] and again.overhead["params_added"] == 0
    assert torch.equal(_logits(model, ids), before)


def test_profile_picks_fastest_aligned_size():
    model, _ = irregular_model()
    ids = _ids()
    before = _logits(model, ids)
    fast = {16: 1.0, 24: 0.5, 32: 0.495, 40: 0.9, 48: 0.2}  # ms per rank
    profile = {"ops": [
        {"op": "lowrank", "m": 512, "shape": {"in": 64, "out": 64}, "dims": list(fast), "ms": list(fast.values())},
        {"op": "gemm_n", "m": 512, "shape": {"k": 64}, "dims": [152, 160, 168], "ms": [2.0, 1.0, 1.5]},
    ]}
    result = repair(model, align=8, profile=profile)
    got = {(d.kind, d.before): d.after for d in result.dims}
    assert got[("rank", 13)] == 24  # window 16..40 (48 is out of it): 32 is fastest, 24 within 2% and smaller
    assert got[("rank", 27)] == 48  # window 32..56: 48 is the fastest measured
    _assert_same_outputs(_logits(model, ids), before)
    assert got[("mlp_width", IRREGULAR_WIDTH)] == 160


def test_resolve_alignment():
    assert resolve_alignment(None, "minimal") == 8 and resolve_alignment(None, "optimal") == 16
    assert resolve_alignment(64, "minimal") == 64
    for bad in (0, -8, 2.5, True):
        with pytest.raises(GacError, match="alignment"):
            resolve_alignment(bad, None)
    with pytest.raises(GacError, match="strategy"):
        resolve_alignment(None, "best")


@pytest.fixture(scope="module")
def repaired_dir(tmp_path_factory):
    """(source gac dir, repaired dir, ids, source logits)."""
    model, structure = irregular_model(seed=5)
    root = tmp_path_factory.mktemp("repair")
    src = gac_dir.save(model, tiny_tokenizer(), root / "src", plan={"gac_plan": 1, "variant": "x"})
    ids = _ids(seed=2, shape=(1, 20))
    expected = _logits(gac_dir.load(src).model, ids)
    lat = LatencyConfig(prefill_tokens=16, warmup=1, prefill_rounds=2)
    out = repair_dir(str(src), str(root / "out"), align=8, measure_latency=True, latency=lat)
    return src, out, ids, expected


def test_repair_dir_writes_plan_and_report(repaired_dir):
    src, out, _, _ = repaired_dir
    report = json.loads((out.out / "repair.json").read_text())
    assert report == json.loads(json.dumps(out.report))
    assert report["alignment"] == 8 and report["changed"] == len(out.result.changed) > 0
    assert report["logits_check"]["max_rel_error"] <= 1e-5 and report["logits_check"]["argmax_identical"]
    lat = report["latency"]
    assert lat["prefill_tokens"] == 16 and lat["prefill_ms_before"] > 0 and lat["prefill_ms_after"] > 0
    plan = gac_dir.read_plan(out.out)
    assert plan["variant"] == "repaired" and plan["alignment"] == 8 and plan["source_model"] == str(src)
    assert plan["source_plan"] == gac_dir.read_plan(src) and plan["source_plan"]["variant"] == "x"
    assert plan["overhead"] == out.result.overhead and all(v % 8 == 0 for v in plan["dims"].values())


def test_repair_dir_loads_with_gac(repaired_dir):
    import gac

    _, out, ids, expected = repaired_dir
    model = gac.load(out.out).model
    assert all(m.rank % 8 == 0 for m in model.modules() if isinstance(m, LowRankLinear))
    _assert_same_outputs(_logits(model, ids), expected)


@pytest.mark.subprocess
def test_repair_dir_loads_with_plain_transformers(repaired_dir, tmp_path):
    _, out, ids, expected = repaired_dir
    ref = tmp_path / "ref.pt"
    torch.save({"ids": ids, "logits": expected}, ref)
    script = textwrap.dedent(f"""
        import sys, torch
        from transformers import AutoModelForCausalLM
        ref = torch.load({str(ref)!r})
        model = AutoModelForCausalLM.from_pretrained({str(out.out)!r}, trust_remote_code=True).eval()
        ranks = [m.rank for m in model.modules() if type(m).__name__ == "LowRankLinear"]
        widths = [layer.mlp.gate_proj.out_features for layer in model.model.layers]
        if not ranks or any(r % 8 for r in ranks + widths):
            sys.exit(f"not aligned: ranks {{ranks}} widths {{widths}}")
        with torch.inference_mode():
            got = model(ref["ids"], use_cache=False).logits
        rel = ((got - ref["logits"]).abs().max() / ref["logits"].abs().max()).item()
        if rel > 1e-5 or not torch.equal(got.argmax(-1), ref["logits"].argmax(-1)):
            sys.exit(f"logits differ: {{rel}}")
        if any(n.split(".")[0] == "gac" for n in sys.modules):
            sys.exit("the saved modeling code imported gac")
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_repair_dir_plain_hf_dir(tiny_model_dir, tmp_path):
    out = repair_dir(str(tiny_model_dir), str(tmp_path / "o"), strategy="minimal", measure_latency=False)
    assert out.result.changed == [] and out.result.overhead["params_added"] == 0  # width 160 is aligned
    assert "latency" not in out.report and gac_dir.read_plan(out.out)["strategy"] == "minimal"
    with pytest.raises(GacError, match="already exists"):
        repair_dir(str(tiny_model_dir), str(tmp_path / "o"), align=8)


def test_repair_pads_palu_group_ranks_exactly():
    """Per-group ranks inside a grouped K/V factorization (palu) are padded; the function is unchanged."""
    import copy

    from gac.calibration.stats import calibrate
    from gac.models.modeling_gac import GroupedLowRankLinear
    from gac.repair.repair import repair
    from tests.helpers_tiny import tiny_model

    model = tiny_model()
    palu = make_compressor("palu")
    names = linears_of(palu.groups(model))
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    stats = calibrate(model, ids, names, xtx=True, progress=False)
    units = palu.analyze(model, palu.groups(model), stats, progress=False, windows=ids)
    irregular = {u.name: 5 + (i % 3) for i, u in enumerate(units)}  # ranks 5, 6, 7: none a multiple of 8
    palu.materialize(model, units, irregular)
    before = copy.deepcopy(model)
    result = repair(model, align=8)
    grouped = [m for m in model.modules() if isinstance(m, GroupedLowRankLinear)]
    assert grouped and all(r % 8 == 0 for m in grouped for r in m.ranks)
    assert result.structure["grouped_lowrank"] == {n: m.ranks for n, m in model.named_modules()
                                                   if isinstance(m, GroupedLowRankLinear)}
    with torch.inference_mode():
        want, got = before(ids).logits, model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_profile_sizes_expert_widths_by_the_experts_op():
    """An MoE layer's expert width is padded to the size the profile's experts op (the whole experts forward at the
    layer's expert count and experts a token) finds fastest, not by a dense GEMM's table."""
    from gac.models.modeling_gac import fit_experts_implementation
    from tests.helpers_tiny import TINY

    config = transformers.Qwen3MoeConfig(**{**TINY, "intermediate_size": 96}, moe_intermediate_size=37,
                                         num_experts=4, num_experts_per_tok=2, head_dim=16)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    fit_experts_implementation(model, (4, 37))  # torch's grouped GEMM refuses rows of 37 floats
    ids = _ids()
    before = _logits(model, ids)
    experts = {"op": "experts", "m": 512, "shape": {"hidden": 64, "experts": 4, "top_k": 2}, "dims": [40, 48, 56],
               "ms": [2.0, 1.0, 1.5]}
    gemm = {"op": "gemm_n", "m": 512, "shape": {"k": 64}, "dims": [40, 48, 56], "ms": [1.0, 2.0, 2.0]}
    result = repair(model, align=8, profile={"ops": [experts, gemm]})
    widths = {d.before: d.after for d in result.dims if d.kind == "mlp_width"}
    assert widths == {37: 48}  # window 40..64: 48 is the experts op's fastest (gemm_n's would be 40)
    _assert_same_outputs(_logits(model, ids), before)
