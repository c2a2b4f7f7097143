"""The selection plan contract: validation messages, select() against brute force, the result dict."""

import itertools
import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gac.align.plan import Plan, SelectionResult, WeightSpec, select
from gac.errors import GacError


def _plan(**overrides):
    plan = {
        "budget": 100_000,
        "weights": [
            {"name": "a", "dim": 37.3, "score": 1.0, "params_per_dim": 1000},
            {"name": "b", "dim": 61.9, "score": 2.0, "params_per_dim": 768, "fixed_params": 5},
        ],
    }
    plan.update(overrides)
    return plan


@st.composite
def plans(draw):
    """1-5 weights with 1-4 explicit candidates each and a budget that is sometimes infeasible."""
    weights = []
    for i in range(draw(st.integers(1, 5))):
        dims = draw(st.lists(st.integers(0, 64), min_size=1, max_size=4))
        weights.append(
            {
                "name": f"w{i}",
                "dim": draw(st.floats(0, 64)),
                "score": draw(st.floats(0, 10)),
                "params_per_dim": draw(st.integers(1, 300)),
                "fixed_params": draw(st.integers(0, 50)),
                "candidates": dims,
            }
        )
    sizes = [[w["fixed_params"] + d * w["params_per_dim"] for d in w["candidates"]] for w in weights]
    budget = draw(st.integers(max(0, sum(map(min, sizes)) - 50), sum(map(max, sizes)) + 50))
    return {"budget": budget, "alignment": 8, "weights": weights}


def brute_force(plan):
    """Best objective over every combination of candidates within budget, or None."""
    ws = plan["weights"]
    best = None
    for dims in itertools.product(*(w["candidates"] for w in ws)):
        size = sum(w["fixed_params"] + d * w["params_per_dim"] for w, d in zip(ws, dims))
        if size <= plan["budget"]:
            obj = math.fsum(w["score"] * w["params_per_dim"] * (d - w["dim"]) for w, d in zip(ws, dims))
            best = obj if best is None else max(best, obj)
    return best


@settings(max_examples=200, deadline=None)
@given(plans())
def test_select_matches_brute_force(plan):
    expected = brute_force(plan)
    if expected is None:
        with pytest.raises(GacError, match="raise the budget to at least"):
            select(plan)
        return
    result = select(plan)
    ws = {w["name"]: w for w in plan["weights"]}
    params = sum(ws[n]["fixed_params"] + d * ws[n]["params_per_dim"] for n, d in result.dims.items())
    assert result.params == params <= plan["budget"]
    assert all(d in ws[n]["candidates"] for n, d in result.dims.items())
    assert abs(result.objective - expected) <= 1e-9 * max(1.0, abs(expected))


def test_infeasible_plan_names_the_smallest_budget():
    plan = _plan(budget=10)
    # smallest aligned candidates: a -> 8 * 1000, b -> 32 * 768 + 5
    with pytest.raises(GacError, match=f"at least {8 * 1000 + 32 * 768 + 5}"):
        select(plan)


def test_result_dict_has_exactly_the_contract_keys():
    result = select(_plan())
    d = result.to_dict()
    assert set(d) == {"dims", "params", "budget", "objective", "aligned_fraction", "exact", "solver_ms"}
    assert d["dims"] == {"a": 32, "b": 88}  # b has the higher score per parameter, so it gets the room
    assert d["params"] == 32 * 1000 + 88 * 768 + 5 <= d["budget"] == 100_000
    assert d["aligned_fraction"] == 1.0 and d["exact"] is True
    json.dumps(d)  # serializable as is


def test_select_accepts_plan_dict_and_path(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan()))
    by_dict, by_path, by_str = select(_plan()), select(path), select(str(path))
    by_plan = select(Plan.from_dict(_plan()))
    for other in (by_path, by_str, by_plan):
        assert other.dims == by_dict.dims and other.objective == by_dict.objective
    assert isinstance(by_dict, SelectionResult)


def test_generated_candidates_respect_bounds_and_alignment():
    plan = _plan(alignment=16, window=2)
    plan["weights"][0].update(min_dim=32, max_dim=48)
    result = select(plan)
    assert result.dims["a"] in (32, 48)
    assert all(d % 16 == 0 for d in result.dims.values())


def test_plan_round_trips_through_to_dict():
    weight = {"name": "x", "dim": 5, "score": 1, "params_per_dim": 3, "candidates": [8, 4]}
    plan = Plan.from_dict(_plan(weights=[weight]))
    assert Plan.from_dict(plan.to_dict()) == plan
    assert plan.weights[0].candidates == (4, 8)


def test_values_replace_the_linear_objective_and_round_trip():
    # linear scores would keep "a" (score 2) at 16 and cut "b" to 8; the values say the opposite is cheaper
    weights = [{"name": "a", "dim": 12, "score": 2.0, "params_per_dim": 10, "candidates": [16, 8],
                "values": [0.5, -0.1]},
               {"name": "b", "dim": 12, "score": 1.0, "params_per_dim": 10, "candidates": [8, 16],
                "values": [-3.0, 0.2]}]
    plan = Plan.from_dict(_plan(budget=240, weights=weights))
    assert plan.weights[0].values == (-0.1, 0.5)  # sorted with their candidates
    assert Plan.from_dict(plan.to_dict()) == plan
    assert select(plan).dims == {"a": 8, "b": 16}
    with pytest.raises(GacError, match="one number per"):
        Plan.from_dict(_plan(weights=[{**weights[0], "values": [1.0]}]))
    with pytest.raises(GacError, match="need the candidates"):
        Plan.from_dict(_plan(weights=[{"name": "c", "dim": 3, "score": 1, "params_per_dim": 1, "values": [1.0]}]))


def test_integral_float_budget_is_accepted():
    assert Plan.from_dict(_plan(budget=1e5)).budget == 100_000


def _weight(**overrides):
    w = {"name": "q", "dim": 10.0, "score": 1.0, "params_per_dim": 4}
    w.update(overrides)
    return {k: v for k, v in w.items() if v is not ...}


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        ([], "plan must be a JSON object"),
        ({"weights": []}, "missing key 'budget'"),
        ({"budget": 10}, "missing key 'weights'"),
        ({"budget": 10, "weights": []}, "'weights' is empty"),
        ({"budget": 10, "weights": {}}, "'weights' must be a list"),
        ({"budget": 1.5, "weights": [_weight()]}, "budget .* must be an integer"),
        ({"budget": "100", "weights": [_weight()]}, "budget .* must be an integer"),
        ({"budget": -1, "weights": [_weight()]}, "budget .* must be >= 0"),
        ({"budget": 10, "alignment": 0, "weights": [_weight()]}, "alignment must be >= 1"),
        ({"budget": 10, "weights": [_weight(score=...)]}, "weight 'q': missing key 'score'"),
        ({"budget": 10, "weights": [_weight(name=...)]}, "weight #0: missing key 'name'"),
        ({"budget": 10, "weights": [_weight(params_per_dim=0)]}, "weight 'q': params_per_dim must be >= 1"),
        ({"budget": 10, "weights": [_weight(params_per_dim=-3)]}, "params_per_dim must be >= 1"),
        ({"budget": 10, "weights": [_weight(params_per_dim=2.5)]}, "params_per_dim must be an integer"),
        ({"budget": 10, "weights": [_weight(fixed_params=-1)]}, "fixed_params must be >= 0"),
        ({"budget": 10, "weights": [_weight(candidates=[])]}, "weight 'q': candidates is empty"),
        ({"budget": 10, "weights": [_weight(candidates=[8, 4.5])]}, "candidate must be an integer"),
        ({"budget": 10, "weights": [_weight(candidates="8")]}, "candidates must be a list"),
        ({"budget": 10, "weights": [_weight(dim=float("nan"))]}, "dim must be a finite number"),
        ({"budget": 10, "weights": [_weight(dim="ten")]}, "dim must be a finite number"),
        ({"budget": 10, "weights": [_weight(min_dim=64, max_dim=8)]}, "min_dim 64 > max_dim 8"),
        ({"budget": 10, "weights": [_weight(), _weight()]}, "duplicate weight name 'q'"),
        ({"budget": 10, "weights": [_weight(name="")]}, "non-empty string"),
        ({"budget": 10, "weights": [3]}, "weight #0 must be an object"),
    ],
)
def test_validation_errors_are_one_line(plan, match):
    with pytest.raises(GacError, match=match) as err:
        Plan.from_dict(plan)
    assert "\n" not in str(err.value)


def test_candidate_window_left_empty_names_the_weight():
    plan = _plan()
    plan["weights"][0]["max_dim"] = 4
    with pytest.raises(GacError, match="weight 'a': no multiple of 8"):
        select(plan)


def test_weightspec_validates_on_direct_construction():
    with pytest.raises(GacError, match="params_per_dim must be >= 1"):
        WeightSpec(name="w", dim=1.0, score=1.0, params_per_dim=0)


def test_unreadable_and_invalid_json_name_the_path(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(GacError, match=re.escape(f"cannot read plan {missing}")):
        Plan.from_json(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("{\"budget\": 10,")
    with pytest.raises(GacError, match=re.escape(f"plan {broken} is not valid JSON")):
        Plan.from_json(broken)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"budget": 10}))
    with pytest.raises(GacError, match=re.escape(f"{bad}: plan: missing key 'weights'")):
        Plan.from_json(bad)


def test_select_rejects_other_types():
    with pytest.raises(GacError, match="select\\(\\) takes"):
        select(42)
