"""What the quantization tests (and the serving tests' quantized checkpoints) share: a serve-sized tiny Llama
(head_dim 32) holding every structure gac writes, at a pruned width vLLM's int4 kernel takes or one it does not, saved
as a gac output; and the quantizer's calibration at test sizes."""

from __future__ import annotations

import torch

from tests.helpers_serve import serve_tiny_model
from tests.helpers_tiny import tiny_tokenizer

FIT_WIDTH, UNFIT_WIDTH = 288, 280  # a pruned MLP width that is a multiple of 32, and one that is not


def structures(width: int = FIT_WIDTH):
    """Layer 0: q_proj and o_proj factorized at rank 32 (k and v dense beside q); layer 1: MLP cut to `width`
    channels; layer 2: down_proj at rank 64; layer 3: k_proj and v_proj as PaLU groups of rank 32 (one a KV
    head). Factors from truncated SVDs, so the model stays close to the original."""
    from gac.models import surgery
    from gac.models.groups import groups_of

    model = serve_tiny_model()
    for name, rank in (("model.layers.0.self_attn.q_proj", 32), ("model.layers.0.self_attn.o_proj", 32),
                       ("model.layers.2.mlp.down_proj", 64)):
        u, s, vh = torch.linalg.svd(model.get_submodule(name).weight.detach(), full_matrices=False)
        surgery.factorize(model, name, vh[:rank], u[:, :rank] * s[:rank])
    for name in ("model.layers.3.self_attn.k_proj", "model.layers.3.self_attn.v_proj"):
        factors = []
        for w in model.get_submodule(name).weight.detach().chunk(2):  # [32, 128] per KV head
            u, s, vh = torch.linalg.svd(w, full_matrices=False)
            factors.append((vh[:32], u[:, :32] * s[:32]))
        surgery.factorize_head_groups(model, name, factors)
    surgery.apply(model, [(groups_of(model, "mlp", layers=[1])[0], surgery.Keep(torch.arange(width)))])
    return model


def save_gac(model, d):
    from gac.checkpoint.gac_dir import plan_record, save

    return save(model, tiny_tokenizer(), d, plan=plan_record(variant="gac", source_model="tiny", alignment=32,
                                                             dims={}))


FAST = dict(seq_len=32, calib_windows=4, dtype="float32")  # GPTQ on a few short windows; float32 on any CPU
