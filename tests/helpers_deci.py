"""DeciLM's readers as the tests state them: the MLP width each serving engine computes from a block's ffn_mult, and a
tiny model whose layers DeciLM (and GGUF's deci architecture) must hold: a cut MLP and a removed KV group."""

from __future__ import annotations

import torch

from gac.models.groups import groups_of
from gac.models.surgery import Keep, KeepHeads


# The MLP width of a block's ffn_mult as SGLang and TensorRT-LLM compute it (their only rule: neither reads
# intermediate_size): SGLang python/sglang/srt/models/nemotron_nas.py and TensorRT-LLM
# tensorrt_llm/_torch/models/modeling_nemotron_nas.py, both `_ffn_mult_to_intermediate_size(ffn_mult, n_embd)`:
# `intermediate_size = int(2 * ffn_mult * n_embd / 3)`, then `_find_multiple(intermediate_size, 256)`, which returns
# n when `n % k == 0`, else `n + k - (n % k)`. Written here from their statement, not imported from gac.
def sglang_width(ffn_mult: float, n_embd: int) -> int:
    n = int(2 * ffn_mult * n_embd / 3)
    return n if n % 256 == 0 else n + 256 - (n % 256)


def tensorrt_llm_width(ffn_mult: float, hidden_size: int) -> int:
    n = int(2 * ffn_mult * hidden_size / 3)
    return n if n % 256 == 0 else n + 256 - (n % 256)


ENGINE_RULES = {"SGLang": sglang_width, "TensorRT-LLM": tensorrt_llm_width}


def deci_model(model):
    """Layer 0: MLP cut to 100 of 160 channels; layer 1: one of two KV groups (and its query heads) removed."""
    groups_of(model, "mlp")[0].cut(model, Keep(torch.arange(30, 130)))  # 100 channels
    # KV head 1 serves query heads 2 and 3
    groups_of(model, "heads")[1].cut(model, KeepHeads(torch.tensor([2, 3]), torch.tensor([1])))
    return model
