"""`gac select`: writes the result JSON, prints a summary, fails in one line, never imports torch."""

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from gac.cli import main

PLAN = {
    "budget": 100_000,
    "weights": [
        {"name": "a", "dim": 37.3, "score": 1.0, "params_per_dim": 1000},
        {"name": "b", "dim": 61.9, "score": 2.0, "params_per_dim": 768, "fixed_params": 5},
    ],
}


@pytest.fixture
def plan_path(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    return path


def test_select_writes_result_json(plan_path, tmp_path):
    out = tmp_path / "nested" / "result.json"
    result = CliRunner().invoke(main, ["select", str(plan_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data) == {"dims", "params", "budget", "objective", "aligned_fraction", "exact", "solver_ms"}
    assert data["dims"] == {"a": 32, "b": 88}
    assert data["params"] <= data["budget"] == 100_000
    assert "aligned fraction" in result.output and "100.0%" in result.output
    assert [p.name for p in out.parent.iterdir()] == ["result.json"]  # no temp file left behind


def test_select_json_flag_prints_the_result(plan_path):
    result = CliRunner().invoke(main, ["select", str(plan_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["dims"] == {"a": 32, "b": 88}


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "cannot read plan"),
        ("{not json", "is not valid JSON"),
        (json.dumps({**PLAN, "budget": 10}), "raise the budget to at least"),
    ],
)
def test_errors_exit_2_with_one_line(tmp_path, content, match):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(main, ["select", str(path), "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "r.json").exists()


@pytest.mark.subprocess
def test_error_in_a_real_process_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gac", "select", str(tmp_path / "missing.json")], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: cannot read plan") and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.subprocess
def test_select_and_help_never_import_torch(plan_path, tmp_path):
    out = tmp_path / "result.json"
    script = textwrap.dedent(
        f"""
        import sys
        from gac.cli import main
        main(["select", {str(plan_path)!r}, "--out", {str(out)!r}], standalone_mode=False)
        main(["select", "--help"], standalone_mode=False)
        main(["--help"], standalone_mode=False)
        assert "torch" not in sys.modules, "torch was imported"
        print("no-torch-ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "no-torch-ok" in proc.stdout
    assert json.loads(out.read_text())["params"] <= PLAN["budget"]
