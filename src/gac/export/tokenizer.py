"""The tokenizer and chat template of an exported GGUF. A model that came from a GGUF (the embedded alias, a .gguf
file, or a gac output compressed from one) gets its source's `tokenizer.*` fields copied verbatim: the same
vocabulary, merges, pre-tokenizer, special tokens and chat template. A Hugging Face model with a byte-level BPE
tokenizer.json gets them through the gguf package's vocab helpers, with llama.cpp's default pre-tokenizer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from gac.errors import GacError

log = logging.getLogger(__name__)
PREFIX = "tokenizer."


def source_gguf(spec: str) -> Path | None:
    """The GGUF a model spec's tokenizer comes from: the alias's or the file's, or, for a gac output, that of the
    model it was compressed from (gac_plan.json's source_model), when that still resolves; else None."""
    from gac.models.io import is_gac_dir, read_plan
    from gac.models.loading import gguf_of

    seen = set()
    while spec not in seen:
        seen.add(spec)
        if (gguf := gguf_of(spec)) is not None:
            return gguf
        path = Path(spec).expanduser()
        if path.is_dir() and is_gac_dir(path):
            source = read_plan(path).get("source_model")
            if not isinstance(source, str):
                return None
            spec = source
            continue
        return None
    return None


def fields_from_gguf(path: Path) -> Callable:
    """A writer step copying every `tokenizer.*` field of the GGUF at `path` with its own value types."""
    import gguf

    reader = gguf.GGUFReader(path)
    fields = {k: (f.contents(), list(f.types)) for k, f in reader.fields.items() if k.startswith(PREFIX)}
    if "tokenizer.ggml.tokens" not in fields:
        raise GacError(f"{path} has no tokenizer: export a model whose source GGUF carries one")

    def add(writer, vocab_size: int) -> None:
        n = len(fields["tokenizer.ggml.tokens"][0])
        if n != vocab_size:
            raise GacError(f"the source GGUF's tokenizer has {n} tokens but the model {vocab_size} embeddings: "
                           "export the model with its own tokenizer")
        for key, (value, types) in fields.items():
            if types[0] == gguf.GGUFValueType.ARRAY:
                writer.add_key_value(key, value, types[0], sub_type=types[-1])
            else:
                writer.add_key_value(key, value, types[0])

    return add


def fields_from_hf(directory: Path) -> Callable:
    """A writer step for a Hugging Face byte-level BPE tokenizer (tokenizer.json) in `directory`."""
    import gguf
    from gguf.vocab import BpeVocab, SpecialVocab

    try:
        vocab = BpeVocab(Path(directory))
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise GacError(f"{directory}: GGUF export carries byte-level BPE tokenizers (tokenizer.json) or a source "
                       f"GGUF's tokenizer; this one is neither ({e})") from None
    special = SpecialVocab(Path(directory), load_merges=True)

    def add(writer, vocab_size: int) -> None:
        tokens, types = [], []
        for text, _score, kind in vocab.all_tokens():
            tokens.append(text if isinstance(text, str) else text.decode("utf-8"))
            types.append(int(kind))
        if len(tokens) > vocab_size:
            raise GacError(f"the tokenizer has {len(tokens)} tokens but the model only {vocab_size} embeddings")
        for i in range(len(tokens), vocab_size):  # embedding rows past the vocabulary, as convert_hf_to_gguf pads
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        special.add_to_gguf(writer, quiet=True)

    log.info("tokenizer: %d BPE tokens from %s, llama.cpp's default pre-tokenizer", vocab.vocab_size, directory)
    return add


def tokenizer_fields(spec: str, model_dir: Path | None) -> Callable:
    """The tokenizer step for the model `spec`: its source GGUF's fields, else the HF tokenizer in `model_dir`."""
    gguf_path = source_gguf(spec)
    if gguf_path is not None:
        log.info("tokenizer and chat template copied from %s", gguf_path)
        return fields_from_gguf(gguf_path)
    if model_dir is None:
        raise GacError(f"no tokenizer to carry over for {spec!r}: export a local model directory or a GGUF")
    return fields_from_hf(model_dir)
