"""`gac quantize` of a DeciLM directory (`gac export --format deci`): the checkpoint stays DeciLM's (its config's
architecture, auto_map and blocks, gac's code files), so engines without gac load it, and gac.load reads it too."""

from __future__ import annotations

import json

import pytest
import torch

from gac.checkpoint import deci
from tests.helpers import gac_cli
from tests.helpers_quantize import FAST
from tests.helpers_tiny import tiny_tokenizer


@pytest.mark.slow
def test_a_quantized_deci_directory_keeps_its_config_and_code(tmp_path):
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import plan_record, save
    from gac.checkpoint.loading import load_model
    from gac.models import surgery
    from gac.models.groups import groups_of
    from gac.quantize.run import quantize_dir
    from gac.quantize.schemes import QuantizeConfig
    from tests.helpers_serve import serve_tiny_model

    model = serve_tiny_model()  # head_dim 32; MLP 320
    surgery.apply(model, [(g, surgery.Keep(torch.arange(w))) for g, w in zip(groups_of(model, "mlp"), (256, 288))])
    pruned = save(model, tiny_tokenizer(), tmp_path / "pruned",
                  plan=plan_record(variant="gac", source_model="tiny", alignment=32, dims={}))
    assert gac_cli("export", pruned, "--format", "deci", "--out", tmp_path / "deci", "--quiet").returncode == 0
    out = quantize_dir(tmp_path / "deci", tmp_path / "w8a8", QuantizeConfig("w8a8", method="rtn", **FAST),
                       progress=False).out
    source = json.loads((tmp_path / "deci" / "config.json").read_text())
    config = json.loads((out / "config.json").read_text())
    for key in ("architectures", "auto_map", "model_type", "block_configs"):
        assert config[key] == source[key], key
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    for name in deci.CODE_FILES:
        assert (out / name).read_bytes() == deci.code_path(name).read_bytes()
    record = json.loads((out / deci.EXPORT_FILE).read_text())
    assert record["quantization"]["scheme"] == "w8a8" and not record["engines"]["llama.cpp"]["serves"]
    ids = torch.randint(0, 320, (1, 16), generator=torch.Generator().manual_seed(0))  # [B, S]
    with torch.inference_mode():
        by_gac = load_model(str(out)).model(ids).logits
        stock = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()(ids).logits
        unquantized = load_model(str(tmp_path / "deci")).model(ids).logits
    torch.testing.assert_close(stock, by_gac)
    assert (by_gac - unquantized).abs().max() / unquantized.abs().max() < 0.05  # 8-bit weights and activations
