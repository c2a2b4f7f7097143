"""Each variant's figures, whichever the pipeline: parameters and aligned fraction and, with evaluation, held-out
perplexity and latency (timed side by side on the whole models, or measured as the layers went by)."""

from __future__ import annotations

import logging

from gac.pipelines.base import Measured
from gac.pipelines.stages import StageClock

log = logging.getLogger(__name__)

# a variant's measured keys, null in the report without evaluation
NOT_EVALUATED = ("ppl", "prefill_ms", "prefill_spread_pct", "decode_ms_per_token", "decode_spread_pct")


def evaluate_variants(
    models: dict, names: list[str], held_out, cfg, *, measured: Measured | None = None, clock: StageClock | None = None
) -> tuple[dict, dict | None]:
    """({variant: figures}, how latency was measured or None): each model's parameters and aligned fraction over
    `names` and, with cfg.evaluate, its held-out perplexity and prefill and decode latency, all models timed side by
    side (cfg.evaluation_latency). `measured`: perplexities and layer timings taken layer by layer (the models were
    never whole: gac.evaluate.layer_latency). What is not measured is null. Under torchrun perplexity is computed on
    shares of the windows (every rank calls this), latency on rank 0 alone. clock: where the perplexity and timing
    stages' seconds go."""
    from gac.evaluate.latency import measure_latency
    from gac.evaluate.layer_latency import WHOLE_MODEL
    from gac.evaluate.perplexity import perplexity
    from gac.models.dims import params_and_alignment

    variants = {}
    for name, m in models.items():
        params, aligned = params_and_alignment(m, names, cfg.alignment)
        variants[name] = {"params": params, "aligned_fraction": aligned, **dict.fromkeys(NOT_EVALUATED)}
    if not cfg.evaluate:
        return variants, None
    if measured is not None:
        for name, value in measured.ppl.items():
            variants[name]["ppl"] = value
        for name, figures in measured.latency.figures().items():
            variants[name].update(figures)
        return variants, measured.latency.method()
    clock = clock or StageClock()
    with clock.stage("perplexity"):
        for name, m in models.items():
            variants[name]["ppl"] = perplexity(m, held_out, desc=f"perplexity {name}", progress=cfg.progress)
    from gac.distributed import node_threads, world

    if not world().is_main:  # under torchrun rank 0 alone times the models; the others leave latency null
        return variants, None
    log.info("timing %s side by side", ", ".join(models))
    with clock.stage("timing"), node_threads():  # rank 0's figures are one process's on the node
        timed = measure_latency(models, cfg.evaluation_latency)
    for name, lat in timed.items():
        variants[name].update(lat)
    return variants, dict(WHOLE_MODEL)
