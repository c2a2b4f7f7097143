"""The dims-by-layer scatter of `gac inspect --plot`, also saved with every compressed model as dims.png."""

from __future__ import annotations

import os
from typing import BinaryIO

from gac.models.dims import KINDS, Dim, InspectResult


def _category(d: Dim, alignments: tuple[int, ...]) -> str:
    fits = [a for a in alignments if d.aligned[a]]
    return f"multiple of {max(fits)}" if fits else f"not a multiple of {alignments[0]}"


def plot_dims(result: InspectResult, path: str | os.PathLike[str] | BinaryIO) -> None:
    """Scatter of the listed dims by layer (log scale), coloured by the largest alignment each dim meets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KINDS if any(d.kind == k for d in result.dims)]
    offsets = {k: (j - (len(kinds) - 1) / 2) * 0.12 for j, k in enumerate(kinds)}  # spread kinds within a layer
    markers = dict(zip(KINDS, ("o", "^", "v", "s", "D")))
    cats = [f"not a multiple of {result.alignments[0]}"] + [f"multiple of {a}" for a in result.alignments]
    palette = ("#d62728", "#ffbf00", "#2ca02c", "#1f77b4", "#9467bd", "#8c564b")
    colours = {c: palette[i % len(palette)] for i, c in enumerate(cats)}
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for kind in kinds:
        for cat in cats:
            pts = [d for d in result.dims if d.kind == kind and _category(d, result.alignments) == cat]
            if pts:
                ax.scatter(
                    [(d.layer or 0) + offsets[kind] for d in pts],
                    [d.value for d in pts],
                    s=22,
                    marker=markers[kind],
                    c=colours[cat],
                    alpha=0.8,
                    label=f"{kind}: {cat}",
                    edgecolors="none",
                )
    shares = ", ".join(f"{100 * s:.0f}% not /{a}" for a, s in result.share_misaligned.items())
    ax.set_title(f"Compressible dims by layer ({result.judged_over} dims judged: {shares})")
    ax.set_xlabel("layer")
    ax.set_ylabel("dim")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
