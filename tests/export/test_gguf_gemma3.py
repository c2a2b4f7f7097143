"""Gemma 3 as llama.cpp's `gemma3` architecture: pruned tiny models (text, and a multimodal checkpoint's language
model) run in llama.cpp with gac's logits, past the sliding window, with norms stored as w + 1, q/k rows as they
are and a rope base per layer type; what llama.cpp's gemma3 cannot hold (per-layer heads, per-layer MLP widths
unless zero-padded, other query scales or softcaps) is one line and nothing written; a SentencePiece-style BPE
tokenizer (Gemma's) splits text in llama.cpp as in transformers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gac.errors import GacError
from gac.export.gguf_writer import write_gguf
from gac.export.tokenizer import fields_from_hf
from gac.models.groups import groups_of
from gac.models.surgery import Keep, KeepHeads
from tests.helpers import assert_names_a_fix, assert_one_error_line, run_gac, sentencepiece_bpe_tokenizer
from tests.helpers_tiny import FAMILY_EXTRA, TINY, save_tiny, tiny_gemma3_multimodal, tiny_tokenizer

MAX_REL_ERROR = 1e-2  # max |difference| / max |logit|, f16 weights against gac's fp32 (measured ~2e-3)
# rope bases apart from llama.cpp's defaults, so a base written to the wrong layer type (or not at all) shows
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
        "full_attention": {"rope_type": "default", "rope_theta": 20000.0}}
TOKENS = list(range(3, 3 + 24))  # three times the sliding window (8)


def _config(**overrides):
    import transformers

    return transformers.Gemma3TextConfig(**{**TINY, **FAMILY_EXTRA["gemma3_text"], "rope_parameters": ROPE,
                                            **overrides})


def _randomize_norms(model):
    """Gemma initializes its norms at w = 0 (a gain of 1 + w = 1): random ones make a missing shift show."""
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.normal_(0.0, 0.3)
    return model


def _gemma3(**overrides):
    import transformers

    torch.manual_seed(0)
    return _randomize_norms(transformers.AutoModelForCausalLM.from_config(_config(**overrides)).eval())


def _cut(model, *, mlp=(96, 96), heads=True):
    """Layer i's MLP cut to mlp[i] channels; with heads, KV group 0 and its query heads removed in every layer."""
    for group, width in zip(groups_of(model, "mlp"), mlp, strict=True):
        group.cut(model, Keep(torch.arange(width)))
    if heads:
        for group in groups_of(model, "heads"):
            group.cut(model, KeepHeads(torch.tensor([2, 3]), torch.tensor([1])))
    return model


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-tokenizer")
    tiny_tokenizer().save_pretrained(d)
    return d


def _write(model, tok_dir, path, **kw):
    return write_gguf(model, path, tokenizer_fields=fields_from_hf(tok_dir), name="tiny-gemma3", **kw)


def _round_trip(path, model, tokens=TOKENS):
    from gac.export.engine import logits, open_gguf

    with open_gguf(path) as llm:
        got = logits(llm, tokens)  # [S, V]
    with torch.inference_mode():
        ref = model(torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()
    return float(np.abs(got - ref).max() / np.abs(ref).max()), float((got.argmax(-1) == ref.argmax(-1)).mean())


def test_gemma3_metadata_norms_and_shapes_as_llama_cpp_reads_them(tok_dir, tmp_path):
    import gguf

    model = _cut(_gemma3())
    geo = _write(model, tok_dir, tmp_path / "g.gguf")
    assert geo.arch == "gemma3" and geo.ff == (96, 96) and geo.heads == (2, 2) and geo.kv_heads == (1, 1)
    r = gguf.GGUFReader(tmp_path / "g.gguf")
    field = {k: f.contents() for k, f in r.fields.items()}
    assert field["general.architecture"] == "gemma3"
    assert field["gemma3.feed_forward_length"] == 96 and field["gemma3.attention.head_count"] == 2
    assert field["gemma3.attention.head_count_kv"] == 1 and field["gemma3.attention.key_length"] == 16
    assert field["gemma3.attention.sliding_window"] == 8
    assert field["gemma3.attention.sliding_window_pattern"] == [True, False]  # the config's layer_types
    assert field["gemma3.rope.freq_base"] == 20000.0 and field["gemma3.rope.freq_base_swa"] == 500.0
    tensors = {t.name: t for t in r.tensors}
    layer = model.model.layers[0]
    norms = {"attn_norm": layer.input_layernorm, "attn_q_norm": layer.self_attn.q_norm,
             "attn_k_norm": layer.self_attn.k_norm, "post_attention_norm": layer.post_attention_layernorm,
             "ffn_norm": layer.pre_feedforward_layernorm, "post_ffw_norm": layer.post_feedforward_layernorm}
    for name, module in norms.items():
        np.testing.assert_allclose(np.asarray(tensors[f"blk.0.{name}.weight"].data),
                                   module.weight.detach().numpy() + 1.0, rtol=1e-6)  # Gemma's (1 + w)
    q = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(32, 64)
    np.testing.assert_array_equal(q, layer.self_attn.q_proj.weight.detach().numpy().astype(np.float16))  # neox: as is
    assert [int(x) for x in tensors["blk.1.ffn_down.weight"].shape] == [96, 64]
    assert "output.weight" not in tensors  # tied: llama.cpp reuses token_embd


def test_pruned_gemma3_runs_in_llama_cpp_with_gacs_logits(llama_cpp, tok_dir, tmp_path):
    model = _cut(_gemma3())
    _write(model, tok_dir, tmp_path / "g.gguf")
    rel, same = _round_trip(tmp_path / "g.gguf", model)
    assert rel < MAX_REL_ERROR and same == 1.0, (rel, same)


def test_linear_rope_on_global_layers_runs_in_llama_cpp(llama_cpp, tok_dir, tmp_path):
    """Gemma 3 4B and larger scale the global layers' positions (linear, factor 8); the sliding ones not."""
    rope = {**ROPE, "full_attention": {"rope_type": "linear", "rope_theta": 20000.0, "factor": 8.0}}
    model = _cut(_gemma3(rope_parameters=rope))
    _write(model, tok_dir, tmp_path / "g.gguf")
    rel, same = _round_trip(tmp_path / "g.gguf", model)
    assert rel < MAX_REL_ERROR and same == 1.0, (rel, same)


def test_per_layer_mlp_widths_are_refused_or_zero_padded(llama_cpp, tok_dir, tmp_path):
    """llama.cpp's gemma3 loader makes every layer's MLP at the first layer's width: different widths are one
    line, or with pad_mlp every layer at the widest with zero channels, which computes the same."""
    model = _cut(_gemma3(), mlp=(96, 40), heads=False)
    with pytest.raises(GacError, match="one MLP width") as e:
        _write(model, tok_dir, tmp_path / "no.gguf")
    assert_names_a_fix(str(e.value))
    assert not (tmp_path / "no.gguf").exists()
    geo = _write(model, tok_dir, tmp_path / "g.gguf", pad_mlp=True)
    assert geo.ff == (96, 96) and geo.model_ff == (96, 40)
    rel, same = _round_trip(tmp_path / "g.gguf", model)
    assert rel < MAX_REL_ERROR and same == 1.0, (rel, same)


def _one_layer_heads_cut():
    model = _gemma3()
    groups_of(model, "heads")[1].cut(model, KeepHeads(torch.tensor([2, 3]), torch.tensor([1])))
    return model


@pytest.mark.parametrize("case", ["heads", "query scale", "no sliding layer", "softcap", "activation", "rope"])
def test_what_llama_cpps_gemma3_cannot_hold_is_one_line(tok_dir, tmp_path, case):
    make = {
        "heads": _one_layer_heads_cut,  # llama.cpp makes every layer's q/k/v at the first layer's head counts
        "query scale": lambda: _gemma3(query_pre_attn_scalar=32),  # llama.cpp: 1/sqrt(head_dim)
        "no sliding layer": lambda: _gemma3(layer_types=["full_attention"] * 2),  # llama.cpp aborts on it
        "softcap": lambda: _gemma3(final_logit_softcapping=30.0),
        "activation": lambda: _gemma3(hidden_activation="gelu"),  # erf GELU; llama.cpp's is tanh
        "rope": lambda: _gemma3(rope_parameters={**ROPE, "full_attention": {
            "rope_type": "yarn", "rope_theta": 20000.0, "factor": 4.0, "original_max_position_embeddings": 64}}),
    }
    expected = {"heads": "same head counts", "query scale": "scales queries", "no sliding layer": "sliding-window",
                "softcap": "softcapping", "activation": "GELU", "rope": "rope"}
    with pytest.raises(GacError, match=expected[case]) as e:
        _write(make[case](), tok_dir, tmp_path / "x.gguf")
    assert_names_a_fix(str(e.value))
    assert not (tmp_path / "x.gguf").exists()


# --- gac outputs: compressed by `gac compress`, exported by `gac export` ---------------------------------------


@pytest.fixture(scope="module")
def gemma3_text_dir(tmp_path_factory):
    return save_tiny(_gemma3(), tmp_path_factory.mktemp("tiny-gemma3-text"))


def test_gac_prune_output_exports_and_runs_in_llama_cpp(llama_cpp, gemma3_text_dir, tmp_path):
    """The CLI end to end: gac compress (prune, every layer, MLP channels) -> gac export -> llama.cpp, whose
    logits match gac.load's; per-layer widths are refused in one line until --pad-mlp."""
    from gac.checkpoint.gac_dir import load

    out = tmp_path / "pruned"
    p = run_gac("compress", "--model", gemma3_text_dir, "--compressor", "prune", "--ratio", "0.3", "--out", out,
                "--prune-layers", "all", "--head-mode", "none", "--seq-len", "32", "--calib-windows", "4",
                "--no-eval", "--quiet")
    assert p.returncode == 0, p.stderr
    widths = [w for w in json.loads((out / "report.json").read_text())["dims"]["gac"].values() if w is not None]
    gguf_out, report = tmp_path / "g.gguf", tmp_path / "g.json"
    args = ("export", out, "--out", gguf_out, "--report", report, "--quiet")
    if len(set(widths)) > 1:
        assert_one_error_line(run_gac(*args), "one MLP width")
        assert not gguf_out.exists()
    p = run_gac(*args, "--pad-mlp")
    assert p.returncode == 0, p.stderr
    assert "gemma3 GGUF, f16" in p.stdout
    r = json.loads(report.read_text())
    assert r["ff"] == [max(widths)] * 2 and r.get("model_ff", r["ff"]) == widths
    rel, same = _round_trip(gguf_out, load(out).model)
    assert rel < MAX_REL_ERROR and same == 1.0, (rel, same)


def test_multimodal_gemma3s_language_model_runs_in_llama_cpp(llama_cpp, tmp_path):
    """A multimodal checkpoint (layers under model.language_model) compressed by gac: its language model is written
    as gemma3, as llama.cpp's converter writes it (the vision tower belongs in an mmproj file, not written here)."""
    import gguf

    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig
    from gac.checkpoint.gac_dir import load
    from gac.export.export import write_f16

    src, out = tmp_path / "mm", tmp_path / "mm-pruned"
    _randomize_norms(tiny_gemma3_multimodal()).save_pretrained(src)
    tiny_tokenizer().save_pretrained(src)
    compress(CompressConfig(model=str(src), compressor="prune", ratio=0.3, out=str(out), evaluate=False,
                            progress=False, compressor_options={"layers": "all", "head_mode": "none"},
                            text=TextConfig(seq_len=32, calib_windows=2, eval_windows=1)))
    loaded = load(out)
    geo = write_f16(loaded, tmp_path / "mm.gguf", pad_mlp=True)
    assert geo.arch == "gemma3"
    names = {t.name for t in gguf.GGUFReader(tmp_path / "mm.gguf").tensors}
    assert all(n.startswith(("blk.", "token_embd", "output_norm")) for n in names), names  # no vision tensor
    rel, same = _round_trip(tmp_path / "mm.gguf", loaded.model)
    assert rel < MAX_REL_ERROR and same == 1.0, (rel, same)


# --- Gemma's tokenizer: SentencePiece-style BPE with byte fallback ---------------------------------------------


def test_sentencepiece_bpe_tokenizer_splits_as_transformers_in_llama_cpp(llama_cpp, tmp_path):
    import gguf
    from pydoc_data.topics import topics

    hf = sentencepiece_bpe_tokenizer()
    hf.save_pretrained(tmp_path)
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    fields_from_hf(tmp_path)(w, len(hf))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    field = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()}
    assert field["tokenizer.ggml.model"] == "llama" and field["tokenizer.ggml.add_space_prefix"] is False
    assert field["tokenizer.ggml.token_type"][hf.convert_tokens_to_ids("<0x41>")] == int(gguf.TokenType.BYTE)
    texts = [topics[k] for k in sorted(topics)[40:60]] + ["naïve café — 日本語 🤖", "  two  spaces\n\nand lines"]
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        got = [llm.tokenize(t.encode(), add_bos=False, special=False) for t in texts]
    finally:
        llm.close()
    want = [hf(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b] == []
    assert any(hf.convert_tokens_to_ids("<0xC3>") in ids for ids in want)  # the byte fallback was exercised
