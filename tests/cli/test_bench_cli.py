"""`gac bench` from the command line: the tiny model twice writes json/md/png; bad input is one line, exit 2."""

from __future__ import annotations

import json
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


def test_cli_module_does_not_import_torch():
    code = "import sys, gac.cli.bench; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
