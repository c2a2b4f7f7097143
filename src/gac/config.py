"""The configuration of a `gac compress` run (CompressConfig): every default lives here, and the checks of its values
and combinations, worded in its own field names (gac.errors.ConfigError; the CLI names its flags instead); its
objective (gac.objectives.base.Objective) checks its own field and what excludes it. gac.api takes it; the pipelines
below the facade take it by its type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gac.align.targets import get_target
from gac.calibration.texts import TextConfig
from gac.compressors import ASVDConfig, AutoConfig, CompressorConfig, compressor_for, config_for
from gac.compressors.linalg import FACTORIZATIONS
from gac.errors import ConfigError, GacError
from gac.evaluate.latency import LatencyConfig
from gac.hw.device import ALIGNMENT
from gac.objectives import objective_for
from gac.objectives.latency.config import SpeedupConfig
from gac.objectives.parameter import COMPRESS_WINDOW, DEFAULT_RATIO

if TYPE_CHECKING:
    from gac.heal.run import HealConfig
    from gac.objectives.base import Objective
    from gac.quantize.schemes import QuantizeConfig

AUTO_PIPELINE = "auto"  # CompressConfig.pipeline's default: the memory forecast chooses (gac.pipelines.choice)
# the pipeline with the whole model in memory (gac.pipelines.whole_model): what heal, quantize, a speedup and
# --compressor auto need
WHOLE_MODEL = "whole"


@dataclass(frozen=True)
class CompressConfig:
    """Every default of `gac compress` lives here; the CLI passes only what the user gave.

    `compressor` is a compressor's config (gac.compressors: ASVDConfig(alpha=0.5), PruneConfig(layers="all"), ...,
    or AutoConfig for `--compressor auto`), whose type chooses the handler; a name ("asvd") is converted here to that
    compressor's config with `compressor_options` set on it (CompressConfig(compressor="prune",
    compressor_options={"layers": "all"})), each option checked by the config. `compressor_options` then records the
    options as given (report.json's "compressor_options"; an objective reads which ones the user chose), a config's
    own options besides where one was passed."""

    model: str = "smollm2-135m"
    compressor: CompressorConfig = field(default_factory=ASVDConfig)  # or its name (converted in __post_init__)
    ratio: float | None = None  # share of compressible parameters to remove (None: DEFAULT_RATIO; none with a speedup)
    out: str | None = None
    alignment: int = ALIGNMENT
    align: bool = True  # False: save the compressor's own dims
    window: int = COMPRESS_WINDOW  # aligned candidates each side of d* (gac.objectives.parameter says why one)
    profile: str | None = None  # hardware profile JSON driving the candidates
    target: str | None = None  # deployment target (gac.align.targets.TARGETS), e.g. "llama.cpp:q4_k_m"
    dtype: str = "float32"
    device: str = "cpu"
    factorization: str = "auto"  # gac.compressors.linalg.FACTORIZATIONS, or auto: gram on CUDA, gram32 on CPU
    compressor_options: dict[str, Any] = field(default_factory=dict)
    speedup: SpeedupConfig | None = None  # latency as the objective, not a ratio (gac.objectives.latency)
    text: TextConfig = TextConfig()
    latency: LatencyConfig = LatencyConfig()  # with a speedup at the objective's shape (evaluation_latency)
    evaluate: bool = True
    force: bool = False
    progress: bool = True
    # a name in gac.pipelines.PIPELINES ("whole", "layerwise": a model directory read one layer at a time), or
    # "auto": chosen by the memory forecast against the memory available (gac.pipelines.choice checks the name)
    pipeline: str = AUTO_PIPELINE
    max_memory: str | None = None  # "cpu=8GiB,0=20GiB": the memory the forecast must fit (else what is free now)
    heal: HealConfig | None = None  # distill the saved variant from the original (gac.heal)
    quantize: QuantizeConfig | None = None  # the saved variant quantized after healing, a compressed-tensors
    # checkpoint (gac.quantize)
    dist_timeout_s: float | None = None  # under torchrun: how long a rank waits for the others at a collective (None:
    # GAC_DIST_TIMEOUT, else gac.distributed.DEFAULT_TIMEOUT_S)

    def __post_init__(self) -> None:
        self._set(self._compressor_config())  # first: the objective's checks read it
        objective = self.objective  # one of ratio and speedup
        self._set(objective.settle(self))  # its own field checked first (a default ratio where none is given)
        if self.quantize is not None and (off_whole := self.off_whole_model()):
            raise ConfigError(
                "{quantize} quantizes the whole model in memory, so it cannot run layer by layer: drop "
                f"{off_whole}, or quantize the output later with `gac quantize`"
            )
        if self.heal is not None and (off_whole := self.off_whole_model()):
            raise ConfigError(
                "{heal} trains the whole model in memory, so it cannot run layer by layer: drop "
                f"{off_whole}, or heal the output later with `gac heal`"
            )
        if isinstance(self.compressor, AutoConfig):
            self._check_auto()
        if self.dist_timeout_s is not None and not self.dist_timeout_s > 0:
            raise ConfigError(f"dist_timeout_s {self.dist_timeout_s} must be positive, e.g. {{dist_timeout_s:300}}")
        if self.alignment < 1:
            raise ConfigError(f"alignment {self.alignment} must be a positive integer, e.g. {{alignment:8}}")
        if self.factorization not in ("auto", *FACTORIZATIONS):
            raise GacError(f"unknown factorization {self.factorization!r}: choose auto or {', '.join(FACTORIZATIONS)}")
        target = get_target(self.target)  # a known target, or one line naming them
        if self.target and self.profile:
            raise ConfigError("{target} and {profile} both choose the candidates: pass one of them")
        if target is not None and not target.low_rank:
            self._check_no_low_rank(target.name)
        self._set(objective.check(self))  # the other fields against the objective (a speedup's resolved for them)

    def _compressor_config(self) -> dict[str, Any]:
        """The compressor as its config, `compressor_options` set on it, and the options as given."""
        given, named = dict(self.compressor_options), self.compressor
        if isinstance(named, str):  # a name, as the CLI and most callers give it
            return {"compressor": config_for(named, **given), "compressor_options": given}
        own = {k: v for k, v in named.options().items() if k not in given}
        return {"compressor": named.with_options(**given), "compressor_options": {**given, **own}}

    def _set(self, fields: dict[str, Any]) -> None:
        """Set fields of this frozen config while it checks itself (what an objective settled or resolved)."""
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def _check_no_low_rank(self, target: str) -> None:
        """A target whose format holds no low-rank projections (DeciLM's layers keep their MLP width and KV heads
        only) takes a compressor that cuts whole channels and heads."""
        if isinstance(self.compressor, AutoConfig):
            does = "compares low-rank compressors among others"
        elif compressor_for(self.compressor).factorizes:
            does = "factorizes weights into low-rank pairs"
        else:
            return
        raise ConfigError(
            f"{{compressor:{self.compressor.name}}} {does}, and the layers of {{target:{target}}} hold no ranks (only "
            "their own widths): use {compressor:prune}, or drop {target}"
        )

    def _check_auto(self) -> None:
        """--compressor auto compares every compressor at its defaults (AutoConfig takes no options), analyzed on one
        whole-model calibration."""
        if off_whole := self.off_whole_model():
            raise ConfigError(
                "{compressor:auto} analyzes every compressor with the whole model in memory, so it "
                f"cannot run layer by layer: drop {off_whole}, or name one compressor"
            )

    def off_whole_model(self) -> str | None:
        """What may take this run off the whole model in memory, in a ConfigError's words (a pipeline other than the
        whole model's, or a max_memory the forecast may choose layer by layer for); None when nothing does."""
        named = self.pipeline not in (AUTO_PIPELINE, WHOLE_MODEL)
        if not (named or self.max_memory):
            return None
        return f"{{pipeline:{self.pipeline if named else 'layerwise'}}}/{{max_memory}}"

    @property
    def objective(self) -> Objective:
        """The objective this run keeps (gac.objectives.objective_for): latency with a speedup, else parameters."""
        return objective_for(self)

    @property
    def analysis_ratio(self) -> float:
        """The ratio the analysis probes at (keep = 1 - ratio) and the memory forecast sizes the output by: the given
        one, or DEFAULT_RATIO with a speedup, which has none."""
        return DEFAULT_RATIO if self.ratio is None else self.ratio

    @property
    def saved_variant(self) -> str:
        """The variant written to `out`: GAC's dims, or the compressor's own where `align` is False."""
        return "gac" if self.align else "unaligned"

    @property
    def evaluation_latency(self) -> LatencyConfig:
        """How the variants are timed: `latency`, at the objective's phase shape with a speedup."""
        return self.objective.evaluation_latency(self)

    @property
    def factorization_method(self) -> str:
        """The factorization `auto` resolves to: the float64 Gram path on CUDA (cuSOLVER's SVD is slow); on a CPU the
        float32 one where the weight's conditioning allows it (about 2x faster than LAPACK's SVD at 8B shapes),
        else the exact SVD (gac.compressors.linalg.scaled_svd)."""
        if self.factorization != "auto":
            return self.factorization
        return "gram" if str(self.device).startswith("cuda") else "gram32"
