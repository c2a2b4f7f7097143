"""Every supported dense family (README: llama, mistral, qwen2, qwen3, granite, olmo2, phi, gemma3_text) compresses
with low-rank pairs, saves, and loads back with gac.load and with plain transformers (trust_remote_code) giving the
same logits."""

import pytest
import torch

from gac.calibration.stats import calibrate
from gac.checkpoint.gac_dir import load, save
from gac.compressors import make_compressor
from gac.models.adapters import adapter_for
from gac.models.modeling_gac import LowRankLinear
from tests.helpers_tiny import tiny_model, tiny_tokenizer

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "granite", "olmo2", "phi", "gemma3_text"]


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_round_trip(model_type, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    model = tiny_model(model_type, seed=1)
    names = adapter_for(model.config).linear_names(model.config)
    per_layer = 6 if model_type == "phi" else 7  # q k v o + gate up down (llama) or fc1 fc2 (phi)
    assert len(names) == per_layer * model.config.num_hidden_layers
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, model.config.vocab_size, (2, 16), generator=g)  # [n, seq]
    comp = make_compressor("svd")
    analyses = comp.analyze(model, comp.groups(model), calibrate(model, windows, names, progress=False), progress=False)
    ranks = {a.name: 3 + k % 5 for k, a in enumerate(analyses)}  # irregular
    structure = comp.materialize(model, analyses, ranks)
    assert structure == {"lowrank": ranks}  # read off the live model: every factorized linear, nothing else
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=g)  # [B, S]
    expected = _logits(model, ids)

    out = save(model, tiny_tokenizer(), tmp_path / "m", plan={"compressor": "svd"})
    loaded = load(out).model
    assert sum(isinstance(m, LowRankLinear) for m in loaded.modules()) == len(names)
    torch.testing.assert_close(_logits(loaded, ids), expected, atol=1e-5, rtol=0)

    plain = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert type(plain.get_submodule(names[0])).__name__ == "LowRankLinear"
    torch.testing.assert_close(_logits(plain, ids), expected, atol=1e-5, rtol=0)
