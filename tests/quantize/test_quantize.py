"""`gac quantize` on tiny gac outputs (factor pairs, PaLU groups, a pruned width): each scheme round-trips through
compressed-tensors, gac.load and transformers (with gac and without it) load the checkpoint, unfit linears are
refused in one line before anything is written or left unquantized under --skip-unfit, and bad input is one line.
No engine here: tests/serve serves these checkpoints in vLLM."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import assert_one_error_line, gac_cli
from tests.helpers_quantize import FAST

RUNS = {"w4a16-rtn": ("w4a16", "rtn"), "w8a8-rtn": ("w8a8", "rtn"), "w4a16-gptq": ("w4a16", "gptq")}


@pytest.fixture(scope="module")
def quantized(structures_dir, tmp_path_factory):
    """{run: quantized directory} of the structures model, one per scheme and method."""
    from gac.quantize.run import quantize_dir
    from gac.quantize.schemes import QuantizeConfig

    root = tmp_path_factory.mktemp("quantized")
    return {name: quantize_dir(structures_dir, root / name, QuantizeConfig(scheme, method=method, **FAST),
                               progress=False).out for name, (scheme, method) in RUNS.items()}


def linears(model) -> dict:
    """{name: nn.Linear} of the decoder's linears."""
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}


def dequantized(model, ids):
    """The model after one forward: transformers' compressed-tensors integration decompresses on the first one."""
    with torch.inference_mode():
        return model(ids).logits


@pytest.mark.slow
@pytest.mark.parametrize("run, bits", [("w4a16-rtn", 4), ("w8a8-rtn", 8)])
def test_round_to_nearest_round_trips_every_linear_of_every_structure(structures_dir, quantized, run, bits):
    """Each weight read back is its original rounded to the nearest point of the saved grid: on the grid, within
    half a step of the original (and the scale's own rounding to the checkpoint's dtype: bfloat16 for w4a16, whose
    activations are 16-bit), on the factor pairs and PaLU's groups as on the dense and pruned linears."""
    import gac

    ids = torch.randint(0, 320, (1, 16), generator=torch.Generator().manual_seed(0))
    original = linears(gac.load(structures_dir).model)
    model = gac.load(quantized[run]).model
    dequantized(model, ids)
    loaded = linears(model)
    saved = json.loads((quantized[run] / "config.json").read_text())["dtype"]
    assert saved == {4: "bfloat16", 8: "float32"}[bits]
    half_step = 0.5 + 2 ** (bits - 1) * torch.finfo(getattr(torch, saved)).eps / 2
    assert set(loaded) == set(original) and any(".a" in n for n in loaded) and any(".b.1" in n for n in loaded)
    for name, m in loaded.items():
        w, w0 = m.weight.detach().float(), original[name].weight.detach().float()  # [out, in]
        scale = m.weight_scale.detach().float().repeat_interleave(w.shape[1] // m.weight_scale.shape[1], dim=1)
        steps = w / scale
        assert (steps - steps.round()).abs().max() < 1e-3, name  # on the grid
        assert steps.min() >= -(2 ** (bits - 1)) and steps.max() <= 2 ** (bits - 1), name
        assert ((w - w0).abs() <= scale * (half_step + 1e-3) + 1e-7).all(), name  # the nearest grid point


def test_quantized_models_compute_close_to_the_original(structures_dir, quantized):
    import gac

    ids = torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(1))
    reference = dequantized(gac.load(structures_dir).model, ids)
    rel = {run: float((dequantized(gac.load(d).model, ids) - reference).norm() / reference.norm())
           for run, d in quantized.items()}
    assert rel["w8a8-rtn"] < 0.05 and rel["w4a16-rtn"] < 0.4 and rel["w4a16-gptq"] < 0.4, rel
    assert rel["w8a8-rtn"] < rel["w4a16-rtn"] / 4, rel  # int8 is many times finer than int4


def test_gptq_moves_weights_off_round_to_nearest(quantized):
    import gac

    ids = torch.zeros(1, 4, dtype=torch.long)
    rtn, gptq = (gac.load(quantized[r]).model for r in ("w4a16-rtn", "w4a16-gptq"))
    dequantized(rtn, ids), dequantized(gptq, ids)
    differ = [n for n, m in linears(gptq).items() if not torch.equal(m.weight, linears(rtn)[n].weight)]
    assert len(differ) == len(linears(gptq))  # GPTQ's error feedback changes every linear's rounding


def test_the_checkpoint_is_compressed_tensors_and_keeps_the_gac_structure(structures_dir, quantized):
    from safetensors import safe_open

    d = quantized["w4a16-rtn"]
    config = json.loads((d / "config.json").read_text())
    q = config["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["format"] == "pack-quantized" and q["ignore"] == ["lm_head"]
    assert q["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert config["gac_structure"] == json.loads((structures_dir / "config.json").read_text())["gac_structure"]
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"model.layers.0.self_attn.q_proj.a.weight_packed", "model.layers.3.self_attn.k_proj.b.1.weight_scale",
            "model.layers.1.mlp.down_proj.weight_shape"} <= keys
    assert not any(k.endswith("proj.weight") for k in keys)  # no dense copy of a quantized linear
    report = json.loads((d / "quantize.json").read_text())
    assert report["quantized"] == len(report["linears"]) and report["rule"]["kernel"] == "CPUWNA16LinearKernel"
    plan = json.loads((d / "gac_plan.json").read_text())
    assert plan["quantization"]["label"] == "w4a16-g32-rtn" and plan["variant"] == "gac"


@pytest.mark.subprocess
def test_transformers_loads_it_without_gac(quantized):
    """trust_remote_code: the directory's own modeling code and transformers' compressed-tensors integration, gac
    never imported, give the logits gac.load gives."""
    import gac

    d = quantized["w8a8-rtn"]
    script = (f"import sys, torch, transformers\n"
              f"m = transformers.AutoModelForCausalLM.from_pretrained({str(d)!r}, trust_remote_code=True, "
              "dtype=torch.float32)\n"
              "with torch.inference_mode(): logits = m(torch.arange(8)[None]).logits\n"
              "assert 'gac' not in sys.modules\n"
              "print(logits.sum().item(), logits.abs().sum().item())\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    total, size = map(float, p.stdout.split()[-2:])
    expected = dequantized(gac.load(d).model, torch.arange(8)[None])
    assert abs(total - float(expected.sum())) <= 1e-4 * size


def test_an_unfit_model_is_refused_before_anything_is_written(unfit_dir, tmp_path):
    out = tmp_path / "out"
    p = gac_cli("quantize", unfit_dir, "--scheme", "w4a16", "--out", out, "--method", "rtn", "--quiet")
    line = assert_one_error_line(p, "model.layers.1.mlp.{gate_proj,up_proj}: its output width N = 560")
    assert "--target vllm:w4a16" in line and "--skip-unfit" in line
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_skip_unfit_writes_the_unfit_linears_unquantized(unfit_dir, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "out"
    p = gac_cli("quantize", unfit_dir, "--scheme", "w4a16", "--out", out, "--method", "rtn", "--skip-unfit",
                "--dtype", "float32", "--quiet")
    assert p.returncode == 0, p.stderr
    assert "left unquantized: model.layers.1.mlp.down_proj (its input width K = 280 is not a multiple of 32)" in p.stdout
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert sorted(ignore) == ["lm_head", "model.layers.1.mlp.down_proj", "model.layers.1.mlp.gate_proj",
                              "model.layers.1.mlp.up_proj"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.1.mlp.down_proj.weight" in keys and "model.layers.2.mlp.up_proj.weight_packed" in keys


@pytest.mark.parametrize("args, expected", [
    (["--scheme", "w4a16", "--group", "0"], "group 0 is not a group size"),
    (["--scheme", "w4a16", "--group", "7"], "group 7 is odd"),
    (["--scheme", "w8a8", "--group", "32"], "w8a8 quantizes weights per output channel"),
    (["--scheme", "int3"], "invalid value for '--scheme'"),
])
def test_bad_options_are_one_line(structures_dir, tmp_path, args, expected):
    assert_one_error_line(gac_cli("quantize", structures_dir, "--out", tmp_path / "o", *args), expected)
    assert not (tmp_path / "o").exists()


def test_bad_inputs_are_one_line(quantized, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_one_error_line(gac_cli("quantize", tmp_path / "empty", "--scheme", "w8a8", "--out", tmp_path / "o"),
                          "has no config.json")
    again = gac_cli("quantize", quantized["w8a8-rtn"], "--scheme", "w4a16", "--out", tmp_path / "o")
    assert_one_error_line(again, "is already quantized (compressed-tensors in its config.json): pass the "
                                 "unquantized model it was made from to quantize")
    for verb in (["heal", quantized["w8a8-rtn"]], ["repair", quantized["w8a8-rtn"]],
                 ["compress", "--model", quantized["w8a8-rtn"]]):
        assert_one_error_line(gac_cli(*verb, "--out", tmp_path / "o"), "is already quantized")


@pytest.fixture(scope="module")
def original_dir(tmp_path_factory):
    from tests.helpers_serve import serve_tiny_model
    from tests.helpers_tiny import tiny_tokenizer

    d = tmp_path_factory.mktemp("original") / "tiny"
    serve_tiny_model().save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


@pytest.mark.slow
def test_compress_heals_then_quantizes_in_one_step(original_dir, tmp_path):
    """`gac compress --target vllm:w4a16 --heal --quantize w4a16`: the dims meet the kernel, healing trains the
    float model, then every linear is quantized and the checkpoint loads."""
    import gac

    out = tmp_path / "out"
    p = gac_cli("compress", "--model", original_dir, "--compressor", "prune", "--ratio", "0.3", "--target",
                "vllm:w4a16", "--heal", "--heal-tokens", "256", "--quantize", "w4a16", "--method", "rtn", "--out", out,
                "--seq-len", "32", "--calib-windows", "4", "--no-eval", "--quiet")
    assert p.returncode == 0, p.stderr
    assert "(w4a16-g32-rtn quantized)" in p.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["heal"]["run"]["steps"] >= 1 and report["target"]["met"] == report["target"]["constrained"]
    q = json.loads((out / "quantize.json").read_text())
    assert q == report["quantization"] and q["unquantized"] == 0 and q["quantized"] == len(q["linears"])
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "pack-quantized"
    assert json.loads((out / "gac_plan.json").read_text())["quantization"]["label"] == "w4a16-g32-rtn"
    assert torch.isfinite(dequantized(gac.load(out).model, torch.arange(8)[None])).all()


def test_quantize_options_without_quantize_are_refused(original_dir, tmp_path):
    assert_one_error_line(gac_cli("compress", "--model", original_dir, "--method", "gptq", "--out", tmp_path / "o"),
                          "--method set quantization: give --quantize too")


def test_lm_evaluation_harness_scores_it_as_gac_load_does(lm_eval, quantized):
    """lm-eval's hf backend (trust_remote_code, as docs/USAGE.md has it) loads the quantized gac output, and its
    log-likelihood of a continuation is the one gac.load's model gives."""
    import gac
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    d = quantized["w8a8-rtn"]
    lm = HFLM(pretrained=str(d), trust_remote_code=True, device="cpu", dtype="float32", batch_size=1)
    context, continuation = "The list type", " is a mutable sequence"
    (score, _), = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)])
    ctx, cont = lm._encode_pair(context, continuation)
    ids = torch.tensor([ctx + cont])
    logprobs = dequantized(gac.load(d).model, ids)[0].log_softmax(-1)  # [S, V]
    expected = sum(float(logprobs[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))
    assert abs(score - expected) <= 1e-4 * abs(expected)
