"""Gemma 3 (text): Llama's projection names, but a per-head q/k norm, head_dim apart from hidden / heads, its own
query scale, sliding-window layers and a scaled embedding. Added through its adapter line only: prune (heads and MLP
channels) and a low-rank compressor compress it aligned within budget, and the output round-trips through gac.load and
transformers with the same logits; a multimodal checkpoint (text under text_config, layers under
model.language_model) compresses its language model."""

import pytest
import torch

from gac.api import compress
from tests.helpers_compress import fast_config
from tests.helpers_tiny import save_tiny, tiny_gemma3_multimodal, tiny_model


@pytest.fixture(scope="module", params=["gemma3_text", "gemma3"])
def tiny_gemma3_dir(request, tmp_path_factory):
    model = tiny_model("gemma3_text") if request.param == "gemma3_text" else tiny_gemma3_multimodal()
    return save_tiny(model, tmp_path_factory.mktemp(f"tiny-{request.param}"))


@pytest.mark.slow
@pytest.mark.parametrize("compressor,options", [("prune", {"layers": "all"}), ("asvd", {"importance": "magnitude"})])
def test_gemma3_compresses_aligned_and_round_trips(tiny_gemma3_dir, tmp_path, monkeypatch, compressor, options):
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import load

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    out = tmp_path / "out"
    result = compress(fast_config(tiny_gemma3_dir, compressor=compressor, ratio=0.3, out=str(out), evaluate=False,
                                  compressor_options=options))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"]
    assert r["variants"]["gac"]["aligned_fraction"] == 1.0 and any(d is not None for d in r["dims"]["gac"].values())
    layers = "model.language_model.layers." if "language_model" in next(iter(r["dims"]["gac"])) else "model.layers."
    assert all(n.startswith(layers) for n in r["dims"]["gac"])  # the language model's layers, never the vision tower
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))  # longer than the window
    with torch.inference_mode():
        want = result.models["gac"](ids, use_cache=False).logits
        for model in (load(out).model, AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()):
            assert torch.equal(model(ids, use_cache=False).logits, want)
