"""Mixture-of-experts families (Qwen3-MoE, Mixtral, OLMoE: transformers 5's fused expert weights gate_up [E, 2I, H]
and down [E, H, I]): prune cuts one expert width per layer, each expert its own channels, chosen by the knapsack under
the budget; the saved model keeps the per-expert checkpoint layout and round-trips through gac.load and transformers.
gpt-oss (transposed, interleaved, biased experts): test_gpt_oss_family.py."""

import json
import math

import pytest
import torch

from gac.api import compress
from tests.helpers_compress import fast_config
from tests.helpers_moe import (
    FAMILIES,
    assert_gguf_export_refused,
    assert_unaligned_output_repairs,
    expert_widths,
    pruned_experts,
    tiny_moe,
)
from tests.helpers_tiny import save_tiny


@pytest.fixture(scope="module", params=FAMILIES)
def moe_dir(request, tmp_path_factory):
    """An HF directory of a tiny random MoE model, saved as transformers saves it (per-expert tensors)."""
    return save_tiny(tiny_moe(request.param), tmp_path_factory.mktemp(request.param))


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits


@pytest.mark.slow
@pytest.mark.parametrize("ratio", [0.15, 0.30])
def test_moe_prune_aligned_within_budget_and_round_trips(moe_dir, tmp_path, monkeypatch, ratio):
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import load

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    out = tmp_path / "out"
    result, experts = pruned_experts(moe_dir, out, ratio)
    saved = result.models["gac"]
    widths = expert_widths(saved)
    assert widths == [experts[n] or g for n, g in zip(sorted(experts), widths)]
    for name, w in zip(sorted(experts), widths):  # one width for every expert of a layer: [E, 2w, H] and [E, H, w]
        block = saved.get_submodule(name)
        assert {tuple(p.shape[1:]) for p in block.parameters()} == {(2 * w, 64), (64, w)}
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == f"gac_{saved.config.model_type.removeprefix('gac_')}"
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    want = _logits(saved, ids)
    for model in (load(out).model, AutoModelForCausalLM.from_pretrained(out).eval(),
                  AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()):
        assert torch.equal(_logits(model, ids), want)
        assert expert_widths(model) == widths


def test_moe_saved_output_keeps_the_per_expert_checkpoint_layout(moe_dir, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "out"
    compress(fast_config(moe_dir, compressor="prune", ratio=0.3, out=str(out), evaluate=False,
                         compressor_options={"layers": "all"}))
    with safe_open(out / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in keys)
    assert any(".experts.0." in k for k in keys)  # each expert's own tensors, as the family's engines read them


@pytest.mark.slow
def test_moe_layerwise_equals_the_whole_model_pipeline(moe_dir, tmp_path):
    from gac.checkpoint.gac_dir import load

    runs = {}
    for layerwise in (False, True):
        out = tmp_path / f"out-{layerwise}"
        pipeline = "layerwise" if layerwise else "whole"
        result = compress(fast_config(moe_dir, compressor="prune", ratio=0.3, out=str(out), evaluate=layerwise,
                                      pipeline=pipeline, compressor_options={"layers": "all"}))
        runs[layerwise] = (result.report.dims["gac"], load(out).model)
        # evaluated layer by layer: the unaligned variant's layers (copies holding their own config) run eagerly
        assert not layerwise or result.report.variants["unaligned"].ppl > 1
    assert runs[True][0] == runs[False][0]
    ids = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(_logits(runs[True][1], ids), _logits(runs[False][1], ids), atol=1e-5)


def test_moe_attention_is_factorized_and_experts_left_whole(moe_dir, tmp_path):
    from gac.checkpoint.gac_dir import load
    from gac.models.groups import groups_of

    out = tmp_path / "out"
    r = compress(fast_config(moe_dir, compressor="asvd", ratio=0.15, out=str(out), evaluate=False,
                             compressor_options={"importance": "magnitude"})).report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"] and r["variants"]["gac"]["aligned_fraction"] == 1.0
    model = load(out).model
    assert all(".self_attn." in g.name or ".mlp." in g.name for g in groups_of(model, "rank"))
    assert not any(".experts" in g.name for g in groups_of(model, "rank"))
    assert expert_widths(model) == [g.full for g in groups_of(model, "experts")]


@pytest.mark.slow
def test_unaligned_moe_output_repairs_to_the_same_function(moe_dir, tmp_path):
    assert_unaligned_output_repairs(moe_dir, tmp_path)


@pytest.mark.subprocess
def test_moe_gguf_export_is_one_line(moe_dir, tmp_path):
    assert_gguf_export_refused(moe_dir, tmp_path)


def test_experts_kind_cuts_each_expert_its_own_channels():
    from gac.models.groups import groups_of
    from gac.models.surgery import KeepExperts, apply

    model = tiny_moe("mixtral")
    (g, *_) = groups_of(model, "experts")
    block = model.get_submodule(g.block)
    gate_up, down = block.gate_up_proj.detach().clone(), block.down_proj.detach().clone()  # [E, 2I, H], [E, H, I]
    keep = torch.tensor([[0, 5, 9], [1, 2, 3], [4, 30, 39], [7, 8, 20]])  # [E, 3]
    apply(model, [(g, KeepExperts(keep))])
    for e in range(4):
        rows = torch.cat([keep[e], keep[e] + 40])
        assert torch.equal(block.gate_up_proj[e], gate_up[e, rows])
        assert torch.equal(block.down_proj[e], down[e][:, keep[e]])
    assert groups_of(model, "experts")[0].dim == 3


def test_magnitude_importance_weights_experts_by_their_routed_share():
    from gac.calibration.importance import ChannelScores, routed_share
    from gac.calibration.stats import LinearStats

    scores = ChannelScores(torch.ones(4, 6), torch.ones(4, 5))  # [E, out], [E, in]
    stats = {"w": LinearStats(torch.zeros(5), extra={"routed": torch.tensor([6, 2, 0, 0])})}
    got = routed_share(scores, stats, "w")
    assert torch.allclose(got.out[:, 0], torch.tensor([3.0, 1.0, 0.0, 0.0]))  # share x E: mean 1 per expert
    assert torch.equal(routed_share(scores, {}, "w").out, scores.out)  # no routing seen: as it is


def test_calibration_counts_the_tokens_routed_to_each_expert():
    from gac.calibration.stats import calibrate
    from gac.models.groups import groups_of

    model = tiny_moe("qwen3_moe")
    names = list(groups_of(model, "experts")[0].linears)
    stats = calibrate(model, torch.randint(0, 320, (2, 16)), names, progress=False)
    routed = stats[names[0]].extra["routed"]
    assert routed.shape == (4,) and int(routed.sum()) == 2 * 16 * 2  # every token, top-2


def test_dense_layers_of_an_moe_model_keep_the_mlp_kind():
    from gac.models.groups import groups_of

    model = tiny_moe("qwen3_moe")  # layer 2 is dense (mlp_only_layers)
    assert [g.name for g in groups_of(model, "mlp")] == ["model.layers.2.mlp"]
    assert [g.name for g in groups_of(model, "experts")] == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]


def test_inspect_lists_one_expert_width_per_moe_layer():
    from gac.models.dims import inspect_model
    from gac.models.groups import groups_of
    from gac.models.surgery import KeepExperts, apply

    model = tiny_moe("qwen3_moe")
    g = groups_of(model, "experts")[1]
    apply(model, [(g, KeepExperts(torch.arange(20).repeat(4, 1)))])
    widths = {d.name: d.value for d in inspect_model(model, (8,)).dims if d.kind == "mlp_width"}
    assert widths == {"model.layers.0.mlp.experts": 40, "model.layers.1.mlp.experts": 20, "model.layers.2.mlp": 96}


def test_moe_expert_widths_meet_a_deployment_target(moe_dir, tmp_path):
    r = compress(fast_config(moe_dir, compressor="prune", ratio=0.3, out=str(tmp_path / "out"), evaluate=False,
                             target="vllm:tp2", compressor_options={"layers": "all"})).report.to_dict()
    widths = [d for n, d in r["dims"]["gac"].items() if n.endswith(".experts")]
    assert widths and all(d is None or d % 16 == 0 for d in widths)  # each of 2 ranks: a multiple of 8
    assert r["target"]["met"] == r["target"]["constrained"] and r["variants"]["gac"]["params"] <= r["budget_params"]


def test_fused_expert_gradients_fold_block_by_block_as_whole(monkeypatch):
    import gac.calibration.importance as importance

    g, w = torch.randn(5, 6, 7), torch.randn(5, 6, 7)  # [E, out, in]
    whole = importance.channel_sums(g, w)
    monkeypatch.setattr(importance, "FOLD_ELEMENTS", 2 * 6 * 7)  # two experts at a time: blocks of 2, 2, 1
    blocked = importance.channel_sums(g, w)
    assert [tuple(t.shape) for t in blocked] == [(5, 6), (5, 7), (5, 6), (5, 7)]
    for a, b in zip(whole, blocked):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(blocked[0][3], (g[3] * w[3]).abs().sum(1))


def test_experts_latency_is_one_term_of_the_experts_op_at_the_layer_geometry():
    from gac.hw.profile import FixedSizes
    from gac.models.groups import groups_of
    from gac.models.kinds.base import Term

    for model_type in FAMILIES:
        g = groups_of(tiny_moe(model_type), "experts")[0]
        geometry = {"hidden": 64, "experts": 4, "top_k": 2}
        assert g.profile_op == "experts" and g.profile_shape == geometry
        assert g.latency_terms() == (None, [Term("experts", tuple(sorted(geometry.items())))])
        sizes = FixedSizes.of(g.profile_op, g.profile_shape)
        assert (sizes.hidden, sizes.experts, sizes.top_k) == (64, 4, 2)


def test_moe_latency_model_times_each_expert_width_from_the_experts_sweep(monkeypatch):
    """measure_latency_model (what --speedup builds) sweeps the experts op once for the model's layers, at M = the
    phase's tokens, and every candidate width of each layer reads its own measured time."""
    import gac.hw.profile as hp
    from gac.models.groups import groups_of
    from gac.objectives.latency.model import FULL, Phase, measure_latency_model

    groups = groups_of(tiny_moe("qwen3_moe"), "experts")  # two MoE layers of width 40, one geometry
    swept = []
    run_profile = hp.run_profile
    monkeypatch.setattr(hp, "run_profile", lambda spec, **kw: swept.append(spec) or run_profile(spec, **kw))
    lm = measure_latency_model(groups, Phase("prefill", 1, 16), repeats=1, progress=False)
    (spec,) = swept
    assert spec.ops == ("experts",) and spec.m_values == (16,) and spec.dims == (8, 16, 24, 32, 40)
    assert (spec.sizes.hidden, spec.sizes.experts, spec.sizes.top_k) == (64, 4, 2)
    for g in groups:
        assert set(lm.tables[g.name]) == {8, 16, 24, 32, FULL}
        assert all(0 < ms < float("inf") for ms in lm.tables[g.name].values())
    assert lm.tables[groups[0].name] == lm.tables[groups[1].name]  # one sweep serves every layer of the geometry


def test_profile_candidates_of_an_expert_width_come_from_the_experts_sweep():
    """--profile auto on an MoE model may measure nothing but the experts: their sweep alone gives candidates, and
    a width on a cliff of it is dropped."""
    from types import SimpleNamespace

    from gac.align.profiled import candidates_from_profile

    shape = {"hidden": 64, "experts": 4, "top_k": 2}
    profile = {"ops": [{"op": "experts", "m": 16, "shape": shape, "dims": [8, 16, 24, 32],
                        "ms": [1.0, 3.0, 2.0, 2.5]}]}
    unit = SimpleNamespace(name="model.layers.0.mlp.experts", profile_op="experts", profile_shape=shape, min_dim=1,
                           max_dim=40)
    candidates_for = candidates_from_profile(profile, m=16, alignment=8, window=1)
    assert candidates_for(unit, 18) == [24]
    assert "cliff" in candidates_for.excluded[unit.name][16]


def test_profile_auto_measures_the_experts_op_at_each_layer_geometry():
    from types import SimpleNamespace

    from gac.align.profiled import dims_around, profile_for_model
    from gac.models.groups import groups_of

    g = groups_of(tiny_moe("mixtral"), "experts")[0]
    unit = SimpleNamespace(name=g.name, group=g, profile_op=g.profile_op, profile_shape=g.profile_shape)
    profile = profile_for_model("auto", [unit], {g.name: 19}, device="cpu", dtype="float32", m=8, alignment=8,
                                window=1, progress=False)
    (entry,) = profile["ops"]
    assert (entry["op"], entry["m"], entry["shape"]) == ("experts", 8, {"hidden": 64, "experts": 4, "top_k": 2})
    assert entry["dims"] == list(dims_around([19], alignment=8, window=1)) and all(ms > 0 for ms in entry["ms"])


@pytest.mark.slow
def test_moe_speedup_predicts_the_experts_from_the_experts_sweep(moe_dir, tmp_path, monkeypatch):
    """--speedup with prune on a tiny MoE model end to end: its latency tables are measured, the experts groups' from
    one experts sweep at the phase's tokens and the layers' geometry. That sweep's times are then made steep in the
    width (a tiny layer's are launch overhead, too flat to reach any target) and the closed loop is timed by a
    stand-in: the knapsack reaches the target by cutting expert widths, aligned."""
    import gac.hw.profile as hp
    from gac.objectives.latency.config import Instruments, SpeedupConfig
    from tests.helpers_latency import FAST, ShortThenReached

    swept = []
    run_profile = hp.run_profile

    def sweep(spec, **kw):
        profile = run_profile(spec, **kw)
        swept.append((spec, profile))
        for entry in profile["ops"]:
            if entry["op"] == "experts":
                entry["ms"] = [0.05 * d for d in entry["dims"]]
        return profile

    monkeypatch.setattr(hp, "run_profile", sweep)
    monkeypatch.setenv("GAC_CACHE_DIR", str(tmp_path / "cache"))  # measured here, not read from another test's sweep
    speedup = SpeedupConfig(1.05, **FAST, instruments=Instruments(timer=ShortThenReached()))
    r = compress(fast_config(moe_dir, compressor="prune", out=str(tmp_path / "out"), evaluate=False,
                             compressor_options={"layers": "all"}, speedup=speedup)).report.to_dict()
    ((spec, profile),) = [(s, p) for s, p in swept if "experts" in s.ops]
    assert spec.ops == ("experts",) and spec.m_values == (16,) and {8, 16, 24, 32, 40} <= set(spec.dims)
    entry = profile["ops"][0]
    assert entry["shape"] == {"hidden": 64, "experts": 4, "top_k": 2} and entry["backend"] in ("grouped_mm", "eager")
    widths = {n: d for n, d in r["dims"]["gac"].items() if n.endswith(".experts")}
    assert widths and all(d is None or d % 8 == 0 for d in widths.values())
    assert any(d is not None and d < 40 for d in widths.values())  # the experts' table is what the knapsack cut
    assert r["latency_objective"]["reached"] and math.isfinite(r["variants"]["gac"]["predicted_ms"])


@pytest.fixture(scope="module")
def olmoe_dir(tmp_path_factory):
    return save_tiny(tiny_moe("olmoe"), tmp_path_factory.mktemp("olmoe"))


def test_olmoe_prunes_its_experts_aligned_and_round_trips(olmoe_dir, tmp_path, monkeypatch):
    """OLMoE: Qwen3-MoE's experts (a layout line); its q norm spans all heads, so the experts alone are pruned."""
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import load

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    out = tmp_path / "out"
    result = compress(fast_config(olmoe_dir, compressor="prune", ratio=0.3, out=str(out), evaluate=False,
                                  compressor_options={"layers": "all", "head_mode": "none"}))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"] and r["variants"]["gac"]["aligned_fraction"] == 1.0
    widths = [d for n, d in r["dims"]["gac"].items() if n.endswith(".experts")]
    assert widths and all(d is None or d % 8 == 0 for d in widths) and any(d is not None for d in widths)
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        assert any(".experts.0.gate_proj." in k for k in f.keys())  # per expert, as transformers saves OLMoE
    want = _logits(result.models["gac"], ids := torch.randint(0, 320, (2, 12)))
    for model in (load(out).model, AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()):
        assert torch.equal(_logits(model, ids), want)


def test_olmoe_heads_are_refused_in_one_line(olmoe_dir, tmp_path):
    from gac.errors import GacError
    from tests.helpers import assert_names_a_fix

    with pytest.raises(GacError, match="query norm spans all heads") as e:
        compress(fast_config(olmoe_dir, compressor="prune", ratio=0.3, out=str(tmp_path / "out"), evaluate=False,
                             compressor_options={"layers": "all"}))
    assert_names_a_fix(str(e.value))
