"""Latency objective vs parameter objective (issue 16): for each compressor, one calibration and one latency table
(fitted on a reference model per --speedup target and once for the ratios), then
`--speedup` at every target (closed loop: predicted vs measured ms) and `--ratio` at every ratio, then every model of
the compressor timed round-robin with the baseline and its A/A twin in one final run (one baseline for every speedup)
and, for a trained model, its held-out perplexity. Writes pareto.json, pareto.md and pareto.png (perplexity against
measured speedup, both objectives) to --out.

  python benchmarks/pareto.py --out docs/pareto-cpu                    # embedded SmolLM2-135M, this CPU
  python benchmarks/pareto.py --model random-smollm2 --device cuda --dtype bfloat16 --shape 1x1024 --out DIR
  python benchmarks/pareto.py --compare-phases PREFILL/pareto.json DECODE/pareto.json   # how the dims differ
Random-weight models (random-smollm2, random-tiny) are for latency only: their perplexity means nothing.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

log = logging.getLogger("pareto")


def load(args):
    """(model, calib [n, S] tokens, held-back calibration windows (the guard's, beside calib), held-out windows or None,
    source)."""
    import torch

    from gac.calibration.texts import HELD_BACK_WINDOWS, TextConfig, held_back_windows, load_windows
    from gac.hw.device import torch_dtype

    if args.model.startswith("random-"):
        from gpu_evidence import PRESETS, build_model, decay_spectra

        model = build_model(PRESETS[args.model.removeprefix("random-")], device=args.device,
                            dtype=torch_dtype(args.dtype), seed=0)
        decay_spectra(model, 1.0, seed=0)  # trained-like decaying spectra, so ranks vary between weights
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, model.config.vocab_size, (args.calib_windows + HELD_BACK_WINDOWS, args.seq_len),
                               generator=g)
        return model, tokens[:args.calib_windows], tokens[args.calib_windows:], None, args.model
    from gac.checkpoint.loading import load_model

    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    text = TextConfig(seq_len=args.seq_len, calib_windows=args.calib_windows, eval_windows=args.eval_windows)
    calib, held_out = load_windows(loaded.tokenizer, text)
    return loaded.model, calib, held_back_windows(loaded.tokenizer, text), held_out, loaded.source


def config(model, name: str, args, speedup=None):
    """gac compress's config for this compressor: the latency objective's with `speedup` (a SpeedupConfig), else the
    parameter objective's at its default ratio."""
    from gac.api import CompressConfig

    small = name == "prune" and model.config.num_hidden_layers < 3  # the default keeps the first and last layers
    options = {**({"layers": "all"} if small else {}), **dict(o.split("=", 1) for o in args.option)}
    return CompressConfig(compressor=name, compressor_options=options, device=args.device, dtype=args.dtype,
                          alignment=args.align, progress=False, speedup=speedup)


def analyses(model, calib, held_back, name: str, args, speedup) -> tuple:
    """(analysis, config of the latency objective, config of the parameter objective): gac compress's analysis (one
    calibration, spectra and loss model), shared by both: --speedup changes no compressor option (prune's heads are
    held whole in the knapsack alone, gac.objectives.latency.config.WHOLE_HEADS)."""
    from gac.pipelines.whole_model import analyze

    latency, parameters = config(model, name, args, speedup), config(model, name, args)
    return analyze(model, calib, latency, held_back=held_back), latency, parameters


def evaluate(built, held_out, lm, dims) -> dict:
    """The latency model's predicted saving for a built model (the tables' part, free of the model's constant: the
    final timing adds its own baseline) and, for a trained model, its held-out perplexity."""
    from gac.evaluate.perplexity import perplexity

    row = {"predicted_saving_ms": lm.predict({}) - lm.predict(dims)}
    if held_out is not None:
        row["ppl"] = perplexity(built, held_out, desc="ppl", progress=False)
    return row


def time_together(model, built: dict, cfg, rounds: int) -> dict:
    """{label: figures}: the baseline, an A/A twin of it and every built model timed round-robin in one run, so every
    speedup is measured against the same baseline calls (the drift between separate timings on a shared machine, 1-3%
    here, is as large as the differences the objectives are compared by)."""
    from gac.objectives.latency.steps import time_beside

    base, floor, t = time_beside(model, built, dataclasses.replace(cfg, timing_rounds=rounds))
    return {label: {"baseline_ms": base, "measured_ms": t[label].median_ms,
                    "measured_speedup": base / t[label].median_ms, "aa_floor_pct": 100 * floor,
                    "spread_pct": t[label].spread_pct} for label in built}


def run_compressor(name, model, calib, held_back, held_out, args) -> dict:
    from gac.objectives import select_dims
    from gac.objectives.latency.config import SpeedupConfig, parse_shape
    from gac.objectives.latency.model import Phase, measure_latency_model
    from gac.objectives.latency.steps import fit_latency

    batch, seq = parse_shape(args.shape)
    margin = {} if args.margin is None else {"margin": args.margin}  # None: SpeedupConfig's own
    cfg = SpeedupConfig(args.targets[0], phase=args.phase, batch=batch, seq=seq, rounds=args.rounds,
                        timing_rounds=args.timing_rounds, **margin)
    t0 = time.perf_counter()
    analyzed, latency_cfg, params_cfg = analyses(model, calib, held_back, name, args, cfg)
    analyze_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # the groups' tables for the ratio rows (the latency objective's closed loop measures its own, from the cache)
    lm = measure_latency_model([u.group for u in analyzed.units], Phase(args.phase, batch, seq), alignment=args.align,
                               device=args.device, dtype=args.dtype, progress=False)
    table_s = time.perf_counter() - t0
    out = {"compressor": name, "analyze_s": analyze_s, "latency_table_s": table_s, "latency": [], "ratio": [],
           "options": {"latency": latency_cfg.compressor_options, "ratio": params_cfg.compressor_options},
           "groups": {u.name: [u.group.kind, kept_dim(u.group, None)] for u in analyzed.units}}
    if held_out is not None:
        from gac.evaluate.perplexity import perplexity

        out["baseline_ppl"] = perplexity(model, held_out, desc="ppl", progress=False)
    built = {}  # label -> (row, model, latency model, dims): timed together at the end
    for target in args.targets:
        t0 = time.perf_counter()
        try:
            outcome = select_dims(model, analyzed, dataclasses.replace(
                latency_cfg, speedup=dataclasses.replace(cfg, speedup=target))).selection
        except Exception as e:  # noqa: BLE001 - an unreachable target is a result too
            out["latency"].append({"target": target, "error": str(e)})
            log.info("%s %.2fx: %s", name, target, e)
            continue
        m = outcome.model  # as the loop built and timed it
        guard = outcome.guard()
        row = {"target": target, "loop_s": time.perf_counter() - t0, "rounds": [r.to_dict() for r in outcome.rounds],
               "reached": outcome.kept.reached, "loop_speedup": outcome.kept.timed.measured_speedup,
               "dims": outcome.dims, "kept": guard["kept"], "saving_scale": outcome.latency_model.meta.get("saving_scale"),
               "guard": {s.name: {"reached": s.reached, "loss": s.loss, "rounds": len(s.rows),
                                  "measured_speedup": s.kept.timed.measured_speedup if s.kept else None,
                                  "ratio": s.kept.solved.ratio if s.kept else None}
                         for s in outcome.streams},
               **evaluate(m.eval(), held_out, outcome.latency_model, outcome.dims)}
        out["latency"].append(row)
        built[f"latency {target:g}"] = (row, m)
        # the guard's parameter-objective model (its own closed loop to the same measured target) is the twin; the
        # knapsack's own model is built too where the guard kept the other
        for stream, key in (("parameter", "twin"), ("latency", "knapsack")):
            dims = guard.get(stream, {}).get("dims")
            if dims is None:
                row[key] = {"reason": f"no {stream} stream" if stream not in guard else "no choice within the budget"}
            elif stream == guard["kept"]:
                row[key] = {"same": True, "ratio": row["guard"][stream]["ratio"]}  # the row's own model
            else:
                m = copy.deepcopy(model)
                analyzed.compressor.materialize(m, analyzed.units, dims)
                row[key] = {"ratio": row["guard"][stream]["ratio"], "dims": dims,
                            **evaluate(m.eval(), held_out, outcome.latency_model, dims)}
                built[f"{key} {target:g}"] = (row[key], m)
    lm = fit_latency(model, analyzed.compressor, analyzed.units, lm, cfg)  # for the parameter objective's rows
    out["ratio_saving_scale"] = lm.meta.get("saving_scale")
    for ratio in args.ratios:
        dims = select_dims(model, analyzed, dataclasses.replace(params_cfg, ratio=ratio)).dims["gac"]
        m = copy.deepcopy(model)
        analyzed.compressor.materialize(m, analyzed.units, dims)
        row = {"ratio": ratio, **evaluate(m.eval(), held_out, lm, dims)}
        out["ratio"].append(row)
        built[f"ratio {ratio:g}"] = (row, m)
    timed = time_together(model, {label: b[1] for label, b in built.items()}, cfg, args.final_rounds)
    for label, (row, _) in built.items():
        row.update(timed[label])
        # the latency model's constant calibrated on this timing's own baseline, as the closed loop calibrates it: the
        # prediction is the measured baseline less the predicted saving
        row["predicted_ms"] = row["baseline_ms"] - row["predicted_saving_ms"]
        row["predicted_speedup"] = row["baseline_ms"] / row["predicted_ms"]
        row["error_pct"] = 100 * (row["predicted_ms"] / row["measured_ms"] - 1)
        log.info("%s %s: measured %.3fx (predicted %.3fx, error %+.1f%%, A/A %.1f%%)%s", name, label,
                 row["measured_speedup"], row["predicted_speedup"], row["error_pct"], row["aa_floor_pct"],
                 f", ppl {row['ppl']:.2f}" if "ppl" in row else "")
    add_param_ppl(out)
    return out


def add_param_ppl(run: dict) -> None:
    """Every latency row with a perplexity gets the parameter objective's at its measured speedup (and the band that
    the joint timing's A/A floor leaves on it; the baseline, ratio 0 at speedup 1 by definition, is the parameter
    curve's first point) and, against its twin (the guard's parameter-objective model at the same target, timed
    in the same run), the differences in perplexity and in measured speed."""
    points = list(run["ratio"])
    if run.get("baseline_ppl") is not None:
        points.append({"ratio": 0.0, "measured_speedup": 1.0, "ppl": run["baseline_ppl"]})
    for row in run["latency"]:
        twin = row.get("twin", {})
        if twin.get("same") and "measured_ms" in row:  # the guard kept the parameter objective's model
            row["speed_vs_twin_pct"] = 0.0
            if "ppl" in row:
                row["ppl_vs_twin_pct"] = 0.0
        elif "measured_ms" in twin and "measured_ms" in row:
            row["speed_vs_twin_pct"] = 100 * (twin["measured_ms"] / row["measured_ms"] - 1)  # positive: faster
            if "ppl" in twin and "ppl" in row:
                row["ppl_vs_twin_pct"] = 100 * (row["ppl"] / twin["ppl"] - 1)
        if "ppl" not in row:
            continue
        row.update(param_ppl_at(row["measured_speedup"], row["ppl"], points))
        if row["param_ppl"] is not None and "aa_floor_pct" in row:
            f = 1 + row["aa_floor_pct"] / 100  # the parameter curve read at the speedup the noise floor allows
            band = [param_ppl_at(row["measured_speedup"] * k, row["ppl"], points)["ppl_vs_param_pct"]
                    for k in (f, 1 / f)]
            row["ppl_vs_param_band_pct"] = None if None in band else sorted(band)


def param_ppl_at(speedup: float, ppl: float, ratio_rows: list[dict]) -> dict:
    """The parameter objective's perplexity at a measured speedup: log(ppl) interpolated linearly in measured
    speedup between the two ratio rows that bracket it, and `ppl` against it in percent (positive: worse)."""
    pts = sorted((r["measured_speedup"], r["ppl"], r["ratio"]) for r in ratio_rows if r.get("ppl") is not None)
    for (s0, p0, r0), (s1, p1, r1) in zip(pts, pts[1:]):
        if s0 <= speedup <= s1:
            w = (speedup - s0) / (s1 - s0) if s1 > s0 else 0.5
            param = math.exp((1 - w) * math.log(p0) + w * math.log(p1))
            return {"param_ppl": param, "param_bracket": [r0, r1], "ppl_vs_param_pct": 100 * (ppl / param - 1)}
    span = f"{pts[0][0]:.3f}x..{pts[-1][0]:.3f}x" if pts else "none"
    return {"param_ppl": None, "ppl_vs_param_pct": None,
            "param_ppl_reason": f"{speedup:.3f}x is not between two ratio rows (measured {span})"}


def group_kind(name: str, groups: dict | None = None) -> str:
    """rank, head_rank, mlp or heads: from pareto.json's groups where recorded, else from the name (the adapters
    name every family's attention self_attn and its MLP mlp; PaLU groups end in #gN)."""
    if groups and name in groups:
        return groups[name][0]
    if "#g" in name:
        return "head_rank"
    return {"self_attn": "heads", "mlp": "mlp"}.get(name.rsplit(".", 1)[-1], "rank")


def kept_dim(group, dim):
    """The dim a group keeps (None: as the original has it, a dense weight keeping its full rank)."""
    if dim is not None:
        return dim
    return group.full_dim if group.full_dim is not None else min(group.in_features, group.out_features)


def compare_dims(dims_a: dict, dims_b: dict, groups: dict | None = None) -> dict:
    """How two choices differ: groups whose dim differs, and per kind the kept dims summed in each (a group left
    whole, None, counts at its full dim where `groups` {name: [kind, full dim]} records it, else only as whole)."""
    by_kind = {}
    for name in sorted(set(dims_a) | set(dims_b)):
        k = by_kind.setdefault(group_kind(name, groups), {"groups": 0, "differ": 0, "kept_a": 0, "kept_b": 0,
                                                           "whole_a": 0, "whole_b": 0})
        full = groups[name][1] if groups and name in groups else None
        a, b = (d if d is not None else full for d in (dims_a.get(name), dims_b.get(name)))
        k["groups"] += 1
        k["differ"] += a != b
        for side, d in (("a", a), ("b", b)):
            k[f"kept_{side}"] += d or 0
            k[f"whole_{side}"] += d is None or d == full
    return {"groups": sum(k["groups"] for k in by_kind.values()),
            "differ": sum(k["differ"] for k in by_kind.values()), "by_kind": by_kind}


def compare_phases(a: dict, b: dict) -> list[dict]:
    """Per compressor and latency target present in both pareto.json results, compare_dims of their choices."""
    rows = []
    runs_b = {c["compressor"]: c for c in b["compressors"]}
    for ca in a["compressors"]:
        cb = runs_b.get(ca["compressor"])
        if cb is None:
            continue
        groups = ca.get("groups") or cb.get("groups")
        targets_b = {r["target"]: r for r in cb["latency"] if "dims" in r}
        for ra in ca["latency"]:
            rb = targets_b.get(ra["target"])
            if "dims" in ra and rb is not None:
                rows.append({"compressor": ca["compressor"], "target": ra["target"],
                             **compare_dims(ra["dims"], rb["dims"], groups)})
    return rows


def phases_markdown(rows: list[dict], a: dict, b: dict) -> str:
    """compare_phases as a table: A is the first run, B the second."""
    def where(r):
        return f"{r['args']['phase']} {r['args']['shape']}"

    lines = [f"A: {where(a)}, B: {where(b)}", "",
             "| compressor | target | groups differing | kind | differing | kept dims A | kept dims B | whole A "
             "| whole B |", "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        for kind, k in sorted(r["by_kind"].items()):
            lines.append(f"| {r['compressor']} | {r['target']:.2f}x | {r['differ']}/{r['groups']} | {kind} | "
                         f"{k['differ']}/{k['groups']} | {k['kept_a']} | {k['kept_b']} | {k['whole_a']} | "
                         f"{k['whole_b']} |")
    if not any(c.get("groups") for c in a["compressors"] + b["compressors"]):
        lines += ["", "These runs record no full dims (pareto.json before `groups`): whole groups are not in the sums."]
    return "\n".join(lines) + "\n"


def environment(args) -> dict:
    import torch
    import transformers

    env = {"argv": sys.argv, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
           "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        env["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    if args.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
    return env


def markdown(result: dict) -> str:
    lines = [f"# Latency vs parameter objective: {result['model']}, {result['args']['phase']} {result['args']['shape']}",
             "", f"{result['env']}", "",
             "Every model of a compressor, and its baseline with an A/A twin, timed round-robin in one final run "
             "(`measured`); `loop` is the closed loop's own kept timing. `predicted`: that run's baseline less the latency "
             "model's predicted saving (its tables fitted on a reference model, the constant on the run's baseline); `error`: predicted against "
             "measured whole-model ms. `vs target`: measured speedup against the target (never short: at least "
             "minus the A/A floor). `vs params at equal measured speed`: the "
             "parameter objective's perplexity read off its ratios at the same measured speedup (in brackets: read at "
             "that speedup +- the A/A floor). `twin`: the guard's model, the parameter objective's allocation over the "
             "same groups brought to the same measured target by its own closed loop, timed in the same run: "
             "perplexity and measured speed against it (speed positive: faster). `kept`: the stream whose model "
             "--speedup returned (the lower held-back loss of those reaching the target); `knapsack's own`: the "
             "latency knapsack's model where the guard kept the twin.", "",
             ("| compressor | objective | target / ratio | rounds | kept | loop speedup | predicted speedup | measured "
              "speedup | vs target | error | A/A floor | ppl | vs params at equal measured speed | vs twin (ratio): ppl, speed "
              "| knapsack's own: ppl, speed |"),
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]

    def f(x, spec):
        return "n/a" if x is None else format(x, spec)

    def vs(r):  # the parameter objective's ppl interpolated at this row's measured speedup
        if "param_ppl" not in r:
            return ""
        if r["param_ppl"] is None:
            return f"n/a: {r['param_ppl_reason']}"
        lo, hi = r["param_bracket"]
        band = r.get("ppl_vs_param_band_pct")
        band = f" [{band[0]:+.1f}, {band[1]:+.1f}]" if band else ""
        return f"{r['ppl_vs_param_pct']:+.1f}%{band} (params {r['param_ppl']:.2f}, ratios {lo:g}-{hi:g})"

    def speed(r, key):
        return f(r.get(key), ".3f") + ("x" if r.get(key) is not None else "")

    for c in result["compressors"]:
        lines.append(f"| {c['compressor']} | baseline | | | | | | 1.000x | | | | {f(c.get('baseline_ppl'), '.2f')} "
                     "| | | |")
        for r in c["latency"]:
            if "error" in r:
                lines.append(f"| {c['compressor']} | latency | {r['target']:.2f}x | | | | | {r['error']} | | | | | | "
                             "| |")
                continue
            twin = r.get("twin", {})
            ratio = f"ratio {twin['ratio']:.3f}, " if twin.get("ratio") is not None else ""
            if twin.get("same"):
                twin = f"the same model ({ratio}kept by the guard)"
            elif "speed_vs_twin_pct" in r:
                ppl = f"{r['ppl_vs_twin_pct']:+.1f}%" if "ppl_vs_twin_pct" in r else "n/a"
                twin = (f"{ppl}, {r['speed_vs_twin_pct']:+.1f}% ({ratio}ppl {f(twin.get('ppl'), '.2f')}, "
                        f"{twin['measured_speedup']:.3f}x)")
            else:
                twin = twin.get("reason", "")
            own = r.get("knapsack", {})
            own = (f"{f(own.get('ppl'), '.2f')}, {own['measured_speedup']:.3f}x" if "measured_speedup" in own else
                   "kept" if own.get("same") else own.get("reason", ""))
            lines.append(f"| {c['compressor']} | latency | {r['target']:.2f}x | {len(r['rounds'])} | "
                         f"{r.get('kept', 'latency')} | {speed(r, 'loop_speedup')} | {speed(r, 'predicted_speedup')} "
                         f"| {speed(r, 'measured_speedup')} | {100 * (r['measured_speedup'] / r['target'] - 1):+.1f}% | "
                         f"{r['error_pct']:+.1f}% | {r['aa_floor_pct']:.1f}% | "
                         f"{f(r.get('ppl'), '.2f')} | {vs(r)} | {twin} | {own} |")
        for r in c["ratio"]:
            lines.append(f"| {c['compressor']} | params | {r['ratio']:.2f} | | | | {speed(r, 'predicted_speedup')} | "
                         f"{speed(r, 'measured_speedup')} | | {r['error_pct']:+.1f}% | {r['aa_floor_pct']:.1f}% | "
                         f"{f(r.get('ppl'), '.2f')} | | | |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, c in enumerate(result["compressors"]):
        color = colors[n % len(colors)]  # one colour per compressor: --speedup solid, --ratio dashed
        for kind, marker in (("latency", "o-"), ("ratio", "s--")):
            rows = sorted((r for r in c[kind] if "ppl" in r), key=lambda r: r["measured_speedup"])
            if kind == "ratio" and c.get("baseline_ppl") is not None:
                rows = [{"measured_speedup": 1.0, "ppl": c["baseline_ppl"]}, *rows]  # ratio 0 is the baseline
            if rows:
                ax.plot([r["measured_speedup"] for r in rows], [r["ppl"] for r in rows], marker, color=color,
                        label=f"{c['compressor']} {'--speedup' if kind == 'latency' else '--ratio'}")
        twins = [r["twin"] for r in c["latency"] if "ppl" in r.get("twin", {}) and "measured_speedup" in r["twin"]]
        if twins:  # the guard's parameter-objective model at each target
            ax.plot([t["measured_speedup"] for t in twins], [t["ppl"] for t in twins], "^", color=color, ms=7,
                    mfc="none", label=f"{c['compressor']} parameter-objective twin (the guard's)")
        own = [r["knapsack"] for r in c["latency"] if "ppl" in r.get("knapsack", {})]
        if own:  # the latency knapsack's model where the guard kept its twin
            ax.plot([t["measured_speedup"] for t in own], [t["ppl"] for t in own], "v", color=color, ms=7,
                    mfc="none", label=f"{c['compressor']} knapsack's own (not kept)")
        at = [r for r in c["latency"] if r.get("param_ppl") is not None]
        if at:  # the --ratio curve read at each --speedup point's measured speedup
            ax.plot([r["measured_speedup"] for r in at], [r["param_ppl"] for r in at], "x", color=color, ms=8,
                    label=f"{c['compressor']} --ratio at equal speed")
    ax.set_xlabel(f"measured speedup ({result['args']['phase']} {result['args']['shape']})")
    ax.set_ylabel("held-out perplexity")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--compressors", nargs="+", default=["asvd", "svd_llm", "palu", "prune"])
    p.add_argument("--targets", nargs="+", type=float, default=[1.05, 1.1, 1.2, 1.3, 1.4])
    p.add_argument("--ratios", nargs="+", type=float, default=[0.1, 0.2, 0.3, 0.4])
    p.add_argument("--phase", default="prefill", choices=["prefill", "decode"])
    p.add_argument("--shape", default="1x512")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--align", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--timing-rounds", type=int, default=10, help="interleaved calls per closed-loop timing")
    # no default read off SpeedupConfig here: gac.objectives imports torch, which --compare-phases never needs
    p.add_argument("--margin", type=float, default=None,
                   help="--speedup's margin past each target (gac compress --margin; default: its default)")
    p.add_argument("--final-rounds", type=int, default=20,
                   help="interleaved calls per model in the final timing of every model of a compressor together")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--calib-windows", type=int, default=16)
    p.add_argument("--eval-windows", type=int, default=24)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a compressor option for every compressor, e.g. head_mode=none (prune)")
    p.add_argument("--out")
    p.add_argument("--compare-phases", nargs=2, metavar=("A/pareto.json", "B/pareto.json"),
                   help="no run: how the chosen dims differ between two runs' latency targets (e.g. prefill, decode)")
    p.add_argument("--render", metavar="DIR/pareto.json", help="no run: add the equal-speed comparison to it, rewrite it, pareto.md and pareto.png")
    args = p.parse_args(argv)
    if args.compare_phases:
        a, b = (json.loads(Path(f).read_text()) for f in args.compare_phases)
        print(phases_markdown(compare_phases(a, b), a, b))
        return
    if args.render:  # no run: the tables and plot of a saved pareto.json again, with today's comparison
        path = Path(args.render)
        result = json.loads(path.read_text())
        for run in result["compressors"]:
            add_param_ppl(run)
        path.write_text(json.dumps(result, indent=1))
        (path.parent / "pareto.md").write_text(markdown(result))
        if any(run.get("baseline_ppl") is not None for run in result["compressors"]):
            plot(result, path.parent / "pareto.png")
        print(markdown(result))
        return
    if not args.out:
        p.error("--out is required (except with --compare-phases or --render)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, calib, held_back, held_out, source = load(args)
    result = {"model": source, "args": vars(args), "env": environment(args), "compressors": []}
    for name in args.compressors:
        result["compressors"].append(run_compressor(name, model, calib, held_back, held_out, args))
        (out / "pareto.json").write_text(json.dumps(result, indent=1))  # written as it goes
        (out / "pareto.md").write_text(markdown(result))
    result["env"]["loadavg_end"] = environment(args).get("loadavg")
    (out / "pareto.json").write_text(json.dumps(result, indent=1))
    (out / "pareto.md").write_text(markdown(result))
    if held_out is not None:
        plot(result, out / "pareto.png")
    print(markdown(result))


if __name__ == "__main__":
    main()
