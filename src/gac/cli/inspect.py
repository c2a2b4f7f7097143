"""`gac inspect MODEL`: every compressible dim of a model and whether it is aligned. torch is imported lazily."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gac.cli.options import Int
from gac.errors import GacError


def parse_alignments(text: str) -> tuple[int, ...]:
    """'8,16,32' -> (8, 16, 32); one line GacError for anything but positive integers."""
    try:
        values = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        values = ()
    if not values or values[0] < 1 or values[-1] > 1024:
        raise GacError(
            f"bad --align {text!r}: give positive integers up to 1024 separated by commas, e.g. --align 8,16,32"
        )
    return values


@click.command("inspect")
@click.argument("model")
@click.option(
    "--align",
    "align_text",
    metavar="N[,N...]",
    default="8,16,32",
    show_default=True,
    help="Alignments to check, comma list.",
)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), help="Write every dim as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Scatter of dims by layer (PNG).")
@click.option(
    "--limit",
    type=Int(0, example=40),
    default=40,
    show_default=True,
    help="Misaligned dims shown in the table (0: all).",
)
def command(model, align_text, json_out, plot, limit) -> None:
    """List MODEL's compressible dims (ranks, linear widths, MLP width, head_dim) and which are misaligned."""
    from gac.cli.output import setup_logging
    from gac.io import validate

    alignments = parse_alignments(align_text)
    for path, flag in ((json_out, "--json"), (plot, "--plot")):
        if path is not None:
            validate.output_file(path, flag)
    validate.local_model_typo(model)
    setup_logging(quiet=True)
    from gac.checkpoint.loading import load_model
    from gac.evaluate.dims_plot import plot_dims
    from gac.io.atomic import write_file, write_text
    from gac.models.dims import inspect_model

    result = inspect_model(load_model(model).model, alignments)
    if json_out is not None:
        write_text(json_out, json.dumps({"model": model, **result.to_json()}, indent=2), flag="--json")
    if plot is not None:
        write_file(plot, lambda p: plot_dims(result, p), flag="--plot")
    _print(model, result, limit)
    for what, path in (("json", json_out), ("plot", plot)):
        if path is not None:
            click.echo(f"wrote {what} to {path}")


def _print(model: str, result, limit: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    bad = result.misaligned()
    table = Table(
        title=f"{model}: {len(bad)} of {len(result.dims)} listed dims misaligned "
        f"to {'/'.join(map(str, result.alignments))}"
    )
    for col in ("layer", "module", "kind", "dim", *[f"/{a}" for a in result.alignments], "judged"):
        table.add_column(col, justify="left" if col in ("module", "kind") else "right")
    for d in bad[: limit or None]:
        table.add_row(
            "-" if d.layer is None else str(d.layer),
            d.name,
            d.kind,
            str(d.value),
            *["yes" if d.aligned[a] else "[red]no[/red]" for a in result.alignments],
            "yes" if d.judged else "",
        )
    if bad:
        console.print(table)
        if limit and len(bad) > limit:
            console.print(f"... {len(bad) - limit} more misaligned dims (--limit 0 shows all, --json writes all)")
    else:
        console.print(f"{model}: every listed dim is a multiple of {'/'.join(map(str, result.alignments))}")
    judged = (
        "compressed dims (ranks, pruned widths)"
        if result.judged_over == "compressed"
        else "in/out features of the compressible linears"
    )
    counts = result.counts()
    console.print(f"judged over the {counts[result.alignments[0]]['judged']} {judged}:")
    for a, share in result.share_misaligned.items():
        console.print(f"  misaligned to {a:>3}: {100 * share:6.2f}%  ({counts[a]['misaligned']} dims)")
