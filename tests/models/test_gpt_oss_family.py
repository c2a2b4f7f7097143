"""gpt-oss (transformers' gpt_oss): experts stored transposed, gate_up [E, H, 2I] with gate and up interleaved along
its last axis (gate = [..., ::2], up = [..., 1::2]) and biased (gate_up_proj_bias [E, 2I], down_proj_bias [E, H]),
down [E, I, H]; attention with biases and a sink per query head; sliding-window layers. Added through its layout:
prune cuts one aligned expert width per layer under the budget, each expert its own channels (a channel's gate and up
entries and its bias together), heads with their sinks; the saved output keeps the fused tensors transformers writes
for gpt-oss and round-trips through gac.load and transformers with the same logits."""

import copy
import json

import pytest
import torch

from gac.api import compress
from tests.helpers_compress import fast_config
from tests.helpers_moe import assert_gguf_export_refused, assert_unaligned_output_repairs, expert_widths, pruned_experts
from tests.helpers_tiny import TINY, save_tiny, tiny_tokenizer

E, H, I, HEADS, KV, HD = 4, 64, 40, 4, 2, 16  # experts, hidden, expert width, query heads, KV heads, head_dim


def tiny_gpt_oss(seed: int = 0):
    import transformers

    config = transformers.GptOssConfig(
        **{**TINY, "num_hidden_layers": 3, "intermediate_size": I}, head_dim=HD, num_local_experts=E,
        num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 8})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # transformers initializes the biases at zero: random ones, so that cutting them shows
        for name, p in model.named_parameters():
            if name.endswith(("_bias", ".sinks")) or (".self_attn." in name and name.endswith(".bias")):
                p.normal_(0, 0.1)
    return model


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    """An HF directory of a tiny random gpt-oss model, saved as transformers saves it (fused expert tensors)."""
    return save_tiny(tiny_gpt_oss(), tmp_path_factory.mktemp("gpt-oss"))


IDS = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))  # longer than the sliding window


def _logits(model, ids=IDS):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits


def _reloaded(out):
    """The saved output as gac.load, transformers after `import gac`, and trust_remote_code build it."""
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import load

    return (load(out).model, AutoModelForCausalLM.from_pretrained(out).eval(),
            AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval())


@pytest.mark.slow
@pytest.mark.parametrize("ratio", [0.15, 0.30])
def test_gpt_oss_prune_cuts_one_aligned_expert_width_per_layer_and_round_trips(gpt_oss_dir, tmp_path, monkeypatch,
                                                                               ratio):
    from safetensors import safe_open

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    out = tmp_path / "out"
    result, experts = pruned_experts(gpt_oss_dir, out, ratio)  # heads too (group mode): not refused
    saved = result.models["gac"]
    widths = expert_widths(saved)
    assert widths == [experts.get(f"model.layers.{i}.mlp.experts") or I for i in range(3)]
    for i, w in enumerate(widths):  # one width for every expert of a layer, biases cut with their channels
        block = saved.get_submodule(f"model.layers.{i}.mlp.experts")
        assert (tuple(block.gate_up_proj.shape), tuple(block.gate_up_proj_bias.shape)) == ((E, H, 2 * w), (E, 2 * w))
        assert (tuple(block.down_proj.shape), tuple(block.down_proj_bias.shape)) == ((E, w, H), (E, H))
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gac_gpt_oss"
    with safe_open(out / "model.safetensors", "pt") as f:  # the fused tensors, as transformers saves gpt-oss
        keys = list(f.keys())
    assert "model.layers.1.mlp.experts.gate_up_proj" in keys and "model.layers.1.mlp.experts.gate_up_proj_bias" in keys
    assert not any(".experts.0." in k for k in keys)
    want = _logits(saved)
    for model in _reloaded(out):
        assert torch.equal(_logits(model), want)
        assert expert_widths(model) == widths


@pytest.mark.slow
def test_gpt_oss_layerwise_equals_the_whole_model_pipeline(gpt_oss_dir, tmp_path):
    """Layer by layer, evaluated as a user runs it: the unaligned variant's layers run their experts eagerly (a
    layer copied on its own holds its own config), and each timed layer runs with its own kind of attention mask
    (sliding-window or full)."""
    from gac.checkpoint.gac_dir import load

    runs = {}
    for layerwise in (False, True):
        out = tmp_path / f"out-{layerwise}"
        pipeline = "layerwise" if layerwise else "whole"
        result = compress(fast_config(gpt_oss_dir, compressor="prune", ratio=0.3, out=str(out), evaluate=layerwise,
                                      pipeline=pipeline, compressor_options={"layers": "all"}))
        runs[layerwise] = (result.report, load(out).model)
    assert runs[True][0].dims["gac"] == runs[False][0].dims["gac"]
    assert any(n.endswith(".experts") for n in runs[True][0].dims["gac"])
    assert any(d % 8 for d in runs[True][0].dims["unaligned"].values())  # run eagerly, evaluated
    assert all(runs[True][0].variants[v].decode_ms_per_token > 0 for v in ("baseline", "unaligned", "gac"))
    torch.testing.assert_close(_logits(runs[True][1]), _logits(runs[False][1]), atol=1e-5, rtol=0)


def test_gpt_oss_experts_cut_keeps_each_channels_gate_up_and_bias_together():
    """Cutting channels is the same function as zeroing the down rows of the others; each kept channel keeps its
    gate column 2c, its up column 2c + 1 and both biases, in every expert its own channels."""
    from gac.models.groups import groups_of
    from gac.models.surgery import KeepExperts, apply

    model = tiny_gpt_oss(seed=1)
    g = groups_of(model, "experts")[1]
    assert (g.transposed, g.interleaved, g.gate_up_bias) == (True, True, "model.layers.1.mlp.experts.gate_up_proj_bias")
    block = model.get_submodule(g.block)
    gate_up, bias, down = (block.gate_up_proj.detach().clone(), block.gate_up_proj_bias.detach().clone(),
                           block.down_proj.detach().clone())  # [E, H, 2I], [E, 2I], [E, I, H]
    keep = torch.stack([torch.randperm(I, generator=torch.Generator().manual_seed(e))[:8].sort().values
                        for e in range(E)])  # [E, 8]
    masked = copy.deepcopy(model)
    with torch.no_grad():
        for e in range(E):
            drop = torch.ones(I, dtype=torch.bool)
            drop[keep[e]] = False
            masked.get_submodule(g.block).down_proj[e, drop] = 0
    apply(model, [(g, KeepExperts(keep))])
    for e in range(E):
        assert torch.equal(block.gate_up_proj[e, :, 0::2], gate_up[e, :, 2 * keep[e]])  # gate
        assert torch.equal(block.gate_up_proj[e, :, 1::2], gate_up[e, :, 2 * keep[e] + 1])  # up
        assert torch.equal(block.gate_up_proj_bias[e], bias[e].reshape(I, 2)[keep[e]].reshape(-1))
        assert torch.equal(block.down_proj[e], down[e, keep[e]])
    assert groups_of(model, "experts")[1].dim == 8
    torch.testing.assert_close(_logits(model), _logits(masked), atol=1e-5, rtol=0)


def test_gpt_oss_importance_scores_each_channel_from_its_own_entries():
    """The experts unit's channel score is its gate and up columns of gate_up and its row of down (magnitude:
    squared weights), not the rows of a transposed weight or the halves of an interleaved one."""
    from gac.calibration.importance import measure
    from gac.compressors.prune import ExpertsUnit
    from gac.models.groups import groups_of

    model = tiny_gpt_oss(seed=2)
    g = groups_of(model, "experts")[0]
    unit = ExpertsUnit.scored(g, measure("magnitude", model, list(g.linears)))
    gate_up, down = (model.get_parameter(n).detach().double().square() for n in g.linears)  # [E, H, 2I], [E, I, H]
    want = gate_up.sum(1)[:, 0::2] + gate_up.sum(1)[:, 1::2] + down.sum(2)  # [E, I]
    assert unit.channel_importance.shape == (E, I)
    torch.testing.assert_close(torch.as_tensor(unit.channel_importance), want, rtol=1e-5, atol=0)


@pytest.mark.parametrize("mode", ["group", "uniform"])
def test_gpt_oss_heads_are_cut_with_their_sinks_and_round_trip(tmp_path, monkeypatch, mode):
    """Removing heads removes their sinks (one per query head): the same function as zeroing the removed heads' o
    columns; the saved structure rebuilds the sinks' shape and every loader gives the same logits."""
    from gac.checkpoint.gac_dir import save
    from gac.models.groups import groups_of
    from gac.models.structure import structure_of
    from gac.models.surgery import KeepHeads, apply, channels_of

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    model = tiny_gpt_oss(seed=3)
    g = groups_of(model, "heads", layers=[1], mode=mode)[0]
    assert g.head_parameters == ("model.layers.1.self_attn.sinks",)
    q_heads, kv_heads = (torch.tensor([2, 3]), torch.tensor([1])) if mode == "group" else (torch.tensor([0, 3]),
                                                                                            torch.arange(KV))
    sinks = model.get_parameter(g.head_parameters[0]).detach().clone()
    masked = copy.deepcopy(model)
    with torch.no_grad():
        drop = torch.ones(HEADS * HD, dtype=torch.bool)
        drop[channels_of(q_heads, HD)] = False
        masked.get_submodule(g.o).weight[:, drop] = 0
    apply(model, [(g, KeepHeads(q_heads, kv_heads))])
    assert torch.equal(model.get_parameter(g.head_parameters[0]), sinks[q_heads])
    torch.testing.assert_close(_logits(model), _logits(masked), atol=1e-5, rtol=0)
    structure = structure_of(model)
    assert structure["parameter"] == {g.head_parameters[0]: [2]}
    assert structure["attention"] == {g.block: {"num_heads": 2, "num_kv_heads": len(kv_heads)}}
    out = save(model, tiny_tokenizer(), tmp_path / "m", plan={"compressor": "prune"})
    want = _logits(model)
    for loaded in _reloaded(out):
        assert torch.equal(_logits(loaded), want)


@pytest.mark.slow
def test_unaligned_gpt_oss_output_repairs_to_the_same_function(gpt_oss_dir, tmp_path):
    """Zero padding an interleaved, biased expert width: zero (gate, up) pairs and biases at the end, zero down rows."""
    assert_unaligned_output_repairs(gpt_oss_dir, tmp_path)


@pytest.mark.slow
def test_gpt_oss_asvd_factorizes_the_biased_attention_and_leaves_the_experts_whole(gpt_oss_dir, tmp_path,
                                                                                    monkeypatch):
    from gac.models.groups import groups_of

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    out = tmp_path / "out"
    result = compress(fast_config(gpt_oss_dir, compressor="asvd", ratio=0.15, out=str(out), evaluate=False,
                                  compressor_options={"importance": "magnitude"}))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"] and r["variants"]["gac"]["aligned_fraction"] == 1.0
    assert r["dims"]["gac"] and all(".self_attn." in n for n in r["dims"]["gac"])
    saved = result.models["gac"]
    for name in r["dims"]["gac"]:  # every factorized attention weight (all biased) keeps its bias on the second factor
        m = saved.get_submodule(name)
        assert type(m).__name__ == "LowRankLinear" and m.b.bias is not None, name
    assert expert_widths(saved) == [I] * 3
    want = _logits(saved)
    for model in _reloaded(out):
        assert torch.equal(_logits(model), want)


def test_inspect_reads_the_transposed_expert_weights_the_right_way_round():
    from gac.models.dims import inspect_model

    dims = {(d.name, d.kind): d.value for d in inspect_model(tiny_gpt_oss(), (8,)).dims}
    gate_up, down = "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"
    assert (dims[gate_up, "in_features"], dims[gate_up, "out_features"]) == (H, 2 * I)
    assert (dims[down, "in_features"], dims[down, "out_features"]) == (I, H)
    assert dims["model.layers.0.mlp.experts", "mlp_width"] == I


@pytest.mark.subprocess
def test_gpt_oss_gguf_export_is_one_line(gpt_oss_dir, tmp_path):
    assert_gguf_export_refused(gpt_oss_dir, tmp_path)


def test_a_quantized_gpt_oss_checkpoint_is_refused_in_one_line(tmp_path):
    """gpt-oss is published in MXFP4 (expert tensors as blocks and scales): refused before loading, naming the
    float checkpoint transformers can write from it."""
    from gac.errors import GacError
    from tests.helpers import assert_names_a_fix

    d = tmp_path / "mxfp4"
    tiny_gpt_oss().save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "mxfp4"}}))
    for pipeline in ("whole", "layerwise"):
        with pytest.raises(GacError, match="quantized checkpoint") as e:
            compress(fast_config(d, compressor="prune", ratio=0.3, out=str(tmp_path / "out"), evaluate=False,
                                 pipeline=pipeline, compressor_options={"layers": "all"}))
        assert "Mxfp4Config(dequantize=True)" in str(e.value)
        assert_names_a_fix(str(e.value))
