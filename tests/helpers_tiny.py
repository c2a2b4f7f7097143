"""Tiny random models of the dense families and the tiny tokenizer they are saved with, so that every test runs
offline in seconds (the fixtures in tests/conftest.py build on these)."""

from __future__ import annotations

import torch

TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=320, max_position_embeddings=256, tie_word_embeddings=True)


# Gemma 3: its head_dim is not hidden / heads, its query scale is its own, half its layers see a sliding window
FAMILY_EXTRA = {"gemma3_text": dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention"])}


def tiny_tokenizer():
    """A byte-level BPE tokenizer trained on Python's docs, wrapped for transformers."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY["vocab_size"], special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [topics[k] for k in sorted(topics)[:60]]
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def save_tiny(model, d, **save_options):
    """`model` and the tiny tokenizer saved as an HF model directory at `d` (save_options: save_pretrained's);
    returns `d`."""
    model.save_pretrained(d, **save_options)
    tiny_tokenizer().save_pretrained(d)
    return d


def tiny_model(model_type: str = "llama", seed: int = 0):
    import transformers

    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "mistral": transformers.MistralConfig, "qwen3": transformers.Qwen3Config,
                  "granite": transformers.GraniteConfig, "olmo2": transformers.Olmo2Config,
                  "phi": transformers.PhiConfig, "gemma3_text": transformers.Gemma3TextConfig}[model_type]
    torch.manual_seed(seed)
    config = config_cls(**TINY, **FAMILY_EXTRA.get(model_type, {}))
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def peaked_tiny_llama(d):
    """A tiny random Llama with peaked logits (initializer_range 0.3) and the tiny tokenizer saved at `d`: at the
    default 0.02 its next-token distributions are near uniform and compressing it costs almost no KL to heal."""
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, initializer_range=0.3))
    return save_tiny(model, d)


def tiny_gemma3_multimodal():
    import transformers

    text = transformers.Gemma3TextConfig(**TINY, **FAMILY_EXTRA["gemma3_text"])
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       mm_tokens_per_image=4)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()
