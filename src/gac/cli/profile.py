"""`gac profile`: measure kernel latency over dims on this device and write the profile JSON and plots.

torch is imported inside the command so `gac --help` stays fast.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from gac.errors import GacError


def parse_dims(text: str) -> tuple[int, ...]:
    """'64:256' (inclusive), '64:256:8', '96,104,111' or a mix like '96:128,256' -> sorted unique dims."""
    dims: set[int] = set()
    for part in text.split(","):
        bits = part.strip().split(":")
        try:
            nums = [int(b) for b in bits]
        except ValueError:
            nums = []
        if not nums or len(nums) > 3 or any(n < 1 for n in nums) or (len(nums) > 1 and nums[0] > nums[1]):
            raise GacError(f"bad --dims {text!r}: use START:STOP[:STEP] (inclusive) or a comma list, e.g. 64:256:8")
        if len(nums) == 1:
            dims.add(nums[0])
        else:
            dims.update(range(nums[0], nums[1] + 1, nums[2] if len(nums) == 3 else 1))
    return tuple(sorted(dims))


@click.command("profile")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Profile JSON to write (default: the cache file for this device, dtype and torch).")
@click.option("--quick", is_flag=True, help="Small sweep (dims 96..128, M=1024 and 1), under a minute on a CPU.")
@click.option("--dims", "dims_text", metavar="START:STOP[:STEP]", help="Dims to sweep (inclusive), e.g. 64:256.")
@click.option("--plan", type=click.Path(dir_okay=False, path_type=Path),
              help="Sweep windows around each weight's dim in this selection plan.")
@click.option("--model", "model_spec", help="Sweep windows around every dim this model has (alias, dir, .gguf).")
@click.option("--m", "m", type=click.IntRange(min=1), help="Prefill tokens M (default 512; 1024 with --quick).")
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: torch's current count).")
@click.option("--force", is_flag=True, help="Measure again even when a cached profile with this sweep exists.")
@click.option("--no-plot", is_flag=True, help="Do not write the PNG plots.")
def command(device, dtype, out, quick, dims_text, plan, model_spec, m, threads, force, no_plot) -> None:
    """Measure GEMM, SDPA and low-rank latency over dims on this device (the hardware profile)."""
    import dataclasses

    from gac.hw import profile as hp

    if sum(x is not None for x in (dims_text, plan, model_spec)) > 1:
        raise GacError("give one of --dims, --plan or --model, not several")
    hp.check_device(device)
    spec = hp.SweepSpec.quick() if quick else hp.SweepSpec()
    if dims_text:
        dims = parse_dims(dims_text)
        spec = dataclasses.replace(spec, dims=dims, head_dims=dims)
    if plan:
        spec = hp.spec_from_plan(plan, spec)
    if model_spec:
        from gac.models.loading import load_model

        spec = hp.spec_from_model(load_model(model_spec).model, spec)
    if m is not None:
        spec = dataclasses.replace(spec, m_values=(m, 1) if m > 1 else (1,))
    if threads is not None:
        spec = dataclasses.replace(spec, threads=threads)

    reused = not force and hp.load_cached_profile(spec, device=device, dtype=dtype) is not None
    start = time.perf_counter()
    result = hp.profile(spec, device=device, dtype=dtype, out=out, force=force)
    path = out or hp.cached_profile_path(device, dtype)
    _print_summary(result, reused=reused, seconds=time.perf_counter() - start)
    click.echo(f"profile: {path}")
    if not no_plot:
        from gac.hw.plots import plot_profile

        for png in plot_profile(result, path.parent, prefix=path.stem):
            click.echo(f"plot:    {png}")


def _print_summary(result: dict, *, reused: bool, seconds: float) -> None:
    from gac.hw.cliffs import entry_label, find_cliffs

    points = sum(len(e["dims"]) for e in result["ops"])
    how = f"reused the cached profile of {result['date'][:10]} (--force to measure again)" if reused \
        else f"measured in {seconds:.1f} s"
    click.echo(f"{len(result['ops'])} sweeps, {points} points on {result['device_name']} "
               f"({result['device']}, {result['dtype']}, {result['threads']} threads): {how}")
    for entry in result["ops"]:
        table = dict(zip(entry["dims"], entry["ms"]))
        cliffs = find_cliffs(table)
        aligned = [d for d in cliffs if d % 8 == 0]
        shown = ", ".join(str(d) for d in aligned[:8]) + (" ..." if len(aligned) > 8 else "")
        span = f"{min(entry['ms']):.4g}-{max(entry['ms']):.4g} ms"
        click.echo(f"  {entry_label(entry):<36} {span:<20} {len(cliffs):3d} cliffs, at multiples of 8: "
                   f"{shown or 'none'}")
