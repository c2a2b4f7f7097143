"""Fixtures of the serving tests: a tiny Llama that vLLM's CPU attention runs (head_dim 32), and gac outputs of
every structure kind written from it: low rank (mixed dense and factorized q/k/v, o and MLP pairs), PaLU groups,
per-layer MLP widths and head counts (KV heads too), a repaired (zero-padded) model and the original."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import installed_for_ci, tiny_tokenizer
from tests.helpers import run_gac

SERVE_TINY = dict(hidden_size=128, intermediate_size=320, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=320, max_position_embeddings=512, tie_word_embeddings=True)
FAST = ["--seq-len", "32", "--calib-windows", "4", "--no-eval", "--quiet"]


@pytest.fixture(scope="session")
def vllm():
    """vLLM, its CPU build here (required under CI)."""
    return installed_for_ci("vllm", "vLLM", "vllm")


def serve_tiny_model():
    import transformers

    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SERVE_TINY)).eval()


def resized(model):
    """Per-layer sizes no compressor chose: layer 1 keeps one KV group (2 query heads, 1 KV head), layer 2 one
    query head per group (2 and 2), MLP widths 157 and 200 in layers 0 and 3."""
    from gac.models import surgery
    from gac.models.groups import groups_of

    heads = groups_of(model, "heads", layers=[1, 2])
    cuts = [(heads[0], surgery.KeepHeads(torch.tensor([2, 3]), torch.tensor([1]))),
            (heads[1], surgery.KeepHeads(torch.tensor([0, 2]), torch.tensor([0, 1])))]
    cuts += [(group, surgery.Keep(torch.arange(width)))
             for group, width in zip(groups_of(model, "mlp", layers=[0, 3]), (157, 200))]
    surgery.apply(model, cuts)
    return model


@pytest.fixture(scope="session")
def serve_dirs(tmp_path_factory):
    """{name: directory}: the original (plain HF) and gac outputs of each structure kind."""
    from gac.models.io import plan_record, save

    root = tmp_path_factory.mktemp("serve")
    original = root / "original"
    serve_tiny_model().save_pretrained(original)
    tiny_tokenizer().save_pretrained(original)
    dirs = {"original": original}
    for name, args in {"asvd": ["--compressor", "asvd", "--ratio", "0.3"],
                       "palu": ["--compressor", "palu", "--ratio", "0.3"],
                       "prune": ["--compressor", "prune", "--ratio", "0.3"],
                       "asvd-unaligned": ["--compressor", "asvd", "--ratio", "0.3", "--no-align"]}.items():
        p = run_gac("compress", "--model", str(original), *args, "--out", str(root / name), *FAST, timeout=900)
        assert p.returncode == 0, p.stderr
        dirs[name] = root / name
    p = run_gac("repair", str(root / "asvd-unaligned"), "--out", str(root / "repaired"), "--no-latency")
    assert p.returncode == 0, p.stderr
    dirs["repaired"] = root / "repaired"
    save(resized(serve_tiny_model()), tiny_tokenizer(), root / "resized",
         plan=plan_record(variant="unaligned", source_model=str(original), alignment=None, dims={}))
    dirs["resized"] = root / "resized"
    return dirs
