"""A GGUF's tokenizer as transformers converts it, checked before any work against the file's own metadata and
against llama.cpp, the engine the file is written for: the special tokens must be the file's, the BOS/EOS flags
are set to the file's (an exact repair), and a fixed probe text must split into llama.cpp's token ids, or the load
is refused. transformers' GGUF conversion has differed between releases (a SentencePiece vocabulary split
otherwise, its BOS flag dropped), and a model fed other ids than it was trained on computes plausible nonsense."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gac.errors import GacError
from gac.io.llama_log import collected_log

if TYPE_CHECKING:
    from llama_cpp import Llama
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# Words, code, digits, runs of spaces, tabs and newlines, accents, CJK and an emoji: where byte-level BPE,
# SentencePiece's space handling and byte fallback each go wrong when a vocabulary is converted wrongly.
PROBE = (
    "Hello world. The quick brown fox jumps over the lazy dog.\n\n"
    "def f(x):\n    return x ** 2  # square\n\tindented\n"
    "  leading and   repeated spaces, 12345 and 3.14159; naïve café, 東京, 😀!"
)


@dataclass(frozen=True)
class GgufTokenizerFlags:
    """What a GGUF says of its tokenizer (`tokenizer.ggml.*`): llama.cpp adds BOS and EOS by these flags."""

    model: str  # "llama" (SentencePiece), "gpt2" (byte-level BPE), ...
    add_bos: bool
    add_eos: bool
    bos_id: int | None
    eos_id: int | None

    @classmethod
    def from_metadata(cls, meta: dict) -> GgufTokenizerFlags:
        """From `tokenizer.ggml.*` values (llama.cpp's metadata strings or the gguf reader's values). A flag the
        file leaves out takes llama.cpp's default: BOS for SentencePiece-style vocabularies, EOS never."""
        model = str(meta.get("tokenizer.ggml.model", ""))

        def flag(key: str, default: bool) -> bool:
            value = meta.get(key)
            return default if value is None else str(value).lower() in ("true", "1")

        def token(key: str) -> int | None:
            value = meta.get(key)
            return None if value is None else int(value)

        return cls(
            model=model,
            add_bos=flag("tokenizer.ggml.add_bos_token", model == "llama"),
            add_eos=flag("tokenizer.ggml.add_eos_token", False),
            bos_id=token("tokenizer.ggml.bos_token_id"),
            eos_id=token("tokenizer.ggml.eos_token_id"),
        )


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, gguf: Path, source: str) -> None:
    """Make `tokenizer` (converted by transformers from `gguf`) use the file's BOS and EOS tokens and add them as the
    file says (exact repairs), or raise a one-line GacError where a probe text splits into other ids than llama.cpp's.
    """
    vocab = _llama_cpp_vocab(gguf)
    try:
        flags = GgufTokenizerFlags.from_metadata(vocab.metadata if vocab is not None else _gguf_metadata(gguf))
        _repair_specials(tokenizer, flags, source)
        if vocab is None:
            log.info(
                "%s: llama.cpp's bindings are not installed, so its tokenizer was checked against the GGUF's "
                "metadata only (install gac[llamacpp] to check its splits too)",
                source,
            )
            return
        want = list(vocab.tokenize(PROBE.encode(), add_bos=True, special=False))  # BOS/EOS by the file's flags
    finally:
        if vocab is not None:
            vocab.close()
    have = list(tokenizer(PROBE)["input_ids"])
    if have != want:
        i = next((k for k, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
        raise GacError(
            f"the tokenizer transformers {_transformers_version()} converted from {source} splits text unlike "
            f"llama.cpp ({len(have)} tokens of a probe text against {len(want)}, the first difference at token {i}: "
            f"{_token_at(have, i)} against {_token_at(want, i)}): {_WAY_OUT}"
        )


def _repair_specials(tokenizer: PreTrainedTokenizerBase, flags: GgufTokenizerFlags, source: str) -> None:
    """The file's BOS and EOS tokens (by id, in the same vocabulary) and its flags for adding them: where transformers'
    conversion chose others, set as the file says."""
    for name, want in (("bos", flags.bos_id), ("eos", flags.eos_id)):
        if want is not None and getattr(tokenizer, f"{name}_token_id", None) != want:
            token = tokenizer.convert_ids_to_tokens(want)
            if token is None:
                raise GacError(
                    f"the GGUF of {source} names {name} token {want}, outside the {len(tokenizer)} tokens transformers "
                    f"{_transformers_version()} converted: {_WAY_OUT}"
                )
            log.info("%s: %s token set to %r (id %d), as the GGUF says", source, name, token, want)
            setattr(tokenizer, f"{name}_token", token)
    for name, want in (("add_bos_token", flags.add_bos), ("add_eos_token", flags.add_eos)):
        if bool(getattr(tokenizer, name, False)) != want:
            log.info("%s: %s set to %s, as the GGUF says", source, name, want)
            setattr(tokenizer, name, want)  # transformers' setter rebuilds the post-processor that adds the token


_WAY_OUT = (
    "load the model's Hugging Face directory (with its tokenizer.json) instead of the GGUF, or use a transformers "
    "release whose GGUF conversion matches llama.cpp (`bash scripts/setup.sh` installs one)"
)


def _token_at(ids: list[int], i: int) -> int | str:
    return ids[i] if i < len(ids) else "the end"


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _llama_cpp_vocab(gguf: Path) -> Llama | None:
    """llama.cpp's vocabulary of `gguf` loaded alone, no weights (a llama_cpp.Llama: its metadata and tokenizer), or
    None where its bindings are not installed or cannot read the file."""
    try:
        import llama_cpp
    except ImportError:
        return None
    try:
        with collected_log(llama_cpp) as messages:
            return llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    except (ValueError, RuntimeError, OSError) as e:
        why = next((m.strip() for m in reversed(messages) if m.strip()), str(e))
        log.warning(
            "llama.cpp could not read the vocabulary of %s (%s): its tokenizer is checked by metadata", gguf, why
        )
        return None


def _gguf_metadata(gguf: Path) -> dict:
    """The `tokenizer.ggml.*` scalars of `gguf`, read by the gguf package (slower than llama.cpp on a large vocabulary:
    it parses every field)."""
    import gguf as gguf_lib

    reader = gguf_lib.GGUFReader(gguf)
    scalars = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and field.types and field.types[0] != gguf_lib.GGUFValueType.ARRAY:
            scalars[key] = field.contents()
    return scalars
