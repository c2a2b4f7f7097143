"""The timing journal: a loop's n-th timing of the same models replays the n-th recorded on this machine; models of
other shapes, another phase or shape, or --retime are timed afresh; a broken file is measured past, in one warning."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from gac.hw.timing import Timing
from gac.objectives.latency.journal import TimingJournal, journal_path, shape_signature

CFG = SimpleNamespace(phase="prefill", batch=1, seq=16, timing_rounds=3)


class NoisyTimer:
    """Every call a fresh random figure per model, as a shared CPU gives: replayed figures repeat, measured ones do
    not."""

    def __init__(self):
        self.calls = 0
        self.rng = random.Random(0)

    def __call__(self, models, cfg, aa=True):
        self.calls += 1
        names = [*models, *(["baseline (A/A)"] if aa else [])]
        return {name: Timing.from_samples([self.rng.uniform(1.0, 2.0) for _ in range(3)]) for name in names}


def models(width=8):
    return {"baseline": torch.nn.Linear(16, 16), "latency": torch.nn.Linear(16, width)}


def test_a_loop_replays_what_an_earlier_loop_recorded_in_order(tmp_path):
    timer, path = NoisyTimer(), tmp_path / "journal.json"
    first = TimingJournal(path=path)
    recorded = [first.time(timer, models(), CFG, aa=True) for _ in range(2)]
    assert timer.calls == 2 and (first.measured, first.replayed) == (2, 0) and recorded[0] != recorded[1]

    again = first.session()  # the next loop (or the next run): same models, same order
    replayed = [again.time(timer, models(), CFG, aa=True) for _ in range(2)]
    assert replayed == recorded and timer.calls == 2 and (again.replayed, again.measured) == (2, 0)
    third = again.time(timer, models(), CFG, aa=True)  # past what was recorded: measured and appended
    assert timer.calls == 3 and third not in recorded
    assert TimingJournal(path=path).time(timer, models(), CFG, aa=True) == recorded[0]
    assert again.summary() == {"path": str(path), "replay": True, "replayed": 2, "measured": 1}


@pytest.mark.parametrize("change", ["shape", "seq", "aa", "dtype"])
def test_other_models_or_settings_are_timed_afresh(tmp_path, change):
    timer, path = NoisyTimer(), tmp_path / "journal.json"
    TimingJournal(path=path).time(timer, models(), CFG, aa=True)
    timed, cfg, aa = models(), CFG, True
    if change == "shape":
        timed = models(width=24)
    elif change == "seq":
        cfg = SimpleNamespace(**{**vars(CFG), "seq": 32})
    elif change == "aa":
        aa = False
    else:
        timed = {name: m.to(torch.bfloat16) for name, m in timed.items()}
    journal = TimingJournal(path=path)
    journal.time(timer, timed, cfg, aa=aa)
    assert timer.calls == 2 and journal.measured == 1


def test_the_weights_values_do_not_matter_their_shapes_do():
    a, b = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    assert not torch.equal(a.weight, b.weight) and shape_signature(a) == shape_signature(b)
    assert shape_signature(a) != shape_signature(torch.nn.Linear(16, 9))
    assert shape_signature(a) != shape_signature(torch.nn.Linear(16, 8, bias=False))


def test_retime_measures_afresh_and_records_over_the_earlier_timings(tmp_path):
    timer, path = NoisyTimer(), tmp_path / "journal.json"
    old = TimingJournal(path=path).time(timer, models(), CFG, aa=True)
    fresh = TimingJournal(replay=False, path=path)
    new = fresh.time(timer, models(), CFG, aa=True)
    assert timer.calls == 2 and new != old and fresh.summary()["replay"] is False
    assert TimingJournal(path=path).time(timer, models(), CFG, aa=True) == new and timer.calls == 2


def test_a_broken_journal_is_timed_past_and_rewritten(tmp_path, caplog):
    timer, path = NoisyTimer(), tmp_path / "journal.json"
    path.write_text("{not json")
    journal = TimingJournal(path=path)
    journal.time(timer, models(), CFG, aa=True)
    assert timer.calls == 1 and "ignoring the timing journal" in caplog.text
    assert json.loads(path.read_text())["version"] == 1


def test_the_journal_sits_in_the_cache_named_for_the_device_dtype_and_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("GAC_CACHE_DIR", str(tmp_path))
    path = journal_path(torch.nn.Linear(4, 4).to(torch.bfloat16))
    assert path.parent == tmp_path / "timings" and path.name.startswith("cpu-") and "bfloat16" in path.name
    assert torch.__version__.split("+")[0] in path.name


def test_a_record_this_version_cannot_read_is_timed_afresh_and_replaced(tmp_path, caplog):
    timer, path = NoisyTimer(), tmp_path / "journal.json"
    TimingJournal(path=path).time(timer, models(), CFG, aa=True)
    data = json.loads(path.read_text())
    key = next(iter(data["timings"]))
    data["timings"][key][0]["baseline"]["unknown_field"] = 1
    path.write_text(json.dumps(data))
    journal = TimingJournal(path=path)
    fresh = journal.time(timer, models(), CFG, aa=True)
    assert timer.calls == 2 and journal.measured == 1 and "ignoring a timing" in caplog.text
    assert TimingJournal(path=path).time(timer, models(), CFG, aa=True) == fresh and timer.calls == 2
