"""Staircase plots of a hardware profile: latency vs dim, one PNG per op with a panel per token count M."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gac.hw.cliffs import entry_label
from gac.hw.device import ALIGNMENT
from gac.io.atomic import write_file

if TYPE_CHECKING:
    from matplotlib.axes import Axes

logger = logging.getLogger(__name__)

DIM_LABELS = {
    "gemm_n": "N (output features) of Y[M,N] = X[M,K] W[N,K]^T",
    "gemm_k": "K (input features) of Y[M,N] = X[M,K] W[N,K]^T",
    "sdpa": "head dim",
    "sdpa_heads": "query heads",
    "experts": "expert width w of every expert's gate_up [2w, H] and down [H, w]",
    "lowrank": "rank r of X[M,in] -> r -> out",
}


def _draw_entry(ax: Axes, entry: Mapping, alignment: int) -> None:
    timed = [i for i, t in enumerate(entry["ms"]) if t is not None]  # a quantized kernel's refused dims: no time
    dims, ms = [entry["dims"][i] for i in timed], [entry["ms"][i] for i in timed]
    ax.plot(dims, ms, color="0.6", lw=0.8, zorder=1)
    if "p10_ms" in entry and "p90_ms" in entry:
        ax.fill_between(
            dims,
            [entry["p10_ms"][i] for i in timed],
            [entry["p90_ms"][i] for i in timed],
            color="0.85",
            step=None,
            zorder=0,
            label="p10-p90",
        )
    for d in entry.get("refused") or {}:
        ax.axvline(int(d), color="black", lw=0.5, ls=":", zorder=0)
    groups = {
        "other": [(d, t) for d, t in zip(dims, ms) if d % alignment],
        f"multiple of {alignment}": [(d, t) for d, t in zip(dims, ms) if d % alignment == 0 and d % 64],
        "multiple of 64": [(d, t) for d, t in zip(dims, ms) if d % 64 == 0],
    }
    styles: dict[str, dict[str, Any]] = {  # matplotlib's keyword arguments
        "other": dict(s=8, color="0.45", marker="o"),
        f"multiple of {alignment}": dict(s=30, color="tab:blue", marker="s"),
        "multiple of 64": dict(s=70, color="tab:red", marker="*"),
    }
    for name, pts in groups.items():
        if pts:
            ax.scatter(*zip(*pts), label=name, zorder=2, **styles[name])
    for d in range(64 * (min(dims) // 64 + 1), max(dims) + 1, 64):
        ax.axvline(d, color="tab:red", lw=0.6, alpha=0.3, zorder=0)
    backend = f"  [{entry['backend']}]" if entry.get("backend") else ""
    ax.set_title(entry_label(entry) + backend, fontsize=10)
    ax.set_ylabel("median latency (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


def plot_profile(
    profile: Mapping, out_dir: str | Path, *, prefix: str = "profile", alignment: int = ALIGNMENT
) -> list[Path]:
    """Write `{prefix}_{op}.png` per op (one panel per M) into `out_dir`; return the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_op: dict[str, list[Mapping]] = {}
    for entry in profile.get("ops", []):
        by_op.setdefault(entry["op"], []).append(entry)

    get = profile.get
    header = (
        f"{get('device_name', '?')}, {get('dtype', '?')}, {get('threads', '?')} threads, "
        f"torch {get('torch', '?')}, {str(get('date', ''))[:10]}"
    )
    paths = []
    for op, entries in by_op.items():
        fig, axes = plt.subplots(len(entries), 1, figsize=(10, 3.6 * len(entries)), squeeze=False)
        for ax, entry in zip(axes[:, 0], entries):
            _draw_entry(ax, entry, alignment)
        axes[-1, 0].set_xlabel(DIM_LABELS.get(op, "dim"))
        fig.suptitle(f"{op}: {header}", fontsize=11)
        fig.tight_layout()
        path = out_dir / f"{prefix}_{op}.png"
        write_file(path, lambda p, fig=fig: fig.savefig(p, dpi=110))  # signal-safe: no half-written PNG
        plt.close(fig)
        paths.append(path)
        logger.info("wrote %s", path)
    return paths
