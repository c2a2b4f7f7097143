"""`gac compress`'s objective options: --ratio (parameters) or --speedup with --phase and --shape (latency)."""

from __future__ import annotations

import click

from gac.cli.options import Real

SPEEDUP_OPTIONS = (
    click.option(
        "--speedup",
        type=Real(1, example=1.2),
        help="Latency as the objective: the best model predicted and measured to run this many times faster "
        "than the original at --phase and --shape (excludes --ratio; every model is timed at --shape).",
    ),
    click.option(
        "--phase",
        type=click.Choice(["prefill", "decode"]),
        help="--speedup: time a prefill, or one decode step per sequence [default: prefill].",
    ),
    click.option("--shape", help="--speedup: BATCHxTOKENS, tokens prefilled or held in the KV cache [default: 1x512]."),
    click.option(
        "--param-cap",
        type=Real(0, example=0.9),
        help="--speedup: keep at most this share, in (0, 1], of the compressible parameters (those --ratio "
        "counts), e.g. 0.9 [default: no cap].",
    ),
    click.option(
        "--margin",
        type=Real(None, 0.5, example=0.03),
        help="--speedup: aim this share past the target, so that a kept model still measures at least the "
        "target when timed again later (a speedup moves 2-3% between runs on a shared CPU); 0 aims at "
        "the target itself [default: 0.03].",
    ),
    click.option(
        "--no-guard",
        is_flag=True,
        help="--speedup: keep the latency knapsack's own choice, without building the parameter objective's "
        "choice at the same budget beside it and keeping, of those that reach the target, the one with "
        "the lower loss on held-back calibration windows.",
    ),
    click.option(
        "--retime",
        is_flag=True,
        help="--speedup: time every model afresh, recording over the timings this machine recorded of the "
        "same models at the same shape (a run otherwise replays them, and repeats the earlier run's "
        "choices: $GAC_CACHE_DIR/timings).",
    ),
)


def speedup_options(f):
    for option in reversed(SPEEDUP_OPTIONS):
        f = option(f)
    return f


def latency_objective(
    speedup, phase, shape, param_cap, *, prefill_tokens=None, no_guard=False, margin=None, retime=False
):
    """gac.objectives.latency.config.SpeedupConfig from the options, or None for the parameter objective (the
    objective's own ConfigError otherwise, worded by flag). CompressConfig checks the options --speedup excludes,
    --ratio included."""
    from gac.objectives.latency.config import speedup_config

    return speedup_config(
        speedup,
        phase=phase,
        shape=shape,
        param_cap=param_cap,
        margin=margin,
        guard=not no_guard,
        retime=retime,
        prefill_tokens=prefill_tokens,
    )
