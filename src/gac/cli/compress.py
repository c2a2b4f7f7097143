"""`gac compress`: the main job. Parses options and calls gac.api.compress; defaults live in CompressConfig."""

from __future__ import annotations

import click

from gac.align.targets import TARGETS
from gac.cli.heal import heal_config, heal_options
from gac.cli.objective import latency_objective, speedup_options
from gac.cli.options import Int, Real
from gac.cli.quantize import SCHEMES, quantize_config, quantize_options

# gac.compressors.CHOICES (the registry's names, then auto), spelled here so that parsing options imports no torch (a
# test holds them equal); the compressors' configs map the options below when the command runs
COMPRESSORS = ("svd", "asvd", "svd_llm", "prune", "palu", "auto")
# gac.calibration.importance.LOWRANK_IMPORTANCE, likewise
IMPORTANCE = ("output", "magnitude", "activation", "taylor", "fisher")
FACTORIZATIONS = ("svd", "gram", "gram32")  # gac.compressors.linalg.FACTORIZATIONS, likewise
PIPELINES = ("whole", "layerwise", "auto")  # gac.pipelines.PIPELINES' names and gac.config.AUTO_PIPELINE, likewise


def _given(**kwargs) -> dict:
    """Only the options the user actually passed, so the dataclass defaults stay the single source."""
    return {k: v for k, v in kwargs.items() if v is not None}


def _check_inputs(model, out, force, profile, allow_mismatch, device, dtype, calib_file, eval_file) -> None:
    """Everything that can be checked before the model is loaded: fail in a second, not after the work."""
    from gac.io import validate

    validate.output_dir(out, "--out", force=force)
    for path, flag in ((calib_file, "--calib-file"), (eval_file, "--eval-file")):
        if path is not None:
            validate.read_text(path, "text file", flag)
    if model is not None:
        validate.local_model_typo(model)
        validate.not_quantized(model, "compress")
        validate.not_a_gac_output(model)
        validate.enough_space(out, validate.weights_size(model) // 2)  # the output is at least half the source
    if profile is not None and profile != "auto":
        from gac.hw.profile import load_profile
        from gac.hw.profile_schema import check_profile_matches

        check_profile_matches(
            load_profile(profile), profile, device=device or "cpu", dtype=dtype or "float32", allow=allow_mismatch
        )


@click.command("compress")
@click.option("--model", help="smollm2-135m (default, embedded), a HF model dir, a .gguf file, or a hub id.")
@click.option(
    "--compressor",
    type=click.Choice(COMPRESSORS),
    help="Dimension-reducing compressor, or auto: analyze asvd, svd_llm, palu and prune on one calibration, "
    "predict each one's loss at the target, build the best two, keep the lower loss on held-back "
    "calibration text (report.md lists them all) [default: asvd].",
)
@click.option(
    "--ratio",
    type=Real(0, 1, example=0.15),
    help="Share of compressible parameters to remove, in (0, 1) [default: 0.15, without --speedup].",
)
@speedup_options
@click.option("--out", type=click.Path(file_okay=False), help="Output model directory (required unless --dry-run).")
@click.option(
    "--align",
    "alignment",
    type=Int(1, 1024, example=8, hint="give a positive integer up to 1024, usually a power of two, e.g. --align 8"),
    help="Alignment multiple for candidate dims [default: 8].",
)
@click.option("--no-align", is_flag=True, help="Save the compressor's own (unaligned) dims instead of GAC's.")
@click.option(
    "--profile",
    type=click.Path(dir_okay=False),
    help="Hardware profile JSON driving the candidates (from `gac profile`, any machine), or `auto`: "
    "measure this device around the dims needed.",
)
@click.option(
    "--target",
    help=f"Deployment target whose alignment the dims must meet: {', '.join(TARGETS)} "
    "(vllm:tpN: tensor-parallel shards); the knapsack keeps the same budget.",
)
@click.option(
    "--allow-profile-mismatch",
    is_flag=True,
    help="Use a --profile measured for another dtype or device type (a warning instead of an error).",
)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="[default: float32]")
@click.option("--device", help="cpu or cuda[:N] [default: cpu].")
@click.option(
    "--factorization",
    type=click.Choice(["auto", *FACTORIZATIONS]),
    help="Low-rank spectra from an exact SVD (svd), or from eigh of the smaller Gram matrix in float64 "
    "(gram: several times faster on a GPU) or float32 (gram32: ~2x faster on a CPU at 8B shapes; "
    "the exact SVD for a weight too ill-conditioned for it) [default: auto: gram on CUDA, gram32 "
    "on CPU].",
)
@click.option(
    "--alpha",
    type=Real(example=1),
    help="asvd: activation scaling exponent; 1 whitens independent input channels [default: 1; ASVD's paper: 0.5].",
)
@click.option(
    "--importance",
    type=click.Choice(IMPORTANCE),
    help="Importance (channels/heads to keep, per-weight score); output: gac's loss model, low-rank "
    "compressors only [default: prune taylor; asvd, svd_llm and palu output; svd magnitude].",
)
@click.option(
    "--prune-layers", help="prune: layers to prune, e.g. 1-28, 2,4,6 or all [default: all but the first and last]."
)
@click.option(
    "--head-mode",
    type=click.Choice(["group", "uniform", "none"]),
    help="prune: remove whole KV groups, the same number of query heads per group, or no heads "
    "[default: group; under --speedup the knapsack keeps heads whole unless this is given].",
)
@click.option(
    "--drop-experts",
    type=Real(high=1, example=0.25),
    help="prune, mixture-of-experts models: share F in [0, 1) of each MoE layer's experts to drop whole, "
    "with their router rows: every MoE layer drops round(F x experts), its least important (the "
    "budget counts them; the widths fill the rest) [default: 0, none].",
)
@click.option(
    "--group-size", type=Int(1, 1024, example=1), help="palu: KV heads sharing one down-projection [default: 1]."
)
@click.option("--calib-file", type=click.Path(dir_okay=False), help="Calibration text [default: Python docs].")
@click.option("--eval-file", type=click.Path(dir_okay=False), help="Held-out evaluation text [default: Python docs].")
@click.option("--seq-len", type=Int(1, 131072, example=512), help="Tokens per window [default: 512].")
@click.option(
    "--calib-windows",
    type=Int(1, 100000, example=16),
    help="Calibration windows, spread evenly over the calibration text [default: 16].",
)
@click.option("--eval-windows", type=Int(1, 100000, example=24), help="Evaluation windows [default: 24].")
@click.option(
    "--prefill-tokens",
    type=Int(1, 131072, example=512),
    help="Prefill length for latency [default: 512; under --speedup its --shape].",
)
@click.option("--no-eval", is_flag=True, help="Skip perplexity and latency (parameters and alignment only).")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option(
    "--layerwise/--whole-model",
    default=None,
    help="Force the pipeline: layer by layer in bounded memory (a safetensors model directory read one "
    "decoder layer at a time, the output streamed to shards), or the whole model in memory "
    "[default: layer by layer exactly when the whole-model forecast exceeds the memory available].",
)
@click.option(
    "--pipeline",
    type=click.Choice(PIPELINES),
    help="The pipeline by its name: whole or layerwise (as --whole-model, --layerwise), or auto: chosen by the "
    "memory forecast [default: auto].",
)
@click.option(
    "--max-memory",
    help="Memory budget in accelerate's format, e.g. cpu=8GiB [default: what the device has free]: layer "
    "by layer when the whole model would not fit; refused before any work when even that would not.",
)
@click.option(
    "--heal",
    is_flag=True,
    help="Heal the saved model by distillation from the original before saving it (see `gac heal`).",
)
@heal_options
@click.option(
    "--quantize",
    "quantize_scheme",
    type=click.Choice(SCHEMES),
    help="Quantize the saved model (after --heal) to a compressed-tensors checkpoint for vLLM's quantized "
    "kernels, as `gac quantize --scheme` does; the quantize options below apply.",
)
@quantize_options
@click.option(
    "--dist-timeout",
    type=Real(0, example=300),
    help="Under torchrun: seconds a rank waits for the others at a collective before it stops with an error "
    "[default: GAC_DIST_TIMEOUT, else 300].",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the forecast (peak memory per device, disk, rough time) from the config alone and exit.",
)
def command(
    model,
    compressor,
    ratio,
    speedup,
    phase,
    shape,
    param_cap,
    margin,
    no_guard,
    retime,
    out,
    alignment,
    no_align,
    profile,
    target,
    allow_profile_mismatch,
    dtype,
    device,
    factorization,
    alpha,
    importance,
    prune_layers,
    head_mode,
    drop_experts,
    group_size,
    calib_file,
    eval_file,
    seq_len,
    calib_windows,
    eval_windows,
    prefill_tokens,
    no_eval,
    force,
    quiet,
    layerwise,
    pipeline,
    max_memory,
    heal,
    heal_file,
    heal_tokens,
    heal_samples,
    heal_batch,
    heal_lr,
    heal_train,
    hidden_weight,
    ce_weight,
    heal_precision,
    unlike_file,
    quantize_scheme,
    group,
    method,
    skip_unfit,
    serve_device,
    serve_tp,
    dist_timeout,
    dry_run,
):
    """Compress a model, select aligned dims under the same budget, evaluate, and save."""
    from gac.cli.output import print_report, setup_logging
    from gac.errors import GacError

    setup_logging(quiet)
    if max_memory is not None:
        from gac.checkpoint.placement import parse_max_memory

        parse_max_memory(max_memory)  # a bad budget fails now, in one line
    if layerwise is not None:  # --layerwise / --whole-model: a pipeline's name, as --pipeline gives it
        flag, named = ("--layerwise", "layerwise") if layerwise else ("--whole-model", "whole")
        if pipeline not in (None, named):
            raise GacError(f"{flag} and --pipeline {pipeline} name two pipelines: give one of them")
        pipeline = named
    if out is None and not dry_run:
        raise GacError("missing --out: name the output model directory, e.g. --out out/model (or pass --dry-run)")
    if not dry_run:
        _check_inputs(model, out, force, profile, allow_profile_mismatch, device, dtype, calib_file, eval_file)
    from gac.api import CompressConfig, compress
    from gac.calibration.texts import TextConfig
    from gac.evaluate.latency import LatencyConfig

    # the compressor's options by its config's field names (gac.cli.options.CONFIG_FLAGS): CompressConfig sets them on
    # the config of the compressor named, which refuses one it does not have ("--alpha does not apply to ...")
    options = _given(
        alpha=alpha,
        importance=importance,
        layers=prune_layers,
        head_mode=head_mode,
        group_size=group_size,
        drop_experts=drop_experts,
    )
    healing = dict(
        heal_file=heal_file,
        heal_tokens=heal_tokens,
        heal_samples=heal_samples,
        heal_batch=heal_batch,
        heal_lr=heal_lr,
        heal_train=heal_train,
        hidden_weight=hidden_weight,
        ce_weight=ce_weight,
        heal_precision=heal_precision,
        unlike_file=unlike_file,
    )
    if not heal and any(v is not None for v in healing.values()):
        given = ", ".join("--" + k.replace("_", "-") for k, v in healing.items() if v is not None)
        raise GacError(f"{given} set healing: give --heal too")
    quantizing = dict(group=group, method=method, serve_device=serve_device, serve_tp=serve_tp)
    if quantize_scheme is None and (skip_unfit or any(v is not None for v in quantizing.values())):
        given = ", ".join(
            "--" + k.replace("_", "-")
            for k, v in {**quantizing, "skip_unfit": skip_unfit or None}.items()
            if v is not None
        )
        raise GacError(f"{given} set quantization: give --quantize too")
    objective = latency_objective(
        speedup, phase, shape, param_cap, prefill_tokens=prefill_tokens, no_guard=no_guard, margin=margin, retime=retime
    )
    cfg = CompressConfig(
        **_given(
            model=model,
            compressor=compressor,
            ratio=ratio,
            out=out,
            alignment=alignment,
            profile=profile,
            target=target,
            dtype=dtype,
            device=device,
            factorization=factorization,
            pipeline=pipeline,
        ),
        align=not no_align,
        compressor_options=options,
        speedup=objective,
        text=TextConfig(
            **_given(
                calib_file=calib_file,
                eval_file=eval_file,
                seq_len=seq_len,
                calib_windows=calib_windows,
                eval_windows=eval_windows,
            )
        ),
        latency=LatencyConfig(**_given(prefill_tokens=prefill_tokens)),
        evaluate=not no_eval,
        force=force,
        progress=not quiet,
        max_memory=max_memory,
        dist_timeout_s=dist_timeout,
        heal=heal_config(**{**healing, "heal_file": heal_file or calib_file}) if heal else None,
        quantize=quantize_config(quantize_scheme, skip_unfit=skip_unfit, dtype=dtype or "float32", **quantizing)
        if quantize_scheme
        else None,
    )
    if dry_run:
        from gac.pipelines.choice import plan_memory
        from gac.pipelines.memory import describe, forecast_of

        choice = plan_memory(cfg)
        click.echo(describe(forecast_of(cfg, choice.pipeline), choice.reason))
        return
    result = compress(cfg)
    report = result.report
    if report is None:  # under torchrun rank 0 reports and writes; the others computed their shares
        return
    print_report(report.to_dict())
    how = report.latency_method
    if how is not None and how.layers_timed is not None:  # timed layer by layer
        click.echo(
            f"latency estimated layer by layer ({len(how.layers_timed)} of {how.depth} layers timed, "
            "scaled by depth; see report.md)"
        )
    a = report.auto
    if a:
        click.echo(f"compressor auto: kept {a['kept']} ({a['why']}); every compressor's figures in report.md")
    t = report.target
    if t:
        click.echo(
            f"target {t['name']}: {t['met']} of {t['constrained']} constrained dims meet it "
            f"(unaligned: {t['unaligned_met']}); see report.md"
        )
    if report.heal:
        from gac.cli.heal import describe as describe_heal

        for line in describe_heal(report.heal):
            click.echo(line)
    q = report.quantization
    if q:
        from gac.cli.quantize import describe as describe_quantization

        for line in describe_quantization(q):
            click.echo(line)
    plots = "dims.png and heal.png" if report.heal else "dims.png"
    what = f"{report.saved_variant} model ({q['label']} quantized)" if q else f"{report.saved_variant} model"
    click.echo(f"saved {what}, report.json, report.md and {plots} to {result.out}")
