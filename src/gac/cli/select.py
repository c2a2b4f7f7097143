"""`gac select PLAN.json`: pick hardware-aligned dims for any compressor's plan.

Imports neither torch nor anything that does, so the command starts fast.
"""

from __future__ import annotations

import json
import os
import tempfile
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
    result = select(plan)
    if out is not None:
        write_json_atomic(out, result.to_dict())
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        _print_summary(result, out)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so readers see the old file or the new one, never half of it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise GacError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise GacError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
