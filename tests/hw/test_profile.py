"""Tiny real CPU sweeps: a valid profile, save/load round trip, cache keyed and reused, errors, plots."""

import dataclasses
import json

import pytest
import torch

from gac.align.profiled import spec_from_model, spec_from_plan
from gac.errors import GacError
from gac.hw import profile as hp
from gac.hw.plots import plot_profile

TINY = hp.SweepSpec(
    dims=(8, 9, 16),
    head_dims=(8, 16),
    m_values=(4, 1),
    sizes=hp.FixedSizes(hidden=32, lowrank_in=32, lowrank_out=24, heads=2, context=16),
    warmup=1,
    repeats=3,
    threads=1,
)


@pytest.fixture(scope="module")
def tiny_profile():
    return hp.run_profile(TINY, device="cpu", dtype="float32", progress=False)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GAC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "profiles"


def test_tiny_sweep_is_a_valid_profile(tiny_profile):
    p = tiny_profile
    assert p["gac_profile"] == 1 and p["device"] == "cpu" and p["dtype"] == "float32"
    assert p["threads"] == 1 and p["torch"] == torch.__version__ and p["device_name"]
    assert [(e["op"], e["m"]) for e in p["ops"]] == [(op, m) for op in hp.OPS for m in (4, 1)]
    for e in p["ops"]:
        n = len(e["dims"])
        assert len(e["ms"]) == len(e["p10_ms"]) == len(e["p90_ms"]) == n
        assert all(lo <= mid <= hi for lo, mid, hi in zip(e["p10_ms"], e["ms"], e["p90_ms"]))
        assert all(ms > 0 for ms in e["ms"])
        assert e["backend"] == ("cpu" if e["op"] == "sdpa" else None)
    sdpa = {e["m"]: e["shape"] for e in p["ops"] if e["op"] == "sdpa"}
    assert sdpa == {4: {"batch": 1, "heads": 2, "seq": 4}, 1: {"batch": 1, "heads": 2, "seq": 16}}
    assert json.loads(json.dumps(p)) == p


def test_thread_count_restored_after_sweep():
    before = torch.get_num_threads()
    hp.run_profile(dataclasses.replace(TINY, ops=("gemm_n",), m_values=(1,)), progress=False)
    assert torch.get_num_threads() == before


def test_bfloat16_sweep_records_dtype():
    spec = dataclasses.replace(TINY, ops=("gemm_k",), m_values=(2,))
    assert hp.run_profile(spec, dtype="bfloat16", progress=False)["dtype"] == "bfloat16"


def test_save_load_round_trip(tiny_profile, tmp_path):
    path = hp.save_profile(tiny_profile, tmp_path / "sub" / "p.json")
    assert hp.load_profile(path) == tiny_profile
    assert [f.name for f in path.parent.iterdir()] == ["p.json"]  # no temp file left behind


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "not found"),
        ("{not json", "not valid JSON"),
        ('{"ops": []}', "not a gac profile"),
        ('{"gac_profile": 99, "ops": []}', "format 99"),
        ('{"gac_profile": 1, "ops": [{"op": "gemm_n", "m": 1, "dims": [8], "ms": []}]}', "malformed"),
        ('{"gac_profile": 1, "ops": []}', "no measurements"),
    ],
)
def test_invalid_profile_files(tmp_path, text, message):
    path = tmp_path / "p.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(GacError, match=message) as err:
        hp.load_profile(path)
    assert "\n" not in str(err.value)


def test_cache_path_keyed_by_device_dtype_torch(cache):
    f32, bf16 = hp.cached_profile_path("cpu", "float32"), hp.cached_profile_path("cpu", torch.bfloat16)
    assert f32.parent == cache and f32 != bf16
    assert "float32" in f32.name and "bfloat16" in bf16.name and f32.name.startswith("cpu-")
    assert torch.__version__.split("+")[0] in f32.name


def test_profile_caches_and_reuses(cache, tmp_path, monkeypatch):
    first = hp.profile(TINY, out=tmp_path / "out.json", progress=False)
    assert hp.cached_profile_path().is_file() and hp.load_profile(tmp_path / "out.json") == first

    def no_sweep(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(hp, "run_profile", no_sweep)
    assert hp.profile(TINY, progress=False) == first
    with pytest.raises(AssertionError):  # another spec or --force measures again
        hp.profile(dataclasses.replace(TINY, repeats=2), progress=False)
    with pytest.raises(AssertionError):
        hp.profile(TINY, force=True, progress=False)


def test_a_cache_swept_by_an_older_method_is_measured_again(cache, tmp_path, monkeypatch):
    """Both caches (the per-device one and --speedup's auto sweeps) measure again a profile without today's
    sweep_method: its CPU sweeps read operands from cache."""
    first = hp.profile(TINY, progress=False)
    assert first["sweep_method"] == hp.SWEEP_METHOD
    old = {k: v for k, v in first.items() if k != "sweep_method"}
    hp.save_profile(old, hp.cached_profile_path())
    assert hp.load_cached_profile(TINY) is None
    hp.save_profile(old, hp.sweep_cache_path(TINY, device="cpu", dtype="float32"))
    monkeypatch.setattr(hp, "run_profile", lambda *a, **k: first)
    assert hp.cached_sweep(TINY, device="cpu", dtype="float32", progress=False) is first
    assert hp.load_profile(hp.sweep_cache_path(TINY, device="cpu", dtype="float32"))["sweep_method"] == hp.SWEEP_METHOD


@pytest.mark.parametrize("chunk_mib, llc_mib, copies", [(100, 480, 10), (100, 4096, 21), (1500, 480, 1),
                                                        (1, 480, hp.MAX_COPIES), (10, 32, 7)])
def test_cpu_chunk_copies_exceed_twice_the_last_level_cache(chunk_mib, llc_mib, copies):
    """A chunk's input sets together exceed twice the cache (at most CPU_ROTATION_CAP: 2 GiB, here 21 x 100 MiB),
    one set per dim where the chunk alone does, and no more than MAX_COPIES."""
    assert hp.cpu_chunk_copies(chunk_mib << 20, llc_mib << 20) == copies


def test_cpu_sweep_rotates_operand_copies(monkeypatch):
    """On CPU each dim of a chunk gets the copies cpu_chunk_copies asks for its chunk's bytes (recorded per entry)."""
    monkeypatch.setattr(hp, "last_level_cache_bytes", lambda: 64 << 10)  # 64 KiB: a few copies of tiny operands
    spec = dataclasses.replace(TINY, ops=("gemm_n",), m_values=(4,))
    entry = hp.run_profile(spec, progress=False)["ops"][0]
    shape = entry["shape"]
    chunk = sum(hp._set_bytes(hp._tensor_shapes("gemm_n", 4, d, shape), torch.float32) for d in TINY.dims)
    assert entry["copies"] == hp.cpu_chunk_copies(chunk, 64 << 10) > 1


def test_last_level_cache_is_read_or_defaulted():
    assert hp.last_level_cache_bytes() >= 1 << 20


def test_spec_validation():
    with pytest.raises(GacError, match="unknown op"):
        hp.SweepSpec(ops=("conv",))
    with pytest.raises(GacError, match="dims"):
        hp.SweepSpec(dims=())
    with pytest.raises(GacError, match="unknown dtype"):
        hp.run_profile(TINY, dtype="int8", progress=False)
    with pytest.raises(GacError, match="head_dim 4160 is not supported.*--head-dims"):
        hp.SweepSpec(head_dims=tuple(range(64, 4161, 8)))
    for bad in (0, -1, 2.5):
        with pytest.raises(GacError, match="heads must be a positive integer"):
            hp.FixedSizes(heads=bad)


def test_spec_from_plan_windows():
    plan = {"budget": 10**6, "weights": [{"name": "a", "dim": 107.4, "score": 1.0, "params_per_dim": 10,
                                          "candidates": [100]}]}
    dims = spec_from_plan(plan, TINY).dims
    assert {107, 100} <= set(dims)
    assert {72, 80, 104, 112, 136, 144} <= set(dims)  # the candidate window, one multiple wider
    assert all(d == 107 or d == 100 or d % 8 == 0 for d in dims)
    with pytest.raises(GacError):
        spec_from_plan({"budget": 1, "weights": []})


def test_quick_spec_covers_the_111_cliff():
    spec = hp.SweepSpec.quick()
    assert {96, 111, 112, 128} <= set(spec.dims) and spec.m_values == (1024, 1)
    assert spec.sizes.hidden == 1024


def test_plots_written_as_png(tiny_profile, tmp_path):
    paths = plot_profile(tiny_profile, tmp_path, prefix="p")
    assert sorted(p.name for p in paths) == sorted(f"p_{op}.png" for op in hp.OPS)
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_cuda_sweep():
    spec = dataclasses.replace(TINY, threads=None, buffers=2)
    p = hp.run_profile(spec, device="cuda", dtype="float16", progress=False)
    assert p["device"] == "cuda" and p["device_name"] == torch.cuda.get_device_name()
    for e in p["ops"]:
        assert all(ms > 0 for ms in e["ms"])
        if e["op"] == "sdpa":
            assert e["backend"] in hp.SDPA_BACKENDS


def test_spec_from_model_includes_palu_group_ranks(tiny):
    """A grouped (PaLU) K projection: each group's rank and their sum (the shared down-projection's N) are swept."""
    from gac.models.surgery import factorize_head_groups

    k = tiny.model.layers[0].self_attn.k_proj  # 64 -> 32: two groups of 16 rows
    factorize_head_groups(tiny, "model.layers.0.self_attn.k_proj",
                                 [(torch.randn(r, k.in_features), torch.randn(16, r)) for r in (11, 14)])
    spec = spec_from_model(tiny, TINY)
    assert {11, 14, 25} <= set(spec.dims) and {64, 160, 32} <= set(spec.dims)
    assert 16 in spec.head_dims and spec.sizes.hidden == spec.sizes.lowrank_in == 64


def test_sdpa_heads_sweep_times_each_query_head_count_with_grouped_kv():
    sizes = hp.FixedSizes(batch=1, context=16, head_dim=8, q_per_kv=2)
    spec = hp.SweepSpec(ops=("sdpa_heads",), dims=(2, 4, 6), m_values=(1,), sizes=sizes, warmup=0, repeats=2,
                        threads=1)
    entry = hp.run_profile(spec, progress=False)["ops"][0]
    assert entry["dims"] == [2, 4, 6] and all(ms > 0 for ms in entry["ms"])
    assert entry["shape"] == {"batch": 1, "head_dim": 8, "seq": 16, "q_per_kv": 2}
    q, k, _ = hp._tensor_shapes("sdpa_heads", 1, 6, entry["shape"])
    assert q == (1, 6, 1, 8) and k == (1, 3, 16, 8)  # 6 query heads over 3 KV heads
    fixed_kv = {"batch": 1, "head_dim": 8, "seq": 16, "kv_heads": 2}
    assert hp._tensor_shapes("sdpa_heads", 16, 6, fixed_kv)[1] == (1, 2, 16, 8)
    with pytest.raises(GacError, match="multiples of 2"):
        dataclasses.replace(spec, dims=(3,))
    with pytest.raises(GacError, match="not both"):
        hp.FixedSizes(kv_heads=2, q_per_kv=2)


def test_spec_json_leaves_out_unused_sdpa_heads_sizes():
    """Specs without the heads sweep keep the JSON (and so the cache keys) older profiles were saved with."""
    assert set(TINY.to_json()["sizes"]) == {"hidden", "lowrank_in", "lowrank_out", "batch", "heads", "context"}
    assert hp.SweepSpec(sizes=hp.FixedSizes(head_dim=64)).to_json()["sizes"]["head_dim"] == 64


EXPERTS = hp.SweepSpec(ops=("experts",), dims=tuple(range(8, 25)), m_values=(8, 1),
                       sizes=hp.FixedSizes(hidden=64, experts=4, top_k=2), warmup=1, repeats=3, threads=1)


def test_experts_sweep_times_each_width_as_transformers_runs_it(tmp_path):
    """Every width gets a finite positive time and records what ran it, as gac's models run it: transformers'
    implementation for a loaded model at multiples of 8 channels, the eager loop elsewhere (gac's models run any
    other width eagerly, in float32 too, where torch's grouped GEMM would take rows of 16 bytes)."""
    from gac.hw.experts import loaded_implementation

    loaded = loaded_implementation()
    assert loaded in ("grouped_mm", "eager")
    p = hp.run_profile(EXPERTS, progress=False)
    assert [(e["op"], e["m"]) for e in p["ops"]] == [("experts", 8), ("experts", 1)]
    for e in p["ops"]:
        assert e["shape"] == {"hidden": 64, "experts": 4, "top_k": 2} and e["dims"] == list(EXPERTS.dims)
        assert all(0 < ms < float("inf") for ms in e["ms"])
        ran = dict(zip(e["dims"], e.get("backends", [e["backend"]] * len(e["dims"]))))
        assert ran == {d: loaded if d % 8 == 0 else "eager" for d in ran}
    assert hp.load_profile(hp.save_profile(p, tmp_path / "p.json")) == p  # the schema knows the op


def test_a_width_the_loaded_implementation_refuses_is_timed_eagerly(monkeypatch):
    """Where transformers' implementation raises on a width (torch's grouped GEMM: rows that are not 16 bytes), the
    op runs and records the eager loop, as gac runs a model of that width."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    from gac.hw.experts import ExpertsKernel

    def refuse(*args, **kwargs):
        raise RuntimeError("strides should be multiple of 16 bytes")

    kernel = ExpertsKernel(6, 16, {"hidden": 16, "experts": 4, "top_k": 2}, "cpu", torch.float32)
    kernel.module.config._experts_implementation = "grouped_mm"
    monkeypatch.setitem(ALL_EXPERTS_FUNCTIONS._global_mapping, "grouped_mm", refuse)
    args = tuple(torch.randn(s) for s in hp._tensor_shapes("experts", 6, 16, {"hidden": 16, "experts": 4}))
    assert kernel.fit(args) == "eager" == kernel.implementation
    assert kernel(*args).shape == (6, 16)


@pytest.mark.parametrize("dim", [16, 12, 10])
def test_experts_kernel_is_the_routed_moe_function(dim):
    """The op computes what the layer does: each token's experts' SiLU-gated MLPs, weighted by the routing."""
    from gac.hw.experts import ExpertsKernel

    shape = {"hidden": 16, "experts": 4, "top_k": 2}
    kernel = ExpertsKernel(6, dim, shape, "cpu", torch.float32)
    x, gate_up, down = (torch.randn(s, generator=torch.Generator().manual_seed(0))
                        for s in hp._tensor_shapes("experts", 6, dim, shape))
    kernel.fit((x, gate_up, down))
    index, weights = kernel.routing
    want = torch.zeros_like(x)
    for t in range(6):
        for j in range(2):
            gate, up = (gate_up[index[t, j]] @ x[t]).chunk(2)
            want[t] += weights[t, j] * (down[index[t, j]] @ (torch.nn.functional.silu(gate) * up))
    with torch.inference_mode():
        torch.testing.assert_close(kernel(x, gate_up, down), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, experts, top_k", [(6, 4, 2), (5, 3, 2), (1, 128, 8), (64, 8, 8)])
def test_balanced_routing_gives_distinct_experts_in_turn(m, experts, top_k):
    from gac.hw.experts import balanced_routing

    index, weights = balanced_routing(m, experts, top_k, "cpu", torch.float32)
    assert index.shape == weights.shape == (m, top_k)
    assert all(len(set(row.tolist())) == top_k for row in index)  # a token's experts are distinct
    counts = torch.bincount(index.flatten(), minlength=experts)
    assert int(counts.max() - counts.min()) <= 1 and int(counts.sum()) == m * top_k  # the experts take turns
    assert torch.equal(index[0], torch.arange(top_k)) and torch.allclose(weights.sum(1), torch.ones(m))
    assert torch.equal(balanced_routing(m, experts, top_k, "cpu", torch.float32)[0], index)  # deterministic


def test_experts_sizes_round_trip_and_stay_out_of_other_specs():
    """FixedSizes.of builds the sweep of an experts term's shape; specs without the op keep their JSON keys."""
    shape = {"hidden": 64, "experts": 4, "top_k": 2}
    sizes = hp.FixedSizes.of("experts", shape)
    assert hp._entry_shape("experts", 8, sizes) == shape
    assert {k: EXPERTS.to_json()["sizes"][k] for k in shape} == shape
    assert "experts" not in hp.SweepSpec().to_json()["sizes"] and "top_k" not in TINY.to_json()["sizes"]
    assert json.loads(json.dumps(EXPERTS.to_json())) == EXPERTS.to_json()
    with pytest.raises(GacError, match="experts sweep needs the layer's experts"):
        hp.SweepSpec(ops=("experts",))
    with pytest.raises(GacError, match="top_k 3 is more than the 2 experts"):
        hp.FixedSizes(experts=2, top_k=3)


def test_chunks_hold_at_most_chunk_bytes(monkeypatch):
    """A sweep of big weights builds a few dims at a time (at least one), and still times every dim."""
    shape = hp._entry_shape("experts", 8, EXPERTS.sizes)
    largest = hp._set_bytes(hp._tensor_shapes("experts", 8, 24, shape), torch.float32)
    monkeypatch.setattr(hp, "CHUNK_BYTES", 3 * largest)
    dev = torch.device("cpu")
    assert hp._chunk_size("experts", 8, EXPERTS.dims, shape, EXPERTS, device=dev, dtype=torch.float32) == 3
    monkeypatch.setattr(hp, "CHUNK_BYTES", 1)
    assert hp._chunk_size("experts", 8, EXPERTS.dims, shape, EXPERTS, device=dev, dtype=torch.float32) == 1
    entry = hp.run_profile(dataclasses.replace(EXPERTS, m_values=(2,), repeats=1), progress=False)["ops"][0]
    assert entry["dims"] == list(EXPERTS.dims) and len(entry["ms"]) == len(EXPERTS.dims)


def test_spec_from_an_moe_model_sweeps_its_experts():
    """`gac profile --model` on a mixture of experts adds the experts op at the model's expert count, experts a
    token and hidden size, and sweeps around its expert width; a dense model's ops are left as given."""
    from tests.helpers_moe import tiny_moe

    spec = spec_from_model(tiny_moe("qwen3_moe"), TINY)
    assert spec.ops == (*TINY.ops, "experts")
    assert (spec.sizes.experts, spec.sizes.top_k, spec.sizes.hidden) == (4, 2, 64)
    assert 40 in spec.dims
    from tests.helpers_tiny import tiny_model

    assert spec_from_model(tiny_model(), TINY).ops == TINY.ops


def test_the_experts_op_runs_widths_as_saved_models_do():
    """The op's rule for the eager loop is the one saved models carry (modeling_gac loads without gac)."""
    from gac.hw.experts import GROUPED_MM_ROW
    from gac.models.modeling_gac import GROUPED_MM_ROW as SAVED

    assert GROUPED_MM_ROW == SAVED


def test_quantized_gemm_sweeps_time_int8_and_fp8_and_record_what_a_kernel_refuses(monkeypatch, tmp_path):
    """int8 (torch._int_mm) and fp8 (torch._scaled_mm) GEMMs swept like the float ones; a shape the kernel refuses
    (as CUDA's _int_mm refuses K or N not a multiple of 8: emulated here) has no time and its reason, and the
    profile stays valid and plots."""
    from gac.hw.profile_schema import check_profile

    real = torch._int_mm

    def int_mm(x, w):
        if x.shape[1] % 8 or w.shape[1] % 8:
            raise RuntimeError("mat2 dims must be multiples of 8\nsecond line")
        assert x.dtype == torch.int8 and w.dtype == torch.int8
        return real(x, w)

    monkeypatch.setattr(torch, "_int_mm", int_mm)
    spec = dataclasses.replace(TINY, ops=hp.QUANTIZED_OPS, m_values=(4,))
    p = hp.run_profile(spec, device="cpu", dtype="float32", progress=False)
    by_op = {e["op"]: e for e in p["ops"]}
    assert set(by_op) == set(hp.QUANTIZED_OPS)
    for op in ("int8_n", "int8_k"):
        e = by_op[op]
        assert e["refused"] == {"9": "mat2 dims must be multiples of 8"} and e["ms"][1] is None
        assert e["ms"][0] > 0 and e["ms"][2] > 0
    assert all(t > 0 for t in by_op["fp8_n"]["ms"]) and "refused" not in by_op["fp8_n"]
    check_profile(p, "test")
    assert len(plot_profile(p, tmp_path, prefix="q")) == len(hp.QUANTIZED_OPS)
