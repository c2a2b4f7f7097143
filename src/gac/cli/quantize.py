"""`gac quantize MODEL --scheme S --out DIR`: parses options, calls gac.quantize.run.quantize_dir. The options are
shared with `gac compress --quantize`; defaults live in gac.quantize.schemes.QuantizeConfig."""

from __future__ import annotations

import click

from gac.cli.options import Int

SCHEMES = ("w4a16", "w8a8")  # gac.quantize.schemes.SCHEMES, spelled here so that parsing imports no torch
METHODS = ("rtn", "gptq")  # gac.quantize.schemes.METHODS, likewise
DEVICES = ("cpu", "cuda")  # gac.quantize.kernels.DEVICES, likewise

QUANTIZE_OPTIONS = (
    click.option(
        "--group",
        type=Int(-1, 1 << 20, example=32),
        help="w4a16: input channels per scale, or -1 for one scale per output channel [default: 32].",
    ),
    click.option(
        "--method",
        type=click.Choice(METHODS),
        help="Scales by round to nearest (rtn, no data) or GPTQ (llm-compressor's, on the calibration "
        "text) [default: gptq].",
    ),
    click.option(
        "--skip-unfit",
        is_flag=True,
        help="Leave the linears the scheme's vLLM kernel refuses unquantized (listed in quantize.json) "
        "instead of refusing the model.",
    ),
    click.option(
        "--serve-device",
        type=click.Choice(DEVICES),
        help="The device vLLM will serve on, whose kernels' shape rules every linear must meet [default: cpu].",
    ),
    click.option(
        "--serve-tp",
        type=Int(1, 1024, example=2),
        help="The tensor-parallel size vLLM will serve at: the rules hold for each rank [default: 1].",
    ),
)


def quantize_options(f):
    for option in reversed(QUANTIZE_OPTIONS):
        f = option(f)
    return f


def quantize_config(scheme, *, group=None, method=None, skip_unfit=False, serve_device=None, serve_tp=None, **rest):
    """gac.quantize.schemes.QuantizeConfig from the options given (the others keep the config's defaults)."""
    from gac.quantize.schemes import QuantizeConfig

    given = {
        k: v
        for k, v in (("group", group), ("method", method), ("device", serve_device), ("tp", serve_tp), *rest.items())
        if v is not None
    }
    return QuantizeConfig(scheme=scheme, skip_unfit=skip_unfit, **given)


def describe(report: dict) -> list[str]:
    """The run in a few lines: what was quantized by which kernel's rule, and what was left and why."""
    rule = report["rule"]
    lines = [
        f"{report['label']}: {report['quantized']} of {report['quantized'] + report['unquantized']} linears "
        f"quantized for vLLM's {rule['device']} kernel {rule['kernel']} in {report['seconds']:.0f} s"
    ]
    for lin in report["linears"]:
        if not lin["quantized"]:
            lines.append(f"  left unquantized: {lin['name']} ({lin['why_not']})")
    return lines


@click.command("quantize")
@click.argument("model")
@click.option(
    "--scheme",
    required=True,
    type=click.Choice(SCHEMES),
    help="w4a16: int4 weights in groups (vLLM's W4A16 kernels); w8a8: int8 weights per channel and int8 "
    "activations per token (vLLM's int8 kernels).",
)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output model directory.")
@quantize_options
@click.option(
    "--dtype",
    type=click.Choice(["bfloat16", "float32", "float16"]),
    help="What the model computes in while its scales are found, and its unquantized tensors' dtype "
    "(bfloat16: smaller files; slow GPTQ on a CPU without native bf16) [default: float32; w4a16 saves "
    "bfloat16, its activations' dtype].",
)
@click.option("--calib-file", type=click.Path(dir_okay=False), help="GPTQ's calibration text [default: Python docs].")
@click.option("--calib-windows", type=Int(1, 100000, example=16), help="GPTQ's calibration windows [default: 16].")
@click.option("--seq-len", type=Int(1, 131072, example=512), help="Tokens per window [default: 512].")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def command(
    model,
    scheme,
    out,
    group,
    method,
    skip_unfit,
    serve_device,
    serve_tp,
    dtype,
    calib_file,
    calib_windows,
    seq_len,
    force,
    quiet,
) -> None:
    """Quantize MODEL (a gac output, a Hugging Face directory, a .gguf or an alias) to a compressed-tensors
    checkpoint that vLLM serves with its quantized kernels, every linear checked against the kernel's shape rules
    first."""
    from gac.cli.output import setup_logging
    from gac.io import validate

    setup_logging(quiet)
    if calib_file is not None:
        validate.read_text(calib_file, "text file", "--calib-file")
    cfg = quantize_config(
        scheme,
        group=group,
        method=method,
        skip_unfit=skip_unfit,
        serve_device=serve_device,
        serve_tp=serve_tp,
        dtype=dtype,
        calib_file=calib_file,
        calib_windows=calib_windows,
        seq_len=seq_len,
    )
    from gac.quantize.run import QUANTIZE_FILE, quantize_dir

    result = quantize_dir(model, out, cfg, force=force, progress=not quiet)
    for line in describe(result.report):
        click.echo(line)
    click.echo(f"saved the quantized model and {QUANTIZE_FILE} to {result.out}")
