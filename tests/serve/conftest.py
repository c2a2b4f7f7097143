"""Fixtures of the serving tests: gac outputs of every structure kind written from a tiny Llama that vLLM's CPU
attention runs (head_dim 32; tests/helpers_serve.py builds it): low rank (mixed dense and factorized q/k/v, o and MLP
pairs), PaLU groups, per-layer MLP widths and head counts (KV heads too), a repaired (zero-padded) model and the
original."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import gac_cli, installed_for_ci
from tests.helpers_serve import TP2_LLAMA, serve_check, serve_tiny_family, serve_tiny_model
from tests.helpers_tiny import tiny_tokenizer

FAST = ["--seq-len", "32", "--calib-windows", "4", "--no-eval", "--quiet"]


@pytest.fixture(scope="session")
def vllm():
    """vLLM, its CPU build here (required under CI)."""
    return installed_for_ci("vllm", "vLLM", "vllm")


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
    from gac.checkpoint.gac_dir import plan_record, save

    root = tmp_path_factory.mktemp("serve")
    original = root / "original"
    serve_tiny_model().save_pretrained(original)
    tiny_tokenizer().save_pretrained(original)
    dirs = {"original": original}
    for name, args in {"asvd": ["--compressor", "asvd", "--ratio", "0.3"],
                       "palu": ["--compressor", "palu", "--ratio", "0.3"],
                       "prune": ["--compressor", "prune", "--ratio", "0.3"],
                       "asvd-unaligned": ["--compressor", "asvd", "--ratio", "0.3", "--no-align"]}.items():
        p = gac_cli("compress", "--model", str(original), *args, "--out", str(root / name), *FAST)
        assert p.returncode == 0, p.stderr
        dirs[name] = root / name
    p = gac_cli("repair", str(root / "asvd-unaligned"), "--out", str(root / "repaired"), "--no-latency")
    assert p.returncode == 0, p.stderr
    dirs["repaired"] = root / "repaired"
    save(resized(serve_tiny_model()), tiny_tokenizer(), root / "resized",
         plan=plan_record(variant="unaligned", source_model=str(original), alignment=None, dims={}))
    dirs["resized"] = root / "resized"
    dirs.update(quantized_dirs(root, original))
    return dirs


def int4_kernel(w4a16_dir) -> bool:
    """Whether vLLM's CPU build here has its int4 GEMM for the W4A16 checkpoint `w4a16_dir` (only its AVX-512
    libraries do)."""
    from gac.errors import GacError
    from gac.serve.vllm_engine import check_quantized_kernels

    try:
        check_quantized_kernels(w4a16_dir)
    except GacError:
        return False
    return True


def quantized_dirs(root, original) -> dict:
    """Quantized checkpoints served beside the others (the same engine starts): every structure gac writes (factor
    pairs, PaLU groups, a pruned width; tests.helpers_quantize.structures) at W8A8 by GPTQ and at W4A16 by round to
    nearest (and, with a pruned width the int4 kernel refuses, under --skip-unfit), and the original at W8A8, a plain
    Hugging Face checkpoint served by vLLM's own class. The W4A16 ones are served only where vLLM's CPU build has its
    int4 GEMM; elsewhere they are refused before vLLM starts."""
    from gac.quantize.run import quantize_dir
    from gac.quantize.schemes import QuantizeConfig
    from tests.helpers_quantize import FAST, UNFIT_WIDTH, save_gac, structures

    source = save_gac(structures(), root / "structures")
    unfit = save_gac(structures(UNFIT_WIDTH), root / "unfit")
    runs = {"structures-w8a8": (source, QuantizeConfig("w8a8", method="gptq", **FAST)),
            "structures-w4a16": (source, QuantizeConfig("w4a16", method="rtn", **FAST)),
            "unfit-w4a16-skip": (unfit, QuantizeConfig("w4a16", method="rtn", skip_unfit=True, **FAST)),
            "original-w8a8": (original, QuantizeConfig("w8a8", method="rtn", **FAST))}
    dirs = {name: quantize_dir(src, root / name, cfg, progress=False).out for name, (src, cfg) in runs.items()}
    if not int4_kernel(dirs["structures-w4a16"]):
        for name in ("structures-w4a16", "unfit-w4a16-skip"):
            dirs[f"{name}-refused"] = dirs.pop(name)  # kept out of the served set
    return dirs


def fused_phi3():
    """Phi-3 as no compressor here leaves it: layer 0's fused qkv_proj and gate_up_proj factorized whole (rank 32,
    truncated SVD), layer 1's MLP cut to 200 channels (each kept channel's gate and up rows)."""
    from gac.models import surgery
    from gac.models.groups import groups_of

    model = serve_tiny_family("phi3")
    for name in ("model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"):
        u, s, vh = torch.linalg.svd(model.get_submodule(name).weight.detach(), full_matrices=False)
        surgery.factorize(model, name, vh[:32], u[:, :32] * s[:32])  # a [32, in], b [out, 32]
    surgery.apply(model, [(groups_of(model, "mlp", layers=[1])[0], surgery.Keep(torch.arange(200)))])
    return model


OPTIONS = {"qwen3_moe": {"layers": "all", "drop_experts": 0.25}, "mixtral": {"layers": "all"}}


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory):
    """{name: gac output}: Gemma 3 (asvd), Qwen3-MoE (prune, a quarter of its experts dropped) and Mixtral (prune:
    one expert width a layer), and Phi-3 with its fused projections factorized whole and a pruned MLP."""
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig
    from gac.checkpoint.gac_dir import plan_record, save

    root = tmp_path_factory.mktemp("families")
    dirs = {}
    for family, compressor in (("gemma3_text", "asvd"), ("qwen3_moe", "prune"), ("mixtral", "prune")):
        original = root / f"{family}-original"
        serve_tiny_family(family).save_pretrained(original)
        tiny_tokenizer().save_pretrained(original)
        name = f"{family}-{compressor}"
        compress(CompressConfig(model=str(original), compressor=compressor, ratio=0.3, out=str(root / name),
                                evaluate=False, progress=False,
                                compressor_options=OPTIONS.get(family, {}),
                                text=TextConfig(seq_len=32, calib_windows=4, eval_windows=1)))
        dirs[name] = root / name
    save(fused_phi3(), tiny_tokenizer(), root / "phi3-fused",
         plan=plan_record(variant="unaligned", source_model="phi3", alignment=None, dims={}))
    dirs["phi3-fused"] = root / "phi3-fused"
    return dirs


@pytest.fixture(scope="session")
def served_tp2(vllm, serve_dirs, family_dirs, tmp_path_factory):
    """serve-check at TP=2 on the factorized and pruned Llamas and every family, in one launch of its two ranks."""
    dirs = [serve_dirs[n] for n in TP2_LLAMA] + [serve_dirs["structures-w8a8"]] + list(family_dirs.values())
    return serve_check(dirs, tmp_path_factory.mktemp("served") / "tp2.json", "--tp", "2")
