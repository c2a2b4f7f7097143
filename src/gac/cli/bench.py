"""`gac bench`: prefill and decode latency (and `--ppl` perplexity) of several models side by side. Parses options,
loads the models (whole on --device, or placed by accelerate with --device-map) and calls gac.evaluate.bench.bench;
defaults live in BenchConfig and TextConfig. torch is imported inside the command."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gac.cli.options import Int
from gac.errors import GacError, first_line

if TYPE_CHECKING:
    import torch

    from gac.calibration.texts import TextConfig
    from gac.checkpoint.gac_dir import LoadedModel


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
            raise GacError(
                f"bad --points {text!r}: use BATCHxSEQ[,BATCHxSEQ...] with positive integers, e.g. 1x128,1x512,4x512"
            )
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


def _load(spec: str, *, dtype: str, device: str, placement):
    from gac.checkpoint.loading import load_model

    try:
        return load_model(spec, dtype=dtype, device=device, placement=placement)
    except GacError:
        raise
    except Exception as e:  # any other load failure is still a one-line user error
        first = first_line(e)
        raise GacError(f"could not load model {spec!r}: {first}") from e


def write_outputs(result: dict, out: Path) -> list[Path]:
    """DIR/bench.json, DIR/bench.md, DIR/bench_latency.png, each written atomically."""
    import json

    from gac.evaluate.bench import bench_table_markdown, plot_latency_vs_seq
    from gac.io.atomic import write_file

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

    from gac.evaluate.bench import placement_text, point_key

    names = list(result["decode"])
    table = Table(
        title=f"prefill / decode median ms, latency ratio vs {names[0]} (below 1 is faster) · "
        f"{result['device_name']} · {result['dtype']} · {result['threads']} threads"
    )
    table.add_column("model")
    keys = [point_key(p["batch"], p["seq"]) for p in result["points"]]
    for k in keys:
        table.add_column(f"prefill {k}", justify="right")
    table.add_column(f"decode/token @{result['config']['decode_context']}", justify="right")
    if "ppl" in result:
        table.add_column("perplexity", justify="right")
    ratios = result["ratios_vs_first"]
    for i, name in enumerate(names):

        def cell(ms: float, ratio: float, first: bool = i == 0) -> str:
            return f"{ms:.2f}" if first else f"{ms:.2f} · {ratio:.3f}x"

        row = [
            cell(p["results"][name]["median_ms"], ratios[name]["prefill"][k]) for p, k in zip(result["points"], keys)
        ]
        row.append(cell(result["decode"][name]["median_ms"], ratios[name]["decode"]))
        if "ppl" in result:
            row.append(f"{result['ppl'][name]:.3f}")
        table.add_row(name, *row)
    console = Console()
    if not console.is_terminal:  # logs and pipes get the full table, not an 80-column squeeze
        console = Console(width=160)
    console.print(table)
    for name, summary in (result.get("placement") or {}).items():
        if summary:
            console.print(f"{name}: placed by accelerate, {placement_text(summary)}")
    if result.get("eager_note"):
        console.print(f"Note: {result['eager_note']}.")
    if result.get("aa_floor_pct") is not None:
        console.print(
            f"A/A control: {names[0]} timed twice in the same rounds differs by up to "
            f"{result['aa_floor_pct']:.1f}%: the noise floor of these ratios."
        )


def _placements(device_map: str | None, max_memory: str | None, offload_folder: Path | None, labels: list[str]):
    """One Placement per model; each model offloads to its own subfolder of --offload-folder (accelerate names
    the offloaded files after the weights, which two models share)."""
    from gac.checkpoint.placement import Placement, parse_max_memory

    def folder(label: str) -> str | None:
        return None if offload_folder is None else str(offload_folder / label.replace("/", "--"))

    caps = parse_max_memory(max_memory)
    return [Placement(device_map, caps, folder(label)) for label in labels]  # bad combinations fail here


def _windows(loaded: LoadedModel, text: str, text_cfg: TextConfig) -> torch.Tensor:
    from gac.calibration.texts import token_windows

    if loaded.tokenizer is None:
        raise GacError(
            f"{loaded.source} has no tokenizer, which --ppl needs: put the tokenizer files beside the "
            "weights, or leave --ppl out"
        )
    return token_windows(
        loaded.tokenizer, text, text_cfg.seq_len, text_cfg.eval_windows, what=f"evaluation ({loaded.source})"
    )


@click.command("bench")
@click.argument("models", nargs=-1, required=True, metavar="MODEL [MODEL...]")
@click.option("--device", help="cpu or cuda[:N] [default: cpu]; not with --device-map.")
@click.option(
    "--device-map",
    metavar="auto|balanced|sequential",
    help="Place each model through accelerate over the GPUs, CPU and disk instead of --device.",
)
@click.option(
    "--max-memory",
    metavar="DEV=SIZE[,...]",
    help="With --device-map: accelerate's cap per device and per model, e.g. cpu=8GiB,0=20GiB.",
)
@click.option(
    "--offload-folder",
    type=click.Path(file_okay=False, path_type=Path),
    help="With --device-map: where weights offloaded to disk go, one subfolder per model "
    "[default: a temporary directory].",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="[default: bfloat16 on cuda (or --device-map with a GPU), float32 on cpu].",
)
@click.option(
    "--points",
    "points_text",
    metavar="BxS[,BxS...]",
    help="Prefill points, batch x sequence [default: 1x128,1x512,1x1024,4x512].",
)
@click.option("--rounds", type=Int(1, 100000, example=10), help="Prefill runs per model and point [default: 10].")
@click.option(
    "--decode-batches",
    "decode_batches_text",
    metavar="B[,B...]",
    help="Batch sizes at which decode is timed, e.g. 1,16 [default: 1].",
)
@click.option("--ppl", is_flag=True, help="Also the perplexity of every model on held-out text.")
@click.option("--eval-file", type=click.Path(dir_okay=False), help="With --ppl: held-out text [default: Python docs].")
@click.option("--eval-windows", type=Int(1, 100000, example=24), help="With --ppl: windows [default: 24].")
@click.option("--seq-len", type=Int(1, 131072, example=512), help="With --ppl: tokens per window [default: 512].")
@click.option("--no-aa", is_flag=True, help="Leave out the A/A control (the first model timed twice).")
@click.option("--threads", type=Int(1, 4096, example=4), help="CPU threads (default: torch's current count).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for bench.json, bench.md and bench_latency.png.",
)
@click.option("--quiet", is_flag=True, help="No progress logging.")
def command(
    models,
    device,
    device_map,
    max_memory,
    offload_folder,
    dtype,
    points_text,
    rounds,
    decode_batches_text,
    ppl,
    eval_file,
    eval_windows,
    seq_len,
    no_aa,
    threads,
    out,
    quiet,
) -> None:
    """Time prefill and decode of every MODEL side by side (interleaved, same run, same inputs)."""
    from gac.calibration.texts import TextConfig
    from gac.checkpoint.loading import check_placeable
    from gac.cli.output import setup_logging
    from gac.evaluate.bench import BenchConfig, bench
    from gac.hw.device import check_device, default_dtype
    from gac.hw.timing import cpu_threads
    from gac.io import validate

    setup_logging(quiet)
    if out is not None:
        validate.writable_location(out, "--out", is_dir=True)  # before the timing, not after
    for spec in models:
        validate.local_model_typo(spec)
    given: dict[str, Any] = {}  # BenchConfig's fields the options set
    if points_text is not None:
        given["points"] = parse_points(points_text)
    if rounds is not None:
        given["rounds"] = rounds
    if decode_batches_text is not None:
        given["decode_batches"] = parse_batches(decode_batches_text)
    cfg = BenchConfig(**given, aa=not no_aa)  # bad input fails here, before any model is loaded
    text_given = {
        k: v for k, v in dict(eval_file=eval_file, eval_windows=eval_windows, seq_len=seq_len).items() if v is not None
    }
    if text_given and not ppl:
        raise GacError(
            f"--{next(iter(text_given)).replace('_', '-')} applies only with --ppl: pass --ppl as well, or leave it out"
        )
    text_cfg = TextConfig(**text_given)
    if device_map is not None and device is not None:
        raise GacError(
            "--device and --device-map exclude each other: use --device-map alone (accelerate places "
            "each model; cap the devices with --max-memory)"
        )
    labels = model_labels(models)
    placements = _placements(device_map, max_memory, offload_folder, labels)
    for spec, placement in zip(models, placements):
        check_placeable(spec, placement)
    if offload_folder is not None:
        validate.writable_location(offload_folder, "--offload-folder", is_dir=True)
    device = device or "cpu"
    check_device(device)
    if dtype is None:  # a device map uses the GPUs unless --max-memory leaves them all out
        import torch

        caps = placements[0].max_memory
        on_gpu = device_map is not None and (caps is None or any(isinstance(k, int) for k in caps))
        dtype = default_dtype("cuda" if on_gpu and torch.cuda.is_available() else device)
    if device_map is not None and max_memory is None and len(models) > 1:
        import logging

        logging.getLogger("gac.bench").warning(
            "--device-map without --max-memory: accelerate fills the devices with the first model and may offload "
            "the later ones, so the ratios would compare placements; give each model the same cap with --max-memory"
        )
    text = None
    if ppl:
        from gac.calibration.texts import pydoc_split, read_text

        text = read_text(eval_file, "--eval-file") if eval_file else pydoc_split()[1]
    with cpu_threads(threads):
        loaded = {
            label: _load(spec, dtype=dtype, device=device, placement=placement)
            for label, spec, placement in zip(labels, models, placements)
        }
        held_out = {label: _windows(m, text, text_cfg) for label, m in loaded.items()} if text is not None else None
        result = bench({label: m.model for label, m in loaded.items()}, cfg, held_out)
    result["sources"] = dict(zip(labels, models))
    if device_map is not None:
        result["device_map"] = {
            "map": device_map,
            "max_memory": placements[0].max_memory,
            "offload_folder": None if offload_folder is None else str(offload_folder),
        }
    if ppl:
        result["ppl_text"] = {
            "eval_file": eval_file,
            "eval_windows": text_cfg.eval_windows,
            "seq_len": text_cfg.seq_len,
        }
    print_table(result)
    if out is not None:
        for path in write_outputs(result, out):
            click.echo(f"wrote {path}")
