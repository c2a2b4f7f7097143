"""The structured-pruning compressor on tiny models: GQA consistency, coupled MLP shapes, exact budget accounting,
exactness when the removed parts carry nothing, round trip, GAC over pruned dims, and the error cases."""

import copy
import itertools
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from gac.compressors import make_compressor
from gac.compressors.prune import AttentionUnit, MLPUnit, allocate_steps, parse_layers
from gac.errors import GacError
from gac.models.adapters import adapter_for
from gac.models.dims import params_and_alignment
from tests.helpers_compress import prune_setup, random_windows
from tests.helpers_tiny import tiny_model


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits.float()


def _covered(names, units):
    from gac.models.groups import linears_of

    covered = set(linears_of([u.group for u in units]))
    return [n for n in names if n in covered]


def _valid_dims(u):
    return list(range(u.min_dim, u.max_dim + 1, u.dim_step))


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("head_mode", ["group", "uniform"])
def test_any_head_pruning_builds_a_consistent_model_that_runs(model_type, head_mode):
    """Every width the attention unit can take gives a model whose head counts agree with its projections."""
    model, names, windows, comp, units = prune_setup(model_type, head_mode=head_mode)
    attn_units = [u for u in units if isinstance(u, AttentionUnit)]
    assert len(attn_units) == model.config.num_hidden_layers
    geo = adapter_for(model.config).geometry(model.config)
    for dims_l0, dims_l1 in itertools.product(_valid_dims(attn_units[0]), _valid_dims(attn_units[1])):
        dims = {u.name: None for u in units}
        dims[attn_units[0].name], dims[attn_units[1].name] = dims_l0, dims_l1
        pruned = copy.deepcopy(model)
        structure = comp.materialize(pruned, units, dims)
        for u in attn_units:
            attn = pruned.get_submodule(u.name)
            recorded = structure.get("attention", {}).get(u.name)  # absent when every head is kept
            heads, kv = attn.q_proj.out_features // geo.head_dim, attn.k_proj.out_features // geo.head_dim
            assert recorded == (None if (heads, kv) == (geo.num_heads, geo.num_kv_heads)
                                else {"num_heads": heads, "num_kv_heads": kv})
            assert heads >= 1 and kv >= 1 and heads % kv == 0
            assert attn.num_key_value_groups * kv == heads
            assert attn.q_proj.out_features == attn.o_proj.in_features == heads * geo.head_dim
            assert attn.k_proj.out_features == attn.v_proj.out_features == kv * geo.head_dim
            if head_mode == "uniform":
                assert kv == geo.num_kv_heads  # uniform: every KV head stays, with fewer query heads each
            else:
                assert heads // kv == geo.group_size  # group: whole groups, each with all its query heads
            if model_type == "qwen2":
                assert attn.q_proj.bias.shape == (heads * geo.head_dim,)
        out = _logits(pruned, windows[:2])
        assert out.shape == (2, windows.shape[1], model.config.vocab_size) and bool(torch.isfinite(out).all())
        if dims_l0 != dims_l1:  # decode with a KV cache whose head counts differ between layers
            with torch.inference_mode():
                pruned.generate(windows[:1, :8], max_new_tokens=3, do_sample=False)


def test_gate_up_down_are_cut_together():
    model, names, windows, comp, units = prune_setup(head_mode="none")
    assert all(isinstance(u, MLPUnit) for u in units)
    dims = {units[0].name: 37, units[1].name: 101}
    pruned = copy.deepcopy(model)
    structure = comp.materialize(pruned, units, dims)
    hidden = model.config.hidden_size
    for u in units:
        mlp = pruned.get_submodule(u.name)
        d = dims[u.name]
        assert mlp.gate_proj.weight.shape == mlp.up_proj.weight.shape == (d, hidden)
        assert mlp.down_proj.weight.shape == (hidden, d)
        assert structure["linear"][f"{u.name}.down_proj"] == [hidden, d]
        keep = u.kept_channels(d)  # the same channels in all three
        orig = model.get_submodule(u.name)
        assert torch.equal(mlp.gate_proj.weight, orig.gate_proj.weight[keep])
        assert torch.equal(mlp.up_proj.weight, orig.up_proj.weight[keep])
        assert torch.equal(mlp.down_proj.weight, orig.down_proj.weight[:, keep])
        top = np.sort(u.channel_importance)[::-1][:d]
        assert np.allclose(np.sort(u.channel_importance[keep.numpy()])[::-1], top)  # the most important ones
    assert "attention" not in structure
    assert bool(torch.isfinite(_logits(pruned, windows[:2])).all())


@pytest.mark.parametrize("importance", ["magnitude", "activation", "taylor", "fisher"])
@pytest.mark.parametrize("head_mode", ["group", "uniform"])
def test_budget_respected_and_measured_params_equal_planned(importance, head_mode):
    model, names, windows, comp, units = prune_setup(importance=importance, head_mode=head_mode)
    covered = _covered(names, units)
    assert covered == names  # every layer pruned: the units cover every linear
    compressible, _ = params_and_alignment(model, covered, 8)
    assert compressible == sum(u.numel for u in units)
    assert all(u.score > 0 and math.isfinite(u.score) for u in units)
    assert np.mean([u.score for u in units]) == pytest.approx(1.0)
    budget = math.floor(0.75 * compressible)
    dims = comp.allocate(units, budget)
    planned = sum(u.params(dims[u.name]) for u in units)
    assert planned <= budget
    assert planned >= budget - max(u.dim_step * u.params_per_dim for u in units)  # the greedy fills the budget
    pruned = copy.deepcopy(model)
    comp.materialize(pruned, units, dims)
    params, _ = params_and_alignment(pruned, covered, 8)
    assert params == planned  # measured on the live model == what the plan predicts


def test_removing_dead_channels_and_groups_is_exact():
    """Channels and a KV group whose weights are all zero carry nothing: pruning exactly them keeps the logits."""
    model = tiny_model()
    geo = adapter_for(model.config).geometry(model.config)
    dead = torch.tensor([3, 17, 40, 99])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate_proj.weight[dead] = 0
            layer.mlp.up_proj.weight[dead] = 0
            layer.mlp.down_proj.weight[:, dead] = 0
            g = 1  # KV group 1 and its query heads
            q_rows = slice(g * geo.group_size * geo.head_dim, (g + 1) * geo.group_size * geo.head_dim)
            kv_rows = slice(g * geo.head_dim, (g + 1) * geo.head_dim)
            layer.self_attn.q_proj.weight[q_rows] = 0
            layer.self_attn.k_proj.weight[kv_rows] = 0
            layer.self_attn.v_proj.weight[kv_rows] = 0
            layer.self_attn.o_proj.weight[:, q_rows] = 0
    comp = make_compressor("prune", importance="magnitude", layers="all")
    units = comp.analyze(model, comp.groups(model), {}, progress=False)
    dims = {u.name: u.max_dim - (len(dead) if isinstance(u, MLPUnit) else geo.head_dim) for u in units}
    pruned = copy.deepcopy(model)
    comp.materialize(pruned, units, dims)
    ids = random_windows(model.config.vocab_size)[:2]
    torch.testing.assert_close(_logits(pruned, ids), _logits(model, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.subprocess
def test_round_trip_gac_load_and_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    import gac
    from gac.checkpoint.gac_dir import save

    model, names, windows, comp, units = prune_setup(head_mode="uniform")
    dims = comp.allocate(units, math.floor(0.7 * sum(u.numel for u in units)))
    pruned = copy.deepcopy(model)
    structure = comp.materialize(pruned, units, dims)
    assert structure["attention"]  # heads were pruned, so the round trip covers them
    save(pruned, None, tmp_path / "m", plan={"gac_plan": 1, "dims": dims})
    ids = windows[:2]
    expected = _logits(pruned, ids)
    torch.testing.assert_close(_logits(gac.load(tmp_path / "m").model, ids), expected, rtol=1e-5, atol=1e-5)
    remote = AutoModelForCausalLM.from_pretrained(tmp_path / "m", trust_remote_code=True).eval()
    torch.testing.assert_close(_logits(remote, ids), expected, rtol=1e-5, atol=1e-5)

    # and in a fresh process without gac, outside the repository
    torch.save({"ids": ids, "logits": expected}, tmp_path / "ref.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        from transformers import AutoModelForCausalLM
        ref = torch.load({str(tmp_path / "ref.pt")!r})
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "m")!r}, trust_remote_code=True).eval()
        with torch.inference_mode():
            got = model(ref["ids"], use_cache=False).logits.float()
        diff = (got - ref["logits"]).abs().max().item()
        if diff > 1e-5 or any(n.split(".")[0] == "gac" for n in sys.modules):
            sys.exit(f"logits differ by {{diff}} or gac was imported")
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_compress_end_to_end_gac_over_pruned_dims(tiny_model_dir, tmp_path):
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig
    from gac.checkpoint.gac_dir import read_plan

    out = tmp_path / "pruned"
    cfg = CompressConfig(model=str(tiny_model_dir), compressor="prune", ratio=0.3, out=str(out), evaluate=False,
                         progress=False, text=TextConfig(seq_len=32, calib_windows=4, eval_windows=2),
                         compressor_options={"importance": "taylor", "layers": "all"})
    r = compress(cfg).report.to_dict()
    v = r["variants"]
    assert v["baseline"]["params"] == r["compressible_params"]
    assert r["budget_params"] == int(0.7 * r["compressible_params"])
    assert v["unaligned"]["params"] <= r["budget_params"] and v["gac"]["params"] <= r["budget_params"]
    assert v["gac"]["aligned_fraction"] == 1.0
    assert all(d % 8 == 0 for d in r["dims"]["gac"].values())
    assert set(r["dims"]["unaligned"]) <= {f"model.layers.{i}.{b}" for i in (0, 1) for b in ("mlp", "self_attn")}
    plan = read_plan(out)
    assert plan["dims"] == r["dims"]["gac"] and plan["compressor"]["importance"] == "taylor"
    import gac

    loaded = gac.load(out).model
    for name, d in r["dims"]["gac"].items():
        if name.endswith(".mlp"):
            assert loaded.get_submodule(name).gate_proj.out_features == d


def test_allocate_steps_greedy_by_gain_per_parameter():
    gains = [np.array([9.0, 5.0, 1.0]), np.array([8.0, 7.0, 6.0])]
    # unit 0 steps cost 1, unit 1 steps cost 2; next gains per parameter: 5 (unit 0), 3.5, 3 (unit 1), 1 (unit 0)
    assert allocate_steps(gains, [1, 2], [1, 1], [0, 0], budget=3) == [1, 1]
    assert allocate_steps(gains, [1, 2], [1, 1], [0, 0], budget=4) == [2, 1]
    assert allocate_steps(gains, [1, 2], [1, 1], [0, 0], budget=6) == [2, 2]
    assert allocate_steps(gains, [1, 2], [1, 1], [0, 0], budget=8) == [2, 3]
    assert allocate_steps(gains, [1, 2], [1, 1], [0, 0], budget=7) == [3, 2]  # 3.0 no longer fits: 1 does
    assert allocate_steps(gains, [1, 2], [0, 0], [10, 0], budget=100) == [3, 3]
    for budget in range(3, 10):
        steps = allocate_steps(gains, [1, 2], [1, 1], [0, 0], budget)
        assert steps[0] + 2 * steps[1] <= budget


def test_a_ratio_that_removes_every_head_is_an_error():
    model, names, windows, comp, units = prune_setup()
    smallest = sum(u.params(u.min_dim) for u in units)
    with pytest.raises(GacError, match="every head of a layer"):
        comp.allocate(units, smallest - 1)
    dims = comp.allocate(units, smallest)  # just enough: every attention keeps exactly one KV group
    assert all(dims[u.name] == u.min_dim for u in units if isinstance(u, AttentionUnit))


def test_config_and_layer_errors():
    with pytest.raises(GacError, match="head mode"):
        make_compressor("prune", head_mode="heads")
    with pytest.raises(GacError, match="unknown importance"):
        make_compressor("prune", importance="l1")
    with pytest.raises(GacError, match="layer list"):
        make_compressor("prune", layers="1-x")
    assert parse_layers("1-3,7") == (1, 2, 3, 7) and parse_layers([2, 1]) == (1, 2) and parse_layers(None) is None
    with pytest.raises(GacError, match="first and last are kept"):  # the 2-layer model has nothing left by default
        prune_setup(layers=None)
    with pytest.raises(GacError, match="layer 5 does not exist"):
        prune_setup(layers="1,5")
    model, names, windows, comp, units = prune_setup(layers="1")
    assert [u.name for u in units] == ["model.layers.1.mlp", "model.layers.1.self_attn"]
    assert _covered(names, units) == [n for n in names if n.startswith("model.layers.1.")]


@pytest.mark.parametrize("args,expected", [
    (["--compressor", "svd", "--prune-layers", "1-3"], "--prune-layers does not apply to --compressor svd"),
    (["--compressor", "asvd", "--head-mode", "uniform"], "--head-mode does not apply to --compressor asvd"),
    (["--compressor", "prune", "--alpha", "0.5"], "--alpha does not apply to --compressor prune"),
    (["--compressor", "prune", "--prune-layers", "x"], "layer list"),
])
def test_cli_options_checked_before_any_work(args, expected, tmp_path):
    from click.testing import CliRunner

    from gac.cli import main

    result = CliRunner().invoke(main, ["compress", *args, "--out", str(tmp_path / "o"), "--quiet"])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert not (tmp_path / "o").exists()


def test_profile_candidates_drive_pruned_widths(tiny_model_dir, tmp_path):
    """A synthetic gemm_n profile (N = MLP width, K = hidden) where every multiple of 16 is a cliff."""
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig
    from gac.hw.profile import save_profile

    dims = list(range(1, 161))
    ms = [1.0 + d * 0.01 + (5.0 if d % 16 == 0 else 0.0) for d in dims]
    entry = {"op": "gemm_n", "shape": {"k": 64}, "m": 512, "backend": None, "dims": dims, "ms": ms,
             "p10_ms": ms, "p90_ms": ms}
    profile = {"gac_profile": 1, "device": "cpu", "device_name": "synthetic", "torch": "x", "dtype": "float32",
               "threads": 1, "date": "2026-01-01", "ops": [entry]}
    path = save_profile(profile, tmp_path / "p.json")
    cfg = CompressConfig(model=str(tiny_model_dir), compressor="prune", ratio=0.3, profile=str(path), evaluate=False,
                         progress=False, text=TextConfig(seq_len=32, calib_windows=4, eval_windows=2),
                         compressor_options={"importance": "magnitude", "layers": "all", "head_mode": "none"})
    r = compress(cfg).report.to_dict()
    assert r["dims"]["gac"] and all(d % 8 == 0 and d % 16 != 0 for d in r["dims"]["gac"].values())
    assert r["variants"]["gac"]["params"] <= r["budget_params"]


def test_heads_at_their_minimum_are_one_warning(caplog):
    """A deep cut floors the heads of most layers at once: one line names how many, not one line per layer."""
    model, names, windows, comp, units = prune_setup(head_mode="group")
    with caplog.at_level("WARNING", logger="gac.compressors.prune"):
        minimum = sum(u.fixed_params + u.min_dim * u.params_per_dim for u in units)
        dims = comp.allocate(units, minimum + 64)  # a little above the least every layer must keep
    floored = [u for u in units if isinstance(u, AttentionUnit) and dims[u.name] == u.min_dim < u.max_dim]
    assert len(floored) >= 2
    lines = [r.getMessage() for r in caplog.records if "keep the minimum" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"{len(floored)} attention layers keep the minimum (one KV group)")
