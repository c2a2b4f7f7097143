"""One `gac compress` run, whichever the pipeline: open -> calibrate -> analyze (the pipeline) -> select (the
objective; every compressor under --compressor auto) -> materialize (the pipeline) -> evaluate -> report -> heal ->
quantize -> save (the pipeline writes). The pipeline is chosen by the memory forecast (gac.pipelines.choice)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gac.calibration.texts import held_back_windows, load_windows
from gac.checkpoint.gac_dir import check_out_dir
from gac.compressors import AUTO, compressor_for
from gac.config import WHOLE_MODEL, CompressConfig
from gac.distributed import World, on_main, run_on_main, session
from gac.errors import ConfigError, GacError, literal
from gac.heal.parallel import check_ranks
from gac.heal.run import HealConfig, heal_model
from gac.hw.profile import load_profile
from gac.models.groups import compressed_dims_of
from gac.models.structure import structure_of
from gac.objectives.base import Analyzed, Selected
from gac.pipelines import get_pipeline
from gac.pipelines.auto import choose
from gac.pipelines.choice import plan_memory
from gac.pipelines.evaluation import evaluate_variants
from gac.pipelines.outputs import (
    CompressResult,
    DistributedRun,
    Report,
    build_report,
    experts_kept,
    plan_and_files,
)
from gac.pipelines.stages import StageClock
from gac.quantize.plan import QuantPlan, check_covers
from gac.quantize.plan import plan as quantization_plan
from gac.quantize.run import quantize_model, quantize_report

if TYPE_CHECKING:
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from gac.heal.texts import HealTexts

log = logging.getLogger(__name__)


def run(cfg: CompressConfig) -> CompressResult:
    """load -> calibrate -> analyze -> select -> materialize -> evaluate -> report -> save. Whole in memory, or layer
    by layer (cfg.pipeline, or a max_memory the whole model would exceed): the two pipelines differ only in how the
    model is read, cut and written; selection, evaluation and the report are one path. Under torchrun (either
    pipeline) every rank calibrates and evaluates on its share of the windows and factorizes its share of the
    weights; rank 0 alone chooses the pipeline, selects, times, reports and writes (gac.distributed)."""
    with session(cfg.device, cfg.dist_timeout_s) as world:
        if world.active:
            cfg = _for_rank(cfg, world)
        return _run(cfg, world)


def _for_rank(cfg: CompressConfig, world: World) -> CompressConfig:
    """The run's config on one of several ranks: the rank's own device, progress bars on rank 0 only; --heal's ranks
    checked against its windows a step before any rank loads the model."""
    if cfg.heal is not None:
        check_ranks(cfg.heal.distill.batch, world.size)
    return dataclasses.replace(cfg, device=world.device, progress=cfg.progress and world.is_main)


def _run(cfg: CompressConfig, world: World) -> CompressResult:
    compressor = None if cfg.compressor.name == AUTO else compressor_for(cfg.compressor)
    if cfg.out is not None and world.is_main:
        check_out_dir(cfg.out, cfg.force)  # fail before the long work, not after
    if cfg.profile and cfg.profile != "auto":
        load_profile(cfg.profile)  # a bad profile fails now, not after calibration
    # layer by layer when the whole model would not fit; under torchrun rank 0's choice, every rank's pipeline
    choice = on_main(lambda: plan_memory(cfg), "sharing rank 0's choice of pipeline")
    log.info("pipeline: %s (%s)", choice.pipeline, choice.reason)
    if cfg.heal is not None and choice.pipeline != WHOLE_MODEL:
        raise ConfigError(
            f"{{heal}} trains the whole model in memory, and it does not fit ({literal(choice.reason)}): "
            "compress without {heal}, then heal the output with `gac heal` where it fits"
        )
    cfg = dataclasses.replace(cfg, pipeline=choice.pipeline)
    pipeline = get_pipeline(choice.pipeline)
    clock = StageClock()
    with clock.stage("open"):
        opened = pipeline.open(cfg)
        model, tokenizer = opened.model, opened.tokenizer
        _check_uncompressed(model, cfg.model)
        if tokenizer is None:
            raise GacError(f"{cfg.model} has no tokenizer: put its tokenizer files beside the weights")
        calib, held_out = load_windows(tokenizer, cfg.text)
    held_back = _held_back(tokenizer, cfg)
    heal_texts = _heal_config(cfg).windows(tokenizer) if cfg.heal is not None else None  # a bad text fails now
    auto = None
    if compressor is None and world.active:  # auto under torchrun: rank 0 chooses, the ranks cut its choice
        cfg, chosen, auto = _auto_on_main(model, calib, held_back, cfg)
        compressor = compressor_for(cfg.compressor)
        with clock.stage("analyze"):
            analyzed = pipeline.analyze(opened, calib, cfg, compressor, held_back)
        selected = _with_choice(analyzed, chosen)
    elif compressor is None:  # --compressor auto: the best measured compressor's selection, then the run as its own
        cfg, selected, auto = choose(model, calib, held_back, cfg)
        compressor = selected.compressor
    else:
        with clock.stage("analyze"):
            analyzed = pipeline.analyze(opened, calib, cfg, compressor, held_back)
        with clock.stage("select"):
            selected = _select(model, analyzed, cfg, world)
    with pipeline.output(cfg) as streamed_to:
        with clock.stage("materialize"):
            models, measured = pipeline.materialize(opened, selected, cfg, held_out, streamed_to)
        saved = models[cfg.saved_variant]
        qplan = _quantize_plan(saved, cfg)  # a kernel's refusal before evaluation and saving
        variants, latency_method = evaluate_variants(
            models, selected.names, held_out, cfg, measured=measured, clock=clock
        )
        healed = None
        if cfg.heal is not None and heal_texts is not None:  # under torchrun every rank trains its share (DDP)
            healed = _heal(models, heal_texts, cfg)

        written: list[Report] = []  # rank 0's

        def report_and_write() -> Path | None:
            report = build_report(cfg, opened.name, selected, variants, choice, latency_method)
            written.append(report)
            if world.active:
                report.distributed = DistributedRun.of(world)
            report.auto = auto
            report.heal = healed
            if cfg.compressor_options.get("drop_experts"):
                report.experts_kept = experts_kept(saved)
            quantizer = None
            if qplan is not None:
                report.quantization, quantizer = _quantize(saved, tokenizer, qplan, cfg)
            out = None
            report.stages_s = clock.to_dict()  # before writing: the write's own time is in the log
            if cfg.out is not None:
                plan, files = plan_and_files(saved, cfg, report, compressor)
                out = pipeline.write(
                    saved,
                    tokenizer,
                    cfg,
                    plan=plan,
                    files=files,
                    streamed_to=streamed_to,
                    finish=quantizer.update_config if quantizer is not None else None,
                )
            return out

        # rank 0 alone reports, quantizes and writes, on the node's threads, however long it takes; the others
        # follow its heartbeat (gac.distributed.run_on_main)
        out = run_on_main(report_and_write, "rank 0's report and write")
    if not world.is_main:
        return CompressResult(None, None, models, world.rank)
    return CompressResult(written[0], out, models)


def _select(model: nn.Module, analyzed: Analyzed, cfg: CompressConfig, world: World) -> Selected:
    """The objective's selection; under torchrun rank 0's (its --speedup loop timed on its device alone, the others
    waiting), shared with every rank beside each rank's own analysis."""
    objective = cfg.objective
    if not world.active:
        return objective.select_dims(model, analyzed, cfg)
    mine: list[Selected] = []

    def choose() -> dict:
        mine.append(objective.select_dims(model, analyzed, cfg))
        return _choice_of(mine[0])

    chosen = run_on_main(choose, "rank 0's selection")
    if mine:
        return mine[0]
    return _with_choice(analyzed, chosen)


def _choice_of(selected: Selected) -> dict:
    """Rank 0's choice of dims, what it shares: the fields of Selected but each rank's own (_with_choice's inverse)."""
    return {f.name: getattr(selected, f.name) for f in dataclasses.fields(Selected) if f.name not in _OWN}


def _with_choice(analyzed: Analyzed, chosen: dict) -> Selected:
    """This rank's analysis with rank 0's choice of dims (the fields of Selected but this rank's own)."""
    return Selected(**{f.name: getattr(analyzed, f.name) for f in dataclasses.fields(Analyzed)}, **chosen)


def _auto_on_main(
    model: nn.Module, calib: torch.Tensor, held_back: torch.Tensor | None, cfg: CompressConfig
) -> tuple[CompressConfig, dict, dict]:
    """--compressor auto under torchrun: rank 0 runs the whole comparison as one process does (its loss and
    latency measurements are one device's), and every rank gets (the kept compressor's config, its choice of dims,
    auto's report section). The ranks then analyze that compressor together and cut rank 0's dims, as for a run
    that named it: every analysis of the comparison runs on rank 0 alone, and the kept one once more split."""

    def compare() -> tuple[CompressConfig, dict, dict]:
        kept_cfg, selected, auto = choose(model, calib, held_back, cfg)
        return kept_cfg, _choice_of(selected), auto

    return run_on_main(compare, "rank 0's choice of compressor")


_OWN = {f.name for f in dataclasses.fields(Analyzed)} | {"built"}  # what every rank has of its own


def _check_uncompressed(model: nn.Module, source: str) -> None:
    if compressed_dims_of(model):
        raise GacError(
            f"{source} is already compressed (factorized ranks or pruned widths): compress the original "
            "model, or align this one with `gac repair`"
        )


def _held_back(tokenizer: PreTrainedTokenizerBase, cfg: CompressConfig) -> torch.Tensor | None:
    """The calibration windows besides those that calibrate (gac.calibration.texts.held_back_windows), on which
    --compressor auto and the --speedup guard compare models by one loss: auto's kept model is then the best of every
    closed-loop stream of every compressor it built, and each compressor's is the one its single run keeps. None
    where neither runs."""
    if cfg.compressor.name == AUTO or cfg.objective.needs_held_back(cfg):
        return held_back_windows(tokenizer, cfg.text)
    return None


def _heal_config(cfg: CompressConfig) -> HealConfig:
    """--heal's gac.heal.HealConfig on the run's evaluation text, device and progress setting."""
    if cfg.heal is None:
        raise ValueError("the run has no --heal to configure")
    return dataclasses.replace(cfg.heal, text=cfg.text, device=cfg.device, progress=cfg.progress)


def _heal(models: dict[str, PreTrainedModel], texts: HealTexts, cfg: CompressConfig) -> dict[str, Any]:
    """--heal: distill the saved variant, in place, from the baseline (the original) on `texts`; the report."""
    return heal_model(models[cfg.saved_variant], models["baseline"], texts, _heal_config(cfg))


def _quantize_plan(model: PreTrainedModel, cfg: CompressConfig) -> QuantPlan | None:
    """--quantize's plan for the saved variant (gac.quantize.plan), checked against the kernel's rules now; None
    without --quantize."""
    if cfg.quantize is None:
        return None
    model.config.gac_structure = structure_of(model)
    qplan = quantization_plan(
        model.config,
        dataclasses.replace(
            cfg.quantize, calib_file=cfg.text.calib_file, seq_len=cfg.text.seq_len, calib_windows=cfg.text.calib_windows
        ),
    )
    check_covers(qplan, model)
    return qplan


def _quantize(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, qplan: QuantPlan, cfg: CompressConfig
) -> tuple[dict, ModelCompressor]:
    """--quantize: the saved variant quantized in place (after healing); (its quantize.json, the compressor that
    writes the checkpoint's quantization_config)."""
    start = time.perf_counter()
    with _one_process():
        quantizer = quantize_model(model, tokenizer, qplan, progress=cfg.progress)
    return quantize_report(cfg.model, qplan, time.perf_counter() - start), quantizer


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """llm-compressor as one process while torch's process group is up: under torchrun rank 0 quantizes alone
    (gac.distributed.run_on_main), and llm-compressor would otherwise share its GPTQ work with ranks that are not
    quantizing (compressed-tensors' own switch)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    from compressed_tensors.offload import as_single_threaded  # lazy: an optional dependency of --quantize

    with as_single_threaded():
        yield
