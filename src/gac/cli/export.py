"""`gac export MODEL --format gguf --out FILE.gguf [--type T]`: parses options, calls gac.export.export.export."""

from __future__ import annotations

import click

from gac.cli.options import Int
from gac.export.config import FORMATS


def print_export(report: dict) -> None:
    """One line for the file, the type counts, then every fallback with its cause."""
    types = ", ".join(f"{n} {t}" for t, n in sorted(report["types"].items(), key=lambda kv: -kv[1]))
    click.echo(
        f"{report['file']}: {report['arch']} GGUF, {report['requested']}, {report['bytes'] / 2**20:.1f} MiB; "
        f"tensors: {types}"
    )
    fallbacks = report["fallbacks"]
    if not fallbacks:
        click.echo("no tensor fell back to another type")
        return
    click.echo(
        f"{len(fallbacks)} tensor(s) fell back (row length not a multiple of the type's block): "
        + ", ".join(f"{n} {c}" for c, n in report["fallbacks_by_cause"].items())
    )
    for f in fallbacks:
        click.echo(f"  {f['name']}: row length {f['row_length']} ({f['cause']}): wanted {f['wanted']}, got {f['type']}")


@click.command("export")
@click.argument("model")
@click.option(
    "--format",
    "format_",
    type=click.Choice(FORMATS),
    default="gguf",
    show_default=True,
    help="gguf: llama.cpp's GGUF file; hf: a Hugging Face directory (transformers, vLLM with gac); deci: a DeciLM "
    "directory of a pruned Llama-layout model (vLLM, transformers, llama.cpp without gac; SGLang and TensorRT-LLM "
    "where every MLP width is a multiple of 256: `gac compress --target deci`).",
)
@click.option(
    "--out", required=True, type=click.Path(), help="Output file (.gguf), or directory (--format hf or deci)."
)
@click.option("--type", "type_", help="f16, q8_0, q4_0 or q4_k_m (llama.cpp's quantizer) [default: f16].")
@click.option("--report", type=click.Path(dir_okay=False), help="Also write the per-tensor type report (JSON).")
@click.option("--threads", type=Int(0, 1024, example=2), help="Quantizer threads [default: 0, all cores].")
@click.option(
    "--pad-mlp",
    is_flag=True,
    help="Where llama.cpp's architecture holds one MLP width (gemma3), write every layer at the widest "
    "layer's width with zero channels (the same outputs; the file no smaller than that width).",
)
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def command(model, format_, out, type_, report, threads, pad_mlp, force, quiet) -> None:
    """Export MODEL (a gac output, an HF directory, a .gguf or an alias) for a serving engine: llama.cpp (gguf),
    transformers and vLLM (hf), or engines without gac (deci)."""
    from gac.cli.output import setup_logging
    from gac.export.deci import engines_line, export_deci
    from gac.export.export import ExportConfig, export, export_hf

    setup_logging(quiet)
    given = {k: v for k, v in {"type": type_, "report": report, "threads": threads}.items() if v is not None}
    cfg = ExportConfig(model=model, out=out, format=format_, pad_mlp=pad_mlp, force=force, **given)
    if format_ == "hf":
        click.echo(f"saved {model} as a Hugging Face directory: {export_hf(cfg)}")
        return
    if format_ == "deci":
        result = export_deci(cfg)
        click.echo(f"saved {model} as a DeciLM directory: {result.path}")
        click.echo(engines_line(result.record["engines"]))
        return
    print_export(export(cfg).report)
