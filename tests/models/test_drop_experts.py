"""Prune's --drop-experts on mixture-of-experts models (Qwen3-MoE, Mixtral): every MoE layer drops the same number of
whole experts, its least important, with their router rows; the config's expert count follows; the dropped experts
count toward the budget, the expert widths fill the rest, aligned; the output reloads through gac.load and transformers
with the same logits, and the layer-by-layer pipeline cuts the same."""

import json

import pytest
import torch

from gac.api import compress
from tests.helpers import assert_one_error_line, gac_cli
from tests.helpers_compress import fast_config
from tests.helpers_moe import FAMILIES, tiny_moe
from tests.helpers_tiny import save_tiny, tiny_tokenizer

NEVER = 3  # the expert no token is routed to, in every MoE layer of the models below
COUNT_KEY = {"qwen3_moe": "num_experts", "mixtral": "num_local_experts"}
DROP = {"layers": "all", "drop_experts": 0.25}  # 4 experts -> 3


def never_routed_moe(model_type: str):
    """A tiny MoE model in which expert NEVER of every MoE layer is never routed: the residual stream carries a large
    constant on hidden channel 0 (the embeddings' column 0), and that expert's router row reads minus it, so its
    router logit is far below every other expert's for every token."""
    model = tiny_moe(model_type)
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 20.0
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and gate.weight.dim() == 2 and gate.weight.shape[0] == 4:  # a router [E, H]
                gate.weight[NEVER] = 0.0
                gate.weight[NEVER, 0] = -50.0
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def moe_dir(request, tmp_path_factory):
    return save_tiny(never_routed_moe(request.param), tmp_path_factory.mktemp(f"drop-{request.param}"))


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits


def _routers(model) -> dict:
    from gac.models.adapters import adapter_for

    adapter = adapter_for(model.config)
    return {layer.experts: model.get_submodule(layer.router) for layer in adapter.layers(model.config)
            if layer.experts}


def test_the_constructed_expert_is_never_routed():
    from gac.calibration.stats import calibrate
    from gac.models.groups import groups_of

    for model_type in FAMILIES:
        model = never_routed_moe(model_type)
        names = [g.gate_up for g in groups_of(model, "experts")]
        stats = calibrate(model, torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(0)), names,
                          progress=False)
        for name in names:
            routed = stats[name].extra["routed"]
            assert routed[NEVER] == 0 and routed.sum() == 2 * 16 * 2


@pytest.mark.slow
def test_drop_experts_within_budget_aligned_and_round_trips(moe_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import load, read_config

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    original = AutoModelForCausalLM.from_pretrained(moe_dir).eval()
    model_type = original.config.model_type
    out = tmp_path / "out"
    result = compress(fast_config(moe_dir, compressor="prune", ratio=0.3, out=str(out), evaluate=False,
                                  compressor_options=DROP))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"]
    assert r["variants"]["unaligned"]["params"] <= r["budget_params"]
    assert r["variants"]["gac"]["aligned_fraction"] == 1.0
    assert all(d % 8 == 0 for n, d in r["dims"]["gac"].items() if n.endswith(".experts"))
    saved = result.models["gac"]
    moe_layers = list(_routers(original))
    assert r["experts_kept"] == dict.fromkeys(moe_layers, 3)
    assert "kept 3 experts" in (out / "report.md").read_text()
    assert json.loads((out / "report.json").read_text())["experts_kept"] == r["experts_kept"]

    config = json.loads((out / "config.json").read_text())  # transformers 5 writes Qwen3-MoE's count as Mixtral's
    assert {k: v for k, v in config.items() if k in ("num_experts", "num_local_experts")} == {"num_local_experts": 3}
    assert getattr(read_config(out), COUNT_KEY[model_type]) == 3 and config["num_experts_per_tok"] == 2
    originals, routers = _routers(original), _routers(saved)
    for name in moe_layers:
        block, was = saved.get_submodule(name), original.get_submodule(name)
        width = block.down_proj.shape[-1]
        assert tuple(block.gate_up_proj.shape) == (3, 2 * width, 64) and tuple(block.down_proj.shape) == (3, 64, width)
        assert block.num_experts == routers[name].num_experts == 3
        # the never-routed expert is the one dropped: the kept router rows are experts 0, 1, 2, renumbered in order
        assert tuple(routers[name].weight.shape) == (3, 64)
        assert torch.equal(routers[name].weight, originals[name].weight[:NEVER])
        if width == was.down_proj.shape[-1]:  # whole width: each kept expert's weights as they were
            assert torch.equal(block.gate_up_proj, was.gate_up_proj[:NEVER])

    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    want = _logits(saved, ids)
    for model in (load(out).model, AutoModelForCausalLM.from_pretrained(out).eval()):
        assert torch.equal(_logits(model, ids), want)
        assert {n: r.num_experts for n, r in _routers(model).items()} == dict.fromkeys(moe_layers, 3)


@pytest.mark.slow
def test_dropping_alone_may_meet_the_budget_with_widths_whole(moe_dir, tmp_path):
    """At a ratio the dropped experts alone meet (a quarter of the experts is more than a tenth of the parameters),
    the widths may stay whole, and the experts are still dropped."""
    r = compress(fast_config(moe_dir, compressor="prune", ratio=0.1, out=None, evaluate=False,
                             compressor_options={**DROP, "head_mode": "none"})).report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"] and r["variants"]["gac"]["aligned_fraction"] == 1.0
    assert set(r["experts_kept"].values()) == {3}
    assert not any(n.endswith(".experts") for n in r["dims"]["gac"])  # every expert width kept whole


@pytest.mark.slow
def test_drop_experts_layerwise_equals_the_whole_model_pipeline(moe_dir, tmp_path):
    from gac.checkpoint.gac_dir import load

    runs = {}
    for layerwise in (False, True):
        out = tmp_path / f"out-{layerwise}"
        pipeline = "layerwise" if layerwise else "whole"
        result = compress(fast_config(moe_dir, compressor="prune", ratio=0.3, out=str(out), evaluate=False,
                                      pipeline=pipeline, compressor_options=DROP))
        runs[layerwise] = (result.report.dims["gac"], result.report.experts_kept, load(out).model)
    assert runs[True][:2] == runs[False][:2]
    ids = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(_logits(runs[True][2], ids), _logits(runs[False][2], ids), atol=1e-5)


def test_experts_kind_drops_experts_with_their_router_rows():
    from gac.models.groups import groups_of
    from gac.models.surgery import KeepExperts, apply

    model = tiny_moe("qwen3_moe")
    g = groups_of(model, "experts")[0].dropping(2)
    assert g.params(None) == 40 * 3 * 64 * 2 and g.numel == 40 * 3 * 64 * 4 and g.changes_whole
    block, router = model.get_submodule(g.block), model.get_submodule(g.router)
    gate_up, down, rows = (t.detach().clone() for t in (block.gate_up_proj, block.down_proj, router.weight))
    keep = torch.tensor([[0, 5, 9], [1, 2, 3]])  # kept expert j's channels
    apply(model, [(g, KeepExperts(keep, torch.tensor([1, 3])))])
    assert torch.equal(router.weight, rows[[1, 3]]) and block.num_experts == router.num_experts == 2
    for j, e in enumerate((1, 3)):
        assert torch.equal(block.gate_up_proj[j], gate_up[e, torch.cat([keep[j], keep[j] + 40])])
        assert torch.equal(block.down_proj[j], down[e][:, keep[j]])
    assert model.config.num_experts == 2


@pytest.mark.parametrize("fraction", [-0.25, 1.0, 1.5])
def test_a_fraction_outside_0_1_is_one_line(fraction):
    from gac.compressors import make_compressor
    from gac.errors import GacError

    with pytest.raises(GacError, match=r"outside \[0, 1\)"):
        make_compressor("prune", drop_experts=fraction)


@pytest.mark.slow
def test_drop_experts_refusals_are_one_line(tiny_model_dir, tmp_path):
    """Refused before any output: on the command line (another compressor, a share of 1), and where the model decides
    (too few experts left, no experts, MoE layers left out of the pruned ones), each one line naming the fix."""
    from gac.errors import GacError

    moe_dir = tmp_path / "qwen3-moe"
    tiny_moe("qwen3_moe").save_pretrained(moe_dir)
    tiny_tokenizer().save_pretrained(moe_dir)
    p = gac_cli("compress", "--model", moe_dir, "--compressor", "asvd", "--drop-experts", "0.25", "--no-eval",
                "--out", tmp_path / "b")
    assert_one_error_line(p, "--drop-experts does not apply to --compressor asvd")
    p = gac_cli("compress", "--model", moe_dir, "--compressor", "prune", "--drop-experts", "1", "--no-eval",
                "--out", tmp_path / "e")
    assert_one_error_line(p, "--drop-experts")
    cases = [(moe_dir, {"layers": "all", "drop_experts": 0.75}, "fewer than the 2 each token is routed to"),  # 1 left
             (tiny_model_dir, DROP, "has none"),
             (moe_dir, {"drop_experts": 0.25}, "layers=all")]  # the default layers leave MoE layers whole
    for model, options, expected in cases:
        with pytest.raises(GacError, match=expected) as e:
            compress(fast_config(model, compressor="prune", ratio=0.3, out=str(tmp_path / "a"), evaluate=False,
                                 compressor_options=options))
        assert "\n" not in str(e.value) and ": " in str(e.value)
    assert not any((tmp_path / x).exists() for x in "abe")


def test_drop_experts_under_speedup_is_one_line(moe_dir):
    from gac.api import CompressConfig
    from gac.cli.options import in_flags
    from gac.errors import GacError
    from gac.objectives.latency.config import SpeedupConfig

    with pytest.raises(GacError, match="drop_experts removes parameters") as e:
        CompressConfig(model=str(moe_dir), compressor="prune", compressor_options=DROP, speedup=SpeedupConfig(1.2))
    assert "\n" not in str(e.value) and in_flags(e.value).startswith("--drop-experts removes parameters")
