"""Terminal output shared by the verbs: logging set-up and the report table."""

from __future__ import annotations

import logging
import os
import sys

PROGRESS_INTERVAL_S = 30  # with stderr not a terminal: at most one progress line per bar every 30 s


def quiet_progress_when_redirected(quiet: bool = False) -> None:
    """Progress bars on a terminal redraw in place; in a log file (CI, `> run.log 2>&1`) each redraw is a new
    line. Off a terminal, gac's own bars (tqdm) update at most every PROGRESS_INTERVAL_S (TQDM_MININTERVAL; a
    value the user set wins) and the bars of transformers and huggingface_hub are off. Under --quiet every bar is
    off, also those other libraries draw with plain tqdm or ask for with disable=False (llm-compressor's)."""
    import tqdm.std

    tqdm.std.tqdm._gac_quiet = quiet  # read by each new bar, so the last set-up in a process decides
    on_terminal = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    if on_terminal and not quiet:
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    interval = float(os.environ.get("TQDM_MININTERVAL") or PROGRESS_INTERVAL_S)
    if not getattr(tqdm.std.tqdm, "_gac_throttled", False):  # every bar class derives from tqdm.std.tqdm
        init = tqdm.std.tqdm.__init__

        def throttled_init(self, *args, **kwargs):
            kwargs.setdefault("mininterval", interval)
            if tqdm.std.tqdm._gac_quiet:  # over a library's own disable=False (llm-compressor's bars pass one)
                kwargs["disable"] = True
            init(self, *args, **kwargs)

        tqdm.std.tqdm.__init__ = throttled_init
        tqdm.std.tqdm._gac_throttled = True
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # transformers not installed (gac select needs only the standard library)
        pass


def setup_logging(quiet: bool = False) -> None:
    from rich.logging import RichHandler

    quiet_progress_when_redirected(quiet)
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(show_path=False, show_time=False)],
        force=True,
    )
    for noisy in ("transformers", "accelerate", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def print_report(report: dict) -> None:
    """The variants side by side. Under --ratio: parameters against the budget, prefill speed-up against the
    unaligned compression. Under --speedup (no budget, no unaligned variant): parameters against the original, and
    the speed-up measured at the objective's phase and shape, the baseline timed beside."""
    from rich.console import Console
    from rich.table import Table

    from gac.evaluate.report import goal_text, params_column, speed_column, speed_text

    v = report["variants"]
    title = f"{report['model']} · {report['compressor']} · {goal_text(report)} · {report['device']} {report['dtype']}"
    if not report.get("objective"):
        title += f" · budget {report['budget_params']:,} params"
    size_col, size_ref = params_column(report)
    speed_col, speed_key, speed_ref = speed_column(report)
    table = Table(title=title)
    for col in ("variant", "params", size_col, "aligned", "ppl", "prefill ms", "decode ms/tok", speed_col):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for name, x in v.items():

        def f(key, spec, x=x):
            return "-" if x.get(key) is None else format(x[key], spec)

        table.add_row(
            name,
            f"{x['params']:,}",
            f"{x['params'] / size_ref:.3f}",
            f"{x['aligned_fraction']:.2f}",
            f("ppl", ".2f"),
            f("prefill_ms", ".1f"),
            f("decode_ms_per_token", ".2f"),
            speed_text(x, speed_key, speed_ref, "-"),
        )
    console = Console()
    if not console.is_terminal:  # logs and pipes get the full table, not an 80-column squeeze
        console = Console(width=160)
    console.print(table)
