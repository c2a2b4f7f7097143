"""`gac bench` from the command line: the tiny model twice writes json/md/png; placed by accelerate on CPU and disk
it records the placement and the same perplexity; bad input is one line, exit 2, before any model is loaded."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from click.testing import CliRunner

from gac.cli import main
from gac.cli.bench import model_labels, parse_points
from gac.errors import GacError

FAST = ["--points", "1x8,1x16", "--rounds", "2", "--threads", "1", "--quiet"]


def test_bench_tiny_model_twice_writes_outputs(tiny_model_dir, tmp_path):
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", str(tiny_model_dir), str(tiny_model_dir), *FAST, "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("bench.json", "bench.md", "bench_latency.png"):
        assert (out / name).is_file(), name
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left behind
    data = json.loads((out / "bench.json").read_text())
    label = tiny_model_dir.name
    assert data["models"] == [label, f"{label}#2"]
    assert data["sources"] == {label: str(tiny_model_dir), f"{label}#2": str(tiny_model_dir)}
    assert [(p["batch"], p["seq"]) for p in data["points"]] == [(1, 8), (1, 16)] and data["threads"] == 1
    assert f"{label}#2" in result.output and "wrote" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--points", "1x"], "bad --points"),
        (["--points", "0x128"], "bad --points"),
        (["--points", "1x128,abc"], "bad --points"),
        (["--rounds", "1", "--device", "tpu"], "unknown device"),
    ],
)
def test_bad_options_fail_in_one_line(tiny_model_dir, args, message):
    result = CliRunner().invoke(main, ["bench", str(tiny_model_dir), *args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_model_that_fails_to_load_is_one_line(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    result = CliRunner().invoke(main, ["bench", str(broken), *FAST])
    assert result.exit_code == 2, result.output  # an unexpected exception would give 1 and a traceback
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "broken" in lines[0], result.output


def test_parse_points_and_labels(tmp_path):
    assert parse_points("1x128, 4X512,1x128") == ((1, 128), (4, 512))
    for bad in ("", "1", "x8", "1x8x2", "-1x8", "1x0", "ax8"):
        with pytest.raises(GacError):
            parse_points(bad)
    d = tmp_path / "model-a"
    d.mkdir()
    assert model_labels((str(d), "smollm2-135m", str(d))) == ["model-a", "smollm2-135m", "model-a#2"]


@pytest.mark.subprocess
def test_cli_module_does_not_import_torch():
    code = "import sys, gac.cli.bench; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


PPL = ["--ppl", "--eval-windows", "2", "--seq-len", "16"]


@pytest.fixture(scope="module")
def offloaded(tiny_model_dir, tmp_path_factory):
    """bench.json of the tiny model twice, placed by accelerate with 300 kB of CPU memory: the rest on disk."""
    tmp = tmp_path_factory.mktemp("offloaded")
    result = CliRunner().invoke(main, ["bench", str(tiny_model_dir), str(tiny_model_dir), *FAST, *PPL,
                                       "--device-map", "auto", "--max-memory", "cpu=300KB",
                                       "--offload-folder", str(tmp / "offload"), "--out", str(tmp / "out")])
    assert result.exit_code == 0, result.output
    return json.loads((tmp / "out" / "bench.json").read_text()), (tmp / "out" / "bench.md").read_text(), result.output


def test_bench_places_models_on_cpu_and_disk(offloaded, tiny_model_dir):
    data, markdown, output = offloaded
    label = tiny_model_dir.name
    assert data["device_map"]["map"] == "auto" and data["device_map"]["max_memory"] == {"cpu": 300_000}
    for name in (label, f"{label}#2"):
        placement = data["placement"][name]
        assert set(placement["modules"]) == {"cpu", "disk"}, placement  # both kinds of offload exercised
        assert placement["params"]["disk"] > 0
    timings = [t for p in data["points"] for t in p["results"].values()] + list(data["decode"].values())
    assert all(math.isfinite(t["median_ms"]) and t["median_ms"] > 0 and t["method"] == "wall" for t in timings)
    assert data["eager_note"] and "accelerate" in data["eager_note"]
    assert "disk" in markdown and "Note:" in markdown and "placed by accelerate" in output
    assert all(math.isfinite(v) and v > 1 for v in data["ppl"].values())


def test_offloaded_perplexity_equals_the_plain_load(offloaded, tiny_model_dir, tmp_path):
    data, _, _ = offloaded
    result = CliRunner().invoke(main, ["bench", str(tiny_model_dir), *FAST, *PPL, "--no-aa", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    plain = json.loads((tmp_path / "bench.json").read_text())
    assert plain["placement"] == {tiny_model_dir.name: None} and plain["eager_note"] is None
    expected = plain["ppl"][tiny_model_dir.name]
    assert all(v == pytest.approx(expected, rel=1e-5) for v in data["ppl"].values())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-memory", "cpu=1GiB"], "needs --device-map"),
        (["--offload-folder", "off"], "needs --device-map"),
        (["--device-map", "everywhere"], "unknown --device-map"),
        (["--device-map", "auto", "--device", "cpu"], "exclude each other"),
        (["--device-map", "auto", "--max-memory", "cpu=lots"], "bad --max-memory size"),
        (["--device-map", "auto", "--max-memory", "99=1GiB"], "names GPU 99"),
        (["--device-map", "auto", "smollm2-135m"], "model directories"),
        (["--eval-windows", "2"], "applies only with --ppl"),
    ],
)
def test_bad_placement_options_fail_before_loading(tiny_model_dir, monkeypatch, args, message):
    import gac.cli.bench

    def no_load(*_, **__):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(gac.cli.bench, "_load", no_load)
    result = CliRunner().invoke(main, ["bench", str(tiny_model_dir), *args, *FAST])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
