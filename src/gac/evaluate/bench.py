"""`gac bench`: prefill latency at several (batch, sequence) points and decode per token, every model timed
side by side in one run (round-robin through gac.evaluate.latency), plus the markdown table and the plot."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gac.checkpoint.placement import input_device, is_dispatched, placement_summary
from gac.errors import GacError
from gac.evaluate.latency import LatencyConfig, decode_timings, prefill_timings
from gac.evaluate.perplexity import perplexity
from gac.hw.device import device_name
from gac.hw.timing import Timing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchConfig:
    """Every default of `gac bench`; the CLI passes only what the user gave."""

    points: tuple[tuple[int, int], ...] = ((1, 128), (1, 512), (1, 1024), (4, 512))  # prefill (batch, seq)
    decode_context: int = 128  # tokens in the KV cache before decode steps are timed
    decode_batches: tuple[int, ...] = (1,)  # decode is timed at each of these batch sizes
    aa: bool = True  # A/A control: the first model timed a second time, side by side, as the noise floor
    warmup: int = 2
    rounds: int = 10  # prefill calls per model and point
    decode_rounds: int = 32  # decode steps per model
    seed: int = 0

    def __post_init__(self) -> None:
        points = tuple(tuple(p) for p in self.points)
        if not points or any(len(p) != 2 or min(p) < 1 for p in points):
            raise GacError(
                f"bad bench points {self.points!r}: give (batch, seq) pairs of positive integers, "
                "e.g. points=((1, 128), (1, 512))"
            )
        object.__setattr__(self, "points", points)
        batches = tuple(self.decode_batches)
        if not batches or any(not isinstance(b, int) or b < 1 for b in batches):
            raise GacError(f"bad decode batches {self.decode_batches!r}: give positive integers, e.g. (1, 16)")
        object.__setattr__(self, "decode_batches", batches)
        if self.decode_context < 1:
            raise GacError(f"decode context {self.decode_context} must be at least 1 token")
        if self.warmup < 0 or self.rounds < 1 or self.decode_rounds < 1:
            raise GacError(
                f"warmup {self.warmup} must be >= 0 and rounds {self.rounds}, {self.decode_rounds} >= 1, e.g. rounds=10"
            )


def point_key(batch: int, seq: int) -> str:
    return f"{batch}x{seq}"


AA_SUFFIX = " (A/A)"


def _timing_dict(t: Timing) -> dict[str, Any]:
    d = {"median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "method": t.method}
    if t.launch_bound:
        d["launch_bound"] = True  # eager CUDA timing the host kept up with: leave it out of claims
    return d


def _split_aa(timings: dict, first: str) -> tuple[dict, dict | None]:
    """(the models' timings, the A/A pair {first, twin}) from one interleaved run."""
    twin = timings.pop(first + AA_SUFFIX, None)
    rows = {n: _timing_dict(t) for n, t in timings.items()}
    return rows, (None if twin is None else {"a": rows[first], "b": _timing_dict(twin)})


def _placement(models: dict) -> tuple[torch.device, torch.dtype]:
    """(input device, dtype) shared by every model; mixing them would make the ratios meaningless."""
    seen = {(input_device(m), next(m.parameters()).dtype) for m in models.values()}
    if len(seen) != 1:
        raise GacError(
            f"models are on different devices or dtypes ({sorted(map(str, seen))}): "
            "load them all on one device in one dtype"
        )
    return next(iter(seen))


def bench(models: dict, cfg: BenchConfig = BenchConfig(), held_out: dict | None = None) -> dict:
    """Prefill at every point of `cfg.points` and decode ms/token for every model, interleaved in one run.

    Returns {"device", "device_name", "dtype", "torch", "threads", "date", "config", "models",
    "points": [{"batch", "seq", "results": {model: {median_ms, p10_ms, p90_ms}}}], "decode": {model: {...}},
    "ratios_vs_first": {model: {"prefill": {"BxS": ratio}, "decode": ratio}}, "placement": {model: ...},
    "eager_note"} where a ratio is the model's median latency over the first model's (below 1: faster than the
    first). Models placed by accelerate (`gac.load(..., device_map="auto")`) are timed eagerly, never from a CUDA
    graph: their hooks move tensors between devices; "placement" says where their modules are (None: whole on
    `device`) and "eager_note" says so (None when no model is dispatched). held_out: {model: windows [n, seq]}
    adds "ppl": {model: perplexity}.
    """
    if not models:
        raise GacError("nothing to bench: give at least one model")
    device, dtype = _placement(models)
    dispatched = [name for name, m in models.items() if is_dispatched(m)]
    lat = LatencyConfig(
        batch=1,
        decode_context=cfg.decode_context,
        warmup=cfg.warmup,
        prefill_rounds=cfg.rounds,
        decode_rounds=cfg.decode_rounds,
        seed=cfg.seed,
        cuda_graphs=not dispatched,
    )  # one timing method for all, so the ratios compare alike
    first = next(iter(models))
    timed = {**models, first + AA_SUFFIX: models[first]} if cfg.aa else dict(models)
    points, decode_points = [], []
    for batch, seq in cfg.points:
        log.info("prefill %s: timing %s side by side", point_key(batch, seq), ", ".join(timed))
        rows, aa = _split_aa(prefill_timings(timed, batch, seq, lat), first)
        points.append({"batch": batch, "seq": seq, "results": rows, **({"aa": aa} if aa else {})})
    for batch in cfg.decode_batches:
        log.info(
            "decode at batch %d after %d tokens: timing %s side by side", batch, cfg.decode_context, ", ".join(timed)
        )
        rows, aa = _split_aa(decode_timings(timed, dataclasses.replace(lat, batch=batch)), first)
        decode_points.append(
            {"batch": batch, "context": cfg.decode_context, "results": rows, **({"aa": aa} if aa else {})}
        )
    result = {
        "device": str(device),
        "device_name": device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": dataclasses.asdict(cfg),
        "models": list(models),
        "points": points,
        "decode": decode_points[0]["results"],
        "decode_points": decode_points,
    }
    result["aa_floor_pct"] = aa_floor_pct(result)
    result["ratios_vs_first"] = ratios_vs_first(result)
    result["placement"] = {name: placement_summary(m) for name, m in models.items()}
    result["eager_note"] = (
        None
        if not dispatched
        else (
            f"{', '.join(dispatched)} placed by accelerate: the times include its moves of activations and offloaded "
            "weights between devices"
            + (
                "; every model timed eagerly, not from CUDA graphs (which cannot capture those moves)"
                if device.type == "cuda"
                else ""
            )
        )
    )
    if held_out is not None:
        result["ppl"] = {
            name: perplexity(m, held_out[name], desc=f"perplexity {name}", progress=False) for name, m in models.items()
        }
    return result


def _decode_points(result: dict) -> list[dict]:
    return result.get("decode_points") or [{"batch": 1, "results": result["decode"]}]


def ratios_vs_first(result: dict) -> dict:
    """{model: {"prefill": {"BxS": median / first model's median}, "decode": ..., "decode_by_batch": {"B": ...}}}:
    latency ratios (speed-up = 1/x); "decode" is the first decode batch."""
    names = list(result["decode"])
    first = names[0]

    def ratio(row: dict, name: str) -> float:
        ref = row[first]["median_ms"]
        return row[name]["median_ms"] / ref if ref > 0 else float("nan")

    return {
        name: {
            "prefill": {point_key(p["batch"], p["seq"]): ratio(p["results"], name) for p in result["points"]},
            "decode": ratio(result["decode"], name),
            "decode_by_batch": {str(d["batch"]): ratio(d["results"], name) for d in _decode_points(result)},
        }
        for name in names
    }


def aa_floor_pct(result: dict) -> float | None:
    """The noise floor: the largest |median ratio - 1| between the first model and its A/A twin over every
    prefill and decode point, in percent (None without an A/A block)."""
    pairs = [p["aa"] for p in [*result["points"], *result.get("decode_points", [])] if p.get("aa")]
    if not pairs:
        return None
    return max(abs(p["b"]["median_ms"] / p["a"]["median_ms"] - 1) * 100 for p in pairs if p["a"]["median_ms"] > 0)


def placement_text(summary: dict) -> str:
    """'cpu 2, disk 3 modules' from placement_summary's {"modules": {...}, ...}."""
    return ", ".join(f"{d} {n}" for d, n in summary["modules"].items()) + " modules"


def _cell(t: dict) -> str:
    mark = " (launch-bound)" if t.get("launch_bound") else ""
    return f"{t['median_ms']:.2f} ({t['p10_ms']:.2f}-{t['p90_ms']:.2f}){mark}"


def bench_table_markdown(result: dict) -> str:
    """Markdown: medians with their 10-90 percentile band, latency ratios vs the first model, the A/A floor."""
    names = list(result["decode"])
    keys = [point_key(p["batch"], p["seq"]) for p in result["points"]]
    decodes = _decode_points(result)
    dkeys = [f"decode b{d['batch']}" for d in decodes]
    cfg = result.get("config", {})
    methods = sorted({t.get("method", "?") for p in [*result["points"], *decodes] for t in p["results"].values()})
    lines = [
        f"# gac bench: {', '.join(names)}",
        "",
        f"{result['device']} ({result['device_name']}), {result['dtype']}, {result['threads']} threads, "
        f"torch {result['torch']}, {result['date']}; timing: {', '.join(methods)}.",
        f"Prefill (logits of the last position only): median ms (p10-p90) of {cfg.get('rounds', '?')} interleaved "
        f"runs per batch x sequence point. Decode: ms per step of one token per sequence on a static cache of "
        f"{cfg.get('decode_context', '?')} tokens, {cfg.get('decode_rounds', '?')} steps. All models timed "
        "round-robin in one run.",
        "",
        "| model | " + " | ".join(f"prefill {k} ms" for k in keys) + "".join(f" | {k} ms" for k in dkeys) + " |",
        "|---|" + "---:|" * (len(keys) + len(dkeys)),
    ]
    for name in names:
        cells = [_cell(p["results"][name]) for p in result["points"]] + [_cell(d["results"][name]) for d in decodes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    ratios = result["ratios_vs_first"]
    lines += [
        "",
        f"Latency ratio vs {names[0]} (below 1 is faster; speed-up = 1 / ratio):",
        "",
        "| model | " + " | ".join(keys) + "".join(f" | {k}" for k in dkeys) + " |",
        "|---|" + "---:|" * (len(keys) + len(dkeys)),
    ]
    for name in names:
        r = ratios[name]
        by_batch = r.get("decode_by_batch") or {"1": r["decode"]}
        cells = [f"{r['prefill'][k]:.3f}" for k in keys] + [f"{by_batch[str(d['batch'])]:.3f}" for d in decodes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if result.get("ppl"):
        lines += [
            "",
            "Perplexity on held-out windows: " + ", ".join(f"{n} {v:.3f}" for n, v in result["ppl"].items()) + ".",
        ]
    placed = {n: p for n, p in (result.get("placement") or {}).items() if p}
    if placed:
        lines += [
            "",
            "Placement (accelerate's device map, modules per device): "
            + "; ".join(f"{n}: {placement_text(p)}" for n, p in placed.items())
            + ".",
        ]
    if result.get("eager_note"):
        lines += ["", f"Note: {result['eager_note']}."]
    floor = result.get("aa_floor_pct")
    if floor is not None:
        per = [
            f"{point_key(p['batch'], p['seq'])} {p['aa']['b']['median_ms'] / p['aa']['a']['median_ms']:.3f}"
            for p in result["points"]
            if p.get("aa")
        ]
        per += [
            f"decode b{d['batch']} {d['aa']['b']['median_ms'] / d['aa']['a']['median_ms']:.3f}"
            for d in decodes
            if d.get("aa")
        ]
        lines += [
            "",
            (
                f"A/A control ({names[0]} timed twice in the same rounds): ratios {', '.join(per)}; noise "
                f"floor {floor:.1f}% (differences smaller than this are noise)."
            ),
        ]
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
        ax.fill_between(
            seqs,
            [p["results"][name]["p10_ms"] for p in points],
            [p["results"][name]["p90_ms"] for p in points],
            alpha=0.2,
        )
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("prefill latency, median ms (band: p10-p90)")
    if len(seqs) > 1 and seqs[-1] / seqs[0] >= 8:
        ax.set_xscale("log", base=2)  # sequence lengths are usually powers of two
    ax.set_xticks(seqs, [str(s) for s in seqs])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(
        f"prefill, batch {batch}: {result['device_name']}, {result['dtype']}, {result['threads']} threads, "
        f"torch {result['torch']}, {result['date'][:10]}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return path
