"""GGUF exports run in llama.cpp: logits match gac's own (f16), and the quantizer's fallbacks are reported with
their cause: pruned widths in the unaligned variant, none of those in gac's with the matching target, the
model's own hidden size apart; a Llama-shaped model whose hidden size is a multiple of 256 has no fallback."""

from __future__ import annotations

import pytest
import torch

from gac.checkpoint.gac_dir import LoadedModel
from gac.export.export import write_f16
from gac.export.quantize import quantize, tensor_types, type_report
from tests.helpers_deci import deci_model
from tests.helpers_export import MAX_REL_ERROR, pruned_variants, round_trip

ROUND_TRIP_TOKENS = 128


def _export(model, tokenizer, source, path):
    """(f16 report, geometry, path): the model as an f16 GGUF at `path`."""
    geo = write_f16(LoadedModel(model, tokenizer, source), path)
    return type_report(tensor_types(path, [], geo), "f16"), geo, path


def _quantize(f16_export, type_):
    """The type report of the f16 export quantized to `type_` beside it."""
    _, geo, f16 = f16_export
    out = f16.with_name(f"{f16.stem}-{type_}.gguf")
    fallbacks = quantize(f16, out, type_, threads=2)
    return type_report(tensor_types(out, fallbacks, geo), type_)


def _names(report, cause):
    return {f["name"] for f in report["fallbacks"] if f["cause"] == cause}


# --- a tiny deci model with a Hugging Face tokenizer ---------------------------------------------------------


def test_tiny_deci_gguf_runs_in_llama_cpp_with_gacs_logits(llama_cpp, tiny, tiny_model_dir, tmp_path):
    model = deci_model(tiny)
    from gac.checkpoint.loading import load_model

    tokenizer = load_model(str(tiny_model_dir)).tokenizer
    report, geo, path = _export(model, tokenizer, str(tiny_model_dir), tmp_path / "deci.gguf")
    assert geo.arch == "deci"
    tokens = tokenizer("def f(x): return x + 1  # a tiny test")["input_ids"][:24]
    rel, same = round_trip(path, model, tokens)
    assert rel < MAX_REL_ERROR and same >= 0.99, (rel, same)


# --- the embedded SmolLM2-135M: baseline, unaligned prune, gac prune at ratio 0.15 ---------------------------


@pytest.fixture(scope="module")
def smollm(llama_cpp, tmp_path_factory):
    """The embedded model, its pruned variants (ratio 0.15, one analysis), f16 exports of each."""
    from gac.calibration.texts import TextConfig, load_windows
    from gac.checkpoint.loading import load_model

    loaded = load_model("smollm2-135m")
    calib, held_out = load_windows(loaded.tokenizer, TextConfig(seq_len=128, calib_windows=2, eval_windows=1))
    models = {"baseline": loaded.model, **pruned_variants(loaded.model, calib, ratio=0.15, layers=None,
                                                          targets=("llama.cpp:q4_k_m", "llama.cpp:q8_0"))}
    d = tmp_path_factory.mktemp("smollm-gguf")
    exports = {name: _export(m, loaded.tokenizer, "smollm2-135m", d / f"{name.replace(':', '-')}.gguf")
               for name, m in models.items()}
    return {"models": models, "exports": exports, "tokens": held_out[0, :ROUND_TRIP_TOKENS].tolist()}


@pytest.mark.integration
@pytest.mark.parametrize("variant", ["baseline", "unaligned", "gac:llama.cpp:q4_k_m"])
def test_embedded_round_trip_f16_logits_match_gac(smollm, variant):
    import gguf

    report, geo, path = smollm["exports"][variant]
    rel, same = round_trip(path, smollm["models"][variant], smollm["tokens"])
    assert rel < MAX_REL_ERROR and same >= 0.99, (variant, rel, same)
    r = gguf.GGUFReader(path)  # metadata and per-layer shapes as written
    arch = r.fields["general.architecture"].contents()
    assert arch == geo.arch == ("llama" if variant == "baseline" else "deci")
    ff = r.fields[f"{arch}.feed_forward_length"].contents()
    assert (ff if isinstance(ff, list) else [ff] * len(geo.ff)) == list(geo.ff)
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    for i, width in enumerate(geo.ff):
        assert shapes[f"blk.{i}.ffn_down.weight"] == [width, 576]
        assert shapes[f"blk.{i}.attn_output.weight"] == [geo.heads[i] * 64, 576]
    assert r.fields["tokenizer.chat_template"].contents().startswith("{%")  # carried from the source GGUF
    assert report["fallbacks"] == []


@pytest.mark.integration
@pytest.mark.parametrize("type_", ["q8_0", "q4_k_m"])
def test_embedded_quantized_fallbacks_by_cause(smollm, type_):
    block = {"q8_0": 32, "q4_k_m": 256}[type_]
    reports = {name: _quantize(smollm["exports"][name], type_)
               for name in ("baseline", "unaligned", f"gac:llama.cpp:{type_}")}
    unaligned, gac, base = reports["unaligned"], reports[f"gac:llama.cpp:{type_}"], reports["baseline"]
    pruned = [f for f in unaligned["fallbacks"] if f["cause"] == "pruned width"]
    assert pruned, "the unaligned widths should not all be multiples of the block"
    for f in pruned:  # each listed with the type it wanted and the one it got
        assert f["row_length"] % block and f["type"] != f["wanted"]
        assert f["name"].endswith(("ffn_down.weight", "attn_output.weight"))
    assert _names(gac, "pruned width") == set()
    assert _names(base, "pruned width") == set()
    assert _names(gac, "hidden size") == _names(base, "hidden size")  # 576: the same in every variant
    assert _names(unaligned, "hidden size") <= _names(base, "hidden size")
    if type_ == "q4_k_m":
        assert _names(base, "hidden size"), "576 is not a multiple of 256: K-quant rows of 576 fall back"
    else:
        assert gac["fallbacks"] == []  # 576 = 18 x 32


# --- a random Llama-shaped model whose hidden size is a multiple of 256 --------------------------------------


def test_hidden_multiple_of_256_gac_has_no_fallback_at_q4_k_m(llama_cpp, tiny_model_dir, tmp_path):
    import transformers

    from gac.calibration.texts import TextConfig, load_windows
    from gac.checkpoint.loading import load_model

    tokenizer = load_model(str(tiny_model_dir)).tokenizer
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=768, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                                      max_position_embeddings=256, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    calib, _ = load_windows(tokenizer, TextConfig(seq_len=64, calib_windows=2, eval_windows=1))
    variants = pruned_variants(model, calib, ratio=0.15, targets=("llama.cpp:q4_k_m",))
    reports = {name: _quantize(_export(m, tokenizer, str(tiny_model_dir), tmp_path / f"{name.replace(':', '-')}.gguf"),
                               "q4_k_m") for name, m in variants.items()}
    assert reports["gac:llama.cpp:q4_k_m"]["fallbacks"] == []
    assert "Q4_K" in reports["gac:llama.cpp:q4_k_m"]["types"]
    assert _names(reports["unaligned"], "pruned width")  # taylor's own widths are not multiples of 256
    assert _names(reports["unaligned"], "hidden size") == set()
