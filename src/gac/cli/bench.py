"""`gac bench`: prefill and decode latency of several models side by side. Parses options, loads the models
and calls gac.evaluate.bench.bench; defaults live in BenchConfig. torch is imported inside the command."""

from __future__ import annotations

from pathlib import Path

import click

from gac.cli.options import Int
from gac.errors import GacError


def parse_points(text: str) -> tuple[tuple[int, int], ...]:
    """'1x128,1x512,4x512' -> ((1, 128), (1, 512), (4, 512)), in the order given, duplicates dropped."""
    points: list[tuple[int, int]] = []
    for part in text.split(","):
        bits = part.strip().lower().split("x")
        try:
            batch, seq = (int(b) for b in bits)
        except ValueError:
            batch = seq = 0
        if batch < 1 or seq < 1:
            raise GacError(f"bad --points {text!r}: use BATCHxSEQ[,BATCHxSEQ...] with positive integers, "
                           f"e.g. 1x128,1x512,4x512")
        if (batch, seq) not in points:
            points.append((batch, seq))
    return tuple(points)


def parse_batches(text: str) -> tuple[int, ...]:
    """'1,16' -> (1, 16)."""
    try:
        batches = tuple(int(b) for b in text.split(","))
    except ValueError:
        batches = ()
    if not batches or min(batches) < 1:
        raise GacError(f"bad --decode-batches {text!r}: give positive batch sizes joined by commas, e.g. 1,16")
    return batches


def model_labels(specs: tuple[str, ...]) -> list[str]:
    """Short unique names for the table: a directory's or file's name, else the spec; repeats get #2, #3."""
    labels: list[str] = []
    for spec in specs:
        path = Path(spec).expanduser()
        base = path.name if path.exists() and path.name else spec
        label, n = base, 1
        while label in labels:
            n += 1
            label = f"{base}#{n}"
        labels.append(label)
    return labels


def _load(spec: str, *, dtype: str, device: str):
    from gac.models.loading import load_model

    try:
        return load_model(spec, dtype=dtype, device=device).model
    except GacError:
        raise
    except Exception as e:  # noqa: BLE001 - any other load failure is still a one-line user error
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise GacError(f"could not load model {spec!r}: {first}") from e


def write_outputs(result: dict, out: Path) -> list[Path]:
    """DIR/bench.json, DIR/bench.md, DIR/bench_latency.png, each written atomically."""
    import json

    from gac.evaluate.bench import bench_table_markdown, plot_latency_vs_seq

    from gac.atomic import write_file

    files = {
        "bench.json": lambda p: p.write_text(json.dumps(result, indent=2) + "\n"),
        "bench.md": lambda p: p.write_text(bench_table_markdown(result)),
        "bench_latency.png": lambda p: plot_latency_vs_seq(result, p),
    }
    paths = []
    for name, write in files.items():
        write_file(out / name, write)
        paths.append(out / name)
    return paths


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from gac.evaluate.bench import point_key

    names = list(result["decode"])
    table = Table(title=f"prefill / decode median ms, latency ratio vs {names[0]} (below 1 is faster) · "
                        f"{result['device_name']} · {result['dtype']} · {result['threads']} threads")
    table.add_column("model")
    keys = [point_key(p["batch"], p["seq"]) for p in result["points"]]
    for k in keys:
        table.add_column(f"prefill {k}", justify="right")
    table.add_column(f"decode/token @{result['config']['decode_context']}", justify="right")
    ratios = result["ratios_vs_first"]
    for i, name in enumerate(names):
        def cell(ms: float, ratio: float) -> str:
            return f"{ms:.2f}" if i == 0 else f"{ms:.2f} · {ratio:.3f}x"

        row = [cell(p["results"][name]["median_ms"], ratios[name]["prefill"][k])
               for p, k in zip(result["points"], keys)]
        row.append(cell(result["decode"][name]["median_ms"], ratios[name]["decode"]))
        table.add_row(name, *row)
    console = Console()
    if not console.is_terminal:  # logs and pipes get the full table, not an 80-column squeeze
        console = Console(width=160)
    console.print(table)
    if result.get("aa_floor_pct") is not None:
        console.print(f"A/A control: {names[0]} timed twice in the same rounds differs by up to "
                      f"{result['aa_floor_pct']:.1f}%: the noise floor of these ratios.")


@click.command("bench")
@click.argument("models", nargs=-1, required=True, metavar="MODEL [MODEL...]")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]),
              help="[default: bfloat16 on cuda, float32 on cpu].")
@click.option("--points", "points_text", metavar="BxS[,BxS...]",
              help="Prefill points, batch x sequence [default: 1x128,1x512,1x1024,4x512].")
@click.option("--rounds", type=Int(1, 100000, example=10), help="Prefill runs per model and point [default: 10].")
@click.option("--decode-batches", "decode_batches_text", metavar="B[,B...]",
              help="Batch sizes at which decode is timed, e.g. 1,16 [default: 1].")
@click.option("--no-aa", is_flag=True, help="Leave out the A/A control (the first model timed twice).")
@click.option("--threads", type=Int(1, 4096, example=4), help="CPU threads (default: torch's current count).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for bench.json, bench.md and bench_latency.png.")
@click.option("--quiet", is_flag=True, help="No progress logging.")
def command(models, device, dtype, points_text, rounds, decode_batches_text, no_aa, threads, out, quiet) -> None:
    """Time prefill and decode of every MODEL side by side (interleaved, same run, same inputs)."""
    from gac.cli.output import setup_logging
    from gac.evaluate.bench import BenchConfig, bench
    from gac.hw.timing import cpu_threads
    from gac.hw.device import check_device, default_dtype

    from gac import validate

    setup_logging(quiet)
    if out is not None:
        validate.writable_location(out, "--out", is_dir=True)  # before the timing, not after
    for spec in models:
        validate.local_model_typo(spec)
    given = {}
    if points_text is not None:
        given["points"] = parse_points(points_text)
    if rounds is not None:
        given["rounds"] = rounds
    if decode_batches_text is not None:
        given["decode_batches"] = parse_batches(decode_batches_text)
    cfg = BenchConfig(**given, aa=not no_aa)  # bad input fails here, before any model is loaded
    check_device(device)
    dtype = dtype or default_dtype(device)
    labels = model_labels(models)
    with cpu_threads(threads):
        loaded = {label: _load(spec, dtype=dtype, device=device) for label, spec in zip(labels, models)}
        result = bench(loaded, cfg)
    result["sources"] = dict(zip(labels, models))
    print_table(result)
    if out is not None:
        for path in write_outputs(result, out):
            click.echo(f"wrote {path}")
