"""Each variant's figures, whichever the pipeline: parameters and aligned fraction and, with evaluation, held-out
perplexity and latency (timed side by side on the whole models, or measured as the layers went by)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gac.config import CompressConfig
from gac.distributed import node_threads, world
from gac.evaluate.latency import measure_latency
from gac.evaluate.layer_latency import WHOLE_MODEL, LatencyMethod
from gac.evaluate.perplexity import perplexity
from gac.models.dims import params_and_alignment
from gac.pipelines.base import Measured
from gac.pipelines.stages import StageClock

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

# a variant's measured figures, null in the report without evaluation
NOT_EVALUATED = ("ppl", "prefill_ms", "prefill_spread_pct", "decode_ms_per_token", "decode_spread_pct")
# what the latency objective measured of a variant at its phase and shape; absent from the JSON where it did not
OBJECTIVE_FIGURES = ("predicted_ms", "measured_ms", "prediction_error_pct")


@dataclass
class VariantResult:
    """One variant's figures, report.json's variants[name]: its size and alignment; with evaluation, held-out
    perplexity and latency (null without); under --speedup, the baseline's and the kept model's time at the
    objective's shape, predicted and measured."""

    params: int  # weight parameters of the compressible linears
    aligned_fraction: float  # share of its compressed dims divisible by the alignment
    ppl: float | None = None
    prefill_ms: float | None = None
    prefill_spread_pct: float | None = None  # the 10-90 percentile spread of the timed runs
    decode_ms_per_token: float | None = None
    decode_spread_pct: float | None = None
    predicted_ms: float | None = None
    measured_ms: float | None = None
    prediction_error_pct: float | None = None

    def record(self, figures: Mapping[str, float]) -> None:
        """Take in measured `figures` ({field: value}: a latency measurement's, or the objective's)."""
        for name, value in figures.items():
            if name not in NOT_EVALUATED + OBJECTIVE_FIGURES:
                raise KeyError(f"{name!r} is not a measured figure of a variant")
            setattr(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return {k: v for k, v in out.items() if v is not None or k not in OBJECTIVE_FIGURES}


def evaluate_variants(
    models: dict[str, nn.Module],
    names: list[str],
    held_out: torch.Tensor,
    cfg: CompressConfig,
    *,
    measured: Measured | None = None,
    clock: StageClock | None = None,
) -> tuple[dict[str, VariantResult], LatencyMethod | None]:
    """({variant: figures}, how latency was measured or None): each model's parameters and aligned fraction over
    `names` and, with cfg.evaluate, its held-out perplexity and prefill and decode latency, all models timed side by
    side (cfg.evaluation_latency). `measured`: perplexities and layer timings taken layer by layer (the models were
    never whole: gac.evaluate.layer_latency). What is not measured is null. Under torchrun perplexity is computed on
    shares of the windows (every rank calls this), latency on rank 0 alone. clock: where the perplexity and timing
    stages' seconds go."""
    variants = {name: VariantResult(*params_and_alignment(m, names, cfg.alignment)) for name, m in models.items()}
    if not cfg.evaluate:
        return variants, None
    if measured is not None:
        for name, value in measured.ppl.items():
            variants[name].ppl = value
        for name, figures in measured.latency.figures().items():
            variants[name].record(figures)
        return variants, measured.latency.method()
    clock = clock or StageClock()
    with clock.stage("perplexity"):
        for name, m in models.items():
            variants[name].ppl = perplexity(m, held_out, desc=f"perplexity {name}", progress=cfg.progress)
    if not world().is_main:  # under torchrun rank 0 alone times the models; the others leave latency null
        return variants, None
    log.info("timing %s side by side", ", ".join(models))
    with clock.stage("timing"), node_threads():  # rank 0's figures are one process's on the node
        timed = measure_latency(models, cfg.evaluation_latency)
    for name, lat in timed.items():
        variants[name].record(lat)
    return variants, WHOLE_MODEL
