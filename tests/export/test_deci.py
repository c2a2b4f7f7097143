"""`gac export --format deci`: a pruned tiny Llama as a DeciLM directory that transformers loads without gac (the
same logits), that gac loads back and exports to GGUF; what DeciLM cannot hold is one line, exit 2, nothing written
and no model loaded; `--target deci` gives widths every DeciLM engine builds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from gac.checkpoint import deci
from tests.helpers import assert_one_error_line, gac_cli
from tests.helpers_deci import ENGINE_RULES
from tests.helpers_export import MAX_REL_ERROR, round_trip
from tests.helpers_tiny import save_tiny, tiny_model

FAST = dict(seq_len=32, calib_windows=2, eval_windows=1)
MAX_REL = 1e-4  # float32, the same layers: transformers without gac against gac.load


def _compress(model_dir, out, **options):
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig

    options.setdefault("align", False)
    compress(CompressConfig(model=str(model_dir), out=str(out), evaluate=False, progress=False,
                            text=TextConfig(**FAST), **options))
    return out


WIDTHS = (100, 136)  # the pruned MLP widths of the tiny Llama's two layers (its own: 160), none a multiple of 256


def _saved(model, d):
    from gac.checkpoint.gac_dir import plan_record, save
    from tests.helpers_tiny import tiny_tokenizer

    return save(model, tiny_tokenizer(), d, plan=plan_record(variant="gac", source_model="tiny", alignment=8, dims={},
                                                              compressor={"name": "prune"}))


@pytest.fixture(scope="module")
def pruned_dir(tmp_path_factory):
    """A gac prune output of the tiny Llama: its MLP widths cut to WIDTHS, heads whole."""
    from gac.models import surgery
    from gac.models.groups import groups_of

    model = tiny_model()
    surgery.apply(model, [(g, surgery.Keep(torch.arange(w))) for g, w in zip(groups_of(model, "mlp"), WIDTHS)])
    return _saved(model, tmp_path_factory.mktemp("deci") / "pruned")


@pytest.fixture(scope="module")
def deci_export(pruned_dir):
    out = pruned_dir.parent / "deci"
    p = gac_cli("export", str(pruned_dir), "--format", "deci", "--out", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    return out, p.stdout


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits  # [B, S, V]


def _ids(vocab: int):
    return torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))  # [B, S]


def test_the_directory_is_decilms_with_llamas_tensors_and_gacs_code(pruned_dir, deci_export):
    from safetensors import safe_open

    out, stdout = deci_export
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DeciLMForCausalLM"] and config["model_type"] == "nemotron-nas"
    assert config["auto_map"] == deci.AUTO_MAP and "gac_structure" not in config
    blocks = config["block_configs"]
    assert tuple(b["ffn"]["intermediate_size"] for b in blocks) == WIDTHS
    assert all("ffn_mult" not in b["ffn"] and b["attention"]["n_heads_in_group"] == 2 for b in blocks)
    assert all(not part["no_op"] and not part["replace_with_linear"] for b in blocks for part in b.values())
    for name in deci.CODE_FILES:
        assert (out / name).read_bytes() == deci.code_path(name).read_bytes()
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= {p.name for p in out.iterdir()}
    assert not (out / "gac_plan.json").exists() and not (out / "modeling_gac.py").exists()
    with safe_open(out / "model.safetensors", "pt") as f:
        shape = f.get_slice("model.layers.0.mlp.down_proj.weight").get_shape()
    assert shape == [64, blocks[0]["ffn"]["intermediate_size"]]  # Llama's names, the pruned width
    record = json.loads((out / deci.EXPORT_FILE).read_text())
    assert record["format"] == "deci" and record["source_plan"]["compressor"]["name"] == "prune"
    engines = record["engines"]
    assert [e for e, v in engines.items() if v["serves"]] == ["vLLM", "transformers", "llama.cpp"]
    assert "use `--target deci`" in engines["SGLang"]["why"] and not engines["TensorRT-LLM"]["serves"]
    assert "vLLM, transformers, llama.cpp: yes; SGLang, TensorRT-LLM: no (" in stdout
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []  # no temporary left


@pytest.mark.subprocess
def test_transformers_without_gac_loads_it_with_gacs_logits(pruned_dir, deci_export, tmp_path):
    from gac.checkpoint.loading import load_model

    out, _ = deci_export
    source = load_model(str(pruned_dir)).model
    ids = _ids(source.config.vocab_size)
    ref = tmp_path / "ref.pt"
    widths = [layer.mlp.down_proj.in_features for layer in source.model.layers]
    torch.save({"ids": ids, "logits": _logits(source, ids), "widths": widths}, ref)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["gac"] = None  # `import gac` fails: nothing of gac's may take part
        import torch
        from transformers import AutoModelForCausalLM
        ref = torch.load({str(ref)!r})
        model = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
        if type(model).__name__ != "DeciLMForCausalLM":
            sys.exit(f"built {{type(model).__name__}}")
        widths = [layer.mlp.down_proj.in_features for layer in model.model.layers]
        if widths != ref["widths"]:
            sys.exit(f"widths {{widths}}, expected {{ref['widths']}}")
        with torch.inference_mode():
            got = model(ref["ids"], use_cache=False).logits
        rel = ((got - ref["logits"]).abs().max() / ref["logits"].abs().max()).item()
        if rel > {MAX_REL}:
            sys.exit(f"logits differ by {{rel}} (relative)")
        with torch.inference_mode():
            model.generate(ref["ids"][:1, :4], max_new_tokens=4, do_sample=False)
    """)
    env = {**os.environ, "VLLM_PLUGINS": "", "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),
           "PYTHONPATH": ""}
    # outside the repository, so that neither src/ nor tests/ can be imported by accident
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_gac_loads_it_back_as_the_same_model_and_refuses_edited_code(pruned_dir, deci_export, tmp_path):
    from gac.checkpoint.loading import load_model
    from gac.errors import GacError

    out, _ = deci_export
    source, back = load_model(str(pruned_dir)), load_model(str(out))
    assert back.model.config.gac_structure == source.model.config.gac_structure  # rebuilt from block_configs
    ids = _ids(source.model.config.vocab_size)
    assert torch.equal(_logits(back.model, ids), _logits(source.model, ids))
    assert back.tokenizer("def f(x):")["input_ids"] == source.tokenizer("def f(x):")["input_ids"]
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    with open(edited / deci.MODEL_CODE, "a") as f:
        f.write("\nprint('changed')\n")
    with pytest.raises(GacError, match=r"differs from the file gac wrote.*--format deci"):
        load_model(str(edited))


def test_a_deci_directory_exports_to_a_deci_gguf(deci_export, tmp_path):
    import gguf

    out, _ = deci_export
    path = tmp_path / "m.gguf"
    p = gac_cli("export", str(out), "--out", str(path), "--quiet")
    assert p.returncode == 0, p.stderr
    reader = gguf.GGUFReader(path)
    blocks = json.loads((out / "config.json").read_text())["block_configs"]
    assert reader.fields["general.architecture"].contents() == "deci"
    assert reader.fields["deci.feed_forward_length"].contents() == [b["ffn"]["intermediate_size"] for b in blocks]


def test_the_deci_gguf_runs_in_llama_cpp_with_gacs_logits(llama_cpp, deci_export, tmp_path):
    from gac.checkpoint.loading import load_model

    out, _ = deci_export
    path = tmp_path / "m.gguf"
    assert gac_cli("export", str(out), "--out", str(path), "--quiet").returncode == 0
    loaded = load_model(str(out))
    tokens = loaded.tokenizer("def f(x): return x + 1  # a tiny test")["input_ids"][:24]
    rel, same = round_trip(path, loaded.model, tokens)
    assert rel < MAX_REL_ERROR and same >= 0.99, (rel, same)


def _family_dir(model_type, d, **config):
    model = tiny_model(model_type)
    for key, value in config.items():
        setattr(model.config, key, value)
    return save_tiny(model, d)


def _head_pruned(d):
    """A gac prune output whose layer 1 keeps one KV group with its two query heads."""
    from gac.models import surgery
    from gac.models.groups import groups_of

    model = tiny_model()
    groups_of(model, "heads", layers=[1])[0].cut(model, surgery.KeepHeads(torch.tensor([2, 3]), torch.tensor([1])))
    return _saved(model, d)


@pytest.mark.slow
def test_what_decilm_cannot_hold_is_one_line_before_loading(tiny_model_dir, tmp_path, monkeypatch):
    import gac.export.deci

    quantized = tmp_path / "quantized"
    shutil.copytree(tiny_model_dir, quantized)
    config = json.loads((quantized / "config.json").read_text())
    (quantized / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "fp8"}}))
    not_model = tmp_path / "not-a-model"
    not_model.mkdir()
    (not_model / "notes.txt").write_text("hello")
    cases = {
        "svd": (_compress(tiny_model_dir, tmp_path / "svd", compressor="svd", ratio=0.3), "was compressed with svd"),
        "palu": (_compress(tiny_model_dir, tmp_path / "palu", compressor="palu", ratio=0.3),
                 "was compressed with palu"),
        "heads": (_head_pruned(tmp_path / "heads"), "layer 1 keeps 2 of 4 query heads"),
        "gemma3": (_family_dir("gemma3_text", tmp_path / "gemma3"), "is a gemma3_text model"),
        "qwen2": (_family_dir("qwen2", tmp_path / "qwen2"), "is a qwen2 model"),
        "window": (_family_dir("mistral", tmp_path / "mistral", sliding_window=8), "sliding window of 8 tokens"),
        "not a model": (not_model, "neither a gac output nor a model directory"),
        "quantized": (quantized, "already quantized (fp8"),
    }
    outs = tmp_path / "outs"
    outs.mkdir()

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(gac.export.deci, "load_model", no_load)  # the name export_deci calls
    for case, (source, expected) in cases.items():
        line = assert_one_error_line(gac_cli("export", source, "--format", "deci", "--out", outs / case), expected)
        assert list(outs.iterdir()) == [], case  # nothing written
        if case == "heads":
            assert "--target deci" in line and "--head-mode none" in line
        if case in ("svd", "palu"):
            assert "low-rank" in line and "--compressor prune" in line


def test_mistral_without_a_sliding_window_is_llamas_layers(tmp_path):
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.loading import load_model

    source = _family_dir("mistral", tmp_path / "mistral", sliding_window=None)
    p = gac_cli("export", source, "--format", "deci", "--out", tmp_path / "deci", "--quiet")
    assert p.returncode == 0, p.stderr
    config = json.loads((tmp_path / "deci" / "config.json").read_text())
    assert "sliding_window" not in config and config["model_type"] == "nemotron-nas"
    original = load_model(str(source)).model
    ids = _ids(original.config.vocab_size)
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "deci", trust_remote_code=True).eval()
    torch.testing.assert_close(_logits(stock, ids), _logits(original, ids), atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_target_deci_gives_widths_every_decilm_engine_builds(tmp_path):
    """A tiny Llama whose MLP is wide enough for multiples of 256: prune under --target deci keeps every width a
    multiple of 256 (or whole) and every head, under the budget, and its export gives each layer an ffn_mult that
    SGLang's and TensorRT-LLM's rule reads back as its width."""
    torch.manual_seed(0)
    wide = tiny_model()
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**{**wide.config.to_dict(), "intermediate_size": 1024, "num_hidden_layers": 3})
    wide = AutoModelForCausalLM.from_config(config).eval()
    source = save_tiny(wide, tmp_path / "wide")
    out = _compress(source, tmp_path / "prune-deci", compressor="prune", ratio=0.3, target="deci", align=True,
                    compressor_options={"layers": "all"})
    report = json.loads((out / "report.json").read_text())
    dims = report["dims"]["gac"]
    widths = [d for name, d in dims.items() if name.endswith("mlp")]
    assert widths and all(w % 256 == 0 for w in widths) and any(w < 1024 for w in widths), dims
    heads = [d for name, d in dims.items() if not name.endswith("mlp")]
    assert all(h == 2 * 16 for h in heads), dims  # every KV group kept (group mode's dim: kept KV width)
    assert report["variants"]["gac"]["params"] <= report["budget_params"]
    assert report["target"]["met"] == report["target"]["constrained"]
    p = gac_cli("export", out, "--format", "deci", "--out", tmp_path / "deci", "--quiet")
    assert p.returncode == 0, p.stderr
    assert "vLLM, transformers, llama.cpp, SGLang, TensorRT-LLM: yes" in p.stdout
    blocks = json.loads((tmp_path / "deci" / "config.json").read_text())["block_configs"]
    for block, width in zip(blocks, widths):
        assert set(block["ffn"]) == {"no_op", "replace_with_linear", "ffn_mult"}
        assert all(rule(block["ffn"]["ffn_mult"], 64) == width for rule in ENGINE_RULES.values())
