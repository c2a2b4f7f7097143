"""The objective interface: what an objective selects from (Analyzed: a compressor's calibrated units), what it chose
(Selected: the dims of every variant, and its own selection), and the Objective itself: its selection and every
choice a run makes differently under it (its config checks, the pipeline it forces, its report sections,
--compressor auto's comparison). Each objective is one Objective registered by name in gac.objectives.OBJECTIVES; the
pipelines analyze, the objective selects, the pipelines cut."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import Field, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import torch
    from torch import nn

    from gac.compressors.base import Compressor, Unit
    from gac.compressors.config import CompressorConfig
    from gac.evaluate.latency import LatencyConfig
    from gac.models.groups import DimGroup
    from gac.objectives.latency.config import SpeedupConfig

S = TypeVar("S")  # an objective's selection (gac.align.plan.SelectionResult, the latency objective's LatencyOutcome)


class RunConfig(Protocol):
    """What an objective reads of a run's config: gac.config.CompressConfig's fields, which sits above this layer (so
    it is named by its shape here, read-only as the frozen config's are). A dataclass: an objective hands it back
    changed (dataclasses.replace)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def compressor(self) -> CompressorConfig: ...
    @property
    def compressor_options(self) -> dict[str, Any]: ...
    @property
    def ratio(self) -> float | None: ...
    @property
    def speedup(self) -> SpeedupConfig | None: ...
    @property
    def alignment(self) -> int: ...
    @property
    def align(self) -> bool: ...
    @property
    def window(self) -> int: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def target(self) -> str | None: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def latency(self) -> LatencyConfig: ...
    @property
    def progress(self) -> bool: ...
    @property
    def saved_variant(self) -> str: ...
    def off_whole_model(self) -> str | None: ...


C = TypeVar("C", bound=RunConfig)  # a run's config, handed back changed (Objective.candidate_config)


@dataclass
class Analyzed:
    """The compressor's calibrated units: what every objective and ratio selects from."""

    compressor: Compressor
    units: list[Unit]  # the compressor's units, one per dimension group
    names: list[str]  # the linears the units cover: params and alignment are measured over these
    compressible: int
    windows: torch.Tensor | None  # held-back calibration windows [n, seq] the guard compares on (None: no guard)


@dataclass
class Selected(Analyzed, Generic[S]):
    """What the compressor found and GAC chose; models are cut later, except those the selection built itself."""

    budget: int
    dims: dict[str, dict[str, int | None]]  # variant ("unaligned", "gac") -> {unit name: dim or None}
    selection: S  # the objective's own: its Objective reads it (report sections, --compressor auto's figures)
    # {unit name: {dim: reason}}: aligned dims the profile ruled out
    profile_excluded: dict[str, dict[int, str]] | None = None
    # report.json's "target": which dims the deployment target constrained, and why
    target: dict[str, Any] | None = None
    built: dict[str, nn.Module] = field(default_factory=dict)  # {variant: model} already cut at its dims (the closed
    # loop's kept one)


@dataclass
class Prediction(Generic[S]):
    """--compressor auto's prediction of one candidate at the objective, before it is built."""

    dims: dict[str, int | None]  # {unit name: dim or None} the candidate would be built at
    figures: dict[str, float]  # what the objective predicts besides the loss (latency: "ms", "speedup"), else empty
    build: Callable[[], Selected[S]]  # the selection, its saved variant built (the candidate's factors computed again)


class Objective(ABC, Generic[S]):
    """What a run keeps, and every choice that differs with it. `cfg` is the run's gac.config.CompressConfig (which
    sits above this layer); ConfigErrors name its fields."""

    name: ClassVar[str]  # its key in OBJECTIVES
    # the flag named as forcing the whole-model pipeline (gac.pipelines.choice), None where the forecast chooses
    forces_whole_model: ClassVar[str | None] = None
    # --compressor auto: whether building a candidate times it (the closed loop); else the built ones are timed
    # beside the original, their speedups reported, not ranked by
    times_candidates: ClassVar[bool] = False
    ranking: ClassVar[str]  # --compressor auto: how the kept candidate was chosen, in report.json's "why"

    # --- the config (gac.config.CompressConfig's checks, in its field names)
    def settle(self, cfg: RunConfig) -> dict[str, Any]:
        """Check the objective's own field of `cfg`; {field: value} to set (a default where none was given). Runs
        before CompressConfig's other checks."""
        return {}

    def check(self, cfg: RunConfig) -> dict[str, Any]:
        """Check `cfg`'s other options against this objective; {field: value} to set (resolved for them). Runs after
        CompressConfig's other checks."""
        return {}

    def check_groups(self, groups: Sequence[DimGroup], cfg: RunConfig) -> None:
        """Refuse, from the shapes of the compressor's groups alone and before any calibration, a target they cannot
        meet (a ConfigError)."""
        return None

    def evaluation_latency(self, cfg: RunConfig) -> LatencyConfig:
        """How the variants are timed: cfg.latency unless the objective has its own shape."""
        return cfg.latency

    def needs_held_back(self, cfg: RunConfig) -> bool:
        """Whether the selection compares models on held-back calibration windows (Analyzed.windows)."""
        return False

    # --- the selection and its report
    @abstractmethod
    def select_dims(self, model: nn.Module, analyzed: Analyzed, cfg: RunConfig) -> Selected[S]:
        """The dims of every variant from analyzed units (and, where the objective builds models, the kept one)."""

    @abstractmethod
    def report_sections(self, selected: Selected[S], cfg: RunConfig) -> dict[str, Any]:
        """report.json's sections of this objective ({gac.evaluate.report.Report field: value}); the other
        objectives' are left None."""

    def variant_figures(self, selected: Selected[S]) -> dict[str, dict[str, float]]:
        """{variant: figures} the selection measured of the variants, added to report.json's variants."""
        return {}

    # --- --compressor auto (gac.pipelines.auto): the candidates compared at this objective
    def candidate_config(self, cfg: C, groups: Sequence[DimGroup], common: int) -> C:
        """A candidate's run config (its compressor named in `cfg`) at this objective, whose candidates' weights
        hold `common` parameters in all; a GacError where it cannot be met."""
        return cfg

    @abstractmethod
    def predict(self, model: nn.Module, analyzed: Analyzed, cfg: RunConfig) -> Prediction[S]:
        """A candidate's dims at the objective, predicted without building it."""

    def measured(self, selected: Selected[S], baseline_loss: float) -> tuple[dict[str, Any], float | None]:
        """(what building a candidate measured besides its loss; its held-back loss over `baseline_loss` where the
        selection measured it, else None)."""
        return {}, None

    def rank(self, measured: dict[str, Any]) -> tuple[Any, ...]:
        """A built candidate's key from its measured figures: lower is better."""
        return (measured["loss"],)

    def why_kept(self, measured: dict[str, Any], figures: str) -> str:
        """report.json's "why" of the kept candidate (`measured`), `figures` the built candidates' losses."""
        return f"{self.ranking}, nats/token over the original: {figures}"

    def auto_report(self, cfg: RunConfig, common: int) -> dict[str, Any]:
        """What report.json's "auto" section states of the objective's target."""
        return {}
