"""Fused projections (Phi-3 / Phi-4-mini: q, k and v are rows of one qkv_proj, gate and up the halves of one
gate_up_proj): the mlp group knows the split, so prune keeps each channel's gate row and up row together and low-rank
compressors factorize the fused linears whole; the saved model keeps the fused layout and round-trips."""

import pytest
import torch

from gac.api import compress
from gac.errors import GacError
from tests.helpers import assert_names_a_fix
from tests.helpers_compress import fast_config
from tests.helpers_tiny import TINY, save_tiny


def tiny_phi3(seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    config = transformers.Phi3Config(**{**TINY, "num_hidden_layers": 3}, pad_token_id=0, eos_token_id=1,
                                     bos_token_id=1)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def phi3_dir(tmp_path_factory):
    return save_tiny(tiny_phi3(), tmp_path_factory.mktemp("tiny-phi3"))


def _round_trips(result, out):
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import load

    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = result.models["gac"](ids, use_cache=False).logits
        for model in (load(out).model, AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()):
            assert torch.equal(model(ids, use_cache=False).logits, want)


@pytest.mark.slow
@pytest.mark.parametrize("ratio", [0.15, 0.30])
def test_phi3_prune_cuts_the_fused_gate_up_aligned_and_round_trips(phi3_dir, tmp_path, monkeypatch, ratio):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    out = tmp_path / "out"
    result = compress(fast_config(phi3_dir, compressor="prune", ratio=ratio, out=str(out), evaluate=False,
                                  compressor_options={"layers": "all", "head_mode": "none"}))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"] and r["variants"]["gac"]["aligned_fraction"] == 1.0
    widths = {n: d for n, d in r["dims"]["gac"].items() if d is not None}
    assert widths and all(w % 8 == 0 for w in widths.values())
    saved = result.models["gac"]
    for mlp, w in widths.items():  # the fused layout kept: gate_up [2w, hidden], down [hidden, w]
        assert saved.get_submodule(f"{mlp}.gate_up_proj").weight.shape == (2 * w, 64)
        assert saved.get_submodule(f"{mlp}.down_proj").weight.shape == (64, w)
    _round_trips(result, out)


def test_phi3_lowrank_factorizes_the_fused_linears_whole(phi3_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    out = tmp_path / "out"
    result = compress(fast_config(phi3_dir, compressor="asvd", ratio=0.3, out=str(out), evaluate=False,
                                  compressor_options={"importance": "magnitude"}))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"] and r["variants"]["gac"]["aligned_fraction"] == 1.0
    assert any(n.endswith("qkv_proj") for n in r["dims"]["gac"]) and any(n.endswith("gate_up_proj")
                                                                          for n in r["dims"]["gac"])
    _round_trips(result, out)


def test_fused_gate_up_cut_keeps_each_channels_gate_and_up_rows():
    from gac.models.groups import groups_of
    from gac.models.surgery import Keep, apply

    model = tiny_phi3()
    g = groups_of(model, "mlp")[0]
    (producer,), (consumer,) = g.producers, g.consumers
    gate_up = model.get_submodule(producer).weight.detach().clone()  # [2 x 160, 64]
    keep = torch.tensor([3, 7, 100])
    apply(model, [(g, Keep(keep))])
    assert torch.equal(model.get_submodule(producer).weight, gate_up[torch.cat([keep, keep + 160])])
    assert groups_of(model, "mlp")[0].dim == 3 and model.get_submodule(consumer).in_features == 3


def test_fused_gate_up_pads_each_half_to_the_same_function():
    from gac.models.groups import groups_of
    from gac.models.surgery import Keep, apply, pad

    model = tiny_phi3()
    g = groups_of(model, "mlp")[1]
    apply(model, [(g, Keep(torch.arange(0, 150, 2)))])  # 75 channels
    ids = torch.randint(0, 320, (1, 9))
    with torch.inference_mode():
        before = model(ids).logits
        pad(model, [(groups_of(model, "mlp")[1], 80)])
        assert torch.allclose(model(ids).logits, before, atol=1e-6)
    assert groups_of(model, "mlp")[1].dim == 80


@pytest.mark.parametrize("compressor,options,expected", [("prune", {"layers": "all"}, "head_mode=none"),
                                                         ("palu", {}, "asvd")])
def test_what_a_fused_qkv_cannot_do_is_one_line(phi3_dir, tmp_path, compressor, options, expected):
    with pytest.raises(GacError) as e:
        compress(fast_config(phi3_dir, compressor=compressor, ratio=0.3, out=str(tmp_path / "out"), evaluate=False,
                             compressor_options=options))
    assert expected in str(e.value)
    assert_names_a_fix(str(e.value))
    assert not (tmp_path / "out").exists()
