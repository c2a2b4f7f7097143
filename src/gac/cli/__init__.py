"""The `gac` command. Each verb parses arguments and calls one api function; torch is imported lazily."""

import sys

import click

from gac.errors import GacError


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GacError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted: nothing was written", err=True)
            sys.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gac")
def main():
    """gac: GPU-Aligned Compression for LLMs.

    Compress a model with a dimension-reducing compressor, then pick hardware-aligned
    dims with a knapsack under the same parameter budget.
    """


from gac.cli.select import select_cmd  # noqa: E402

main.add_command(select_cmd)
from gac.cli.profile import command as profile_cmd  # noqa: E402
main.add_command(profile_cmd)
from gac.cli.compress import command as compress_cmd  # noqa: E402

main.add_command(compress_cmd)
from gac.cli.bench import command as bench_cmd  # noqa: E402
main.add_command(bench_cmd)
from gac.cli.repair import command as repair_cmd  # noqa: E402
main.add_command(repair_cmd)
from gac.cli.inspect import command as inspect_cmd  # noqa: E402
main.add_command(inspect_cmd)
