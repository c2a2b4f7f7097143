"""What a run writes, whichever the pipeline: report.json's Report, built once from the selection and the evaluated
variants, and gac_plan.json with the files saved beside the model (report.json, report.md, dims.png; heal.png,
quantize.json)."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import TYPE_CHECKING

from gac.config import CompressConfig
from gac.distributed import timing_threads
from gac.objectives.base import Selected

if TYPE_CHECKING:
    from torch import nn

    from gac.compressors.base import Compressor
    from gac.evaluate.report import Report
    from gac.pipelines.choice import PipelineChoice


def reduced_dims(dims: dict) -> dict:
    """{group: dim} for the groups a variant reduced (whole groups left out), as report.json lists them."""
    return {name: int(d) for name, d in dims.items() if d is not None}


def build_report(
    cfg: CompressConfig,
    model_name: str,
    selected: Selected,
    variants: dict,
    choice: PipelineChoice | None = None,
    latency_method: dict | None = None,
) -> Report:
    """report.json of a run (gac.evaluate.report.Report), built once from the selection and the evaluated variants,
    whichever the pipeline (choice: which and why); the objective's own sections (the knapsack's selection; under a
    speedup the closed loop's rounds) and what it measured of the variants (each timed one's figures at its shape)."""

    from gac.checkpoint.gac_dir import versions
    from gac.evaluate.report import Report
    from gac.hw.device import device_name

    objective = cfg.objective
    for variant, figures in objective.variant_figures(selected).items():
        variants[variant].update(figures)
    return Report(
        model=model_name,
        compressor=cfg.compressor.name,
        ratio=cfg.ratio,
        alignment=cfg.alignment,
        device=cfg.device,
        device_name=device_name(cfg.device),
        dtype=cfg.dtype,
        compressible_params=selected.compressible,
        budget_params=selected.budget,
        compressor_options=dict(cfg.compressor_options),
        profile=cfg.profile,
        latency=dataclasses.asdict(cfg.evaluation_latency),
        eval_tokens=cfg.text.eval_windows * cfg.text.seq_len,
        versions=versions(),
        threads=timing_threads(),  # what the variants were timed with
        pipeline=cfg.pipeline,  # the one the run took (gac.pipelines.run sets it from the choice)
        pipeline_choice=choice.to_dict() if choice is not None else None,
        latency_method=latency_method,
        variants=variants,
        dims={v: reduced_dims(d) for v, d in selected.dims.items()},
        saved_variant=cfg.saved_variant,
        target=selected.target,
        profile_excluded=selected.profile_excluded,
        **objective.report_sections(selected, cfg),
    )


def experts_kept(model: nn.Module) -> dict:
    """{MoE layer's experts module: experts it kept} of a built variant (drop_experts), read off the model."""
    from gac.models.groups import groups_of

    return {g.name: g.num_experts for g in groups_of(model, "experts")}


def plan_and_files(model: nn.Module, cfg: CompressConfig, report: Report, compressor: Compressor) -> tuple[dict, dict]:
    """gac_plan.json's content and the files saved beside the model (report.json, report.md, dims.png; heal.png
    after healing, quantize.json after quantizing)."""
    from gac.checkpoint.gac_dir import QUANTIZE_FILE, plan_record
    from gac.evaluate.dims_plot import plot_dims
    from gac.evaluate.report import report_json, report_markdown
    from gac.heal.run import healed_summary
    from gac.models.dims import inspect_model
    from gac.quantize.run import quantized_summary

    plan = plan_record(
        variant=report.saved_variant,
        source_model=report.model,
        alignment=cfg.alignment,
        dims=report.dims[report.saved_variant],
        compressor=compressor.config.to_dict(),
        ratio=report.ratio,
        compressible_params=report.compressible_params,
        budget_params=report.budget_params,
        target=cfg.target,
        **({"healed": healed_summary(report.model, report.heal)} if report.heal else {}),
        **({"quantization": quantized_summary(report.quantization)} if report.quantization else {}),
    )
    png = io.BytesIO()
    plot_dims(inspect_model(model, {cfg.alignment, 8, 16, 32}), png)
    content = report.to_dict()
    files = {"report.json": report_json(content), "report.md": report_markdown(content), "dims.png": png.getvalue()}
    if report.quantization:
        files[QUANTIZE_FILE] = json.dumps(report.quantization, indent=2) + "\n"
    if report.heal:
        from gac.heal.plot import PLOT_FILE, heal_png

        files[PLOT_FILE] = heal_png(report.heal)
    return plan, files
