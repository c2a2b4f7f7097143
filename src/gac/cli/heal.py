"""`gac heal MODEL --out DIR`: recover a compressed gac output by distillation from its original, dims unchanged.
The healing options are shared with `gac compress --heal`; defaults live in gac.heal's config classes."""

from __future__ import annotations

import click

from gac.cli.options import Int, Real

PRECISIONS = ("auto", "bf16", "fp32")  # gac.heal.distill.PRECISIONS, spelled here so that parsing imports no torch
TRAINED = ("all", "changed")  # gac.heal.distill.TRAINED, likewise

HEAL_OPTIONS = (
    click.option(
        "--heal-file",
        type=click.Path(dir_okay=False),
        help="Text to heal on [default: the calibration text and as many tokens of the standard "
        "library's sources]; windows sharing text with the evaluation text are left out.",
    ),
    click.option(
        "--heal-tokens",
        type=Int(1, 10**10, example=98304),
        help="Training tokens [default: 98304: 96 steps of 2 x 512 tokens].",
    ),
    click.option(
        "--heal-samples",
        type=Int(0, 100000, example=64),
        help="Windows sampled from the original beside the healing text, so healing fits no one domain "
        "[default: 0, none; e.g. 64].",
    ),
    click.option(
        "--heal-batch",
        type=Int(1, 4096, example=8),
        help="Windows a step [default: 2]; under torchrun the ranks split each step's windows, so at most this "
        "many ranks.",
    ),
    click.option("--heal-lr", type=Real(0, 1, example=3e-4), help="Peak learning rate [default: 3e-4]."),
    click.option(
        "--heal-train",
        type=click.Choice(TRAINED),
        help="Which tensors healing trains [default: all: every decoder tensor; changed: those the "
        "compression changed (factor pairs, pruned weights) and the norms, steps 1.1-1.2x faster].",
    ),
    click.option(
        "--hidden-weight",
        type=Real(None, None, example=1.0),
        help="Weight of hidden-state matching beside the logits' KL [default: 0, logits only].",
    ),
    click.option(
        "--ce-weight",
        type=Real(None, None, example=0.5),
        help="Weight of the cross-entropy on the healing text's own tokens beside the logits' KL "
        "[default: 0.5; 0: the KL alone, the original's distributions only].",
    ),
    click.option(
        "--heal-precision",
        type=click.Choice(PRECISIONS),
        help="Matmuls in bf16 (weights and optimizer stay fp32) or fp32 [default: auto: bf16 where the "
        "device has it natively].",
    ),
    click.option(
        "--unlike-file",
        type=click.Path(dir_okay=False),
        help="Evaluation text unlike the calibration text [default: Python's licence, LICENSE.txt, and IDLE's "
        "release notes, idlelib/NEWS.txt, where installed].",
    ),
)


def heal_options(f):
    for option in reversed(HEAL_OPTIONS):
        f = option(f)
    return f


def heal_config(
    *,
    heal_file=None,
    heal_tokens=None,
    heal_samples=None,
    heal_batch=None,
    heal_lr=None,
    heal_train=None,
    hidden_weight=None,
    ce_weight=None,
    heal_precision=None,
    unlike_file=None,
    **rest,
):
    """gac.heal.HealConfig from the options given (the others keep the config's defaults); text files are read and
    checked now, before any model is loaded."""
    from gac.heal.distill import DistillConfig
    from gac.heal.run import HealConfig
    from gac.io import validate

    for path, flag in ((heal_file, "--heal-file"), (unlike_file, "--unlike-file")):
        if path is not None:
            validate.read_text(path, "text file", flag)
    given = {
        k: v
        for k, v in (
            ("tokens", heal_tokens),
            ("batch", heal_batch),
            ("lr", heal_lr),
            ("train", heal_train),
            ("hidden_weight", hidden_weight),
            ("ce_weight", ce_weight),
            ("precision", heal_precision),
        )
        if v is not None
    }
    rest = {**rest, "samples": heal_samples}
    return HealConfig(
        heal_file=heal_file,
        unlike_file=unlike_file,
        distill=DistillConfig(**given),
        **{k: v for k, v in rest.items() if v is not None},
    )


def describe(report: dict) -> list[str]:
    """The healing report in a few lines: perplexity before -> after on each text, the original's beside."""
    from gac.heal.distill import loss_name

    p, r, run = report["ppl"], report["ratio_to_original"], report["run"]
    names = report["texts"]
    lines = [
        f"healed on {run['tokens']:,} tokens of {names['train']} in {run['seconds']:.0f} s ({run['steps']} "
        f"steps in {run.get('precision', 'fp32')} at peak lr {run.get('lr', 0):.2g}, "
        f"{loss_name(report.get('config', {}))}, {run['stopped']}, kept step {run['best_step']})"
    ]
    for key in p["before"]:  # the held-out text, then each unlike text
        lines.append(
            f"perplexity on {names[key]}: {p['before'][key]:.2f} ({r['before'][key]:.3f}x) -> "
            f"{p['after'][key]:.2f} ({r['after'][key]:.3f}x); original {p['original'][key]:.2f}"
        )
    return lines


@click.command("heal")
@click.argument("model")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output model directory.")
@click.option("--original", help="The uncompressed model MODEL was made from [default: the one in gac_plan.json].")
@heal_options
@click.option("--eval-file", type=click.Path(dir_okay=False), help="Held-out evaluation text [default: Python docs].")
@click.option("--seq-len", type=Int(1, 131072, example=512), help="Tokens per window [default: 512].")
@click.option("--eval-windows", type=Int(1, 100000, example=24), help="Evaluation windows [default: 24].")
@click.option("--device", help="cpu or cuda[:N] [default: cpu].")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@click.option(
    "--dist-timeout",
    type=Real(0, example=300),
    help="Under torchrun: seconds a rank waits for the others at a collective before it stops with an error "
    "[default: GAC_DIST_TIMEOUT, else 300].",
)
def command(
    model,
    out,
    original,
    heal_file,
    heal_tokens,
    heal_samples,
    heal_batch,
    heal_lr,
    heal_train,
    hidden_weight,
    ce_weight,
    heal_precision,
    unlike_file,
    eval_file,
    seq_len,
    eval_windows,
    device,
    force,
    quiet,
    dist_timeout,
):
    """Recover MODEL (a gac output) by distillation from its original; dims and parameter count unchanged. Runs
    under torchrun as data-parallel distillation, rank 0 writing."""
    from gac.calibration.texts import TextConfig
    from gac.cli.output import setup_logging
    from gac.io import validate

    setup_logging(quiet)
    validate.output_dir(out, "--out", force=force)
    if eval_file is not None:
        validate.read_text(eval_file, "text file", "--eval-file")
    text = TextConfig(
        **{
            k: v
            for k, v in (("eval_file", eval_file), ("seq_len", seq_len), ("eval_windows", eval_windows))
            if v is not None
        }
    )
    cfg = heal_config(
        heal_file=heal_file,
        heal_tokens=heal_tokens,
        heal_samples=heal_samples,
        heal_batch=heal_batch,
        heal_lr=heal_lr,
        heal_train=heal_train,
        hidden_weight=hidden_weight,
        ce_weight=ce_weight,
        heal_precision=heal_precision,
        unlike_file=unlike_file,
        original=original,
        text=text,
        device=device,
        force=force,
        progress=not quiet,
        dist_timeout_s=dist_timeout,
    )
    from gac.heal.run import heal_dir

    result = heal_dir(model, out, cfg)
    if result.out is None:  # a torchrun rank other than 0: rank 0 reports
        return
    for line in describe(result.report):
        click.echo(line)
    from gac.heal.plot import PLOT_FILE
    from gac.heal.run import HEAL_FILE

    click.echo(f"saved the healed model, {HEAL_FILE} and {PLOT_FILE} to {result.out}")
