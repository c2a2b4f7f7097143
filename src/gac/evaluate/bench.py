"""`gac bench`: prefill latency at several (batch, sequence) points and decode per token, every model timed
side by side in one run (round-robin through gac.evaluate.latency), plus the markdown table and the plot."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from dataclasses import dataclass
from pathlib import Path

from gac.errors import GacError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchConfig:
    """Every default of `gac bench`; the CLI passes only what the user gave."""

    points: tuple[tuple[int, int], ...] = ((1, 128), (1, 512), (1, 1024), (4, 512))  # prefill (batch, seq)
    decode_context: int = 128  # tokens in the KV cache before decode steps are timed
    warmup: int = 2
    rounds: int = 10  # prefill calls per model and point
    decode_rounds: int = 32  # decode steps per model
    seed: int = 0

    def __post_init__(self):
        points = tuple(tuple(p) for p in self.points)
        if not points or any(len(p) != 2 or min(p) < 1 for p in points):
            raise GacError(f"bad bench points {self.points!r}: give (batch, seq) pairs of positive integers, "
                           f"e.g. --points 1x128,1x512")
        object.__setattr__(self, "points", points)
        if self.decode_context < 1:
            raise GacError(f"decode context {self.decode_context} must be at least 1 token")
        if self.warmup < 0 or self.rounds < 1 or self.decode_rounds < 1:
            raise GacError(f"warmup {self.warmup} must be >= 0 and rounds {self.rounds}, {self.decode_rounds} "
                           f">= 1, e.g. --rounds 10")


def point_key(batch: int, seq: int) -> str:
    return f"{batch}x{seq}"


def _timing_dict(t) -> dict[str, float]:
    return {"median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms}


def _placement(models: dict) -> tuple[object, object]:
    """(device, dtype) shared by every model; mixing them would make the ratios meaningless."""
    seen = {(p.device, p.dtype) for p in (next(m.parameters()) for m in models.values())}
    if len(seen) != 1:
        raise GacError(f"models are on different devices or dtypes ({sorted(map(str, seen))}): "
                       f"load them all with the same --device and --dtype")
    return next(iter(seen))


def bench(models: dict, cfg: BenchConfig = BenchConfig()) -> dict:
    """Prefill at every point of `cfg.points` and decode ms/token for every model, interleaved in one run.

    Returns {"device", "device_name", "dtype", "torch", "threads", "date", "config", "models",
    "points": [{"batch", "seq", "results": {model: {median_ms, p10_ms, p90_ms}}}], "decode": {model: {...}},
    "ratios_vs_first": {model: {"prefill": {"BxS": ratio}, "decode": ratio}}} where a ratio is the model's
    median latency over the first model's (below 1: faster than the first).
    """
    import torch

    from gac.evaluate.latency import LatencyConfig, decode_timings, prefill_timings
    from gac.hw.device import device_name

    if not models:
        raise GacError("nothing to bench: give at least one model")
    device, dtype = _placement(models)
    lat = LatencyConfig(batch=1, decode_context=cfg.decode_context, warmup=cfg.warmup,
                        prefill_rounds=cfg.rounds, decode_rounds=cfg.decode_rounds, seed=cfg.seed)
    points = []
    for batch, seq in cfg.points:
        log.info("prefill %s: timing %s side by side", point_key(batch, seq), ", ".join(models))
        timings = prefill_timings(models, batch, seq, lat)
        points.append({"batch": batch, "seq": seq, "results": {n: _timing_dict(t) for n, t in timings.items()}})
    log.info("decode after %d tokens: timing %s side by side", cfg.decode_context, ", ".join(models))
    decode = {n: _timing_dict(t) for n, t in decode_timings(models, lat).items()}
    result = {
        "device": str(device), "device_name": device_name(device), "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": dataclasses.asdict(cfg), "models": list(models),
        "points": points, "decode": decode,
    }
    result["ratios_vs_first"] = ratios_vs_first(result)
    return result


def ratios_vs_first(result: dict) -> dict:
    """{model: {"prefill": {"BxS": median / first model's median}, "decode": ...}}: latency ratios (speed-up = 1/x)."""
    names = list(result["decode"])
    first = names[0]

    def ratio(row: dict, name: str) -> float:
        ref = row[first]["median_ms"]
        return row[name]["median_ms"] / ref if ref > 0 else float("nan")

    return {
        name: {"prefill": {point_key(p["batch"], p["seq"]): ratio(p["results"], name) for p in result["points"]},
               "decode": ratio(result["decode"], name)}
        for name in names
    }


def _cell(t: dict) -> str:
    return f"{t['median_ms']:.2f} ({t['p10_ms']:.2f}-{t['p90_ms']:.2f})"


def bench_table_markdown(result: dict) -> str:
    """Two markdown tables: medians with their 10-90 percentile band, and latency ratios vs the first model."""
    names = list(result["decode"])
    keys = [point_key(p["batch"], p["seq"]) for p in result["points"]]
    cfg = result.get("config", {})
    lines = [
        f"# gac bench: {', '.join(names)}",
        "",
        f"{result['device']} ({result['device_name']}), {result['dtype']}, {result['threads']} threads, "
        f"torch {result['torch']}, {result['date']}.",
        f"Prefill: median ms (p10-p90) of {cfg.get('rounds', '?')} interleaved runs per batch x sequence point. "
        f"Decode: ms per token after {cfg.get('decode_context', '?')} cached tokens, "
        f"{cfg.get('decode_rounds', '?')} steps. All models timed round-robin in one run.",
        "",
        "| model | " + " | ".join(f"prefill {k} ms" for k in keys) + " | decode ms/token |",
        "|---|" + "---:|" * (len(keys) + 1),
    ]
    for name in names:
        cells = [_cell(p["results"][name]) for p in result["points"]] + [_cell(result["decode"][name])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    ratios = result["ratios_vs_first"]
    lines += [
        "",
        f"Latency ratio vs {names[0]} (below 1 is faster; speed-up = 1 / ratio):",
        "",
        "| model | " + " | ".join(keys) + " | decode |",
        "|---|" + "---:|" * (len(keys) + 1),
    ]
    for name in names:
        r = ratios[name]
        lines.append(f"| {name} | " + " | ".join(f"{r['prefill'][k]:.3f}" for k in keys) + f" | {r['decode']:.3f} |")
    return "\n".join(lines) + "\n"


def plot_latency_vs_seq(result: dict, path: str | Path) -> Path:
    """Prefill median ms vs sequence length, one line per model (p10-p90 band), at batch 1 (else the smallest)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    path = Path(path)
    batch = min(p["batch"] for p in result["points"])
    points = sorted((p for p in result["points"] if p["batch"] == batch), key=lambda p: p["seq"])
    seqs = [p["seq"] for p in points]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name in result["decode"]:
        med = [p["results"][name]["median_ms"] for p in points]
        ax.plot(seqs, med, marker="o", label=name)
        ax.fill_between(seqs, [p["results"][name]["p10_ms"] for p in points],
                        [p["results"][name]["p90_ms"] for p in points], alpha=0.2)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("prefill latency, median ms (band: p10-p90)")
    if len(seqs) > 1 and seqs[-1] / seqs[0] >= 8:
        ax.set_xscale("log", base=2)  # sequence lengths are usually powers of two
    ax.set_xticks(seqs, [str(s) for s in seqs])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"prefill, batch {batch}: {result['device_name']}, {result['dtype']}, {result['threads']} threads, "
                 f"torch {result['torch']}, {result['date'][:10]}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return path
