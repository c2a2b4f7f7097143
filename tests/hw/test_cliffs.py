"""Cliff finding and profile-filtered candidates on synthetic latency tables."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gac.align.candidates import aligned_candidates
from gac.align.profiled import profile_candidates
from gac.errors import GacError
from gac.hw.cliffs import entry_label, find_cliffs, latency_table


def staircase(lo=64, hi=200, slow=()):
    """Latency growing with dim (1 ms + 0.01 ms per dim); dims in `slow` cost 40% more."""
    return {d: (1.0 + 0.01 * d) * (1.4 if d in slow else 1.0) for d in range(lo, hi + 1)}


def test_cliff_at_111_excluded_with_reason():
    table = staircase(slow={111})
    result = profile_candidates(table, 110.3, alignment=1, window=4)
    assert 111 not in result.candidates
    assert "cliff" in result.excluded[111] and "112" in result.excluded[111]
    assert result.candidates == [107, 108, 109, 110, 112, 113, 114]


def test_aligned_cliff_excluded():
    table = staircase(slow={104})
    result = profile_candidates(table, 107.0)
    assert result.candidates == [80, 88, 96, 112, 120, 128, 136]
    assert set(result.excluded) == {104} and "slower than" in result.excluded[104]


def test_monotone_table_keeps_static_candidates():
    result = profile_candidates(staircase(), 107.0)
    assert result.candidates == aligned_candidates(107.0, 8)
    assert result.excluded == {} and result.note == ""


def test_within_tolerance_is_not_a_cliff():
    table = {d: ms for d, ms in staircase().items() if d % 8 == 0}
    table[104] = table[112] * 1.01
    assert 104 in profile_candidates(table, 107.0, tolerance=0.02).candidates
    assert 104 not in profile_candidates(table, 107.0, tolerance=0.0).candidates


def test_partial_coverage_drops_unmeasured_dims():
    table = staircase(lo=96, hi=112)
    result = profile_candidates(table, 107.0)
    assert result.candidates == [96, 104, 112]
    assert {80, 88, 120, 128, 136} == set(result.excluded)
    assert all("not measured" in why for why in result.excluded.values())


def test_no_coverage_keeps_static_candidates_with_note():
    result = profile_candidates(staircase(lo=300, hi=400), 107.0)
    assert result.candidates == aligned_candidates(107.0, 8)
    assert "static" in result.note


def test_never_empty_falls_back_to_fastest_measured():
    table = staircase(lo=64, hi=200)
    table[200] = 0.1  # one huge dim beats everything near d*
    result = profile_candidates(table, 107.0)
    assert result.candidates == [80]  # the fastest of the measured candidates
    assert "fastest" in result.note and 80 not in result.excluded


def test_bounds_respected():
    result = profile_candidates(staircase(), 107.0, min_dim=96, max_dim=120)
    assert result.candidates == [96, 104, 112, 120]
    with pytest.raises(GacError):
        profile_candidates(staircase(), 107.0, min_dim=97, max_dim=103)


def test_find_cliffs():
    table = {96: 1.0, 104: 1.5, 111: 2.0, 112: 1.2, 120: 1.3}
    assert find_cliffs(table) == {104: 112, 111: 112}
    assert find_cliffs(staircase()) == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=60, max_size=60), st.floats(64.0, 100.0))
def test_candidates_property(latencies, dim):
    table = dict(zip(range(60, 120), latencies))
    result = profile_candidates(table, dim)
    static = aligned_candidates(dim, 8)
    assert result.candidates, "never empty"
    assert set(result.candidates) | set(result.excluded) == set(static)
    assert not set(result.candidates) & set(result.excluded)
    if not result.note:  # no fallback: no kept dim is beaten by a larger measured dim
        for d in result.candidates:
            assert all(table[b] * 1.02 >= table[d] for b in table if b > d)


PROFILE = {
    "ops": [
        {"op": "gemm_n", "shape": {"k": 512}, "m": 512, "dims": [8, 16], "ms": [1.0, 2.0]},
        {"op": "gemm_n", "shape": {"k": 4096}, "m": 512, "dims": [8, 16], "ms": [3.0, 4.0]},
        {"op": "gemm_n", "shape": {"k": 512}, "m": 1, "dims": [8, 16], "ms": [0.1, 0.2]},
        {"op": "sdpa", "shape": {"batch": 1, "heads": 8, "seq": 512}, "m": 512, "dims": [64], "ms": [5.0]},
    ]
}


def test_latency_table_exact_and_nearest():
    assert latency_table(PROFILE, "gemm_n", m=512, shape={"k": 4096}) == {8: 3.0, 16: 4.0}
    assert latency_table(PROFILE, "gemm_n", m=512, shape={"k": 1000}) == {8: 1.0, 16: 2.0}  # log-nearer 512
    assert latency_table(PROFILE, "gemm_n", m=512, shape={"k": 3000}) == {8: 3.0, 16: 4.0}
    assert latency_table(PROFILE, "gemm_n", m=2, shape={"k": 512}) == {8: 0.1, 16: 0.2}
    assert latency_table(PROFILE, "gemm_n") == {8: 1.0, 16: 2.0}  # first entry when nothing is asked
    assert latency_table(PROFILE, "sdpa", shape={"seq": 100, "other": 3}) == {64: 5.0}


def test_latency_table_missing_op():
    with pytest.raises(GacError, match="no 'lowrank' sweep"):
        latency_table(PROFILE, "lowrank")


def test_entry_label():
    assert entry_label(PROFILE["ops"][0]) == "gemm_n m=512 k=512"
