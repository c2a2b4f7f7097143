"""The closed loop's records (gac.objectives.latency.rounds): a round's row of report.json keeps the keys, and their
order, that the loop has always written; two timings pool into one."""

from __future__ import annotations

import pytest

from gac.objectives.latency.knapsack import LatencyChoice
from gac.objectives.latency.rounds import Round, Solved, Timed

CHOICE = LatencyChoice(dims={"l0.mlp": 64}, predicted_ms=1.5, value=0.9, params=1000, exact=True)
TIMED = ("baseline_measured_ms", "gac_measured_ms", "aa_floor_pct", "measured_speedup", "target_ms", "retimed",
         "timings")
SOLVED = ("round", "budget_ms", "baseline_predicted_ms", "gac_predicted_ms", "groups_predicted_ms", "params", "value")


def test_a_timing_s_figures_and_two_pooled():
    t = Timed.of(2.0, 1.6, 0.01, 1.2, retimed=0, timings=1)
    assert (t.aa_floor_pct, t.measured_speedup) == (pytest.approx(1.0), pytest.approx(1.25))
    assert t.target_ms == pytest.approx(2.0 / (1.2 * 1.01))
    pooled = t.pooled(Timed.of(2.2, 1.8, 0.03, 1.2, retimed=1, timings=1), 1.2)
    assert pooled.gac_measured_ms == pytest.approx(1.7) and pooled.aa_floor_pct == pytest.approx(2.0)
    assert pooled.measured_speedup == pytest.approx(2.1 / 1.7) and (pooled.retimed, pooled.timings) == (1, 2)


def test_a_round_s_row_keeps_report_json_s_keys_in_order():
    first, confirmed = (Timed.of(2.0, ms, 0.01, 1.2, retimed=0, timings=1) for ms in (1.6, 1.65))
    plain = Round(Solved(1, 1.4, CHOICE, 2.0, 1.9), first, reached=False)
    assert list(plain.to_dict()) == [*SOLVED, *TIMED, "reached"]
    assert plain.to_dict()["groups_predicted_ms"] == 1.5 and plain.point == (1.5, 0.8)
    kept = Round(Solved(2, 1.3, CHOICE, 2.0, 1.9, ratio=0.2), confirmed, True, screen=first, held_back_loss=3.0)
    assert list(kept.to_dict()) == [*SOLVED, "ratio", *TIMED, "reached", "screen", "held_back_loss"]
    assert kept.to_dict()["screen"] == first.to_dict() and list(first.to_dict()) == list(TIMED)
    line = Round(Solved(3, 1.35, CHOICE, 2.0, 1.9, line=True), first, False, line_speedup=1.19)
    assert list(line.to_dict()) == [*SOLVED, "line", *TIMED, "line_speedup", "reached"]
