"""The `gac` command. Each verb parses arguments and calls one api function; torch is imported lazily."""

import os
import sys

import click

from gac.errors import GacError


def _leave_if_group_broken(code: int) -> None:
    """Under torchrun, once a collective failed (gac.distributed.broken()): exit now, the exit handlers run but no
    teardown of the broken process group, which can wait forever on a peer that never answers."""
    distributed = sys.modules.get("gac.distributed")  # imported by then wherever a group was formed
    if distributed is None or not distributed.broken() or not distributed.from_env()[1] > 1:
        return  # one process (a test's in-process CLI included) ends as always
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def usage_line(e: click.UsageError) -> str:
    """click's multi-line `Usage: ... Error: ...` block as one `error: <problem>: <fix>` line."""
    ctx = e.ctx
    path = ctx.command_path if ctx is not None else "gac"
    message = _one_line(e.format_message())
    message = message[0].lower() + message[1:] if message[:1].isupper() and message[1:2].islower() else message
    return f"error: {message.rstrip('.')}: see `{path} --help`"


class _Group(click.Group):
    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Every failure a user can cause ends as one `error:` line on stderr: exit 2 for bad input (usage or
        GacError), 130/143/129 for Ctrl-C/SIGTERM/SIGHUP, 1 for a bug (GAC_TRACEBACK=1 shows its traceback)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # bare `gac` (or a group without a verb): the help
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.UsageError as e:
            click.echo(usage_line(e), err=True)
            sys.exit(2)
        except click.ClickException as e:
            click.echo(f"error: {_one_line(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("interrupted: no partial output was left", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx):
        from gac.io.atomic import Terminated, terminate_as_interrupt

        try:
            with terminate_as_interrupt():
                return super().invoke(ctx)
        except GacError as e:
            from gac.cli.options import in_flags

            click.echo(f"error: {_one_line(in_flags(e))}", err=True)
            _leave_if_group_broken(2)
            sys.exit(2)
        except Terminated as e:
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun stops the other ranks when one fails
                click.echo(
                    f"error: rank {os.environ.get('RANK', '?')} of {os.environ['WORLD_SIZE']} stopped ({e}; torchrun "
                    "stops every rank when one fails: see the first failure it lists): no partial output was left",
                    err=True,
                )
            else:
                click.echo(f"interrupted ({e}): no partial output was left", err=True)
            sys.exit(128 + e.signum)
        except KeyboardInterrupt:
            click.echo("interrupted: no partial output was left", err=True)
            sys.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except MemoryError:
            click.echo(
                "error: out of memory: use a smaller model, fewer or shorter windows, or a bigger machine", err=True
            )
            sys.exit(2)
        except Exception as e:  # a bug: still one line, the traceback on request
            if os.environ.get("GAC_TRACEBACK"):
                raise
            first = (str(e).strip().splitlines() or [""])[0][:300]
            click.echo(
                f"error: unexpected {type(e).__name__}: {first}: this is a gac bug, please report it "
                "(GAC_TRACEBACK=1 shows the traceback)",
                err=True,
            )
            sys.exit(1)


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
from gac.cli.export import command as export_cmd  # noqa: E402

main.add_command(export_cmd)
from gac.cli.serve_check import command as serve_check_cmd  # noqa: E402

main.add_command(serve_check_cmd)
from gac.cli.heal import command as heal_cmd  # noqa: E402

main.add_command(heal_cmd)
from gac.cli.quantize import command as quantize_cmd  # noqa: E402

main.add_command(quantize_cmd)
