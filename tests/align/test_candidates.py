"""Aligned candidate dims: the window around d*, clipping to bounds, alignment of every candidate."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gac.align.candidates import aligned_candidates, aligned_fraction, is_aligned
from gac.errors import GacError


def test_window_below_and_above():
    assert aligned_candidates(100.3, 8) == [72, 80, 88, 96, 104, 112, 120, 128]
    assert aligned_candidates(100.3, 8, window=1) == [96, 104]


def test_an_aligned_dim_counts_as_at_or_below():
    assert aligned_candidates(96, 8, window=2) == [88, 96, 104, 112]


def test_min_dim_defaults_to_alignment():
    assert aligned_candidates(10, 8) == [8, 16, 24, 32, 40]
    assert aligned_candidates(10, 8, min_dim=0) == [0, 8, 16, 24, 32, 40]


def test_max_dim_clips():
    assert aligned_candidates(1020, 8, max_dim=1024) == [992, 1000, 1008, 1016, 1024]
    assert aligned_candidates(1020, 8, max_dim=1023) == [992, 1000, 1008, 1016]


def test_nothing_left_is_a_clear_error():
    with pytest.raises(GacError, match="no multiple of 8 within \\[8, 100\\]") as err:
        aligned_candidates(5000, 8, max_dim=100)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dim": -1.0}, "dim must be"),
        ({"dim": float("nan")}, "dim must be"),
        ({"dim": 10.0, "alignment": 0}, "alignment must be a positive integer"),
        ({"dim": 10.0, "window": 0}, "window must be a positive integer"),
        ({"dim": 10.0, "alignment": 8.0}, "alignment must be a positive integer"),
    ],
)
def test_bad_arguments(kwargs, match):
    dim = kwargs.pop("dim")
    with pytest.raises(GacError, match=match):
        aligned_candidates(dim, **kwargs)


@settings(max_examples=200, deadline=None)
@given(
    dim=st.floats(0, 20_000, allow_nan=False),
    alignment=st.sampled_from([1, 8, 16, 64, 128]),
    window=st.integers(1, 6),
    max_dim=st.none() | st.integers(0, 20_000),
)
def test_candidates_properties(dim, alignment, window, max_dim):
    try:
        dims = aligned_candidates(dim, alignment, window=window, max_dim=max_dim)
    except GacError:
        assert max_dim is not None  # only the upper bound can empty the window
        return
    assert dims == sorted(set(dims))
    assert all(d % alignment == 0 for d in dims)
    assert all(alignment <= d and (max_dim is None or d <= max_dim) for d in dims)
    assert sum(d <= dim for d in dims) <= window and sum(d > dim for d in dims) <= window
    if max_dim is None:
        assert sum(d > dim for d in dims) == window  # nothing clips the upper side
        assert min(dims) <= max(dim, alignment)  # some candidate reaches down to d* (or the floor)


def test_is_aligned_and_fraction():
    assert is_aligned(64, 8) and is_aligned(64.0, 8)
    assert not is_aligned(60, 8) and not is_aligned(64.5, 8)
    assert aligned_fraction([8, 16, 20, 24], 8) == 0.75
    assert aligned_fraction([], 8) == 1.0
