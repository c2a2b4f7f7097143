"""`gac repair MODEL --out DIR`: zero-pad irregular ranks and MLP widths, same outputs
(exact in exact arithmetic, within fp32 reassociation error in floating point). torch imported lazily."""

from __future__ import annotations

import click

from gac.cli.options import Int
from gac.errors import GacError

STRATEGIES = ("minimal", "optimal")  # mirrors gac.repair.repair.STRATEGIES without importing torch


def _parse_align(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise GacError(f"bad --align {text!r}: give a positive integer up to 1024, e.g. --align 8")
    return value


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _noise(t: dict, limit_pct: float = 20.0) -> str:
    spread = max(t["prefill_spread_pct_before"], t["prefill_spread_pct_after"])
    return f"; noisy: 10-90% spread up to {spread:.0f}%, is the machine busy?" if spread > limit_pct else ""


@click.command("repair")
@click.argument("model")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output model directory.")
@click.option("--align", "align_text", metavar="N", help="Pad to multiples of N (wins over --strategy) [default: 8].")
@click.option("--strategy", type=click.Choice(STRATEGIES), help="minimal: align 8; optimal: align 16.")
@click.option("--profile", type=click.Path(dir_okay=False), help="Hardware profile JSON: fastest aligned size >= d.")
@click.option(
    "--allow-profile-mismatch",
    is_flag=True,
    help="Use a --profile measured for another dtype or device type (a warning instead of an error).",
)
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--no-latency", is_flag=True, help="Skip timing prefill before vs after.")
@click.option("--prefill-tokens", type=Int(1, 131072, example=512), help="Prefill length for latency [default: 512].")
def command(
    model, out, align_text, strategy, profile, allow_profile_mismatch, force, no_latency, prefill_tokens
) -> None:
    """Zero-pad MODEL's irregular low-rank ranks and MLP widths to aligned sizes (same outputs) and save it."""
    from gac.cli.output import setup_logging
    from gac.io import validate

    align = _parse_align(align_text)
    setup_logging(quiet=True)
    validate.output_dir(out, "--out", force=force)
    validate.local_model_typo(model)
    validate.enough_space(out, validate.weights_size(model))  # the padded model is a little larger
    if profile is not None:
        from gac.hw.profile import load_profile
        from gac.hw.profile_schema import check_profile_matches

        # repair loads, checks and times the model on the CPU in float32
        check_profile_matches(
            load_profile(profile), profile, device="cpu", dtype="float32", allow=allow_profile_mismatch
        )
    from gac.evaluate.latency import LatencyConfig
    from gac.repair import repair_dir

    latency = LatencyConfig(**({} if prefill_tokens is None else {"prefill_tokens": prefill_tokens}))
    res = repair_dir(
        model,
        out,
        align=align,
        strategy=strategy,
        profile=profile,
        force=force,
        measure_latency=not no_latency,
        latency=latency,
    )
    r, rep, o = res.result, res.report, res.result.overhead
    kinds = sorted({d.kind for d in r.changed})
    click.echo(
        f"padded {len(r.changed)} of {len(r.dims)} dims ({', '.join(kinds) or 'none'}) to multiples of "
        f"{r.alignment}" + (f" ({r.strategy})" if r.strategy else "")
    )
    click.echo(
        f"parameters: {o['params_before']:,} -> {o['params_after']:,} (+{o['params_added']:,}, "
        f"+{o['params_added_pct']:.3f}%); memory +{_bytes(o['bytes_added'])}"
    )
    c = rep["logits_check"]
    click.echo(
        f"logits ({c['tokens']} tokens): max relative error {c['max_rel_error']:.2e}, "
        f"argmax {'identical' if c['argmax_identical'] else 'DIFFERS'}"
    )
    if "latency" in rep:
        t = rep["latency"]
        click.echo(
            f"prefill (batch {t['batch']}, {t['prefill_tokens']} tokens, {t['device']}): "
            f"{t['prefill_ms_before']:.1f} ms before, {t['prefill_ms_after']:.1f} ms after "
            f"({t['speedup']:.3f}x)" + _noise(t)
        )
    if r.left_misaligned:
        kinds_left = sorted({d["kind"] for d in r.left_misaligned})
        click.echo(
            f"left as is (padding would not be exact): {len(r.left_misaligned)} misaligned dims "
            f"({', '.join(kinds_left)})"
        )
    click.echo(f"saved the repaired model and repair.json to {res.out}")
