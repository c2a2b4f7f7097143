"""Sharded saving and accelerate placement: round trip through shards, CPU + disk offload, --max-memory parsing."""

from __future__ import annotations

import json

import pytest
import torch

from gac.checkpoint.gac_dir import load, plan_record, save
from gac.checkpoint.loading import load_model
from gac.checkpoint.placement import Placement, is_dispatched, parse_max_memory, placement_summary
from gac.cli.options import in_flags
from gac.errors import GacError
from gac.evaluate.perplexity import perplexity
from tests.helpers_tiny import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """(model, directory) of the tiny model saved by gac in shards of at most 100 kB."""
    model = tiny_model(seed=5)
    out = tmp_path_factory.mktemp("sharded") / "out"
    save(model, tiny_tokenizer(), out, plan=plan_record(variant="gac", source_model="tiny", alignment=8, dims={}),
         max_shard_size="100KB")
    return model, out


def test_save_writes_shards_with_an_index(sharded):
    model, out = sharded
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (out / "model.safetensors").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    assert set(index["weight_map"]) == set(model.state_dict()) - {"lm_head.weight"}  # tied to the embeddings
    assert not list(out.parent.glob(".*"))  # atomic: no temporary directory left beside it


def test_sharded_round_trip_is_exact(sharded):
    model, out = sharded
    loaded = load(out).model
    ref, got = model.state_dict(), loaded.state_dict()
    assert set(ref) == set(got)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_offloaded_evaluation_on_cpu_and_disk(sharded, tmp_path):
    model, out = sharded
    ids = torch.randint(0, model.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(0))
    loaded = load(out, device_map="auto", max_memory="cpu=300KB", offload_folder=str(tmp_path / "offload"))
    placed = set(loaded.model.hf_device_map.values())
    assert placed == {"cpu", "disk"}, loaded.model.hf_device_map  # both kinds of offload exercised
    assert any(p.device.type == "meta" for p in loaded.model.parameters())  # disk-offloaded weights not in memory
    expected = perplexity(model, ids, progress=False)
    assert perplexity(loaded.model, ids, progress=False) == pytest.approx(expected, rel=1e-5)


def test_load_model_dispatches_an_hf_directory(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), placement=Placement("auto", "cpu=300KB"))
    assert "disk" in set(loaded.model.hf_device_map.values())
    assert is_dispatched(loaded.model)
    summary = placement_summary(loaded.model)
    assert summary["modules"]["cpu"] + summary["modules"]["disk"] == len(loaded.model.hf_device_map)
    n_params = sum(p.numel() for p in loaded.model.parameters())
    assert sum(summary["params"].values()) == n_params and summary["params"]["disk"] > 0


def test_a_plain_load_is_not_dispatched(tiny_model_dir):
    model = load_model(str(tiny_model_dir)).model
    assert not is_dispatched(model) and placement_summary(model) is None


def test_device_map_refused_for_a_gguf_alias():
    with pytest.raises(GacError, match="model directories"):
        load_model("smollm2-135m", placement=Placement("auto"))


@pytest.mark.parametrize("spec, expected", [
    ("cpu=8GiB", {"cpu": 8 * 2**30}),
    ("0=20GiB, cpu=1GB", {0: 20 * 2**30, "cpu": 10**9}),
    ("cuda:1=1MiB,disk=2GiB", {1: 2**20, "disk": 2 * 2**30}),
])
def test_max_memory_parses_accelerate_sizes(spec, expected):
    assert parse_max_memory(spec) == expected


@pytest.mark.parametrize("spec, match", [("cpu=lots", "size"), ("gpu=8GiB", "device"), ("cpu=0GiB", "size"),
                                         (",", "device=size")])
def test_bad_max_memory_is_one_line(spec, match):
    with pytest.raises(GacError, match=match) as e:
        parse_max_memory(spec)
    assert "\n" not in str(e.value)


def test_unknown_device_map_is_refused():
    with pytest.raises(GacError, match="unknown device_map 'everywhere'") as e:
        Placement("everywhere")
    assert in_flags(e.value).startswith("unknown --device-map 'everywhere'")  # the CLI names its flag


@pytest.mark.parametrize("kwargs, match", [({"max_memory": "cpu=1GiB"}, "needs device_map"),
                                           ({"offload_folder": "off"}, "needs device_map"),
                                           ({"device_map": "auto", "max_memory": "99=1GiB"}, "names GPU 99")])
def test_placement_options_that_cannot_apply_are_refused(kwargs, match):
    with pytest.raises(GacError, match=match):
        Placement(**kwargs)
