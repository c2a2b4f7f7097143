"""What the memory forecast's tests and the choice of pipeline's share: the real-size configs in docs/configs, a
Llama-shaped config of any depth and width, and a fixed compute rate."""

from __future__ import annotations

from pathlib import Path

import transformers

DOCS = Path(__file__).resolve().parents[1] / "docs" / "configs"
RATE = 1e11  # FLOP/s: fixed so the tests do not time this machine


def llama(layers: int, hidden: int = 1024):
    return transformers.LlamaConfig(hidden_size=hidden, intermediate_size=int(3.5 * hidden), num_hidden_layers=layers,
                                    num_attention_heads=hidden // 128, num_key_value_heads=hidden // 512,
                                    vocab_size=8192, tie_word_embeddings=False)
