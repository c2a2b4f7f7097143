"""The latency model: which ops each group's dim changes, its wide candidate range, tables built from op sweeps
(non-monotone entries kept), the measured constant, and the saved form."""

import pytest

from gac.objectives.latency.model import (
    FULL,
    LatencyModel,
    Phase,
    build_tables,
    measure_latency_model,
    op_spec,
    reference_dims,
    sweep_needs,
)
from gac.errors import GacError
from gac.models.groups import groups_of
from tests.helpers_tiny import tiny_model


def test_phase_rows_and_bad_input():
    assert Phase("prefill", 2, 512).m == 1024 and Phase("decode", 16, 512).m == 16
    with pytest.raises(GacError, match="phase"):
        Phase("train", 1, 512)
    with pytest.raises(GacError, match="shape"):
        Phase("prefill", 0, 512)


def test_candidates_span_small_dims_to_full_width():
    m = tiny_model()
    rank = groups_of(m, "rank")[0]  # q_proj 64x64: break-even rank 31
    assert rank.wide_candidates(8) == [8, 16, 24, FULL]
    mlp = groups_of(m, "mlp")[0]  # width 160
    dims = mlp.wide_candidates(8)
    assert dims[0] == 8 and dims[-2] == 152 and dims[-1] is FULL and len(dims) == 20
    heads = groups_of(m, "heads")[0]  # 2 KV groups of head_dim 16
    assert heads.wide_candidates(8) == [16, FULL]
    palu = groups_of(m, "head_rank", heads_per_group=1)[0]  # no dense member
    assert palu.wide_candidates(8) == [8, 16]


def test_tables_sum_the_ops_that_change_and_keep_cliffs():
    m = tiny_model()
    mlp = groups_of(m, "mlp")[:1]
    needs = sweep_needs(mlp, 8)
    assert set(needs) == {("gemm_n", (("k", 64),)), ("gemm_k", (("n", 64),))}
    # gemm_n has a cliff at 16 (slower than 24): the table must keep it, not smooth it away
    gemm_n = {d: d / 100 for d in needs[("gemm_n", (("k", 64),))]}
    gemm_n[16] = 1.0
    gemm_k = {d: d / 200 for d in needs[("gemm_k", (("n", 64),))]}
    tables, original = build_tables(mlp, 8, {("gemm_n", (("k", 64),)): gemm_n, ("gemm_k", (("n", 64),)): gemm_k})
    table = tables[mlp[0].name]
    assert table[8] == pytest.approx(2 * 0.08 + 8 / 200)  # gate and up (N = w), down (K = w)
    assert table[16] > table[24]  # the cliff survives
    assert table[FULL] == pytest.approx(2 * 1.6 + 160 / 200) == original[mlp[0].name]


def test_palu_original_is_a_share_of_the_dense_projection():
    m = tiny_model()
    groups = groups_of(m, "head_rank", heads_per_group=1)[:2]  # the two KV groups of one k_proj, 16 rows each
    needs = sweep_needs(groups, 8)
    assert needs[("gemm_n", (("k", 64),))] == {16, 32}  # the shared down GEMM at N = 2 r, and dense N = 32
    ops = {key: {d: float(d) for d in dims} for key, dims in needs.items()}
    tables, original = build_tables(groups, 8, ops)
    assert FULL not in tables[groups[0].name]
    assert original[groups[0].name] == pytest.approx(32 / 2)  # half the dense k_proj GEMM
    assert tables[groups[0].name][8] == pytest.approx(16 / 2 + 8)  # half of down at N = 16, plus its up GEMM


def test_rank_group_dense_is_one_gemm_and_lowrank_both():
    m = tiny_model()
    q = groups_of(m, "rank")[:1]
    needs = sweep_needs(q, 8)
    assert needs[("lowrank", (("in", 64), ("out", 64)))] == {8, 16, 24}
    assert needs[("gemm_n", (("k", 64),))] == {64}


def test_constant_and_json_round_trip():
    model = LatencyModel(Phase("decode", 1, 512), {"a": {8: 1.0, FULL: 2.0}, "b": {16: 0.5, 32: 1.0}},
                         {"a": 2.0, "b": 3.0})  # b has no FULL candidate (a PaLU group) but an original time
    cal = model.calibrated(10.0)
    assert cal.constant_ms == pytest.approx(5.0)
    assert cal.predict({}) == pytest.approx(10.0)  # the original predicts what was measured
    assert cal.predict({"a": 8, "b": 16}) == pytest.approx(6.5)
    over = model.calibrated(4.0)  # the sweeps sum to 5 ms: scaled to fit the model, never a negative constant
    assert over.constant_ms == 0.0 and over.predict({}) == pytest.approx(4.0)
    assert over.predict({"a": 8}) == pytest.approx(0.8 * (1.0 + 3.0))
    back = LatencyModel.from_json(cal.to_json())
    assert back.tables == cal.tables and back.phase == cal.phase and back.constant_ms == cal.constant_ms
    assert back.original == cal.original


def test_measured_model_covers_every_candidate():
    m = tiny_model()
    groups = groups_of(m, "heads")[:1] + groups_of(m, "mlp")[:1]
    lm = measure_latency_model(groups, Phase("prefill", 1, 16), repeats=1, progress=False)
    for g in groups:
        assert set(lm.tables[g.name]) == set(g.wide_candidates(8))
        assert all(ms > 0 for ms in lm.tables[g.name].values())


@pytest.mark.parametrize("mode, kv_key", [("group", ("q_per_kv", 2)), ("uniform", ("kv_heads", 2))])
def test_head_group_times_attention_at_each_kept_head_count(mode, kv_key):
    """SDPA's time is read at each candidate's query heads, not scaled from full heads: a sub-linear, non-monotone
    attention table shows through unchanged."""
    g = groups_of(tiny_model(), "heads", mode=mode)[0]  # 4 query heads over 2 KV heads of head_dim 16
    needs = sweep_needs([g], 8)
    key = ("sdpa_heads", (("head_dim", 16), kv_key))
    assert needs[key] == {2, 4}  # half the query heads (one KV group, or one query head per group), and all
    ops = {k: {d: 0.0 for d in dims} for k, dims in needs.items()}  # only attention costs anything
    ops[key] = {2: 0.9, 4: 0.8}  # fewer heads slower: a linear share would give 0.4
    tables, original = build_tables([g], 8, ops)
    assert tables[g.name] == {g.max_dim // 2: 0.9, FULL: 0.8} and original[g.name] == 0.8


@pytest.mark.parametrize("phase", [Phase("prefill", 2, 16), Phase("decode", 2, 16)])
def test_attention_sweep_has_an_entry_per_candidate_head_count(phase):
    g = groups_of(tiny_model(), "heads")[0]
    (key, dims), = [(k, d) for k, d in sweep_needs([g], 8).items() if k[0] == "sdpa_heads"]
    spec = op_spec(*key, dims, phase, repeats=1)
    from gac.hw.profile import run_profile

    entry = run_profile(spec, progress=False)["ops"][0]
    heads = sorted(g.group_size * d // g.head_dim for d in g.wide_candidates(8) if d is not FULL)
    assert entry["dims"] == sorted({*heads, g.num_heads}) and all(ms > 0 for ms in entry["ms"])
    assert entry["shape"]["seq"] == 16 and entry["shape"]["batch"] == 2
    assert entry["m"] == (16 if phase.name == "prefill" else 1)  # causal over its own tokens, or one over the cache


def _width_and_rank_model():
    """A width group (full dim 160, keyed None) and a rank group (break-even 31, not aligned: no candidate)."""
    m = tiny_model()
    groups = groups_of(m, "mlp")[:1] + groups_of(m, "rank")[:1]
    needs = sweep_needs(groups, 8)
    tables, original = build_tables(groups, 8, {k: {d: d / 100 for d in dims} for k, dims in needs.items()})
    full_dims = {g.name: g.full_dim for g in groups if g.full_dim is not None}
    return groups, LatencyModel(Phase("prefill", 1, 16), tables, original, 1.0, {}, full_dims)


def test_full_dim_as_an_int_is_the_original():
    (mlp, rank), lm = _width_and_rank_model()
    assert lm.full_dims == {mlp.name: 160} and 160 not in lm.tables[mlp.name]
    assert lm.predict({mlp.name: 160}) == lm.predict({mlp.name: None}) == lm.predict({})
    assert lm.predict({rank.name: 24}) == pytest.approx(lm.predict({}) - lm.original[rank.name]
                                                        + lm.tables[rank.name][24])


def test_unknown_dim_is_a_one_line_error():
    (mlp, rank), lm = _width_and_rank_model()
    with pytest.raises(GacError, match=rf"^{mlp.name}: no predicted latency for dim 100\b") as e:
        lm.predict({mlp.name: 100})
    assert "\n" not in str(e.value)
    with pytest.raises(GacError, match=f"{rank.name}: .* dim 31"):  # a rank's max_dim is no full dim: not dense
        lm.predict({rank.name: rank.max_dim})


def test_json_round_trip_with_and_without_full_dims():
    import json

    (mlp, _), lm = _width_and_rank_model()
    lm = lm.calibrated(5.0)
    back = LatencyModel.from_json(lm.to_json())
    assert back.full_dims == lm.full_dims and back.tables == lm.tables and back.original == lm.original
    assert back.predict({mlp.name: 160}) == pytest.approx(lm.predict({}))
    old = json.loads(lm.to_json())
    del old["full_dims"]  # written before the field existed
    before = LatencyModel.from_json(json.dumps(old))
    assert before.full_dims == {} and before.predict({}) == pytest.approx(lm.predict({}))
    with pytest.raises(GacError, match="dim 160"):
        before.predict({mlp.name: 160})


def test_measured_model_knows_the_full_dims():
    m = tiny_model()
    groups = groups_of(m, "heads")[:1] + groups_of(m, "rank")[:1]
    lm = measure_latency_model(groups, Phase("prefill", 1, 16), repeats=1, progress=False)
    assert lm.full_dims == {groups[0].name: groups[0].max_dim}  # no rank group: a dense weight has no rank
    assert lm.predict({groups[0].name: groups[0].max_dim}) == lm.predict({})


def _two_groups():
    tables = {"a": {8: 1.0, 16: 2.5, 24: 3.0, FULL: 4.0}, "b": {8: 0.5, 16: 1.0, FULL: 2.0}}
    return LatencyModel(Phase("prefill", 1, 16), tables, {"a": 4.0, "b": 2.0})


def test_reference_dims_sit_near_half_each_groups_time():
    lm = _two_groups()
    assert lm.fastest_ms() == pytest.approx(1.5) and lm.scaled(2.0).fastest_ms() == pytest.approx(3.0)
    assert reference_dims(lm, ["a", "b"]) == {"a": 16, "b": 16}  # 2.5 nearest 2.0; b: 1.0 is half of 2.0
    tie = LatencyModel(lm.phase, {"a": {8: 1.0, 16: 3.0, FULL: 4.0}}, {"a": 4.0})
    assert reference_dims(tie, ["a"]) == {"a": 8}  # 1.0 and 3.0 equally near 2.0: the smaller dim
    assert reference_dims(lm, ["b"]) == {"b": 16}  # a group not named stays as the original


def test_fit_scales_the_saving_to_the_measured_one():
    """The original measures 20 ms and the reference 15 ms: a saving of 5 ms where the sweeps predict 2.5 ms, so
    every table doubles and the constant is what the doubled groups leave of the original."""
    lm = _two_groups()
    ref = {"a": 16, "b": 16}  # predicted saving (4 + 2) - (2.5 + 1) = 2.5
    fit = lm.fitted(20.0, ref, 15.0)
    assert fit.meta["saving_scale"] == pytest.approx(2.0) and fit.meta["baseline_ms"] == 20.0
    assert fit.tables["a"][24] == pytest.approx(6.0) and fit.original["b"] == pytest.approx(4.0)
    assert fit.predict({}) == pytest.approx(20.0) and fit.predict(ref) == pytest.approx(15.0)
    assert fit.constant_ms == pytest.approx(8.0)


@pytest.mark.parametrize("reference_ms", [20.5, 19.9, 5.0])  # slower than the original; a 0.04x scale; a 6x one
def test_fit_distrusts_an_implausible_scale(reference_ms):
    lm = _two_groups()
    fit = lm.fitted(20.0, {"a": 16, "b": 16}, reference_ms)
    assert fit.meta["saving_scale"] == 1.0 and fit.tables == lm.tables and fit.predict({}) == pytest.approx(20.0)
    assert fit.meta["fit_scale"] == pytest.approx((20.0 - reference_ms) / 2.5)


def test_fit_of_a_reference_predicted_to_save_nothing_keeps_the_tables():
    lm = _two_groups()
    fit = lm.fitted(20.0, {}, 19.0)  # every group as the original
    assert fit.meta["fit_scale"] is None and fit.meta["saving_scale"] == 1.0 and fit.tables == lm.tables


def test_fitted_groups_beyond_the_original_are_scaled_down_again():
    lm = _two_groups()  # groups 6 ms; a saving of 2.5 ms measured as 4 ms: scale 1.6, groups 9.6 ms > 8 ms measured
    fit = lm.fitted(8.0, {"a": 16, "b": 16}, 4.0)
    assert fit.meta["saving_scale"] == pytest.approx(1.6) and fit.meta["table_scale"] == pytest.approx(8.0 / 9.6)
    assert fit.constant_ms == 0.0 and fit.predict({}) == pytest.approx(8.0)
