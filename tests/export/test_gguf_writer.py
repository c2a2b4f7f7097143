"""The GGUF writer on tiny random models (no llama.cpp needed): architecture, metadata and per-layer shapes read
back with the gguf reader as written, the rope permutation, the tokenizer, and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gac.errors import GacError
from gac.export.gguf_writer import geometry, permute_rotary, write_gguf
from gac.export.tokenizer import fields_from_hf
from gac.models.groups import groups_of
from tests.helpers_deci import deci_model


def _field(reader, key):
    return reader.fields[key].contents()


def _write(model, tokenizer_dir, path):
    return write_gguf(model, path, tokenizer_fields=fields_from_hf(tokenizer_dir), name="tiny")


def test_uniform_model_is_a_llama_gguf_with_its_metadata_and_shapes(tiny, tiny_model_dir, tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    geo = _write(tiny, tiny_model_dir, path)
    r = gguf.GGUFReader(path)
    assert geo.arch == "llama" and _field(r, "general.architecture") == "llama"
    c = tiny.config
    assert _field(r, "llama.block_count") == c.num_hidden_layers
    assert _field(r, "llama.embedding_length") == c.hidden_size
    assert _field(r, "llama.feed_forward_length") == c.intermediate_size
    assert _field(r, "llama.attention.head_count") == c.num_attention_heads
    assert _field(r, "llama.attention.head_count_kv") == c.num_key_value_heads
    assert _field(r, "llama.context_length") == c.max_position_embeddings
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}  # ggml order: row length first
    assert shapes["blk.0.ffn_down.weight"] == [c.intermediate_size, c.hidden_size]
    assert shapes["blk.1.attn_k.weight"] == [c.hidden_size, c.num_key_value_heads * 16]
    assert "output.weight" not in shapes  # tied: llama.cpp reuses token_embd
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.attn_q.weight"] == "F16" and types["blk.0.attn_norm.weight"] == "F32"
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == c.vocab_size and _field(r, "tokenizer.ggml.model") == "gpt2"
    assert _field(r, "tokenizer.ggml.merges")  # byte-level BPE needs its merges


def test_per_layer_widths_and_heads_make_a_deci_gguf(tiny, tiny_model_dir, tmp_path):
    import gguf

    model = deci_model(tiny)
    path = tmp_path / "deci.gguf"
    geo = _write(model, tiny_model_dir, path)
    assert geo.arch == "deci" and geo.ff == (100, 160) and geo.heads == (4, 2) and geo.kv_heads == (2, 1)
    r = gguf.GGUFReader(path)
    assert _field(r, "general.architecture") == "deci"
    assert _field(r, "deci.feed_forward_length") == [100, 160]
    assert _field(r, "deci.attention.head_count") == [4, 2]
    assert _field(r, "deci.attention.head_count_kv") == [2, 1]
    assert _field(r, "deci.attention.key_length") == 16
    shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}
    assert shapes["blk.0.ffn_down.weight"] == [100, 64] and shapes["blk.0.ffn_gate.weight"] == [64, 100]
    assert shapes["blk.1.attn_q.weight"] == [64, 32] and shapes["blk.1.attn_output.weight"] == [32, 64]
    assert shapes["blk.1.attn_k.weight"] == [64, 16]
    down = next(t for t in r.tensors if t.name == "blk.0.ffn_down.weight")
    expected = model.model.layers[0].mlp.down_proj.weight.detach().numpy().astype(np.float16)  # [out, in]
    np.testing.assert_array_equal(np.asarray(down.data).reshape(expected.shape), expected)


def test_rotary_permutation_is_per_head_and_interleaves_halves():
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of head_dim 8, 3 inputs
    p = permute_rotary(w, 2)
    assert sorted(p[:8, 0].tolist()) == sorted(w[:8, 0].tolist())  # rows stay within their head
    np.testing.assert_array_equal(p[0], w[0])
    np.testing.assert_array_equal(p[1], w[4])  # pair (i, i + hd/2) becomes adjacent rows (2i, 2i + 1)
    np.testing.assert_array_equal(p[3], w[5])


def test_geometry_reads_the_live_model_not_the_config(tiny):
    model = deci_model(tiny)
    geo = geometry(model)
    assert geo.original_ff == 160 and model.config.intermediate_size == 160
    assert geo.original_row_length("blk.0.ffn_down.weight") == 160
    assert geo.original_row_length("blk.1.attn_output.weight") == 64
    assert geo.original_row_length("blk.0.attn_q.weight") == 64


def test_low_rank_model_is_refused(tiny, tiny_model_dir, tmp_path):
    from gac.models.surgery import factorize

    name = groups_of(tiny, "rank")[0].linear  # the first layer's q projection, [64, 64]
    factorize(tiny, name, torch.randn(8, 64), torch.randn(64, 8))  # A [r, in], B [out, r]
    with pytest.raises(GacError, match="low-rank"):
        _write(tiny, tiny_model_dir, tmp_path / "x.gguf")


def test_family_llama_cpp_cannot_run_is_refused(tiny_phi_dir, tmp_path):
    from gac.checkpoint.loading import load_model

    model = load_model(str(tiny_phi_dir)).model
    with pytest.raises(GacError, match="GGUF export supports"):
        write_gguf(model, tmp_path / "x.gguf", tokenizer_fields=lambda w, n: None, name="phi")
