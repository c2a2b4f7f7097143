"""heal.png, saved beside heal.json: a healing run at a glance, its losses by step (backoffs and the kept step
marked) and each evaluation text's perplexity before and after, as a ratio to the original's."""

from __future__ import annotations

import io
import os
import textwrap
from typing import Any, BinaryIO

from gac.heal.distill import loss_name

PLOT_FILE = "heal.png"  # beside heal.json in `gac heal`'s output and beside report.json after `gac compress --heal`


def plot_heal(report: dict[str, Any], path: str | os.PathLike[str] | BinaryIO) -> None:
    """Draw gac.heal.run.heal_model's `report` to `path` (a file name or a binary file object) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run, ratio, names = report["run"], report["ratio_to_original"], report["texts"]
    config = report.get("config", {})
    fig, (loss_ax, ppl_ax) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [3, 2]})

    if run["train_loss"]:
        steps, losses = zip(*run["train_loss"])
        loss_ax.plot(steps, losses, lw=0.8, alpha=0.45, color="#1f77b4", label="training loss")
    steps, losses = zip(*run["held_out_loss"])
    without = ", without the hidden-state term" if config.get("hidden_weight") else ""  # as distill.held_out_loss
    loss_ax.plot(steps, losses, "o-", color="#d62728", label=f"held-out loss (early stopping{without})")
    for i, step in enumerate(run["backoffs"]):
        loss_ax.axvline(step, ls=":", color="grey", label=None if i else "backoff: best tensors back, lower lr")
    loss_ax.axvline(run["best_step"], ls="--", color="#2ca02c", label=f"kept: step {run['best_step']}")
    loss_ax.set_title(
        f"{loss_name(config)} per token: {run['steps']} steps, {run['tokens']:,} tokens, {run['seconds']:.0f} s",
        fontsize=10,
    )
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("loss")
    loss_ax.grid(True, alpha=0.25)
    loss_ax.legend(fontsize=8, frameon=False)

    keys = list(ratio["before"])  # the held-out text, then each unlike text
    x = range(len(keys))
    for offset, when, colour in ((-0.2, "before", "#bbbbbb"), (0.2, "after", "#1f77b4")):
        bars = ppl_ax.bar(
            [i + offset for i in x], [ratio[when][k] for k in keys], width=0.38, color=colour, label=f"{when} healing"
        )
        ppl_ax.bar_label(bars, fmt="%.2fx", fontsize=7)
    ppl_ax.axhline(1.0, color="black", lw=0.8, label="original")
    ppl_ax.set_xticks(list(x), [textwrap.fill(names[k], 18) for k in keys], fontsize=8)
    ppl_ax.set_ylabel("perplexity / the original's")
    ppl_ax.set_title("Perplexity, as a ratio to the original's", fontsize=10)
    top = max(max(ratio[when].values()) for when in ("before", "after"))
    ppl_ax.set_ylim(0, 1.3 * max(top, 1.0))  # room for the legend above the bars
    ppl_ax.legend(fontsize=8, frameon=False, loc="upper right", ncols=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def heal_png(report: dict) -> bytes:
    """plot_heal's PNG, as bytes to save beside the model."""
    png = io.BytesIO()
    plot_heal(report, png)
    return png.getvalue()
