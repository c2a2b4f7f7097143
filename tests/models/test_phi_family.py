"""A family whose layout differs from Llama's (Phi: `dense` output projection, ungated fc1/fc2 MLP, biases on every
linear), added through its adapter only: every compressor compresses it end to end, and the saved model round-trips
through gac.load and plain transformers."""

import json

import pytest
import torch

from gac.api import compress
from tests.helpers_compress import fast_config


@pytest.mark.slow
@pytest.mark.parametrize("compressor,options", [("svd", {}), ("asvd", {"importance": "magnitude"}),
                                                ("svd_llm", {"importance": "magnitude"}),
                                                ("palu", {"importance": "magnitude"}),
                                                ("prune", {"importance": "magnitude", "layers": "all"})])
def test_phi_compresses_and_round_trips(tiny_phi_dir, tmp_path, monkeypatch, compressor, options):
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import load

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    out = tmp_path / "out"
    result = compress(fast_config(tiny_phi_dir, compressor=compressor, ratio=0.3, out=str(out), evaluate=False,
                                  compressor_options=options))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"]
    assert r["variants"]["gac"]["aligned_fraction"] == 1.0 and r["dims"]["gac"]
    if compressor == "prune":
        assert any(name.endswith(".mlp") for name in r["dims"]["gac"])  # fc1/fc2 resized together
    saved = result.models["gac"]
    ids = torch.randint(0, saved.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = saved(ids, use_cache=False).logits
    scale = float(want.abs().max())
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_gac.GacPhiForCausalLM" and config["gac_structure"]
    for model in (load(out).model, AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()):
        with torch.inference_mode():
            got = model(ids, use_cache=False).logits
        assert float((got - want).abs().max()) <= 1e-5 * scale


@pytest.mark.slow
def test_phi_pruned_unaligned_output_repairs_to_the_same_function(tiny_phi_dir, tmp_path):
    from gac.checkpoint.gac_dir import load
    from gac.models.groups import groups_of
    from gac.repair import repair_dir

    raw = tmp_path / "raw"
    compress(fast_config(tiny_phi_dir, compressor="prune", ratio=0.3, out=str(raw), align=False, evaluate=False,
                         compressor_options={"importance": "magnitude", "layers": "all", "head_mode": "none"}))
    widths = [g.dim for g in groups_of(load(raw).model, "mlp")]
    assert any(w % 8 for w in widths)  # the compressor's own widths are irregular
    out = repair_dir(str(raw), str(tmp_path / "fixed"), align=8, measure_latency=False)
    assert out.report["logits_check"]["argmax_identical"] and out.report["logits_check"]["max_rel_error"] < 1e-5
    assert all(g.dim % 8 == 0 for g in groups_of(load(out.out).model, "mlp"))
