"""Terminal output shared by the verbs: logging set-up and the report table."""

from __future__ import annotations

import logging


def setup_logging(quiet: bool = False) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s",
                        handlers=[RichHandler(show_path=False, show_time=False)], force=True)
    for noisy in ("transformers", "accelerate", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    v = report["variants"]
    table = Table(title=f"{report['model']} · {report['compressor']} · ratio {report['ratio']} · "
                        f"{report['device']} {report['dtype']} · budget {report['budget_params']:,} params")
    for col in ("variant", "params", "vs budget", "aligned", "ppl", "prefill ms", "decode ms/tok", "prefill speed-up vs unaligned"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    ref = v.get("unaligned", {}).get("prefill_ms")
    for name, x in v.items():
        def f(key, spec):
            return "-" if x.get(key) is None else format(x[key], spec)

        speed = f"{ref / x['prefill_ms']:.3f}x" if ref and x.get("prefill_ms") else "-"
        table.add_row(name, f"{x['params']:,}", f"{x['params'] / report['budget_params']:.3f}",
                      f"{x['aligned_fraction']:.2f}", f("ppl", ".2f"), f("prefill_ms", ".1f"),
                      f("decode_ms_per_token", ".2f"), speed)
    console = Console()
    if not console.is_terminal:  # logs and pipes get the full table, not an 80-column squeeze
        console = Console(width=160)
    console.print(table)
