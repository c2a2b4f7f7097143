"""What a run writes, whichever the pipeline: report.json's Report, built once from the selection and the evaluated
variants, and gac_plan.json with the files saved beside the model (report.json, report.md, dims.png; heal.png,
quantize.json). The Report is typed; its JSON is made here, where it is written (and by callers that print it)."""

from __future__ import annotations

import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gac.align.plan import SelectionResult
from gac.checkpoint.gac_dir import QUANTIZE_FILE, plan_record, versions
from gac.config import CompressConfig
from gac.distributed import World, timing_threads
from gac.evaluate.dims_plot import plot_dims
from gac.evaluate.latency import LatencyConfig
from gac.evaluate.layer_latency import LatencyMethod
from gac.evaluate.report import report_json, report_markdown
from gac.heal.plot import PLOT_FILE, heal_png
from gac.heal.run import healed_summary
from gac.hw.device import device_name
from gac.models.dims import inspect_model
from gac.models.groups import groups_of
from gac.objectives.base import Selected
from gac.pipelines.choice import PipelineChoice
from gac.pipelines.evaluation import VariantResult
from gac.quantize.run import quantized_summary

if TYPE_CHECKING:
    from torch import nn

    from gac.compressors.base import Compressor


@dataclass(frozen=True)
class DistributedRun:
    """report.json's "distributed": the torchrun world a run had, and what each rank computed."""

    world_size: int
    backend: str | None
    timeout_s: float
    ranks: list[dict[str, Any]]  # [{"rank": r, what: [the items of `what` rank r computed], ...}]

    @classmethod
    def of(cls, world: World) -> DistributedRun:
        return cls(**world.summary())


@dataclass
class Report:
    """One `gac compress` run's report, built once (build_report) whichever the pipeline; to_dict() is report.json.
    The sections of one objective (defaults None) are left out of the JSON under the other. Sections another package
    builds as JSON (the objective's, the target, healing, quantization, auto) are held as that JSON."""

    model: str
    compressor: str
    ratio: float | None  # null under --speedup, which has no ratio
    alignment: int
    device: str
    device_name: str
    dtype: str
    compressible_params: int  # |W|: parameters of all weights the compressor may touch
    budget_params: int  # floor((1 - ratio) |W|); |W| under --speedup
    compressor_options: dict[str, Any]
    profile: str | None
    latency: LatencyConfig  # what the variants were timed with
    eval_tokens: int
    versions: dict[str, str]
    threads: int
    pipeline: str  # "whole" or "layerwise"
    variants: dict[str, VariantResult]  # baseline first, then the variants cut
    dims: dict[str, dict[str, int]]  # {variant: {group: dim}} of the groups each variant reduced
    saved_variant: str
    selection: SelectionResult | None = None  # --ratio: the knapsack's result (its JSON less the dims, in `dims`)
    objective: dict[str, Any] | None = None  # --speedup: the latency objective's options ...
    latency_objective: dict[str, Any] | None = None  # ... and its closed loop (LatencyOutcome.report())
    target: dict[str, Any] | None = None  # which dims the deployment target constrained, and why
    profile_excluded: dict[str, dict[int, str]] | None = None  # {group: {dim: why}}: aligned dims a profile ruled out
    heal: dict[str, Any] | None = None  # --heal: the saved variant's healing (gac.heal.run.heal_model's report)
    quantization: dict[str, Any] | None = None  # --quantize: the saved variant's quantization (quantize.json)
    pipeline_choice: PipelineChoice | None = None  # why this pipeline: its reason, the forecast, the memory available
    latency_method: LatencyMethod | None = None  # how the latencies were obtained (whole models, or layer by layer)
    auto: dict[str, Any] | None = None  # --compressor auto: every compressor's predicted and measured figures
    experts_kept: dict[str, int] | None = None  # --drop-experts: {MoE layer's experts module: experts kept}
    distributed: DistributedRun | None = None  # under torchrun: world size, backend, what each rank computed
    stages_s: dict[str, float] | None = None  # wall seconds of each stage but the write (gac.pipelines.stages)

    def to_dict(self) -> dict[str, Any]:
        """report.json's object: every field, those of another objective (None) left out; the records as their JSON;
        profile_excluded with its count (profile_excluded_dims) and its dims as JSON keys."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is not dataclasses.MISSING:
                continue
            if f.name == "profile_excluded":
                out["profile_excluded_dims"] = sum(map(len, value.values()))
                value = {name: {str(d): why for d, why in sorted(dims.items())} for name, dims in value.items()}
            elif f.name == "variants":
                value = {variant: figures.to_dict() for variant, figures in value.items()}
            out[f.name] = _json(value)
        return out


@dataclass
class CompressResult:
    """What gac.api.compress returns: the typed report, where the saved variant went, and the models."""

    report: Report | None  # to_dict() is report.json; None on a torchrun rank other than 0, which reports nothing
    out: Path | None
    models: dict[str, nn.Module]  # variant name -> model (kept for callers that go on using them)
    rank: int = 0  # under torchrun, this process's rank: rank 0 alone has the report and wrote the output


def _json(value: Any) -> Any:
    """A report field's JSON: a record's own, the knapsack's selection less its dims (report.json's "dims" has them)."""
    if isinstance(value, SelectionResult):
        return {k: v for k, v in value.to_dict().items() if k != "dims"}
    if isinstance(value, (PipelineChoice, LatencyMethod)):
        return value.to_dict()
    if isinstance(value, (LatencyConfig, DistributedRun)):
        return dataclasses.asdict(value)
    return value


def reduced_dims(dims: dict[str, int | None]) -> dict[str, int]:
    """{group: dim} for the groups a variant reduced (whole groups left out), as report.json lists them."""
    return {name: int(d) for name, d in dims.items() if d is not None}


def build_report(
    cfg: CompressConfig,
    model_name: str,
    selected: Selected[Any],
    variants: dict[str, VariantResult],
    choice: PipelineChoice | None = None,
    latency_method: LatencyMethod | None = None,
) -> Report:
    """report.json of a run, built once from the selection and the evaluated variants, whichever the pipeline
    (choice: which and why); the objective's own sections (the knapsack's selection; under a speedup the closed
    loop's rounds) and what it measured of the variants (each timed one's figures at its shape)."""
    objective = cfg.objective
    for variant, figures in objective.variant_figures(selected).items():
        variants[variant].record(figures)
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
        latency=cfg.evaluation_latency,
        eval_tokens=cfg.text.eval_windows * cfg.text.seq_len,
        versions=versions(),
        threads=timing_threads(),  # what the variants were timed with
        pipeline=cfg.pipeline,  # the one the run took (gac.pipelines.run sets it from the choice)
        pipeline_choice=choice,
        latency_method=latency_method,
        variants=variants,
        dims={v: reduced_dims(d) for v, d in selected.dims.items()},
        saved_variant=cfg.saved_variant,
        target=selected.target,
        profile_excluded=selected.profile_excluded,
        **objective.report_sections(selected, cfg),
    )


def experts_kept(model: nn.Module) -> dict[str, int]:
    """{MoE layer's experts module: experts it kept} of a built variant (drop_experts), read off the model."""
    return {g.name: g.num_experts for g in groups_of(model, "experts")}


def plan_and_files(
    model: nn.Module, cfg: CompressConfig, report: Report, compressor: Compressor
) -> tuple[dict[str, Any], dict[str, str | bytes]]:
    """gac_plan.json's content and the files saved beside the model (report.json, report.md, dims.png; heal.png
    after healing, quantize.json after quantizing)."""
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
    files: dict[str, str | bytes] = {
        "report.json": report_json(content),
        "report.md": report_markdown(content),
        "dims.png": png.getvalue(),
    }
    if report.quantization:
        files[QUANTIZE_FILE] = json.dumps(report.quantization, indent=2) + "\n"
    if report.heal:
        files[PLOT_FILE] = heal_png(report.heal)
    return plan, files
