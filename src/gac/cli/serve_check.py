"""`gac serve-check DIR [DIR...]`: parses options, calls gac.serve.agreement.agreement."""

from __future__ import annotations

import click

from gac.cli.options import Int


@click.command("serve-check")
@click.argument("model_dirs", nargs=-1, required=True)
@click.option("--engine", type=click.Choice(["vllm"]), default="vllm", show_default=True, help="Serving engine.")
@click.option("--tp", type=Int(1, 1024, example=2), default=1, show_default=True, help="Tensor parallel size.")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16"]),
    default="auto",
    show_default=True,
    help="What vLLM computes in (auto: float32, bfloat16 for int4 weights, whose kernels run in 16-bit only).",
)
@click.option(
    "--max-tokens",
    type=Int(1, 4096, example=32),
    default=32,
    show_default=True,
    help="Greedy tokens generated per prompt.",
)
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the results (JSON).")
def command(model_dirs, engine, tp, dtype, max_tokens, out) -> None:
    """Serve each MODEL_DIR in the engine and check it computes the model gac saved: greedy tokens of 8 prompts
    and their prompt log-probabilities against gac's own transformers forward."""
    import json
    import os

    from gac.cli.output import setup_logging
    from gac.errors import GacError
    from gac.io.atomic import write_text
    from gac.serve.agreement import agreement

    setup_logging(False)
    if out:
        from gac.io import validate

        validate.output_file(out, "--out")
    # vLLM's engine core in this process, not a process of its own started (and vLLM imported again) per model:
    # the same engine and model code (docs/SERVING.md). Set here, where the process is this command's: in-process,
    # vLLM's CPU worker also seeds this process's random state (harmless: the transformers side is greedy) and stops
    # torch.set_num_threads for the rest of the process, which a Python caller of agreement() may still need.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    results = agreement(model_dirs, dtype=dtype, tp=tp, max_tokens=max_tokens)
    from gac.serve.agreement import kernel_counts

    for d, r in results.items():
        click.echo(
            f"{d}: {r['token_agreement']:.1%} of {r['positions']} greedy tokens agree (teacher-forced "
            f"{r['teacher_forced_agreement']:.1%}, greedy prefix {r['greedy_prefix']:.1%}); prompt log-probs "
            f"max |diff| {r['prompt_logprob_max_abs_diff']:.1e}; vLLM loaded it in {r['vllm_load_s']:.0f} s, "
            f"computes in {r['dtype']}"
        )
        counts = kernel_counts(r["kernels"])
        click.echo("  linears: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])))
        if r["kernels_planned"] is not None and counts != r["kernels_planned"]:
            raise GacError(
                f"vLLM ran {d}'s linears as {counts}, not as its quantize.json plans "
                f"({r['kernels_planned']}): re-run `gac quantize` with this vLLM version"
            )
    if out:
        write_text(out, json.dumps(results, indent=2), flag="--out")
