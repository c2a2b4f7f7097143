"""load_model: HF directories load; every user mistake is a one-line GacError that names a fix."""

import json
import shutil
import time

import pytest
import torch

from gac.checkpoint.loading import embedded_gguf, load_model
from gac.errors import GacError
from gac.hw.device import DTYPES
from tests.helpers import FIX_WORDS
from tests.helpers_tiny import tiny_model



def _assert_one_line_with_fix(err: GacError):
    msg = str(err)
    assert msg and "\n" not in msg
    assert any(w in msg for w in FIX_WORDS), msg


def test_hf_dir_loads_with_working_tokenizer(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir))
    assert loaded.model.config.model_type == "llama"
    assert loaded.source == str(tiny_model_dir)
    assert not loaded.model.training
    assert next(loaded.model.parameters()).dtype == torch.float32
    text = "def f(x): return x"
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids and all(0 <= i < loaded.model.config.vocab_size for i in ids)
    assert loaded.tokenizer.decode(ids) == text
    ref = tiny_model()  # the same seed wrote the directory: same weights, same logits
    x = torch.tensor([ids])
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(x).logits, ref(x).logits)


def test_hf_dir_loads_in_bfloat16(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


def _dir_without_config(tmp_path):
    d = tmp_path / "empty-model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"")
    return str(d)


def _dir_without_tokenizer(tmp_path):
    d = tmp_path / "no-tokenizer"
    tiny_model().save_pretrained(d)
    return str(d)


def _gpt2_dir(tmp_path):
    import transformers

    d = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100).save_pretrained(d)
    return str(d)


def _not_a_model_file(tmp_path):
    p = tmp_path / "weights.bin"
    p.write_bytes(b"\0" * 16)
    return str(p)


def _broken_gguf(tmp_path):
    p = tmp_path / "broken.gguf"
    p.write_bytes(b"not a gguf file at all")
    return str(p)


@pytest.mark.parametrize("make_spec,match", [
    (lambda tmp: "nope", "unknown model 'nope'"),
    (lambda tmp: "./no/such/dir", "model './no/such/dir' not found"),
    (_dir_without_config, "has no config.json"),
    (_dir_without_tokenizer, "no usable tokenizer"),
    (_gpt2_dir, "unsupported architecture 'gpt2'"),
], ids=["alias", "missing-path", "no-config", "no-tokenizer", "gpt2"])
def test_user_errors_are_one_line_gac_errors(tmp_path, make_spec, match):
    spec = make_spec(tmp_path)
    with pytest.raises(GacError, match=match) as info:
        load_model(spec)
    _assert_one_line_with_fix(info.value)


@pytest.mark.parametrize("make_spec,match", [
    (_broken_gguf, "could not read the model config"),
    (_not_a_model_file, "not a model directory"),
], ids=["broken-gguf", "not-a-model-file"])
def test_unreadable_files_are_one_line_gac_errors(tmp_path, make_spec, match):
    # these two messages name the problem and the path (the parser's reason, or the kind of path expected)
    spec = make_spec(tmp_path)
    with pytest.raises(GacError, match=match) as info:
        load_model(spec)
    assert "\n" not in str(info.value) and spec in str(info.value)


def test_gpt2_rejected_before_tokenizer(tmp_path):
    """The architecture check comes first: a GPT-2 dir without tokenizer files names the architecture."""
    d = _gpt2_dir(tmp_path)
    assert not any(p.name.startswith("tokenizer") for p in (tmp_path / "gpt2").iterdir())
    with pytest.raises(GacError, match="gpt2"):
        load_model(d)


def test_hub_id_offline_fails_quickly(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable at import time, which already happened in this process
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    t0 = time.perf_counter()
    with pytest.raises(GacError, match="someone/some-model") as info:
        load_model("someone/some-model")
    assert time.perf_counter() - t0 < 10
    _assert_one_line_with_fix(info.value)
    assert "hub" in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when CUDA is absent")
def test_cuda_without_cuda_raises(tiny_model_dir):
    with pytest.raises(GacError, match="CUDA is not available") as info:
        load_model(str(tiny_model_dir), device="cuda")
    _assert_one_line_with_fix(info.value)


@pytest.mark.parametrize("device", ["tpu", "mps:0", ""])
def test_unknown_device_raises(tiny_model_dir, device):
    with pytest.raises(GacError, match="unknown device") as info:
        load_model(str(tiny_model_dir), device=device)
    _assert_one_line_with_fix(info.value)


@pytest.mark.parametrize("dtype", ["float64", "fp16", "int8"])
def test_unknown_dtype_raises(tiny_model_dir, dtype):
    with pytest.raises(GacError, match=f"unknown dtype '{dtype}'") as info:
        load_model(str(tiny_model_dir), dtype=dtype)
    _assert_one_line_with_fix(info.value)
    assert all(d in str(info.value) for d in DTYPES)


@pytest.mark.integration
def test_embedded_alias_ships_a_gguf():
    path = embedded_gguf("smollm2-135m")
    assert path.is_file()
    assert path.suffix == ".gguf"
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"  # the real file, not a Git LFS pointer
    assert path.stat().st_size > 10_000_000


def test_gac_dir_without_tokenizer_is_still_detected(tmp_path, tiny_model_dir):
    """A directory with gac_plan.json is loaded by gac's own loader (not refused for lacking a tokenizer)."""
    from gac.checkpoint.gac_dir import PLAN_FILE

    d = tmp_path / "gacdir"
    shutil.copytree(tiny_model_dir, d)
    for p in d.glob("tokenizer*"):
        p.unlink()
    (d / PLAN_FILE).write_text(json.dumps({}))
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "gac_structure": {}}))  # every gac output has one
    loaded = load_model(str(d))
    assert loaded.model.config.model_type == "gac_llama"  # gac's config class of the llama family
    assert loaded.tokenizer is None


def test_a_gguf_config_is_read_once_while_the_file_is_unchanged(tmp_path, monkeypatch):
    """The memory forecast and the loader both read a GGUF's config; its metadata (the whole vocabulary) takes
    seconds to parse, so a process parses it once, again only once the file changed, and each caller gets its own
    copy to change."""
    import os

    import transformers

    from gac.checkpoint.loading import read_config_checked

    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    reads = []

    def from_pretrained(where, gguf_file=None, **kwargs):
        reads.append((where, gguf_file))
        return tiny_model().config

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    first = read_config_checked(str(tmp_path), "m.gguf", path.name)
    second = read_config_checked(str(tmp_path), "m.gguf", path.name)
    assert reads == [(str(tmp_path), "m.gguf")]
    assert first is not second and first.to_dict() == second.to_dict()
    first.num_hidden_layers += 1
    assert read_config_checked(str(tmp_path), "m.gguf", path.name).num_hidden_layers == second.num_hidden_layers
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rewritten in place
    read_config_checked(str(tmp_path), "m.gguf", path.name)
    assert len(reads) == 2


@pytest.mark.integration
def test_the_embedded_models_copy_is_read_replaced_when_broken_and_optional(tmp_path, monkeypatch, caplog):
    """The embedded alias reads its GGUF once and then the copy that read kept (tests/test_integration.py checks the
    copy against the GGUF on the real model); a copy that does not load is replaced, and a cache that cannot be
    written costs only the time. The GGUF read is stood in for by a tiny model (a real one takes 50 s)."""
    import gac.checkpoint.loading as loading
    from gac.checkpoint.gac_dir import LoadedModel
    from tests.helpers_tiny import tiny_tokenizer

    reads = []
    real_load_hf = loading._load_hf

    def load_hf(where, torch_dt, *, source, gguf_file=None, **kw):
        reads.append("gguf" if gguf_file else "copy")
        if gguf_file:
            return LoadedModel(tiny_model(seed=5), tiny_tokenizer(), source)
        return real_load_hf(where, torch_dt, source=source, **kw)

    monkeypatch.setattr(loading, "_load_hf", load_hf)
    monkeypatch.setenv("GAC_CACHE_DIR", str(tmp_path / "cache"))
    first = load_model("smollm2-135m")
    copy_dir = loading.embedded_copy("smollm2-135m", torch.float32)
    assert copy_dir.parent == tmp_path / "cache" / "models" and (copy_dir / "model.safetensors").is_file()
    second = load_model("smollm2-135m")
    assert reads == ["gguf", "copy"] and second.source == "smollm2-135m"
    expected = first.model.state_dict()
    assert all(torch.equal(t, expected[k]) for k, t in second.model.state_dict().items())

    (copy_dir / "model.safetensors").write_bytes(b"torn")  # a damaged copy: read the GGUF again, keep a new copy
    with caplog.at_level("WARNING", logger="gac.checkpoint.loading"):
        load_model("smollm2-135m")
    assert reads[2:] == ["copy", "gguf"] and "did not load" in caplog.text
    load_model("smollm2-135m")
    assert reads[4:] == ["copy"]

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("GAC_CACHE_DIR", str(tmp_path / "a-file"))  # nowhere to write: a warning, the model loaded
    caplog.clear()
    with caplog.at_level("WARNING", logger="gac.checkpoint.loading"):
        assert load_model("smollm2-135m").source == "smollm2-135m"
    assert reads[5:] == ["gguf"] and "could not keep a copy" in caplog.text


@pytest.mark.integration
def test_the_forecast_reads_a_kept_copy_of_any_dtype(tmp_path, monkeypatch):
    """The memory forecast's config comes from whichever dtype's copy an earlier load kept (here only a bf16 run's),
    not the GGUF's metadata (seconds to parse)."""
    import gac.checkpoint.loading as loading
    from gac.pipelines.memory import config_of

    monkeypatch.setenv("GAC_CACHE_DIR", str(tmp_path / "cache"))
    assert loading.kept_copy("smollm2-135m") is None
    copy_dir = loading.embedded_copy("smollm2-135m", torch.bfloat16)
    tiny_model(seed=5).config.save_pretrained(copy_dir)  # a bf16 run's copy (its config is what the forecast reads)
    assert loading.kept_copy("smollm2-135m") == copy_dir
    config, tiny = config_of("smollm2-135m"), tiny_model(seed=5).config
    assert (config.hidden_size, config.num_hidden_layers) == (tiny.hidden_size, tiny.num_hidden_layers)


@pytest.mark.integration
def test_the_embedded_model_without_gguf_is_one_line(monkeypatch):
    import importlib.metadata

    real = importlib.metadata.version

    def version(name):
        if name == "gguf":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(GacError, match=r"needs the gguf package: run `pip install gguf`") as err:
        load_model("smollm2-135m")
    _assert_one_line_with_fix(err.value)
