"""`gac profile`: a tiny --dims sweep writes the profile and plots; bad input fails in one line (exit 2)."""

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from gac.cli import main
from gac.cli.profile import parse_dims
from gac.errors import GacError


@pytest.fixture
def env(tmp_path):
    return {"GAC_CACHE_DIR": str(tmp_path / "cache")}


def run(args, env):
    return CliRunner().invoke(main, ["profile", *args], env=env)


TINY = ["--dims", "8:10", "--head-dims", "8,16", "--hidden", "32", "--heads", "2", "--batch", "2", "--context", "16",
        "--m", "4", "--threads", "1"]


@pytest.mark.slow
def test_tiny_dims_sweep_writes_profile_and_plots(tmp_path, env):
    out = tmp_path / "prof" / "cpu.json"
    result = run([*TINY, "--out", str(out)], env)
    assert result.exit_code == 0, result.output
    profile = json.loads(out.read_text())
    assert {e["op"] for e in profile["ops"]} == {"gemm_n", "gemm_k", "sdpa", "lowrank"}
    assert all(e["dims"] == ([8, 16] if e["op"] == "sdpa" else [8, 9, 10]) and e["m"] in (4, 1)
               for e in profile["ops"])
    shapes = {(e["op"], e["m"]): e["shape"] for e in profile["ops"]}
    assert shapes[("gemm_n", 4)] == {"k": 32} and shapes[("lowrank", 1)] == {"in": 32, "out": 32}
    assert shapes[("sdpa", 1)] == {"batch": 2, "heads": 2, "seq": 16}
    assert profile["spec"]["sizes"] == {"hidden": 32, "lowrank_in": 32, "lowrank_out": 32, "batch": 2, "heads": 2,
                                        "context": 16}
    assert profile["threads"] == 1
    assert sorted(p.name for p in out.parent.glob("*.png")) == [
        "cpu_gemm_k.png", "cpu_gemm_n.png", "cpu_lowrank.png", "cpu_sdpa.png"]
    assert f"profile: {out}" in result.output and "measured in" in result.output and "cliffs" in result.output

    again = run([*TINY, "--out", str(out), "--no-plot"], env)
    assert again.exit_code == 0 and "reused the cached profile" in again.output and "plot:" not in again.output
    other = run([*TINY, "--heads", "1", "--out", str(out), "--no-plot"], env)  # fixed sizes are part of the key
    assert other.exit_code == 0 and "measured in" in other.output


@pytest.fixture
def built_spec(monkeypatch, env):
    """Run `gac profile ARGS` and return the SweepSpec it would measure (nothing is measured)."""
    from gac.hw import profile as hp

    seen = {}

    def fake_profile(spec, **kwargs):
        seen["spec"] = spec
        return {"ops": [], "device_name": "x", "device": "cpu", "dtype": "float32", "threads": 1}

    monkeypatch.setattr(hp, "profile", fake_profile)

    def build(args):
        result = run([*args, "--no-plot"], env)
        assert result.exit_code == 0, result.output
        return seen["spec"]

    return build


def test_dims_leave_sdpa_head_dims_alone(built_spec):
    from gac.hw.profile import FixedSizes, SweepSpec

    spec = built_spec(["--dims", "96:160,4032:4160:8"])
    assert spec.dims == (*range(96, 161), *range(4032, 4161, 8))
    assert spec.head_dims == SweepSpec().head_dims and spec.sizes == FixedSizes()
    assert built_spec(["--quick", "--dims", "8:9"]).head_dims == SweepSpec.quick().head_dims


def test_head_dims_and_fixed_sizes_build_the_spec(built_spec):
    spec = built_spec(["--head-dims", "64:256:8", "--hidden", "4096", "--heads", "32", "--batch", "4",
                       "--context", "2048"])
    assert spec.head_dims == tuple(range(64, 257, 8)) and spec.dims == tuple(range(64, 513))
    assert (spec.sizes.hidden, spec.sizes.lowrank_in, spec.sizes.lowrank_out) == (4096, 4096, 4096)
    assert (spec.sizes.heads, spec.sizes.batch, spec.sizes.context) == (32, 4, 2048)


def test_given_sizes_win_over_the_models(built_spec, tiny_model_dir):
    spec = built_spec(["--model", str(tiny_model_dir), "--head-dims", "8:9", "--heads", "3"])
    assert spec.head_dims == (8, 9) and spec.sizes.heads == 3 and spec.sizes.hidden == 64  # hidden from the model
    assert built_spec(["--model", str(tiny_model_dir), "--hidden", "48"]).sizes.lowrank_out == 48


def test_experts_op_sweeps_an_moe_layer_at_the_given_sizes(tmp_path, env):
    out = tmp_path / "cpu.json"
    result = run(["--ops", "experts", "--experts", "4", "--top-k", "2", "--hidden", "32", "--dims", "8:9", "--m", "4",
                  "--threads", "1", "--out", str(out)], env)
    assert result.exit_code == 0, result.output
    profile = json.loads(out.read_text())
    assert [(e["op"], e["m"], e["shape"]) for e in profile["ops"]] == [
        ("experts", m, {"hidden": 32, "experts": 4, "top_k": 2}) for m in (4, 1)]
    assert profile["spec"]["ops"] == ["experts"] and profile["spec"]["sizes"]["top_k"] == 2
    assert [p.name for p in tmp_path.glob("*.png")] == ["cpu_experts.png"]


def test_plan_sweep_windows(tmp_path, env):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"budget": 10**6, "weights": [
        {"name": "a", "dim": 13.2, "score": 1.0, "params_per_dim": 10}]}))
    out = tmp_path / "p.json"
    result = run(["--plan", str(plan), "--m", "1", "--threads", "1", "--out", str(out), "--no-plot"], env)
    assert result.exit_code == 0, result.output
    gemm = next(e for e in json.loads(out.read_text())["ops"] if e["op"] == "gemm_n")
    assert {8, 13, 16, 40} <= set(gemm["dims"]) and gemm["m"] == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dims", "8:x"], "bad --dims"),
        (["--dims", "16:8"], "bad --dims"),
        (["--dims", "0:8"], "bad --dims"),
        (["--dims", "96:160,4032:x"], "bad --dims"),
        (["--head-dims", "64:x"], "bad --head-dims"),
        (["--head-dims", "0:8"], "bad --head-dims"),
        (["--head-dims", "64:4160:8"], "head_dim 4160 is not supported"),
        (["--hidden", "0"], "bad --hidden"),
        (["--heads", "-1"], "bad --heads"),
        (["--batch", "0"], "bad --batch"),
        (["--context", "0"], "bad --context"),
        (["--dims", "8:16", "--plan", "p.json"], "--dims, --plan and --model exclude each other"),
        (["--plan", "/no/such/plan.json"], "cannot read plan"),
        (["--ops", "gemm_n,conv"], "unknown op(s) ['conv']"),
        (["--ops", "experts", "--dims", "8:16"], "an experts sweep needs the layer's experts"),
        (["--ops", "experts", "--experts", "2", "--top-k", "4"], "top_k 4 is more than the 2 experts"),
        (["--experts", "0"], "bad --experts"),
        (["--top-k", "x"], "bad --top-k"),
    ],
)
def test_bad_input_fails_in_one_line(args, message, env):
    result = run(args, env)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_cuda_without_cuda_suggests_cpu(env):
    result = run(["--device", "cuda", "--dims", "8:9"], env)
    assert result.exit_code == 2 and "--device cpu" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_parse_dims():
    assert parse_dims("64:72") == tuple(range(64, 73))
    assert parse_dims("64:128:32") == (64, 96, 128)
    assert parse_dims("111, 96:104:8 ,111") == (96, 104, 111)
    assert parse_dims("126:130,4095:4097") == (126, 127, 128, 129, 130, 4095, 4096, 4097)
    for bad in ("", "a", "1:2:3:4", "8:4", "8:16:0", "-4:8"):
        with pytest.raises(GacError):
            parse_dims(bad)


@pytest.mark.subprocess
def test_cli_module_does_not_import_torch():
    code = "import sys, gac.cli.profile; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_cuda_cli_sweep(tmp_path, env):
    out = tmp_path / "cuda.json"
    result = run(["--device", "cuda", "--dtype", "float16", "--dims", "8:10", "--head-dims", "8,16,64", "--m", "4",
                  "--out", str(out)], env)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["device"] == "cuda"


def test_profile_model_sweeps_around_its_dims(tiny_model_dir, tmp_path):
    """--model: windows around every dim of the model (tiny: hidden 64, intermediate 160, kv 32, head_dim 16)."""
    import json

    from click.testing import CliRunner

    from gac.cli import main

    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["profile", "--device", "cpu", "--model", str(tiny_model_dir), "--m", "8",
                                  "--out", str(out), "--no-plot", "--force"])
    assert r.exit_code == 0, r.output
    p = json.loads(out.read_text())
    gemm = next(e for e in p["ops"] if e["op"] == "gemm_n")
    assert {64, 160, 32}.issubset(gemm["dims"]) and gemm["shape"]["k"] == 64
