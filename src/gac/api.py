"""Public pipeline: `compress` = load -> calibrate -> compress -> select aligned dims -> evaluate -> save."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from gac.align.select import COMPRESS_WINDOW
from gac.analysis import (Analyzed, Selected, analyze, analyze_and_select, analyze_with, latency_loop,  # noqa: F401
                          materialize_variants, reduced_dims, select_dims)  # the run's stages, public here too
from gac.compressors import AUTO
from gac.data import TextConfig
from gac.errors import GacError
from gac.evaluate.latency import LatencyConfig
from gac.hw.device import ALIGNMENT
from gac.linalg import FACTORIZATIONS

log = logging.getLogger(__name__)

# a variant's measured keys, null in the report under --no-eval
NOT_EVALUATED = ("ppl", "prefill_ms", "prefill_spread_pct", "decode_ms_per_token", "decode_spread_pct")
DEFAULT_RATIO = 0.15  # the parameter objective's ratio when neither a ratio nor a speedup is given


@dataclass(frozen=True)
class CompressConfig:
    """Every default of `gac compress` lives here; the CLI passes only what the user gave."""

    model: str = "smollm2-135m"
    compressor: str = "asvd"
    ratio: float | None = None  # share of compressible parameters to remove (None: DEFAULT_RATIO; none under --speedup)
    out: str | None = None
    alignment: int = ALIGNMENT
    align: bool = True  # False (--no-align): save the compressor's own dims
    window: int = COMPRESS_WINDOW  # aligned candidates each side of d* (gac.align.select says why one)
    profile: str | None = None  # hardware profile JSON driving the candidates
    target: str | None = None  # deployment target (gac.align.targets.TARGETS), e.g. "llama.cpp:q4_k_m"
    dtype: str = "float32"
    device: str = "cpu"
    factorization: str = "auto"  # gac.linalg.FACTORIZATIONS, or auto: gram on CUDA, gram32 on CPU
    compressor_options: dict = field(default_factory=dict)
    speedup: object | None = None  # gac.speedup.SpeedupConfig: latency as the objective (--speedup), not a ratio
    text: TextConfig = TextConfig()
    latency: LatencyConfig = LatencyConfig()  # under --speedup at the objective's shape (evaluation_latency)
    evaluate: bool = True
    force: bool = False
    progress: bool = True
    layerwise: bool | None = None  # the layer-by-layer pipeline (True), the whole model (False), or None: chosen
    # by the memory forecast against the memory available (gac.pipeline.choice); a model directory is read lazily
    max_memory: str | None = None  # "cpu=8GiB,0=20GiB": the memory the forecast must fit (else what is free now)
    heal: object | None = None  # gac.heal.HealConfig (--heal): distill the saved variant from the original
    quantize: object | None = None  # gac.quantize.schemes.QuantizeConfig (--quantize): the saved variant quantized
    # after healing, a compressed-tensors checkpoint (gac.quantize)

    def __post_init__(self):
        if self.speedup is not None and self.ratio is not None:
            raise GacError("--speedup and --ratio exclude each other (--ratio is for the parameter objective): give "
                           "one of them")
        if self.speedup is None and self.ratio is None:
            object.__setattr__(self, "ratio", DEFAULT_RATIO)
        if self.speedup is None and not (isinstance(self.ratio, (int, float)) and 0.0 < self.ratio < 1.0):
            raise GacError(f"ratio {self.ratio} is outside (0, 1): pass the share of parameters to remove, e.g. --ratio 0.15")
        if self.quantize is not None and (self.layerwise or self.max_memory):
            raise GacError("--quantize quantizes the whole model in memory, so it cannot run layer by layer: drop "
                           "--layerwise/--max-memory, or quantize the output later with `gac quantize`")
        if self.heal is not None and (self.layerwise or self.max_memory):
            raise GacError("--heal trains the whole model in memory, so it cannot run layer by layer: drop "
                           "--layerwise/--max-memory, or heal the output later with `gac heal`")
        if self.compressor == AUTO:
            self._check_auto()
        if self.alignment < 1:
            raise GacError(f"alignment {self.alignment} must be a positive integer, e.g. --align 8")
        if self.factorization not in ("auto", *FACTORIZATIONS):
            raise GacError(f"unknown factorization {self.factorization!r}: choose auto or {', '.join(FACTORIZATIONS)}")
        from gac.align.targets import get_target

        get_target(self.target)  # a known target, or one line naming them
        if self.target and self.profile:
            raise GacError("--target and --profile both choose the candidates: pass one of them")
        if self.speedup is not None:
            self._check_speedup()
            from gac.speedup import objective_config

            object.__setattr__(self, "speedup", objective_config(self.compressor, self.compressor_options, self.speedup))

    def _check_speedup(self) -> None:
        """--speedup measures its own tables and saves its own dims, with the whole model on the device."""
        excluded = ((self.profile, "--profile", "parameter candidates; --speedup measures its own tables"),
                    (not self.align, "--no-align", "the compressor's own dims under a ratio"),
                    (self.target, "--target", "the parameter objective's candidates"))
        for given, flag, why in excluded:
            if given:
                raise GacError(f"--speedup and {flag} exclude each other ({flag} is for {why}): give one of them")
        if self.compressor_options.get("drop_experts"):
            raise GacError("--drop-experts removes parameters under a ratio's budget, and --speedup has none: drop "
                           "--drop-experts, or use --ratio")
        if self.layerwise or self.max_memory:
            raise GacError("--speedup times the whole model on the device, so it cannot run layer by layer: drop "
                           "--layerwise/--max-memory, or use --ratio")

    def _check_auto(self) -> None:
        """--compressor auto compares every compressor at its defaults, analyzed on one whole-model calibration."""
        if self.compressor_options:
            raise GacError(f"compressor options ({', '.join(sorted(self.compressor_options))}) apply to only some "
                           "compressors, and --compressor auto compares each at its defaults: drop them, or name "
                           "one compressor")
        if self.layerwise or self.max_memory:
            raise GacError("--compressor auto analyzes every compressor with the whole model in memory, so it cannot "
                           "run layer by layer: drop --layerwise/--max-memory, or name one compressor")

    @property
    def analysis_ratio(self) -> float:
        """The ratio the analysis probes at (keep = 1 - ratio) and the memory forecast sizes the output by: the given
        one, or DEFAULT_RATIO under --speedup, which has none."""
        return DEFAULT_RATIO if self.ratio is None else self.ratio

    @property
    def saved_variant(self) -> str:
        """The variant written to `out`: GAC's dims, or the compressor's own under --no-align."""
        return "gac" if self.align else "unaligned"

    @property
    def evaluation_latency(self) -> LatencyConfig:
        """How the variants are timed: `latency`, at the objective's phase shape under --speedup."""
        return self.latency if self.speedup is None else self.speedup.latency_config(self.latency)

    @property
    def factorization_method(self) -> str:
        """The factorization `auto` resolves to: the float64 Gram path on CUDA (cuSOLVER's SVD is slow); on a CPU the
        float32 one where the weight's conditioning allows it (faster than LAPACK's SVD at 8B shapes), else the
        exact SVD (gac.linalg.scaled_svd)."""
        if self.factorization != "auto":
            return self.factorization
        return "gram" if str(self.device).startswith("cuda") else "gram32"


@dataclass
class CompressResult:
    report: dict  # report.json's content (gac.evaluate.report.Report.to_dict)
    out: Path | None
    models: dict  # variant name -> model (kept for callers that go on using them)


def compress(cfg: CompressConfig) -> CompressResult:
    """load -> calibrate -> analyze -> select -> materialize -> evaluate -> report -> save. Whole in memory, or layer
    by layer (cfg.layerwise, or a --max-memory the whole model would exceed): the two pipelines differ only in how
    the model is read, cut and written; selection, evaluation and the report are one path."""
    from gac.compressors import make_compressor
    from gac.data import load_windows
    from gac.models.io import check_out_dir

    compressor = None if cfg.compressor == AUTO else make_compressor(cfg.compressor, **cfg.compressor_options)
    if cfg.out is not None:
        check_out_dir(cfg.out, cfg.force)  # fail before the long work, not after
    if cfg.profile and cfg.profile != "auto":
        from gac.hw.profile import load_profile

        load_profile(cfg.profile)  # a bad profile fails now, not after calibration
    from gac.pipeline.choice import plan_memory

    choice = plan_memory(cfg)  # layer by layer when the whole model would not fit
    log.info("pipeline: %s (%s)", choice.pipeline, choice.reason)
    if cfg.heal is not None and choice.layerwise:
        raise GacError(f"--heal trains the whole model in memory, and it does not fit ({choice.reason}): compress "
                       "without --heal, then heal the output with `gac heal` where it fits")
    cfg = dataclasses.replace(cfg, layerwise=choice.layerwise)
    model, tokenizer, model_name, source = _open(cfg)
    _check_uncompressed(model, cfg.model)
    calib, held_out = load_windows(tokenizer, cfg.text)
    held_back = _held_back(tokenizer, cfg)
    heal_texts = _heal_config(cfg).windows(tokenizer) if cfg.heal is not None else None  # a bad text fails now
    auto = None
    if compressor is None:  # --compressor auto: the best measured compressor's selection, then the run as its own
        from gac.auto import choose

        cfg, selected, auto = choose(model, calib, held_back, cfg)
        compressor = selected.compressor
    else:
        selected = analyze_and_select(model, calib, cfg, compressor, source=source, held_back=held_back)
    with _streamed_output(cfg) as streamed_to:
        models, measured = _materialize(model, source, selected, cfg, held_out, streamed_to)
        qplan = _quantize_plan(models[cfg.saved_variant], cfg)  # a kernel's refusal before evaluation and saving
        variants, latency_method = _evaluate(models, selected.names, held_out, cfg, measured=measured)
        report = _report(cfg, model_name, selected, variants, choice, latency_method)
        report.auto = auto
        if cfg.compressor_options.get("drop_experts"):
            report.experts_kept = _experts_kept(models[cfg.saved_variant])
        if cfg.heal is not None:
            report.heal = _heal(models, heal_texts, cfg)
        quantizer = None
        if qplan is not None:
            report.quantization, quantizer = _quantize(models[cfg.saved_variant], tokenizer, qplan, cfg)
        out = _save(models[cfg.saved_variant], tokenizer, cfg, report, compressor, streamed_to, quantizer)
    return CompressResult(report.to_dict(), out, models)


def _quantize_plan(model, cfg: CompressConfig):
    """--quantize's plan for the saved variant (gac.quantize.plan), checked against the kernel's rules now; None
    without --quantize."""
    if cfg.quantize is None:
        return None
    from gac.models.structure import structure_of
    from gac.quantize.plan import check_covers, plan

    model.config.gac_structure = structure_of(model)
    qplan = plan(model.config, dataclasses.replace(cfg.quantize, calib_file=cfg.text.calib_file,
                                                   seq_len=cfg.text.seq_len, calib_windows=cfg.text.calib_windows))
    check_covers(qplan, model)
    return qplan


def _quantize(model, tokenizer, qplan, cfg: CompressConfig) -> tuple[dict, object]:
    """--quantize: the saved variant quantized in place (after healing); (its quantize.json, the compressor that
    writes the checkpoint's quantization_config)."""
    import time

    from gac.quantize.run import quantize_model, quantize_report

    start = time.perf_counter()
    quantizer = quantize_model(model, tokenizer, qplan, progress=cfg.progress)
    return quantize_report(cfg.model, qplan, time.perf_counter() - start), quantizer


def _held_back(tokenizer, cfg: CompressConfig):
    """The calibration windows besides those that calibrate (gac.data.held_back_windows), on which --compressor auto and
    the --speedup guard compare models by one loss: auto's kept model is then the best of every closed-loop stream of
    every compressor it built, and each compressor's is the one its single run keeps. None where neither runs."""
    from gac.data import held_back_windows

    if cfg.compressor == AUTO or (cfg.speedup is not None and cfg.speedup.guard):
        return held_back_windows(tokenizer, cfg.text)
    return None


def _open(cfg: CompressConfig) -> tuple:
    """(model, tokenizer, model name for the report, layer-wise weight source or None): the model whole in memory,
    or, layer by layer, a safetensors model directory read lazily (gac.models.lazy)."""
    if cfg.layerwise:
        from gac.models.lazy import open_source

        source, tokenizer, model_name = open_source(cfg.model, dtype=cfg.dtype, device=cfg.device)
        return source.model, tokenizer, model_name, source
    from gac.models.loading import load_model

    loaded = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
    return loaded.model, loaded.tokenizer, loaded.source, None


@contextlib.contextmanager
def _streamed_output(cfg: CompressConfig):
    """The atomic output directory (renamed to cfg.out on success) that a layer-wise run streams the saved variant's
    weights into as they are cut; None for a whole-model run, saved at the end, or a run with no output."""
    if not (cfg.layerwise and cfg.out is not None):
        yield None
        return
    from gac.atomic import atomic_dir
    from gac.models.io import check_out_dir

    with atomic_dir(check_out_dir(cfg.out, cfg.force).resolve(), force=cfg.force) as tmp:
        yield tmp


@dataclass
class Measured:
    """What a layer-wise run measures as the layers go by: perplexities, and the layers' timings."""

    ppl: dict  # {variant or "baseline": float}
    latency: object  # gac.evaluate.layer_latency.LayerLatency


def _materialize(model, source, selected: Selected, cfg: CompressConfig, held_out, streamed_to) -> tuple:
    """({variant: model}, the baseline first; Measured on the way, else None): deep copies cut whole, or, layer by
    layer, every variant cut from the analysis' factor cache with perplexity and latency measured as the layers go
    by and the saved variant's weights streamed to `streamed_to`."""
    if source is None:
        models = {"baseline": model, **materialize_variants(model, selected)}
        selected.units = None  # free the SVD factors before evaluation
        return models, None
    from gac.models.sharded import ShardWriter
    from gac.pipeline.materialize import materialize_layerwise, outer_tensors

    saved = cfg.saved_variant
    writer = ShardWriter(streamed_to) if streamed_to is not None else None
    timer = None
    if cfg.evaluate:
        from gac.evaluate.layer_latency import LayerLatency
        from gac.pipeline.layers import layer_count

        timer = LayerLatency(cfg.evaluation_latency, layer_count(model))
    models = materialize_layerwise(model, source, selected.compressor, selected.units, selected.dims,
                                   writer=writer and (saved, writer), progress=cfg.progress,
                                   held_out=held_out if cfg.evaluate else None, timer=timer)
    ppl = models.pop("ppl", None)
    if writer is not None:
        writer.add(outer_tensors(models[saved]))
        writer.close()
    return {"baseline": model, **models}, None if ppl is None else Measured(ppl, timer)


def _heal_config(cfg: CompressConfig):
    """--heal's gac.heal.HealConfig on the run's evaluation text, device and progress setting."""
    return dataclasses.replace(cfg.heal, text=cfg.text, device=cfg.device, progress=cfg.progress)


def _heal(models: dict, texts, cfg: CompressConfig) -> dict:
    """--heal: distill the saved variant, in place, from the baseline (the original) on `texts`; the report."""
    from gac.heal.run import heal_model

    return heal_model(models[cfg.saved_variant], models["baseline"], texts, _heal_config(cfg))


def _check_uncompressed(model, source: str) -> None:
    from gac.models.groups import compressed_dims_of

    if compressed_dims_of(model):
        raise GacError(f"{source} is already compressed (factorized ranks or pruned widths): compress the original "
                       "model, or align this one with `gac repair`")


def _evaluate(models: dict, names: list[str], held_out, cfg: CompressConfig, *,
              measured: Measured | None = None) -> tuple[dict, dict | None]:
    """({variant: figures}, how latency was measured or None): each model's parameters and aligned fraction over
    `names` and, with cfg.evaluate, its held-out perplexity and prefill and decode latency, all models timed side by
    side (cfg.evaluation_latency). `measured`: perplexities and layer timings taken layer by layer (the models were
    never whole: gac.evaluate.layer_latency). What is not measured is null."""
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
    for name, m in models.items():
        variants[name]["ppl"] = perplexity(m, held_out, desc=f"perplexity {name}", progress=cfg.progress)
    log.info("timing %s side by side", ", ".join(models))
    for name, lat in measure_latency(models, cfg.evaluation_latency).items():
        variants[name].update(lat)
    return variants, dict(WHOLE_MODEL)


def _report(cfg: CompressConfig, model_name: str, selected: Selected, variants: dict, choice=None,
            latency_method: dict | None = None):
    """report.json of a run (gac.evaluate.report.Report), built once from the selection and the evaluated variants,
    whichever the pipeline (choice: gac.pipeline.choice.PipelineChoice, which and why); under --speedup the closed loop's rounds and each timed variant's figures at the
    objective's shape."""
    import torch

    from gac.evaluate.report import Report
    from gac.hw.device import device_name
    from gac.models.io import versions

    outcome = selected.selection if cfg.speedup is not None else None
    if outcome is not None:
        for variant, figures in outcome.variant_figures().items():
            variants[variant].update(figures)
    return Report(
        model=model_name, compressor=cfg.compressor, ratio=cfg.ratio, alignment=cfg.alignment, device=cfg.device,
        device_name=device_name(cfg.device), dtype=cfg.dtype, compressible_params=selected.compressible,
        budget_params=selected.budget, compressor_options=dict(cfg.compressor_options), profile=cfg.profile,
        latency=dataclasses.asdict(cfg.evaluation_latency), eval_tokens=cfg.text.eval_windows * cfg.text.seq_len,
        versions=versions(), threads=torch.get_num_threads(), pipeline="layerwise" if cfg.layerwise else "whole",
        pipeline_choice=choice.to_dict() if choice is not None else None, latency_method=latency_method,
        variants=variants, dims={v: reduced_dims(d) for v, d in selected.dims.items()},
        saved_variant=cfg.saved_variant,
        selection=None if outcome else {k: v for k, v in selected.selection.to_dict().items() if k != "dims"},
        objective=cfg.speedup.objective() if outcome else None, latency_objective=outcome.report() if outcome else None,
        target=selected.target, profile_excluded=selected.profile_excluded,
    )


def _experts_kept(model) -> dict:
    """{MoE layer's experts module: experts it kept} of a built variant (--drop-experts), read off the model."""
    from gac.models.groups import groups_of

    return {g.name: g.num_experts for g in groups_of(model, "experts")}


def _save(model, tokenizer, cfg: CompressConfig, report, compressor, streamed_to, quantizer=None) -> Path | None:
    """Write the saved variant with its plan, report.json, report.md and dims.png to cfg.out (None: no output):
    atomically, or beside the weights already streamed to `streamed_to`, the atomic directory that becomes cfg.out.
    quantizer: --quantize's compressed-tensors compressor, which writes the checkpoint's quantization_config."""
    from gac.models.io import save, write_beside_weights

    if cfg.out is None:
        return None
    plan, files = _plan_and_files(model, cfg, report, compressor)
    if streamed_to is None:
        return save(model, tokenizer, cfg.out, plan=plan, extra_files=files, force=cfg.force,
                    finish=quantizer.update_config if quantizer is not None else None)
    write_beside_weights(model, tokenizer, streamed_to, plan=plan, extra_files=files)
    return Path(cfg.out).resolve()


def _plan_and_files(model, cfg: CompressConfig, report, compressor) -> tuple[dict, dict]:
    """gac_plan.json's content and the files saved beside the model (report.json, report.md, dims.png; heal.png
    after --heal)."""
    from gac.evaluate.dims_plot import plot_dims
    from gac.evaluate.report import report_json, report_markdown
    from gac.heal.run import healed_summary
    from gac.models.dims import inspect_model
    from gac.models.io import plan_record
    from gac.models.io import QUANTIZE_FILE
    from gac.quantize.run import quantized_summary

    plan = plan_record(
        variant=report.saved_variant, source_model=report.model, alignment=cfg.alignment,
        dims=report.dims[report.saved_variant],
        compressor={"name": cfg.compressor, **dataclasses.asdict(compressor.config)}, ratio=report.ratio,
        compressible_params=report.compressible_params, budget_params=report.budget_params, target=cfg.target,
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
