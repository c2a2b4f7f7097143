"""`--speedup S`, latency as the objective: its options (SpeedupConfig) and how the model is timed at the objective's
phase and shape (Instruments: the timer, the latency tables and the guard's loss, injected where tests need stand-ins).
The loop is gac.objectives.latency.loop, its stateless steps gac.objectives.latency.steps."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gac.errors import ConfigError, GacError
from gac.evaluate.bench import AA_SUFFIX
from gac.evaluate.latency import LatencyConfig, decode_timings, prefill_timings
from gac.evaluate.perplexity import mean_loss
from gac.objectives.latency.journal import Timer, TimingJournal
from gac.objectives.latency.model import LatencyModel, Phase, measure_latency_model

if TYPE_CHECKING:
    import torch
    from torch import nn

    from gac.compressors.base import Unit
    from gac.hw.timing import Timing
    from gac.models.groups import DimGroup

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpeedupConfig:
    """The latency objective of `gac compress --speedup S [--phase prefill|decode] [--shape BxS]`."""

    speedup: float = 1.2
    phase: str = "prefill"
    batch: int = 1
    seq: int = 512  # prefill tokens per sequence, or the decode KV-cache length
    rounds: int = 4  # closed-loop rounds at most (solve, build, time) while a stream steps by its measured residual
    # rounds past `rounds` that a bracketed stream may still halve its bracket in: within `rounds` alone the end of a
    # bracketed loop hangs on one timing at the gate
    halvings: int = 2
    # after the rounds, up to this many more per stream, each at the budget where a line through all of its timings
    # crosses the aim, until one reaches (gac.objectives.latency.loop.ClosedLoop._line_round); 0: none
    line_rounds: int = 2
    # a round's timing within this share of its gate (the screen's or the confirmation's), either side, is timed once
    # more and the gate judged on both timings pooled, so that one timing's scatter does not decide which model a
    # loop keeps; 0: one timing judges
    gate_band: float = 0.01
    timing_rounds: int = 10  # interleaved calls per model and closed-loop round
    profile_repeats: int = 11  # timed calls per swept dim of the latency tables
    param_cap: float | None = None  # keep at most this share of the compressible groups' original parameters
    guard: bool = True  # build the parameter objective's choice beside the knapsack's; keep the better reaching one
    whole_heads: bool = False  # the knapsack keeps attention head groups whole (the guard's choice may prune them)
    # the loop aims at speedup * (1 + margin): a fixed model's measured speedup drifts between runs by more than the
    # A/A floor of any one run shows, so a model kept at the target itself can measure short when timed again
    margin: float = 0.03
    # how the closed loop measures: the real timer, op sweeps and loss unless a caller (a test) injects stand-ins
    # (every timing of the loop journaled: replayed where this machine timed the same models before)
    instruments: Instruments = field(
        default_factory=lambda: Instruments(journal=TimingJournal()), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if not (isinstance(self.speedup, (int, float)) and math.isfinite(self.speedup) and self.speedup > 1.0):
            raise ConfigError(f"speedup {self.speedup} must be a number above 1, e.g. {{speedup:1.2}}")
        Phase(self.phase, self.batch, self.seq)  # checks phase and shape
        if (
            self.rounds < 1
            or self.timing_rounds < 1
            or self.profile_repeats < 1
            or self.halvings < 0
            or self.line_rounds < 0
        ):
            raise GacError(
                "closed-loop rounds, timing rounds and profile repeats must be >= 1, halvings and line rounds >= 0"
            )
        if not (isinstance(self.gate_band, (int, float)) and 0 <= self.gate_band < 0.5):
            raise GacError(
                f"gate band {self.gate_band} is outside [0, 0.5): give the share of the gate within which "
                "a timing is timed again, e.g. 0.01 (0: one timing judges)"
            )
        if self.param_cap is not None and not (isinstance(self.param_cap, (int, float)) and 0 < self.param_cap <= 1):
            raise ConfigError(
                f"parameter cap {self.param_cap} is outside (0, 1]: give the share of the compressible "
                "parameters to keep at most, e.g. {param_cap:0.9}"
            )
        if not (isinstance(self.margin, (int, float)) and 0 <= self.margin < 0.5):
            raise ConfigError(
                f"margin {self.margin} is outside [0, 0.5): give the share past the target that the loop "
                "aims at, e.g. {margin:0.03} (0: the target itself)"
            )

    @property
    def aim(self) -> float:
        """The speedup the closed loop must measure: the target and its margin."""
        return self.speedup * (1.0 + self.margin)

    @property
    def where(self) -> str:
        return f" at {self.phase} {self.batch}x{self.seq}"

    def latency_config(self, base: LatencyConfig) -> LatencyConfig:
        """`base` (a gac.evaluate.latency.LatencyConfig) at the objective's shape: batch x seq tokens prefilled, a KV
        cache of seq tokens for decode."""
        return dataclasses.replace(base, prefill_tokens=self.seq, batch=self.batch, decode_context=self.seq)

    def objective(self) -> dict[str, Any]:
        return {
            "kind": "latency",
            "speedup": self.speedup,
            "phase": self.phase,
            "shape": f"{self.batch}x{self.seq}",
            "margin": self.margin,
            "param_cap": self.param_cap,
            "guard": self.guard,
            "whole_heads": self.whole_heads,
        }

    def cap_params(self, compressible: int) -> int | None:
        """The parameter cap in parameters of the compressible groups (None: no cap)."""
        return None if self.param_cap is None else math.floor(self.param_cap * compressible)


# Compressors whose attention heads the latency knapsack keeps whole under --speedup unless a head mode is given:
# per millisecond, heads are cheap to remove (a KV group's projections and its share of SDPA), so the knapsack would
# spend its budget on them, and taylor's head importance understates what a head costs in perplexity. The analysis
# keeps the compressor's own head mode, so the guard's parameter objective prunes heads as `--ratio` does and the kept
# model is compared against that. `--head-mode group` lets the knapsack prune heads too.
WHOLE_HEADS = ("prune",)


def objective_config(compressor: str, options: Mapping[str, Any], cfg: SpeedupConfig) -> SpeedupConfig:
    """The latency objective for `compressor` with the user's options: heads held whole in the knapsack where
    WHOLE_HEADS says so and no head mode was given, free otherwise."""
    whole = compressor in WHOLE_HEADS and "head_mode" not in options
    if whole and not cfg.whole_heads:
        log.info(
            "--speedup with %s: the knapsack keeps attention heads whole (their importance does not hold per "
            "millisecond, see WHOLE_HEADS); the guard's parameter objective prunes them as --ratio does; give "
            "--head-mode to let the knapsack prune heads",
            compressor,
        )
    return cfg if whole == cfg.whole_heads else dataclasses.replace(cfg, whole_heads=whole)


def held_whole(unit: Unit, cfg: SpeedupConfig) -> bool:
    """Whether the knapsack leaves this unit as the original has it (a group whose kind removes attention heads,
    under whole_heads)."""
    return cfg.whole_heads and unit.group.removes_heads


def speedup_config(
    speedup: float | None,
    *,
    phase: str | None = None,
    shape: str | None = None,
    param_cap: float | None = None,
    margin: float | None = None,
    guard: bool = True,
    retime: bool = False,
    prefill_tokens: int | None = None,
) -> SpeedupConfig | None:
    """The latency objective a run's options ask for, or None for the parameter objective (no speedup given); one
    ConfigError for a latency option without a speedup, or prefill_tokens with one (its shape sets the timed shape)."""
    if speedup is None:
        if any(v is not None for v in (phase, shape, param_cap, margin)) or not guard or retime:
            raise ConfigError(
                "{phase}, {shape}, {param_cap}, {margin}, {guard=False} and {retime=True} set the latency objective: "
                "give {speedup} too, e.g. {speedup:1.2}"
            )
        return None
    if prefill_tokens is not None:
        raise ConfigError(
            "{speedup} times every model at its {shape}, which {prefill_tokens} would contradict: give "
            "{shape:BATCHxTOKENS} instead"
        )
    batch, seq = parse_shape(shape) if shape is not None else (SpeedupConfig.batch, SpeedupConfig.seq)
    return SpeedupConfig(
        speedup,
        phase=SpeedupConfig.phase if phase is None else phase,
        batch=batch,
        seq=seq,
        param_cap=param_cap,
        guard=guard,
        margin=SpeedupConfig.margin if margin is None else margin,
        instruments=Instruments(journal=TimingJournal(replay=not retime)),
    )


def parse_shape(text: str) -> tuple[int, int]:
    """'1x512' -> (1, 512); one-line GacError otherwise."""
    batch, sep, seq = str(text).lower().partition("x")
    try:
        b, s = int(batch), int(seq)
    except ValueError:
        b = s = 0
    if not sep or b < 1 or s < 1:
        raise GacError(f"bad --shape {text!r}: give BATCHxTOKENS with positive integers, e.g. --shape 1x512")
    return b, s


def time_at_phase(models: Mapping[str, nn.Module], cfg: SpeedupConfig, *, aa: bool = True) -> dict[str, Timing]:
    """{name: Timing} at the objective's phase and shape, every model timed round-robin in one run; with `aa` the first
    model is timed a second time as "<name>" + gac.evaluate.bench.AA_SUFFIX, the noise floor."""
    timed = dict(models)
    if aa:
        first = next(iter(models))
        timed[first + AA_SUFFIX] = models[first]
    lat = cfg.latency_config(
        LatencyConfig(
            warmup=2, prefill_rounds=cfg.timing_rounds, decode_rounds=3 * cfg.timing_rounds, seed=0, cuda_graphs=True
        )
    )
    if cfg.phase == "prefill":
        return prefill_timings(timed, cfg.batch, cfg.seq, lat)
    return decode_timings(timed, lat)


class TablesFactory(Protocol):
    """Instruments.latency_model: measure_latency_model's signature."""

    def __call__(
        self,
        groups: list[DimGroup],
        phase: Phase,
        *,
        alignment: int,
        device: str,
        dtype: str,
        repeats: int,
        progress: bool,
    ) -> LatencyModel: ...


class LossFunction(Protocol):
    """Instruments.loss: gac.evaluate.perplexity.mean_loss's signature."""

    def __call__(self, model: nn.Module, windows: torch.Tensor) -> float: ...


@dataclass(frozen=True)
class Instruments:
    """How the closed loop measures (SpeedupConfig.instruments), injected so that tests run it on stand-ins:

    timer(models, cfg, aa=True) -> {name: gac.hw.timing.Timing}: the models ({name: model}) timed round-robin in one
        run at cfg's phase and shape, with `aa` the first one a second time as "<name> (A/A)" (time_at_phase);
    latency_model(groups, phase, *, alignment, device, dtype, repeats, progress) -> a LatencyModel with a zero
        constant (None: gac.objectives.latency.model.measure_latency_model, from the cached op sweeps);
    loss(model, windows) -> the guard's mean next-token loss on held-back calibration windows [n, seq] (None:
        gac.evaluate.perplexity.mean_loss, as --compressor auto measures);
    journal: gac.objectives.latency.journal.TimingJournal, through which the timer's timings are replayed where
        recorded (None: every timing measured, nothing recorded).
    """

    timer: Timer[SpeedupConfig] = time_at_phase
    latency_model: TablesFactory | None = None
    loss: LossFunction | None = None
    journal: TimingJournal | None = None

    def for_loop(self) -> Instruments:
        """These instruments for one closed loop: its own view of the journal, so that its n-th timing of a set of
        models replays the n-th recorded, whatever other loops (--compressor auto's) timed before it."""
        return self if self.journal is None else dataclasses.replace(self, journal=self.journal.session())

    def time(self, models: Mapping[str, nn.Module], cfg: SpeedupConfig, *, aa: bool = True) -> dict[str, Timing]:
        """{name: Timing}: the timer's, through the journal where there is one."""
        if self.journal is None:
            return self.timer(models, cfg, aa=aa)
        return self.journal.time(self.timer, models, cfg, aa=aa)

    def tables(
        self,
        groups: list[DimGroup],
        phase: Phase,
        *,
        alignment: int,
        device: str,
        dtype: str,
        repeats: int,
        progress: bool,
    ) -> LatencyModel:
        """The latency tables of `groups` at `phase`, with a zero constant."""
        tables = self.latency_model or measure_latency_model
        return tables(
            groups, phase, alignment=alignment, device=device, dtype=dtype, repeats=repeats, progress=progress
        )

    def held_back_loss(self, model: nn.Module, windows: torch.Tensor) -> float:
        return (self.loss or mean_loss)(model, windows)
