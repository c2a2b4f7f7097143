"""A GGUF's tokenizer, converted by transformers, is checked against the file and llama.cpp before any work: tiny
byte-level BPE and SentencePiece-style vocabularies, each with BOS on and off, tokenize as llama.cpp tokenizes them
(the special tokens and the BOS flag repaired where transformers' conversion differs, and kept by the saved tokenizer);
a conversion that splits text otherwise is refused in one line."""

from __future__ import annotations

import json

import pytest

from gac.checkpoint.gguf_tokenizer import PROBE, GgufTokenizerFlags, check_tokenizer
from gac.errors import GacError
from gac.export.tokenizer import fields_from_hf
from tests.helpers import sentencepiece_bpe_tokenizer
from tests.helpers_tiny import tiny_tokenizer


def _vocab_gguf(tokenizer, directory, *, add_bos: bool):
    """A GGUF holding only `tokenizer` (as gac's export writes it) and llama's architecture name, its BOS flag set."""
    import gguf

    tokenizer.save_pretrained(directory)
    path = directory / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    fields_from_hf(directory)(writer, len(tokenizer))
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama_cpp_ids(llama_cpp, path, text):
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        return list(llm.tokenize(text.encode(), add_bos=True, special=False))
    finally:
        llm.close()


TOKENIZERS = {"bpe": tiny_tokenizer, "sentencepiece": sentencepiece_bpe_tokenizer}


@pytest.mark.parametrize("add_bos", [True, False])
@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_converted_tokenizer_tokenizes_as_llama_cpp_and_keeps_the_bos_flag(llama_cpp, tmp_path, kind, add_bos):
    from transformers import AutoTokenizer

    path = _vocab_gguf(TOKENIZERS[kind](), tmp_path, add_bos=add_bos)
    tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    check_tokenizer(tok, path, "vocab.gguf")
    want = _llama_cpp_ids(llama_cpp, path, PROBE)
    assert (want[0] == tok.bos_token_id) is add_bos  # llama.cpp follows the file's flag
    assert tok(PROBE)["input_ids"] == want
    saved = tmp_path / "saved"
    tok.save_pretrained(saved)  # what gac writes beside a compressed model: vLLM and transformers read it next
    assert AutoTokenizer.from_pretrained(saved)(PROBE)["input_ids"] == want


def _with_fewer_merges(tok, keep: float = 0.5):
    """`tok` with the later half of its BPE merges dropped: the same vocabulary and special tokens, other splits
    (what a wrong conversion of a GGUF's merges or scores gives)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    state = json.loads(tok.backend_tokenizer.to_str())
    merges = state["model"]["merges"]
    state["model"]["merges"] = merges[: int(len(merges) * keep)]
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)),
        bos_token=tok.bos_token,
        eos_token=tok.eos_token,
        unk_token=tok.unk_token,
        add_bos_token=tok.add_bos_token,
    )


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_a_conversion_that_splits_otherwise_is_one_line(llama_cpp, tmp_path, kind):
    from transformers import AutoTokenizer

    path = _vocab_gguf(TOKENIZERS[kind](), tmp_path, add_bos=True)
    wrong = _with_fewer_merges(AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name))
    with pytest.raises(GacError, match=r"splits text unlike llama\.cpp .*first difference at token \d+.*"
                                       r"Hugging Face directory") as e:
        check_tokenizer(wrong, path, "vocab.gguf")
    assert "\n" not in str(e.value)


def test_other_special_tokens_are_set_to_the_files(llama_cpp, tmp_path):
    """A conversion that chose another BOS or EOS token (by id, in the same vocabulary) is repaired exactly."""
    from transformers import AutoTokenizer

    source = sentencepiece_bpe_tokenizer()
    path = _vocab_gguf(source, tmp_path, add_bos=True)
    tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    tok.bos_token, tok.eos_token = "<unk>", "<pad>"
    check_tokenizer(tok, path, "vocab.gguf")
    assert (tok.bos_token_id, tok.eos_token_id) == (source.bos_token_id, source.eos_token_id)
    assert tok(PROBE)["input_ids"] == _llama_cpp_ids(llama_cpp, path, PROBE)


def test_without_llama_cpp_the_metadata_still_sets_the_flag(tmp_path, monkeypatch):
    """Where llama.cpp's bindings are missing, the file's own metadata (read by the gguf package) still repairs the
    BOS flag."""
    import sys

    from transformers import AutoTokenizer

    path = _vocab_gguf(sentencepiece_bpe_tokenizer(), tmp_path, add_bos=True)
    tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    tok.add_bos_token = False  # as transformers' conversion drops it in some releases
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails: not installed
    check_tokenizer(tok, path, "vocab.gguf")
    assert tok(PROBE)["input_ids"][0] == tok.bos_token_id


@pytest.mark.parametrize(
    ("meta", "add_bos", "add_eos"),
    [
        ({"tokenizer.ggml.model": "llama"}, True, False),  # llama.cpp's defaults for a SentencePiece vocabulary
        ({"tokenizer.ggml.model": "gpt2"}, False, False),
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.add_bos_token": "false"}, False, False),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.add_bos_token": True,
          "tokenizer.ggml.add_eos_token": "true"}, True, True),
    ],
)
def test_flags_read_as_llama_cpp_reads_them(meta, add_bos, add_eos):
    flags = GgufTokenizerFlags.from_metadata(meta)
    assert (flags.add_bos, flags.add_eos) == (add_bos, add_eos)


def test_a_gguf_model_loads_with_the_files_tokenizer_or_not_at_all(llama_cpp, tmp_path, monkeypatch):
    """gac's loader runs the check on a .gguf before any weight is read: the tiny model written as a GGUF loads
    with a tokenizer that splits as llama.cpp does; the same file under a conversion that splits otherwise is one
    line, and no model is built."""
    import transformers

    from gac.checkpoint.loading import load_model
    from gac.export.gguf_writer import write_gguf
    from tests.helpers_tiny import tiny_model

    tiny_tokenizer().save_pretrained(tmp_path)
    path = tmp_path / "tiny.gguf"
    write_gguf(tiny_model("llama"), path, tokenizer_fields=fields_from_hf(tmp_path), name="tiny")
    loaded = load_model(str(path))
    assert loaded.tokenizer(PROBE)["input_ids"] == _llama_cpp_ids(llama_cpp, path, PROBE)

    convert = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **kw: _with_fewer_merges(convert(*a, **kw)))
    built = []
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **kw: built.append(a))
    with pytest.raises(GacError, match=r"splits text unlike llama\.cpp") as e:
        load_model(str(path))
    assert "\n" not in str(e.value) and built == []
