"""The small stores of the layer-wise pipeline: stored activations (in memory or spilled to disk), the factor cache
and the shard writer (transformers' names and index, tied tensors once, nothing from the meta device)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gac.checkpoint.sharded import ShardWriter
from gac.pipelines.layerwise.analyze import ActivationStore, FactorCache


@pytest.mark.parametrize("spill", [False, True])
def test_activation_store_round_trip(spill):
    tensors = [torch.randn(2, 5, 8), torch.randn(1, 5, 8)]  # [b, seq, D]
    with ActivationStore(spill=spill) as store:
        store[3] = tensors
        got = store[3]
        assert all(torch.equal(a, b) for a, b in zip(got, tensors))
        if spill:
            files = list(Path(store.dir.name).iterdir())
            assert len(files) == 1
        del got, store[3]
        if spill:
            assert not list(Path(store.dir.name).iterdir())
    if spill:
        assert not Path(store.dir.name).exists()  # removed on exit


def test_factor_cache_round_trip():
    a, b = torch.randn(6, 8), torch.randn(5, 6)[:, :4]  # a strided view is stored as its values
    with FactorCache() as cache:
        cache[1] = {"x.A": a, "x.B": b}
        cache[0] = {}  # nothing to keep: cached, with no file
        assert 0 in cache and 1 in cache and 2 not in cache
        got = cache[1]
        assert torch.equal(got["x.A"], a) and torch.equal(got["x.B"], b) and cache[0] == {}
        d = Path(cache.dir.name)
        assert [p.name for p in d.iterdir()] == ["layer-1.safetensors"]
    assert not d.exists() and 1 not in cache  # removed on exit


def test_a_full_temporary_directory_is_one_line_naming_tmpdir(monkeypatch):
    import errno

    import safetensors.torch

    from gac.errors import GacError

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    monkeypatch.setattr(torch, "save", full)
    with FactorCache() as cache, pytest.raises(GacError, match="factor cache .*No space left.*TMPDIR") as e:
        cache[0] = {"a": torch.ones(2)}
    assert "\n" not in str(e.value)
    with ActivationStore(spill=True) as store, pytest.raises(GacError, match="calibration activations .*TMPDIR"):
        store[0] = [torch.ones(2)]


def test_a_real_failed_write_in_either_store_is_one_line_naming_tmpdir():
    """Both stores write safetensors, whose error on a real failed write (past a file-size limit here, a full disk
    in use) carries the errno: one line with the operating system's reason, not an unexpected error."""
    from gac.errors import GacError
    from tests.helpers import file_size_limit

    big = torch.zeros(1 << 16)  # 256 KiB
    with FactorCache() as cache, ActivationStore(spill=True) as store, file_size_limit(100_000):
        with pytest.raises(GacError, match=r"factor cache .*\(File too large\): point TMPDIR") as e:
            cache[0] = {"a": big}
        assert "\n" not in str(e.value)
        with pytest.raises(GacError, match=r"calibration activations .*\(File too large\): point TMPDIR"):
            store[0] = [big]


def test_shard_writer_names_index_and_ties(tmp_path):
    emb = torch.randn(10, 4)
    w = ShardWriter(tmp_path)
    w.add({"model.layers.0.a.weight": torch.randn(3, 4)})
    w.add({"model.embed_tokens.weight": emb, "lm_head.weight": emb, "model.norm.weight": torch.ones(4)})
    paths = w.close()
    assert [p.name for p in paths] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {"model.layers.0.a.weight", "model.embed_tokens.weight", "model.norm.weight"}
    assert index["metadata"]["total_size"] == 4 * (12 + 40 + 4)
    assert torch.equal(load_file(paths[1])["model.embed_tokens.weight"], emb)
    from gac.io.atomic import new_file_mode

    assert all((p.stat().st_mode & 0o777) == new_file_mode() for p in paths)  # not safetensors' 0600
    with pytest.raises(ValueError, match="meta"):
        ShardWriter(tmp_path / "x").add({"w": torch.empty(2, device="meta")})
