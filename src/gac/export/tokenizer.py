"""The tokenizer and chat template of an exported GGUF. A model that came from a GGUF (the embedded alias, a .gguf
file, or a gac output compressed from one) gets its source's `tokenizer.*` fields copied verbatim: the same
vocabulary, merges, pre-tokenizer, special tokens and chat template. A Hugging Face model's tokenizer.json gets them
through the gguf package's vocab helpers: a byte-level BPE (GPT-2 style) as llama.cpp's `gpt2` tokenizer with its
default pre-tokenizer, a SentencePiece-style BPE with byte fallback (Llama 2, Gemma) as its `llama` tokenizer."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gac.checkpoint.deci import is_deci_dir, read_record
from gac.checkpoint.gac_dir import is_gac_dir, read_plan
from gac.checkpoint.loading import gguf_of
from gac.errors import GacError

if TYPE_CHECKING:
    from gguf import GGUFWriter

# a writer step: adds the tokenizer and chat template to a GGUF of `vocab_size` embeddings
TokenizerStep = Callable[["GGUFWriter", int], None]

log = logging.getLogger(__name__)
PREFIX = "tokenizer."


def source_gguf(spec: str) -> Path | None:
    """The GGUF a model spec's tokenizer comes from: the alias's or the file's, or, for a gac output, that of the
    model it was compressed from (gac_plan.json's source_model), for a DeciLM export that of the model it was
    exported from (gac_export.json), when that still resolves; else None."""
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
        if path.is_dir() and is_deci_dir(path):
            record = read_record(path)
            source = (record.get("source_plan") or {}).get("source_model") or record.get("source")
            if not isinstance(source, str):
                return None
            spec = source
            continue
        return None
    return None


def fields_from_gguf(path: Path) -> TokenizerStep:
    """A writer step copying every `tokenizer.*` field of the GGUF at `path` with its own value types."""
    import gguf

    reader = gguf.GGUFReader(path)
    fields = {k: (f.contents(), list(f.types)) for k, f in reader.fields.items() if k.startswith(PREFIX)}
    if "tokenizer.ggml.tokens" not in fields:
        raise GacError(f"{path} has no tokenizer: export a model whose source GGUF carries one")

    def add(writer: GGUFWriter, vocab_size: int) -> None:
        n = len(fields["tokenizer.ggml.tokens"][0])
        if n != vocab_size:
            raise GacError(
                f"the source GGUF's tokenizer has {n} tokens but the model {vocab_size} embeddings: "
                "export the model with its own tokenizer"
            )
        for key, (value, types) in fields.items():
            if types[0] == gguf.GGUFValueType.ARRAY:
                writer.add_key_value(key, value, types[0], sub_type=types[-1])
            else:
                writer.add_key_value(key, value, types[0])

    return add


def fields_from_hf(directory: Path) -> TokenizerStep:
    """A writer step for the Hugging Face tokenizer (tokenizer.json) in `directory`: byte-level BPE, or
    SentencePiece-style BPE with byte fallback; any other is one line."""
    import gguf
    from gguf.vocab import BpeVocab, LlamaHfVocab, SpecialVocab

    directory = Path(directory)
    vocab: BpeVocab | LlamaHfVocab
    try:
        vocab, model = BpeVocab(directory), "gpt2"
    except FileNotFoundError:  # no tokenizer.json, or not a byte-level one
        try:
            vocab, model = LlamaHfVocab(directory), "llama"
        except (FileNotFoundError, TypeError, ValueError, KeyError, OSError) as e:
            raise GacError(_unsupported(directory, e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise GacError(_unsupported(directory, e)) from None
    special = SpecialVocab(directory, load_merges=model == "gpt2")
    spm = _sentencepiece_fields(directory) if model == "llama" else None

    def add(writer: GGUFWriter, vocab_size: int) -> None:
        tokens, scores, types = [], [], []
        for text, score, kind in vocab.all_tokens():
            tokens.append(text if isinstance(text, str) else text.decode("utf-8"))
            scores.append(score)
            types.append(int(kind))
        if len(tokens) > vocab_size:
            raise GacError(f"the tokenizer has {len(tokens)} tokens but the model only {vocab_size} embeddings")
        if spm is not None:
            scores, types = spm(tokens, types)
        for i in range(len(tokens), vocab_size):  # embedding rows past the vocabulary, as convert_hf_to_gguf pads
            tokens.append(f"[PAD{i}]")
            scores.append(-1000.0)
            types.append(int(gguf.TokenType.UNUSED))
        writer.add_tokenizer_model(model)
        writer.add_tokenizer_pre(_pre_tokenizer(directory) if model == "gpt2" else "default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        if spm is not None:
            writer.add_token_scores(scores)
            writer.add_add_space_prefix(_adds_space_prefix(directory))
        special.add_to_gguf(writer, quiet=True)

    log.info(
        "tokenizer: %d %s tokens from %s, llama.cpp's %r tokenizer",
        vocab.vocab_size,
        "byte-level BPE" if model == "gpt2" else "SentencePiece-style BPE",
        directory,
        model,
    )
    return add


def _pre_tokenizer(directory: Path) -> str:
    """llama.cpp's name for a byte-level BPE's pre-tokenizer: GPT-2's regex (a ByteLevel step that splits), whose
    runs of spaces llama.cpp's `default` splits otherwise; `default` for any other."""
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    return "gpt-2" if spec.get("type") == "ByteLevel" and spec.get("use_regex", True) else "default"


def _unsupported(directory: Path, e: Exception) -> str:
    return (
        f"{directory}: GGUF export carries BPE tokenizers (tokenizer.json: byte-level, or SentencePiece-style "
        f"with byte fallback) or a source GGUF's tokenizer; this one is neither ({e})"
    )


def _sentencepiece_fields(directory: Path) -> Callable[[list[str], list[int]], tuple[list[float], list[int]]]:
    """(tokens, library types) -> (scores, types) for llama.cpp's `llama` tokenizer. It merges the adjacent pair
    whose merged token scores highest, so each token scores minus the rank of the first tokenizer.json merge that
    makes it. (gguf's LlamaHfVocab scores every token -1000: with Gemma 3's tokenizer llama.cpp then split 38 of
    45 test texts differently from transformers; with merge ranks all 79 Python-docs topics and 5 texts of
    whitespace, accents, CJK and emoji split identically.) Added tokens are typed as llama.cpp's converter types
    them: special ones CONTROL, the others USER_DEFINED."""
    import gguf

    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    rank: dict[int, int] = {}
    for r, merge in enumerate(spec["model"].get("merges", [])):
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        rank.setdefault(vocab.get(left + right, -1), r)
    added = {a["id"]: a.get("special", False) for a in spec.get("added_tokens", [])}
    normal, byte = int(gguf.TokenType.NORMAL), int(gguf.TokenType.BYTE)
    last = len(spec["model"].get("merges", []))

    def fields(tokens: list[str], types: list[int]) -> tuple[list[float], list[int]]:
        scores, out = [], []
        for i, kind in enumerate(types):
            if i in added and kind != byte:
                kind = int(gguf.TokenType.CONTROL if added[i] else gguf.TokenType.USER_DEFINED)
            out.append(kind)
            scores.append(-float(rank.get(i, last)) if kind == normal else 0.0 if kind == byte else -1000.0)
        return scores, out

    return fields


def _adds_space_prefix(directory: Path) -> bool:
    """Whether the tokenizer puts a space before the text (a normalizer's Prepend of '▁', or a Metaspace that
    prepends), which llama.cpp's `llama` tokenizer does only when told: Llama 2 does, Gemma does not."""
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))

    def steps(node: object) -> Iterator[dict]:
        if isinstance(node, dict):
            yield node
            for key in ("normalizers", "pretokenizers"):
                for child in node.get(key) or ():
                    yield from steps(child)

    for step in [*steps(spec.get("normalizer")), *steps(spec.get("pre_tokenizer"))]:
        if step.get("type") == "Prepend":
            return True
        if (
            step.get("type") == "Metaspace"
            and step.get("prepend_scheme", "always") != "never"
            and step.get("add_prefix_space", True)
        ):
            return True
    return False


def tokenizer_fields(spec: str, model_dir: Path | None) -> TokenizerStep:
    """The tokenizer step for the model `spec`: its source GGUF's fields, else the HF tokenizer in `model_dir`."""
    gguf_path = source_gguf(spec)
    if gguf_path is not None:
        log.info("tokenizer and chat template copied from %s", gguf_path)
        return fields_from_gguf(gguf_path)
    if model_dir is None:
        raise GacError(f"no tokenizer to carry over for {spec!r}: export a local model directory or a GGUF")
    return fields_from_hf(model_dir)
