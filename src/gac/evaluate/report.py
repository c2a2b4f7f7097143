"""report.json (a contract, docs/DESIGN.md) as text: its JSON and a readable report.md table, both made from
report.json's object (gac.pipelines.outputs.Report.to_dict), the edge where the typed report becomes JSON."""

from __future__ import annotations

import json
from typing import Any

VARIANTS = ("baseline", "unaligned", "gac")


def report_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)


def kept_round(latency_objective: dict, stream: str) -> dict:
    """The figures of a closed-loop stream's kept round (report.json's latency_objective): the knapsack's rounds are
    `rounds`, a guard stream's its `history`; each round is written once."""
    g = latency_objective["guard"][stream]
    rows = g["history"] if "history" in g else latency_objective["rounds"]
    return next((row for row in rows if row["round"] == g.get("round")), {})


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def goal_text(r: dict) -> str:
    """What the run asked for: `speedup S x at PHASE BxS` (the latency objective, with the margin it aimed past S)
    or `ratio R`."""
    obj = r.get("objective")
    if not obj:
        return f"ratio {r['ratio']}"
    margin = f" (aimed {100 * obj['margin']:g}% past)" if obj.get("margin") else ""
    return f"speedup {obj['speedup']}x at {obj['phase']} {obj['shape']}{margin}"


def params_column(r: dict) -> tuple[str, int]:
    """(label, denominator) of the parameter comparison: the budget under --ratio; the original under --speedup,
    which has no parameter budget."""
    if r.get("objective"):
        return "vs original", r["variants"]["baseline"]["params"]
    return "vs budget", r["budget_params"]


def speed_column(r: dict) -> tuple[str, str, float | None]:
    """(label, variant key, reference ms) of the speed comparison: prefill against the unaligned compression under
    --ratio; under --speedup (no unaligned variant) the time measured at the objective's phase and shape against
    the baseline timed beside it."""
    v, obj = r["variants"], r.get("objective")
    if obj:
        return f"measured speed-up at {obj['phase']} {obj['shape']}", "measured_ms", v["baseline"].get("measured_ms")
    return "prefill speed-up vs unaligned", "prefill_ms", v.get("unaligned", {}).get("prefill_ms")


def speed_text(x: dict, key: str, reference_ms: float | None, missing: str) -> str:
    """A variant's speed-up, reference over its `key` ms, or `missing` where either time is absent."""
    return f"{reference_ms / x[key]:.3f}x" if reference_ms and x.get(key) else missing


def report_markdown(r: dict) -> str:
    v = r["variants"]
    obj = r.get("objective")
    goal = goal_text(r)
    size_col, size_ref = params_column(r)
    unaligned_ms = v.get("unaligned", {}).get("prefill_ms")
    lines = [
        f"# gac compress: {r['model']}, {r['compressor']}, {goal}",
        "",
        f"device {r['device']} ({r.get('device_name', '')}), dtype {r['dtype']}, alignment {r['alignment']}; "
        + (
            f"no parameter budget (the latency objective); {r['compressible_params']:,} compressible parameters."
            if obj
            else f"budget {r['budget_params']:,} of {r['compressible_params']:,} compressible parameters."
        ),
        "",
        f"| variant | params | {size_col} | aligned | ppl | prefill ms | decode ms/token | prefill vs unaligned |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in VARIANTS:
        if name not in v:
            continue
        x = v[name]
        speed = speed_text(x, "prefill_ms", unaligned_ms, "n/a")
        prefill = _fmt(x.get("prefill_ms"), ".1f")
        if x.get("prefill_spread_pct") is not None:
            prefill += f" (±{x['prefill_spread_pct']:.0f}%)"
        lines.append(
            f"| {name} | {x['params']:,} | {x['params'] / size_ref:.3f} | {x['aligned_fraction']:.2f} | "
            f"{_fmt(x.get('ppl'), '.2f')} | {prefill} | {_fmt(x.get('decode_ms_per_token'), '.2f')} | {speed} |"
        )
    lines += _target_lines(r.get("target"))
    if r.get("experts_kept"):
        counts = sorted(set(r["experts_kept"].values()))
        options = r.get("compressor_options") or {}
        lines += [
            "",
            f"Experts: each of the {len(r['experts_kept'])} MoE layers kept "
            f"{', '.join(map(str, counts))} experts (--drop-experts {options.get('drop_experts', '?')}: its "
            "least important dropped whole, with their router rows).",
        ]
    lines += _auto_lines(r.get("auto"))
    lines += [
        "",
        f"Latency: median of {r.get('latency', {}).get('prefill_rounds', '?')} interleaved prefill runs "
        f"(batch {r.get('latency', {}).get('batch', '?')}, {r.get('latency', {}).get('prefill_tokens', '?')} tokens) "
        f"and {r.get('latency', {}).get('decode_rounds', '?')} decode steps; ± is the 10-90 percentile spread"
        + (
            f" (per layer: {r['latency_method']['how']}; layers timed {r['latency_method']['layers_timed']} of "
            f"{r['latency_method']['depth']})."
            if (r.get("latency_method") or {}).get("method") == "per_layer"
            else "."
        ),
        f"Perplexity: {r.get('eval_tokens', '?')} held-out tokens, the same windows for every variant.",
        f"Saved variant: {r.get('saved_variant', '?')}.",
    ]
    if r.get("pipeline_choice"):
        lines.append(f"Pipeline: {r['pipeline']} ({r['pipeline_choice']['reason']}).")
    if r.get("heal"):
        h = r["heal"]
        texts = ", ".join(
            f"{h['texts'][k]} {h['ppl']['before'][k]:.2f} -> {h['ppl']['after'][k]:.2f} (original "
            f"{h['ppl']['original'][k]:.2f})"
            for k in h["ppl"]["before"]
        )
        lines.append(
            f"Healed by distillation from the original after the figures above ({h['run']['tokens']:,} "
            f"tokens, {h['run']['seconds']:.0f} s): perplexity {texts}."
        )
    if r.get("quantization"):
        q = r["quantization"]
        lines.append(
            f"Quantized after the figures above ({q['label']}, vLLM's {q['rule']['device']} kernel "
            f"{q['rule']['kernel']}): {q['quantized']} linears quantized, {q['unquantized']} left "
            "unquantized (quantize.json lists every linear)."
        )
    if obj:
        lines += [
            "",
            f"Latency objective at {obj['phase']} {obj['shape']} (interleaved with the baseline and an A/A twin):",
        ]
        for name in ("baseline", "gac"):
            x = v.get(name, {})
            if x.get("measured_ms") is not None:
                lines.append(
                    f"- {name}: predicted {x['predicted_ms']:.2f} ms, measured {x['measured_ms']:.2f} ms "
                    f"({x['prediction_error_pct']:+.1f}%)"
                )
        lo = r.get("latency_objective", {})
        margin = f" and its {100 * obj['margin']:g}% margin" if obj.get("margin") else ""
        lines.append(
            f"- measured speedup {lo.get('measured_speedup', float('nan')):.3f}x against {obj['speedup']}x{margin} "
            f"({'reached' if lo.get('reached') else 'short'}; A/A floor {lo.get('aa_floor_pct', float('nan')):.1f}%, "
            f"{len(lo.get('rounds', []))} round(s))"
        )
        if lo.get("line"):
            lines.append(
                f"- kept a line round: the line through its stream's timings puts it at {lo['line_speedup']:.3f}x"
            )
        journal = lo.get("journal") or {}
        if journal.get("replayed"):
            lines.append(
                f"- {journal['replayed']} of {journal['replayed'] + journal['measured']} timings replayed as "
                f"this machine recorded them ({journal['path']}; `--retime` times afresh)"
            )
        guard = lo.get("guard", {})
        if "parameter" in guard:
            lines.append(
                "- guard: kept the "
                + guard["kept"]
                + " stream's model; "
                + "; ".join(
                    f"{s}: {kept_round(lo, s).get('measured_speedup', float('nan')):.3f}x, "
                    f"{'reached' if g['reached'] else 'short'}"
                    + (f", held-back loss {g['loss']:.4f}" if g["loss"] is not None else "")
                    for s, g in guard.items()
                    if s != "kept"
                )
            )
    return "\n".join(lines) + "\n"


def _target_lines(t: dict | None) -> list[str]:
    """Which dims the deployment target constrained, and why (report.json's "target")."""
    if not t:
        return []
    lines = [
        "",
        f"Target {t['name']}: {t['met']} of {t['constrained']} constrained dims meet it in the gac variant "
        f"({t.get('unaligned_met', '?')} in the unaligned one). Why: {t['why']}.",
        "",
        "| group | kind | multiple | dim | row lengths | met |",
        "|---|---|---:|---:|---|---|",
    ]
    for name, g in t["groups"].items():
        met = "yes" if g["met"] else f"no{': ' + g['unattainable'] if 'unattainable' in g else ''}"
        multiple, lengths = g["multiple"], g["row_lengths"]
        if "out_multiple" in g:  # a rule on output widths too (N), beside the row lengths (K)
            multiple, lengths = f"K {multiple}, N {g['out_multiple']}", f"K {lengths}, N {g['out_lengths']}"
        lines.append(f"| {name} | {g['kind']} | {multiple} | {g['dim']} | {lengths} | {met} |")
    return lines


STREAMS = (
    "; in brackets, the loss of each closed-loop stream that reached the target (the guard keeps the lower, "
    "as auto does)"
)


def _auto_lines(a: dict | None) -> list[str]:
    """--compressor auto: every compressor's predicted figures, the measured ones of those built, and which was kept
    (report.json's "auto")."""
    if not a:
        return []
    timed = "removed_params" not in a  # --speedup: one measured target; --ratio: the same parameters removed
    speed = (
        (" predicted speedup |", " measured speedup |", "---:|---:|") if timed else ("", " prefill speedup |", "---:|")
    )
    target = (
        " Speedups: the closed loop's, at its phase and shape."
        if timed
        else f" Every compressor removes the same {a['removed_params']:,} parameters (ratio {a['ratio']} of the "
        f"{a['compressible_params']:,} that any of them may touch), at its own ratio of its own compressible "
        "weights; prefill speedup: the built models timed beside the original."
    )
    lines = [
        "",
        f"Compressor auto: kept {a['kept']} ({a['why']}).{target} Loss: the increase of the mean next-token "
        f"loss over the original in nats per token, measured on {a['held_back_windows']} held-back calibration "
        f"windows (never the evaluation text){STREAMS if timed else ''}. Params: of the "
        f"{a['compressible_params']:,} that any compressor may touch, those a compressor leaves whole counted at "
        "full size.",
        "",
        f"| compressor |{'' if timed else ' own ratio |'} predicted loss | predicted from | predicted params |"
        f"{speed[0]} measured loss | measured params |{speed[1]} status |",
        f"|---|{'' if timed else '---:|'}---:|---|---:|---:|---:|{speed[2]}---|",
    ]
    for name, c in a["candidates"].items():
        p, m = c["predicted"] or {}, c["measured"] or {}
        cells = [name] + ([] if timed else [_fmt(c.get("ratio"), ".4f")])
        cells += [_fmt(p.get("loss"), "+.4f"), p.get("loss_from", "n/a"), _fmt(p.get("params"), ",")]
        if timed:
            cells.append(_fmt(p.get("speedup"), ".3f"))
        streams = ", ".join(f"{s} {loss:+.4f}" for s, loss in m.get("streams", {}).items())  # the guard's
        cells += [
            _fmt(m.get("loss"), "+.4f") + (f" ({streams})" if streams else ""),
            _fmt(m.get("params"), ","),
            _fmt(m.get("speedup"), ".3f")
            + ("" if m.get("reached") is None else " (reached)" if m["reached"] else " (short)"),
        ]
        cells.append(c["status"] + (f": {c['why']}" if c.get("why") else ""))
        lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in cells) + " |")
    return lines
