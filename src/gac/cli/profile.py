"""`gac profile`: measure kernel latency over dims on this device and write the profile JSON and plots.

torch is imported inside the command so `gac --help` stays fast.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from gac.cli.options import Int
from gac.errors import GacError


def parse_dims(text: str, flag: str = "--dims") -> tuple[int, ...]:
    """'64:256' (inclusive), '64:256:8', '96,104,111' or a mix like '96:160,4032:4160' -> sorted unique dims."""
    dims: set[int] = set()
    for part in text.split(","):
        bits = part.strip().split(":")
        try:
            nums = [int(b) for b in bits]
        except ValueError:
            nums = []
        if not nums or len(nums) > 3 or any(n < 1 for n in nums) or (len(nums) > 1 and nums[0] > nums[1]):
            raise GacError(
                f"bad {flag} {text!r}: use START:STOP[:STEP] (inclusive), several joined by commas, "
                "e.g. 96:160,4032:4160:8"
            )
        if len(nums) == 1:
            dims.add(nums[0])
        else:
            dims.update(range(nums[0], nums[1] + 1, nums[2] if len(nums) == 3 else 1))
    return tuple(sorted(dims))


@click.command("profile")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="[default: bfloat16 on cuda, float32 on cpu].",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Profile JSON to write (default: the cache file for this device, dtype and torch).",
)
@click.option("--quick", is_flag=True, help="Small sweep (dims 96..128, M=1024 and 1), under a minute on a CPU.")
@click.option(
    "--dims",
    "dims_text",
    metavar="START:STOP[:STEP],...",
    help="GEMM N/K and low-rank dims to sweep (inclusive), e.g. 96:160,4032:4160.",
)
@click.option(
    "--head-dims",
    "head_dims_text",
    metavar="START:STOP[:STEP],...",
    help="SDPA head dims to sweep, e.g. 64:256:8 (default 64..128; --model: around its head_dim).",
)
@click.option(
    "--hidden",
    type=Int(1, 65536, example=1024),
    help="The GEMMs' fixed dim and the low-rank pair's in/out (default 1024).",
)
@click.option("--heads", type=Int(1, 1024, example=8), help="SDPA heads (default 8).")
@click.option("--batch", type=Int(1, 4096, example=1), help="SDPA batch (default 1).")
@click.option(
    "--context",
    type=Int(1, 1048576, example=512),
    help="SDPA key/value length at decode, M=1 (default 512; prefill attends over M).",
)
@click.option(
    "--ops",
    "ops_text",
    metavar="OP,...",
    help="Ops to sweep (default gemm_n,gemm_k,sdpa,lowrank), e.g. experts: an MoE layer's experts over "
    "their width (with --experts, --top-k and --hidden).",
)
@click.option("--experts", type=Int(1, 65536, example=128), help="Experts in the MoE layer (the experts op).")
@click.option("--top-k", "top_k", type=Int(1, 65536, example=8), help="Experts routed per token (the experts op).")
@click.option(
    "--plan",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Sweep windows around each weight's dim in this selection plan.",
)
@click.option("--model", "model_spec", help="Sweep windows around every dim this model has (alias, dir, .gguf).")
@click.option("--m", "m", type=Int(1, 131072, example=512), help="Prefill tokens M (default 512; 1024 with --quick).")
@click.option("--threads", type=Int(1, 4096, example=4), help="CPU threads (default: torch's current count).")
@click.option("--force", is_flag=True, help="Measure again even when a cached profile with this sweep exists.")
@click.option("--no-plot", is_flag=True, help="Do not write the PNG plots.")
def command(
    device,
    dtype,
    out,
    quick,
    dims_text,
    head_dims_text,
    hidden,
    heads,
    batch,
    context,
    ops_text,
    experts,
    top_k,
    plan,
    model_spec,
    m,
    threads,
    force,
    no_plot,
) -> None:
    """Measure GEMM, SDPA and low-rank latency over dims on this device (the hardware profile).

    --dims, --plan and --model set the GEMM, low-rank (and --ops experts) dims; SDPA head dims come from
    --head-dims (or --model).
    """
    import dataclasses

    from gac.align.profiled import spec_from_model, spec_from_plan
    from gac.hw import profile as hp
    from gac.io import validate

    if sum(x is not None for x in (dims_text, plan, model_spec)) > 1:
        raise GacError("--dims, --plan and --model exclude each other: give only one of --dims, --plan or --model")
    if out is not None:
        validate.output_file(out, "--out")  # before the sweep, not after
    if model_spec is not None:
        validate.local_model_typo(model_spec)
    head_dims = parse_dims(head_dims_text, "--head-dims") if head_dims_text else None
    sizes = {
        k: v
        for k, v in dict(
            hidden=hidden,
            lowrank_in=hidden,
            lowrank_out=hidden,
            heads=heads,
            batch=batch,
            context=context,
            experts=experts,
            top_k=top_k,
        ).items()
        if v is not None
    }
    ops = tuple(op.strip() for op in ops_text.split(",")) if ops_text else None
    spec = _given(hp.SweepSpec.quick() if quick else hp.SweepSpec(), head_dims, sizes, ops)  # checked before loading
    from gac.hw.device import check_device, default_dtype

    check_device(device)
    dtype = dtype or default_dtype(device)
    if dims_text:
        spec = dataclasses.replace(spec, dims=parse_dims(dims_text))
    if plan:
        from gac.cli.select import read_plan_file

        try:
            spec = spec_from_plan(read_plan_file(plan), spec)
        except GacError as e:
            raise GacError(
                f"{plan}: {e}: fix the plan (format: docs/USAGE.md, `gac select`)"
                if str(plan) not in str(e)
                else str(e)
            ) from None
    if model_spec:
        from gac.checkpoint.loading import load_model

        spec = _given(spec_from_model(load_model(model_spec).model, spec), head_dims, sizes, ops)
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


def _given(spec, head_dims: tuple[int, ...] | None, sizes: dict, ops: tuple[str, ...] | None):
    """`spec` with the SDPA head dims, fixed sizes and ops given on the command line (they win over --model's); the
    ops are checked with their sizes."""
    import dataclasses

    spec = dataclasses.replace(spec, ops=ops or spec.ops, sizes=dataclasses.replace(spec.sizes, **sizes))
    return dataclasses.replace(spec, head_dims=head_dims) if head_dims else spec


def _print_summary(result: dict, *, reused: bool, seconds: float) -> None:
    from gac.hw.cliffs import entry_label, find_cliffs

    points = sum(len(e["dims"]) for e in result["ops"])
    how = (
        f"reused the cached profile of {result['date'][:10]} (--force to measure again)"
        if reused
        else f"measured in {seconds:.1f} s"
    )
    click.echo(
        f"{len(result['ops'])} sweeps, {points} points on {result['device_name']} "
        f"({result['device']}, {result['dtype']}, {result['threads']} threads): {how}"
    )
    for entry in result["ops"]:
        table = {d: t for d, t in zip(entry["dims"], entry["ms"]) if t is not None}
        refused = f"; {len(entry['refused'])} dims refused by the kernel" if entry.get("refused") else ""
        if not table:
            click.echo(f"  {entry_label(entry):<36} every dim refused{refused}")
            continue
        cliffs = find_cliffs(table)
        aligned = [d for d in cliffs if d % 8 == 0]
        shown = ", ".join(str(d) for d in aligned[:8]) + (" ..." if len(aligned) > 8 else "")
        span = f"{min(table.values()):.4g}-{max(table.values()):.4g} ms"
        click.echo(
            f"  {entry_label(entry):<36} {span:<20} {len(cliffs):3d} cliffs, at multiples of 8: "
            f"{shown or 'none'}{refused}"
        )
