"""The whole-model pipeline: the model loaded whole in memory, calibrated in one pass, every variant cut from a deep
copy of it and saved at the end. --compressor auto and --speedup run on it only (gac.pipelines.choice)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gac.calibration.stats import calibrate
from gac.checkpoint.gac_dir import save
from gac.checkpoint.loading import load_model
from gac.compressors.sensitivity import PROBE_TOKENS
from gac.config import WHOLE_MODEL, CompressConfig
from gac.models.groups import linears_of
from gac.objectives.base import Analyzed, Selected
from gac.pipelines.base import Measured, Opened, Pipeline, compressor_groups
from gac.pipelines.memory import BUILT_COPY, FACTORS, RUNTIME_BYTES, WORK, Forecast, Workload

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from gac.compressors.base import Compressor
    from gac.models.groups import DimGroup


def analyze(
    model: nn.Module,
    calib: torch.Tensor,
    cfg: CompressConfig,
    compressor: Compressor | None = None,
    held_back: torch.Tensor | None = None,
) -> Analyzed:
    """Calibrate on `calib` [n, seq] and let the compressor analyze every group (spectra, loss model, importance) at
    keep = 1 - cfg.analysis_ratio. The model is not changed. held_back: the windows the --speedup guard compares
    models on (gac.calibration.texts.held_back_windows; None: no guard)."""
    compressor, groups = compressor_groups(model, cfg, compressor)
    stats = calibrate(model, calib, linears_of(groups), xtx=compressor.needs_xtx, progress=cfg.progress)
    return analyze_with(model, calib, cfg, compressor, groups, stats, held_back)


def analyze_with(
    model: nn.Module,
    calib: torch.Tensor,
    cfg: CompressConfig,
    compressor: Compressor,
    groups: Sequence[DimGroup],
    stats: dict,
    held_back: torch.Tensor | None = None,
) -> Analyzed:
    """The compressor's analysis of `groups` from calibration statistics already collected on `calib` (`stats`:
    gac.calibration.stats.calibrate's, over at least the groups' linears; shared by `--compressor auto`), the whole
    model in memory."""
    probe = calib[:1, :PROBE_TOKENS]  # one short window: the loss probe for measured importance
    grads = {"windows": calib} if compressor.needs_windows else {}  # gradient-based importance
    units = compressor.analyze(
        model, groups, stats, probe=probe, keep=1.0 - cfg.analysis_ratio, progress=cfg.progress, **grads
    )
    return Analyzed(compressor, units, linears_of(groups), sum(u.group.numel for u in units), held_back)


def materialize_variants(model: nn.Module, selected: Selected) -> dict:
    """{variant: model} for "unaligned" and "gac": each a deep copy of `model`, cut through surgery; a variant the
    selection built already (the closed loop's kept model) is taken as it was built and timed."""
    models = {}
    for variant, dims in selected.dims.items():
        if variant in selected.built:
            models[variant] = selected.built[variant].eval()
            continue
        models[variant] = selected.compressor.built(model, selected.units, dims)
    return models


class WholeModel(Pipeline):
    """The model whole in memory: loaded, analyzed, cut into deep copies and saved at the end."""

    name = WHOLE_MODEL
    title = "the whole-model pipeline"

    def forecast(self, work: Workload) -> Forecast:
        """Peak: the weights, two variants (deep copies), every weight's SVD factors (fp32), every linear's X^T X
        (when collected) and the largest weight's SVD / loss-model / whitening work, activations and logits. Disk:
        the output. Time: the calibration pass (with the statistics), materialization's pass, a gradient pass where
        the compressor needs one, and the compressor's own work."""
        s, act, tokens = work.shapes, work.value_bytes, work.tokens
        parts = {
            "weights": work.weights,
            BUILT_COPY: 2 * int(work.weights * (1 - work.ratio * 0.8)),
            FACTORS: s.layers * work.layer_factors,
            "all X^T X": s.layers * work.layer_xtx,
            WORK: work.largest,
            "activations and logits": (
                work.transient * s.layers // 4
                + max(work.logits, 2 * work.probe * s.vocab * 4)
                + 4 * tokens * s.hidden * act
            ),
            "runtime": RUNTIME_BYTES,
        }
        one = work.one_pass_s
        passes = {  # the analysis's forward (a gradient pass: forward, recompute, backward), materialization's
            "calibration pass": one + work.statistics_s,
            "materialization pass": one,
            **({f"gradient pass ({work.compressor.proxy})": (1 + 2 * work.backwards) * one} if work.reverse else {}),
        }
        return work.forecast(self.name, parts, work.output_bytes, passes)

    def open(self, cfg: CompressConfig) -> Opened:
        loaded = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
        return Opened(loaded.model, loaded.tokenizer, loaded.source)

    def analyze(
        self,
        opened: Opened,
        calib: torch.Tensor,
        cfg: CompressConfig,
        compressor: Compressor,
        held_back: torch.Tensor | None = None,
    ) -> Analyzed:
        return analyze(opened.model, calib, cfg, compressor, held_back)

    def materialize(
        self, opened: Opened, selected: Selected, cfg: CompressConfig, held_out: torch.Tensor, streamed_to: Path | None
    ) -> tuple[dict, Measured | None]:
        models = {"baseline": opened.model, **materialize_variants(opened.model, selected)}
        selected.units = []  # free the SVD factors before evaluation
        return models, None

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
        if cfg.out is None:
            raise ValueError("a run without an output writes nothing")
        return save(model, tokenizer, cfg.out, plan=plan, extra_files=files, force=cfg.force, finish=finish)


PIPELINE = WholeModel()
