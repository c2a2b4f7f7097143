"""The layer-by-layer pipeline behind gac.pipelines.base.Pipeline: the model opened lazily, its analysis in sweeps
(analyze.py), its variants cut and the saved one streamed to shards as the layers go by (materialize.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gac.checkpoint.gac_dir import check_out_dir, write_beside_weights
from gac.checkpoint.lazy import open_source
from gac.checkpoint.sharded import ShardWriter
from gac.config import CompressConfig
from gac.distributed import world
from gac.evaluate.layer_latency import LayerLatency
from gac.io.atomic import atomic_dir
from gac.models.groups import linears_of
from gac.objectives.base import Analyzed, Selected
from gac.pipelines.base import Measured, Opened, Pipeline, compressor_groups
from gac.pipelines.layerwise.analyze import analyze_layerwise, check_layerwise
from gac.pipelines.layerwise.layers import layer_count
from gac.pipelines.layerwise.materialize import materialize_layerwise, outer_tensors
from gac.pipelines.memory import RUNTIME_BYTES, WORK, Forecast, Workload

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from gac.checkpoint.lazy import LazyCheckpoint, Resident
    from gac.compressors.base import Compressor


def analyze(
    model: PreTrainedModel,
    source: LazyCheckpoint | Resident,
    calib: torch.Tensor,
    cfg: CompressConfig,
    compressor: Compressor | None = None,
    held_back: torch.Tensor | None = None,
) -> Analyzed:
    """The compressor's units at keep = 1 - cfg.analysis_ratio, computed layer by layer from `source`'s weights
    (gac.pipelines.layerwise.analyze); what cutting needs waits in a factor cache on disk for materialize."""
    compressor, groups = compressor_groups(model, cfg, compressor)
    units = analyze_layerwise(
        model, source, compressor, groups, calib, keep=1.0 - cfg.analysis_ratio, progress=cfg.progress
    )
    return Analyzed(compressor, units, linears_of(groups), sum(u.group.numel for u in units), held_back)


class Layerwise(Pipeline):
    """One decoder layer at a time, in memory bounded by a layer's weights and statistics."""

    name = "layerwise"
    title = "the layer-by-layer pipeline"

    def check(self, compressor: Compressor) -> None:
        check_layerwise(compressor)

    def forecast(self, work: Workload) -> Forecast:
        """Peak: the larger of the two sweeps. The analysis holds the embeddings and head, one layer's weights, its
        factors and X^T X, the loss model's float64 work for its largest weight, the calibration activations in
        flight (every layer's input is stored on disk for the reverse sweep) and one batch's head logits;
        materialization one layer's weights and its cut copies and that layer's factors read from the analysis's
        cache (no X^T X, no SVD). Disk: the stored activations (reverse sweep) + max(output, factor cache) + one
        layer's cache, an upper bound (the reverse sweep frees each layer's input as it caches its factors,
        materialization each layer's factors as it writes its output). Time: the calibration sweep (forward; the
        reverse sweep's statistics, recompute and backward) and the compressor's own work; materialization runs no
        pass (it reads the cached factors)."""
        s, b, tokens = work.shapes, work.value_bytes, work.tokens
        analysis = {
            "outer weights": s.outer_params * b,
            "one layer's weights": s.layer_params * b,
            "one layer's factors": work.layer_factors,
            "one layer's X^T X": work.layer_xtx,
            WORK: work.largest,
            "activations in flight": work.flight + max(work.transient, work.logits),
            "runtime": RUNTIME_BYTES,
        }
        materialize = {
            "outer weights": s.outer_params * b,
            # an MoE layer is written per expert (the checkpoint layout): presumed one more copy of the layer
            "one layer's weights and its two cut copies": (3 + bool(s.experts)) * s.layer_params * b,
            "one layer's factors": work.cached,  # read from the cache: no X^T X, no SVD
            "one layer's X^T X": 0,
            WORK: 0,
            "activations in flight": tokens * s.hidden * b + work.transient,
            "runtime": RUNTIME_BYTES,
        }
        parts = max(analysis, materialize, key=lambda p: sum(p.values()))
        stored = s.layers * tokens * s.hidden * b if work.reverse else 0  # each layer's input, for the reverse sweep
        disk = stored + max(work.output_bytes, s.layers * work.cached) + work.cached
        sweeps = (1 + 1 + 1 + 2 * work.backwards if work.reverse else 1) * work.one_pass_s
        return work.forecast(self.name, parts, disk, {"calibration sweep": sweeps + work.statistics_s})

    def open(self, cfg: CompressConfig) -> Opened:
        source, tokenizer, model_name = open_source(cfg.model, dtype=cfg.dtype, device=cfg.device)
        return Opened(source.model, tokenizer, model_name, source)

    def analyze(
        self,
        opened: Opened,
        calib: torch.Tensor,
        cfg: CompressConfig,
        compressor: Compressor,
        held_back: torch.Tensor | None = None,
    ) -> Analyzed:
        return analyze(opened.model, _source(opened), calib, cfg, compressor, held_back)

    @contextlib.contextmanager
    def output(self, cfg: CompressConfig) -> Iterator[Path | None]:
        """The atomic output directory (renamed to cfg.out on success) that the saved variant's weights are streamed
        into as they are cut; None for a run with no output."""
        if cfg.out is None or not world().is_main:  # under torchrun rank 0 alone writes
            yield None
            return
        with atomic_dir(check_out_dir(cfg.out, cfg.force).resolve(), force=cfg.force) as tmp:
            yield tmp

    def materialize(
        self, opened: Opened, selected: Selected, cfg: CompressConfig, held_out: torch.Tensor, streamed_to: Path | None
    ) -> tuple[dict, Measured | None]:
        """Every variant cut from the analysis' factor cache, with perplexity and latency measured as the layers go
        by and the saved variant's weights streamed to `streamed_to`."""
        model, saved = opened.model, cfg.saved_variant
        writer = ShardWriter(streamed_to) if streamed_to is not None else None
        timer = None
        if cfg.evaluate:
            timer = LayerLatency(cfg.evaluation_latency, layer_count(model))
        models = materialize_layerwise(
            model,
            _source(opened),
            selected.compressor,
            selected.units,
            selected.dims,
            writer=(saved, writer) if writer is not None else None,
            progress=cfg.progress,
            held_out=held_out if cfg.evaluate else None,
            timer=timer,
            release=not world().is_main,  # a rank that writes nothing keeps no cut layers
        )
        ppl = models.pop("ppl", None)
        if writer is not None:
            writer.add(outer_tensors(models[saved]))
            writer.close()
        # ppl and the timer are both measured exactly when the run evaluates
        return {"baseline": model, **models}, None if ppl is None or timer is None else Measured(ppl, timer)

    def write(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        cfg: CompressConfig,
        *,
        plan: dict,
        files: dict,
        streamed_to: Path | None,
        finish: Callable | None = None,
    ) -> Path:
        """Beside the weights already streamed to `streamed_to`, the atomic directory that becomes cfg.out."""
        if cfg.out is None:
            raise ValueError("a run without an output writes nothing")
        assert streamed_to is not None  # this pipeline streams every variant it writes
        write_beside_weights(model, tokenizer, streamed_to, plan=plan, extra_files=files)
        return Path(cfg.out).resolve()


PIPELINE = Layerwise()


def _source(opened: Opened) -> LazyCheckpoint | Resident:
    """Where a layer-wise run reads each layer's weights from (its open always gives one)."""
    if opened.source is None:
        raise ValueError("a layer-wise run's model was opened without its weights' source")
    return opened.source
