"""Whole-model timings recorded once per machine and replayed: `--speedup`'s closed loop decides which model to keep by
timings that scatter between runs on a shared CPU, so two runs of the same command (or `--compressor auto` and the
single run of the compressor it keeps) followed different rounds to different models. Keyed by the timed models' shapes
(what their latency depends on), the phase, shape, timing rounds and threads, the n-th timing of the same models in a
loop replays the n-th one recorded; a timing not recorded is measured and appended. So a run repeats the decisions of
the first run on this machine: the same command keeps the same model, and a loop that meets a model an earlier run timed
reads its figures. `--retime` (or TimingJournal(replay=False)) measures every timing afresh and records it over the
earlier ones, as `gac profile --force` re-sweeps. The file is
$GAC_CACHE_DIR/timings/<device>-<dtype>-torch<version>.json, beside the sweeps."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from gac.errors import GacError
from gac.hw.profile import cache_root, cached_profile_path
from gac.hw.timing import Timing
from gac.io.atomic import write_text

log = logging.getLogger(__name__)

VERSION = 1  # a change to what a record holds or how it is keyed starts a new journal

Record = dict[str, Timing]  # one timing of a set of models: {name: Timing}


class TimingShape(Protocol):
    """What a timing is keyed by besides its models: gac.objectives.latency.config.SpeedupConfig's phase, shape and
    timing rounds (that module imports this one)."""

    @property
    def phase(self) -> str: ...
    @property
    def batch(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def timing_rounds(self) -> int: ...


C = TypeVar("C", bound=TimingShape, contravariant=True)


class Timer(Protocol[C]):
    """timer(models, cfg, aa=True) -> {name: Timing}: the models timed round-robin in one run at cfg's phase and shape
    (gac.objectives.latency.config.time_at_phase)."""

    def __call__(self, models: Mapping[str, nn.Module], cfg: C, *, aa: bool = True) -> dict[str, Timing]: ...


def _digest(obj: object) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def shape_signature(model: nn.Module) -> str:
    """A hash of what a model's latency depends on: its class, attention implementation, and every tensor's name,
    shape, dtype and device (not its values)."""
    config = getattr(model, "config", None)
    return _digest(
        [
            type(model).__name__,
            getattr(config, "_attn_implementation", None),
            [[n, list(t.shape), str(t.dtype), t.device.type] for n, t in model.state_dict().items()],
        ]
    )


def journal_path(model: nn.Module) -> Path:
    """$GAC_CACHE_DIR/timings/<device>-<dtype>-torch<version>.json for the device and dtype of `model`'s first
    tensor (the sweep cache's naming)."""
    first = next(iter(model.state_dict().values()))
    return cache_root() / "timings" / cached_profile_path(str(first.device), str(first.dtype)).name


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("ignoring the timing journal %s (%s): timing afresh", path, e)
        return {}
    return data if isinstance(data, dict) and data.get("version") == VERSION else {}


def _records(path: Path, raw: list[Any]) -> list[Record]:
    """A key's records as read from the journal file, up to the first this version cannot read (those from it on
    are timed afresh and recorded over)."""
    records = []
    for record in raw:
        try:
            records.append({name: Timing(**t) for name, t in record.items()})
        except (TypeError, AttributeError) as e:
            log.warning("ignoring a timing in the journal %s (%s): timing afresh", path, e)
            break
    return records


def _json(record: Record) -> dict[str, dict[str, Any]]:
    return {name: dataclasses.asdict(t) for name, t in record.items()}


@dataclass
class TimingJournal:
    """One closed loop's view of the journal (session() gives the next loop a fresh one): how many times it has
    timed each set of models, and how many of its timings were replayed or measured."""

    replay: bool = True  # False: every timing measured afresh and recorded over the earlier ones (--retime)
    path: Path | None = None  # None: journal_path() of the first model timed
    replayed: int = 0
    measured: int = 0
    _seen: Counter[str] = field(default_factory=Counter, repr=False)
    _records: dict[str, list[Record]] = field(default_factory=dict, repr=False)  # key -> this loop's list (the
    # file's, or new)

    def session(self) -> TimingJournal:
        """A fresh view for one closed loop: its n-th timing of a set of models replays the n-th recorded."""
        return TimingJournal(self.replay, self.path)

    def time(self, timer: Timer[C], models: Mapping[str, nn.Module], cfg: C, *, aa: bool) -> dict[str, Timing]:
        """timer(models, cfg, aa=aa) -> {name: Timing}, replayed where this loop's timing of these models was
        recorded, else measured and recorded."""
        path = self.path = self.path or journal_path(next(iter(models.values())))
        key = _digest(
            {
                "models": [[name, shape_signature(m)] for name, m in models.items()],
                "phase": cfg.phase,
                "batch": cfg.batch,
                "seq": cfg.seq,
                "timing_rounds": cfg.timing_rounds,
                "aa": aa,
                "threads": torch.get_num_threads(),
            }
        )
        if key not in self._records:
            self._records[key] = _records(path, _read(path).get("timings", {}).get(key, [])) if self.replay else []
        records, n = self._records[key], self._seen[key]
        self._seen[key] += 1
        if n < len(records):
            self.replayed += 1
            return dict(records[n])
        timings = timer(models, cfg, aa=aa)
        self.measured += 1
        records.append(dict(timings))
        self._write(path, key, records)
        return timings

    def _write(self, path: Path, key: str, records: list[Record]) -> None:
        """The file read again (another run may have added keys) with this key's records, written atomically."""
        data = _read(path)
        data = {"version": VERSION, "timings": {**data.get("timings", {}), key: [_json(r) for r in records]}}
        try:
            write_text(path, json.dumps(data))
        except GacError as e:
            log.warning("could not record the timing: %s", e)

    def summary(self) -> dict[str, Any]:
        """report.json's latency_objective.journal: where, whether replaying, and how many timings were replayed or
        measured."""
        return {
            "path": str(self.path) if self.path else None,
            "replay": self.replay,
            "replayed": self.replayed,
            "measured": self.measured,
        }
