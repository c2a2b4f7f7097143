"""Tiny random MoE models (experts stored per expert) and what their tests share with gpt-oss's (fused experts):
pruning every layer at a ratio, repairing an unaligned output and refusing a GGUF export."""

from __future__ import annotations

import torch

from gac.api import compress
from tests.helpers import assert_one_error_line, run_gac
from tests.helpers_compress import fast_config
from tests.helpers_tiny import TINY

FAMILIES = ("qwen3_moe", "mixtral")


def tiny_moe(model_type: str, seed: int = 0):
    import transformers

    if model_type == "qwen3_moe":  # one dense layer (mlp_only_layers) beside the sparse ones
        config = transformers.Qwen3MoeConfig(**{**TINY, "num_hidden_layers": 3, "intermediate_size": 96},
                                             moe_intermediate_size=40, num_experts=4, num_experts_per_tok=2,
                                             head_dim=16, mlp_only_layers=[2])
    elif model_type == "olmoe":  # its q/k norms span all heads (heads not prunable); eos within the tiny vocabulary
        config = transformers.OlmoeConfig(**{**TINY, "intermediate_size": 40}, num_experts=4, num_experts_per_tok=2,
                                          eos_token_id=1, pad_token_id=1)
    else:
        config = transformers.MixtralConfig(**{**TINY, "intermediate_size": 40}, num_local_experts=4,
                                            num_experts_per_tok=2)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def pruned_experts(model_dir, out, ratio):
    """prune every layer of `model_dir` at `ratio` into `out`: within budget, 100% aligned, and the budget met by
    cutting expert widths (multiples of 8). The result and {experts module: its dim (None: whole)}."""
    result = compress(fast_config(model_dir, compressor="prune", ratio=ratio, out=str(out), evaluate=False,
                                  compressor_options={"layers": "all"}))
    r = result.report.to_dict()
    assert r["variants"]["gac"]["params"] <= r["budget_params"]
    assert r["variants"]["gac"]["aligned_fraction"] == 1.0
    experts = {n: d for n, d in r["dims"]["gac"].items() if n.endswith(".experts")}
    assert experts and all(d is None or d % 8 == 0 for d in experts.values())
    assert any(d is not None for d in experts.values())  # the budget is met by cutting experts
    return result, experts


def expert_widths(model) -> list[int]:
    from gac.models.groups import groups_of

    return [g.dim for g in groups_of(model, "experts")]


def assert_unaligned_output_repairs(model_dir, tmp_path):
    """prune without alignment leaves irregular expert widths; repair pads them to multiples of 8 with the same
    logits (argmax identical, relative error under 1e-5)."""
    from gac.checkpoint.gac_dir import load
    from gac.repair import repair_dir

    raw = tmp_path / "raw"  # at 0.25 every tiny family's own widths are irregular (at 0.3 mixtral's are 32 and 24)
    compress(fast_config(model_dir, compressor="prune", ratio=0.25, out=str(raw), align=False, evaluate=False,
                         compressor_options={"layers": "all", "head_mode": "none"}))
    assert any(w % 8 for w in expert_widths(load(raw).model))  # the compressor's own widths are irregular
    out = repair_dir(str(raw), str(tmp_path / "fixed"), align=8, measure_latency=False)
    assert out.report["logits_check"]["argmax_identical"] and out.report["logits_check"]["max_rel_error"] < 1e-5
    assert all(w % 8 == 0 for w in expert_widths(load(out.out).model))


def assert_gguf_export_refused(model_dir, tmp_path):
    """A pruned MoE output's GGUF export is refused in one line, and no file is written."""
    out = tmp_path / "out"
    compress(fast_config(model_dir, compressor="prune", ratio=0.3, out=str(out), evaluate=False,
                         compressor_options={"layers": "all"}))
    p = run_gac("export", out, "--format", "gguf", "--out", tmp_path / "m.gguf")
    assert_one_error_line(p, "GGUF export supports")
    assert not (tmp_path / "m.gguf").exists()
