"""Saving compressed models: round trip through gac and through plain transformers, atomic, --force."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gac.calibration.stats import calibrate
from gac.checkpoint import gac_dir
from gac.checkpoint.gac_dir import MODELING_FILE, PLAN_FILE, save
from gac.checkpoint.loading import load_model
from gac.checkpoint.verify import code_hash
from gac.compressors import make_compressor
from gac.errors import GacError
from gac.models.adapters import adapter_for
from gac.models import modeling_gac
from gac.models.modeling_gac import LowRankLinear
from tests.helpers_tiny import tiny_model, tiny_tokenizer


def _irregular_ranks(analyses):
    """Deliberately unaligned ranks (odd, varied), one weight left dense."""
    ranks = {a.name: 1 + (7 * k + 3) % (min(a.in_features, a.out_features) - 1) for k, a in enumerate(analyses)}
    ranks[analyses[2].name] = None
    return ranks


@pytest.fixture(scope="module")
def compressed():
    """(model, tokenizer, structure, plan, ids, expected logits) of the tiny model compressed by svd."""
    model = tiny_model(seed=3)
    names = adapter_for(model.config).linear_names(model.config)
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, model.config.vocab_size, (2, 16), generator=g)  # [n, seq]
    comp = make_compressor("svd")
    analyses = comp.analyze(model, comp.groups(model), calibrate(model, windows, names, progress=False), progress=False)
    ranks = _irregular_ranks(analyses)
    structure = comp.materialize(model, analyses, ranks)
    assert len(set(structure["lowrank"].values())) > 3  # irregular
    plan = {"compressor": "svd", "ranks": ranks}
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=g)  # [B, S]
    with torch.inference_mode():
        logits = model(ids, use_cache=False).logits
    return model, tiny_tokenizer(), structure, plan, ids, logits


@pytest.fixture(scope="module")
def saved(compressed, tmp_path_factory):
    model, tok, structure, plan, _, _ = compressed
    out = tmp_path_factory.mktemp("saved") / "model"
    returned = save(model, tok, out, plan=plan, extra_files={"report.json": "{}"})
    assert returned == out.resolve()
    return out


def _logits(model, ids):
    with torch.inference_mode():
        return model(ids, use_cache=False).logits


def test_saved_dir_contents(saved, compressed):
    _, _, structure, plan, _, _ = compressed
    written = json.loads((saved / PLAN_FILE).read_text())
    assert written == {**json.loads(json.dumps(plan)), gac_dir.MODELING_HASH: code_hash(saved / MODELING_FILE)}
    assert (saved / "report.json").read_text() == "{}"
    assert (saved / MODELING_FILE).read_bytes() == Path(modeling_gac.__file__).read_bytes()
    assert (saved / "model.safetensors").is_file()
    config = json.loads((saved / "config.json").read_text())
    assert config["gac_structure"] == structure
    assert config["model_type"] == "gac_llama"  # transformers alone does not know it: no silent LlamaForCausalLM
    assert config["auto_map"] == {"AutoConfig": "modeling_gac.GacLlamaConfig",
                                  "AutoModelForCausalLM": "modeling_gac.GacLlamaForCausalLM",
                                  "AutoModel": "modeling_gac.GacLlamaModel"}


def test_gac_load_gives_same_logits(saved, compressed):
    _, _, structure, _, ids, expected = compressed
    loaded = gac_dir.load(saved)
    for name, rank in structure["lowrank"].items():
        module = loaded.model.get_submodule(name)
        assert isinstance(module, LowRankLinear) and module.rank == rank
    torch.testing.assert_close(_logits(loaded.model, ids), expected, atol=1e-6, rtol=0)
    assert loaded.tokenizer is not None
    assert loaded.tokenizer("hello")["input_ids"] == tiny_tokenizer()("hello")["input_ids"]


def test_load_model_detects_gac_dir(saved, compressed):
    _, _, _, _, ids, expected = compressed
    loaded = load_model(str(saved))
    assert any(isinstance(m, LowRankLinear) for m in loaded.model.modules())
    torch.testing.assert_close(_logits(loaded.model, ids), expected, atol=1e-6, rtol=0)


@pytest.mark.subprocess
def test_plain_transformers_loads_in_fresh_process(saved, compressed, tmp_path):
    _, _, structure, _, ids, expected = compressed
    ref = tmp_path / "ref.pt"
    torch.save({"ids": ids, "logits": expected, "lowrank": structure["lowrank"]}, ref)
    script = textwrap.dedent(f"""
        import sys, torch
        from transformers import AutoModelForCausalLM
        assert "gac" not in sys.modules
        ref = torch.load({str(ref)!r})
        model = AutoModelForCausalLM.from_pretrained({str(saved)!r}, trust_remote_code=True).eval()
        for name, rank in ref["lowrank"].items():
            m = model.get_submodule(name)
            if type(m).__name__ != "LowRankLinear" or m.rank != rank:
                sys.exit(f"{{name}}: {{type(m).__name__}} rank {{getattr(m, 'rank', None)}}, expected {{rank}}")
        with torch.inference_mode():
            got = model(ref["ids"], use_cache=False).logits
        diff = (got - ref["logits"]).abs().max().item()
        if diff > 1e-6:
            sys.exit(f"logits differ by {{diff}}")
        if any(n.split(".")[0] == "gac" for n in sys.modules):
            sys.exit("the saved modeling code imported gac")
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),
           "PYTHONPATH": ""}
    # run outside the repository so that neither src/ nor tests/ can be imported by accident
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


IMPORT_ORDERS = {
    "gac first": "import gac\nfrom transformers import AutoModelForCausalLM, AutoTokenizer",
    "transformers first": "from transformers import AutoModelForCausalLM, AutoTokenizer\nimport gac",
    "a config class first": "import gac\nfrom transformers import LlamaConfig\n"
                            "from transformers import AutoModelForCausalLM, AutoTokenizer",
}


def _booby_trapped_copy(saved, tmp_path):
    """A copy of the saved output whose modeling_gac.py leaves a mark file when it runs: (directory, mark)."""
    import shutil

    d, mark = tmp_path / "model", tmp_path / "ran"
    shutil.copytree(saved, d)
    with open(d / MODELING_FILE, "a") as f:
        f.write(f"\nopen({str(mark)!r}, 'w').write('the directory code ran')\n")
    return d, mark


@pytest.mark.subprocess
@pytest.mark.parametrize("order", list(IMPORT_ORDERS))
def test_after_import_gac_transformers_loads_it_with_gacs_classes(saved, compressed, tmp_path, order):
    """After `import gac` (before or after transformers), AutoModelForCausalLM.from_pretrained(DIR) builds gac's
    own classes without trust_remote_code; with trust_remote_code=True too: the directory's modeling_gac.py (here
    one that leaves a mark when run) is never imported."""
    _, _, structure, _, ids, expected = compressed
    d, mark = _booby_trapped_copy(saved, tmp_path)
    ref = tmp_path / "ref.pt"
    torch.save({"ids": ids, "logits": expected}, ref)
    script = IMPORT_ORDERS[order] + textwrap.dedent(f"""
        import sys, torch
        ref = torch.load({str(ref)!r})
        for trust in (False, True):
            model = AutoModelForCausalLM.from_pretrained({str(d)!r}, trust_remote_code=trust).eval()
            if type(model).__module__ != "gac.models.modeling_gac" or type(model).__name__ != "GacLlamaForCausalLM":
                sys.exit(f"built {{type(model).__module__}}.{{type(model).__name__}}")
            with torch.inference_mode():
                diff = (model(ref["ids"], use_cache=False).logits - ref["logits"]).abs().max().item()
            if diff > 1e-6:
                sys.exit(f"logits differ by {{diff}}")
        AutoTokenizer.from_pretrained({str(d)!r})
        if any(n.startswith("transformers_modules") for n in sys.modules):
            sys.exit("the directory's code was imported")
    """)
    src = Path(gac_dir.__file__).parents[2]  # this gac, whatever the working directory (not an installed one)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),
           "PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not mark.exists()
    assert "could not register" not in proc.stderr


def test_gac_load_runs_no_code_from_the_directory_and_refuses_an_edited_one(saved, compressed, tmp_path, caplog):
    _, _, _, _, ids, expected = compressed
    d, mark = _booby_trapped_copy(saved, tmp_path)
    with pytest.raises(GacError, match="modeling_gac.py differs from the file gac wrote") as info:
        gac_dir.load(d)
    assert "allow_modified_code=True" in str(info.value) and "\n" not in str(info.value)
    with caplog.at_level("WARNING", logger="gac.checkpoint.verify"):
        loaded = gac_dir.load(d, allow_modified_code=True)
    assert "never run it" in caplog.text
    torch.testing.assert_close(_logits(loaded.model, ids), expected, atol=1e-6, rtol=0)
    (d / MODELING_FILE).unlink()  # nothing left that trust_remote_code could run: gac needs no such file
    torch.testing.assert_close(_logits(gac_dir.load(d).model, ids), expected, atol=1e-6, rtol=0)
    assert not mark.exists()


def test_a_gac_output_resaves_as_the_same_model(saved, compressed, tmp_path):
    """Loaded (gac's config class, model type gac_llama) and saved again: the same files' meaning and logits."""
    _, _, _, plan, ids, expected = compressed
    loaded = gac_dir.load(saved)
    again = save(loaded.model, loaded.tokenizer, tmp_path / "again", plan=gac_dir.read_plan(saved))
    first, second = (json.loads((d / "config.json").read_text()) for d in (saved, again))
    assert second == first
    assert gac_dir.read_plan(again) == gac_dir.read_plan(saved)
    torch.testing.assert_close(_logits(gac_dir.load(again).model, ids), expected, atol=1e-6, rtol=0)


def test_gac_classes_are_built_once_and_pickle(saved):
    """The same class object on every lookup (transformers' Auto mappings key on it) and a loaded config pickles
    (vLLM hands it to its engine process so)."""
    import pickle

    from gac.models import modeling_gac

    config = gac_dir.read_config(saved)
    assert type(config) is modeling_gac.gac_config_class("llama") is modeling_gac.gac_config_class("gac_llama")
    assert modeling_gac.gac_class("llama") is modeling_gac.gac_class("gac_llama") is modeling_gac.GacLlamaForCausalLM
    again = pickle.loads(pickle.dumps(config))
    assert type(again) is type(config) and again.gac_structure == config.gac_structure


def test_modeling_file_imports_no_gac(saved):
    text = (saved / MODELING_FILE).read_text()
    assert "import gac" not in text
    assert "from gac" not in text
    assert "class LowRankLinear" in text


def test_saved_architecture_is_the_one_gacs_vllm_plugin_serves(saved):
    """save_pretrained writes the live class (LlamaForCausalLM, which vLLM would build at the original shapes);
    the saved name is the Gac class that both auto_map and gac's vLLM plugin resolve."""
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["GacLlamaForCausalLM"]
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_gac.GacLlamaForCausalLM"


def test_vllm_transformers_backend_cannot_build_a_resized_model(saved):
    """Built from inside vLLM's Transformers backend (which fuses projections by shape), a gac model with a
    structure refuses with the fix; built from anywhere else, it builds. A frame of that file name stands in."""
    from transformers import AutoConfig

    from gac.models.modeling_gac import VLLM_TRANSFORMERS_BACKEND, gac_class

    config = AutoConfig.from_pretrained(saved)
    cls = gac_class(config.model_type)
    inside = compile("cls(config)", f"/site-packages/{VLLM_TRANSFORMERS_BACKEND}base.py", "eval")
    with pytest.raises(ValueError, match=r"pip install 'gac\[vllm\]'"):
        eval(inside, {"cls": cls, "config": config})
    assert isinstance(eval(compile("cls(config)", "/site-packages/elsewhere.py", "eval"),
                           {"cls": cls, "config": config}), cls)
    base = gac_class(config.model_type, base_model=True)  # what that backend builds: AutoModel, the decoder
    with pytest.raises(ValueError, match="Transformers backend cannot build"):
        eval(inside, {"cls": base, "config": config})
    config.gac_structure = {}
    assert isinstance(eval(inside, {"cls": cls, "config": config}), cls)  # nothing resized: vLLM may build it


def test_automodel_is_the_decoder_at_the_saved_shapes(saved, compressed):
    from transformers import AutoModel

    _, _, _, _, ids, _ = compressed
    config = json.loads((saved / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_gac.GacLlamaModel"
    decoder = AutoModel.from_pretrained(saved, trust_remote_code=True).eval()
    full = load_model(str(saved)).model
    with torch.inference_mode():
        torch.testing.assert_close(decoder(ids).last_hidden_state, full.model(ids).last_hidden_state)


def test_existing_dir_refused_unless_force(compressed, tmp_path):
    model, tok, structure, plan, ids, expected = compressed
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(GacError, match="already exists") as info:
        save(model, tok, out, plan=plan)
    assert "--force" in str(info.value)
    assert sorted(p.name for p in out.iterdir()) == ["stale.txt"]  # untouched
    save(model, tok, out, plan=plan, force=True)
    assert not (out / "stale.txt").exists()  # replaced, not merged
    assert (out / PLAN_FILE).is_file()
    torch.testing.assert_close(_logits(gac_dir.load(out).model, ids), expected, atol=1e-6, rtol=0)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temp or old dirs left beside it


def test_existing_file_refused_even_with_force(compressed, tmp_path):
    model, tok, structure, plan, _, _ = compressed
    out = tmp_path / "file"
    out.write_text("x")
    with pytest.raises(GacError, match="not a directory"):
        save(model, tok, out, plan=plan, force=True)
    assert out.read_text() == "x"


def _failing_write(model, tokenizer, d, plan, extra_files, *_):
    (d / "config.json").write_text("{}")
    raise RuntimeError("disk full")


def test_failed_save_leaves_nothing(compressed, tmp_path, monkeypatch):
    model, tok, structure, plan, _, _ = compressed
    monkeypatch.setattr(gac_dir, "_write", _failing_write)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="disk full"):
        save(model, tok, out, plan=plan)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no .partial temp dir either


def test_failed_forced_save_keeps_the_old_dir(compressed, tmp_path, monkeypatch):
    model, tok, structure, plan, _, _ = compressed
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("previous model")
    monkeypatch.setattr(gac_dir, "_write", _failing_write)
    with pytest.raises(RuntimeError, match="disk full"):
        save(model, tok, out, plan=plan, force=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_load_refuses_non_gac_dir(tiny_model_dir):
    with pytest.raises(GacError, match=PLAN_FILE):
        gac_dir.load(tiny_model_dir)


LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy-0.1.0"


def test_output_of_release_0_1_0_still_loads(tmp_path, monkeypatch):
    """A directory saved by gac 0.1.0 (every structure kind: pruned linears and heads, PaLU groups, low-rank
    pairs) loads with gac.load and with plain transformers, and computes the logits it computed then."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from gac.checkpoint.gac_dir import load

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    expected = load_file(LEGACY / "expected_logits.safetensors")
    scale = float(expected["logits"].abs().max())
    for model in (load(LEGACY).model, AutoModelForCausalLM.from_pretrained(LEGACY, trust_remote_code=True).eval()):
        with torch.inference_mode():
            got = model(expected["ids"], use_cache=False).logits
        assert float((got - expected["logits"]).abs().max()) <= 1e-5 * scale
    structure = json.loads((LEGACY / "config.json").read_text())["gac_structure"]
    assert set(structure) == {"linear", "attention", "lowrank", "grouped_lowrank"}
