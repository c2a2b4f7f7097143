"""`gac select PLAN.json`: pick hardware-aligned dims for any compressor's plan.

Imports neither torch nor anything that does, so the command starts fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from gac.align.plan import SelectionResult, select
from gac.errors import GacError


@click.command("select")
@click.argument("plan", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the result JSON here (dims, params, budget, objective, aligned_fraction).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result JSON instead of the summary.")
def select_cmd(plan: Path, out: Path | None, as_json: bool) -> None:
    """Pick one aligned dim per weight of PLAN.json within its parameter budget."""
    from gac.io.validate import output_file

    if out is not None:
        output_file(out, "--out")  # before the solve, not after
    data = read_plan_file(plan)
    try:
        result = select(data)
    except GacError as e:
        raise GacError(f"{plan}: {e}: fix the plan (format: docs/USAGE.md, `gac select`)") from None
    if out is not None:
        write_json_atomic(out, result.to_dict())
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_summary(result, out)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so readers see the old file or the new one, never half of it (signal-safe, see gac.io.atomic)."""
    from gac.io.atomic import write_text

    write_text(path, json.dumps(data, indent=2) + "\n")


def read_plan_file(plan: Path) -> Any:
    """The plan's JSON, read with a size and nesting bound (a /dev/zero or a 100k-deep plan is one line)."""
    from gac.io.validate import read_json

    fix = "pass a plan JSON object with 'budget' and 'weights'"
    data = read_json(plan, "plan", "PLAN.json", fix=fix)
    if not isinstance(data, dict):
        raise GacError(f"plan {plan} is a JSON {type(data).__name__}, not an object: {fix}")
    return data


def _print_summary(result: SelectionResult, out: Path | None) -> None:
    share = result.params / result.budget if result.budget else 0.0
    solver = "exact DP" if result.exact else "coarsened DP, within budget"
    lines = [
        f"weights           {len(result.dims)}",
        f"params            {result.params:,} of budget {result.budget:,} ({share:.2%})",
        f"aligned fraction  {result.aligned_fraction:.1%}",
        f"objective         {result.objective:.6g}",
        f"solver            {result.solver_ms:.1f} ms ({solver})",
    ]
    if out is not None:
        lines.append(f"wrote             {out}")
    click.echo("\n".join(lines))
