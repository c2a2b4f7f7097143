"""vLLM's greedy tokens and prompt log-probabilities for many model directories, one engine after another.

At tensor parallel size 1 every engine runs in this process. At size N > 1, N rank processes start once and build each
model's engine in themselves, model after model (vLLM's `external_launcher` executor: torchrun's way of offline tensor
parallelism; rank 0 writes what the ranks computed), where vLLM's default `mp` executor would start N fresh workers per
model, each importing vLLM again (the time it saves: docs/SERVING.md). The engine, the model code and the sharding are
vLLM's own either way.

`python -m gac.serve.vllm_runs JOB RANK_OUT` is a rank's entry point (started by `vllm_runs`, not by users).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gac.errors import GacError
from gac.serve.vllm_engine import cpu_bind, make_llm

if TYPE_CHECKING:
    from torch import nn
    from vllm.logprobs import Logprob

POLL_S = 0.5  # how often the launcher looks at its ranks


def vllm_run(
    model_dir: str | Path, prompts: list[list[int]], max_tokens: int, *, dtype: str, tp: int = 1, executor: str = "mp"
) -> dict:
    """Greedy tokens (no stop token) and prompt log-probabilities of `prompts` in one vLLM engine on `model_dir`,
    and its load time; the engine is shut down after."""
    from vllm import SamplingParams, TokensPrompt
    from vllm import envs as vllm_envs

    start = time.perf_counter()
    llm = make_llm(model_dir, dtype=dtype, tp=tp, max_model_len=256, executor=executor)
    load_s = time.perf_counter() - start
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    # prompt_logprobs=0: a dict of the prompt's own token at every position but the first (None)
    prompt = [cast("list[dict[int, Logprob]]", o.prompt_logprobs)[1:] for o in outs]
    logprobs = [[next(iter(d.values())).logprob for d in p] for p in prompt]
    kernels = llm.apply_model(linear_kernels)[0]
    llm.llm_engine.engine_core.shutdown()
    del llm
    if not vllm_envs.VLLM_ENABLE_V1_MULTIPROCESSING:
        from vllm.distributed import cleanup_dist_env_and_memory

        # the engine ran in this process: its process group, its memory and vLLM's env cache go before the next
        cleanup_dist_env_and_memory()
    return {"tokens": tokens, "prompt_logprobs": logprobs, "load_s": load_s, "kernels": kernels}


def linear_kernels(model: nn.Module) -> dict[str, str]:
    """{vLLM module name: what computes it} for every linear of a model vLLM built: the quantized kernel of a
    quantized linear (e.g. CPUWNA16LinearKernel), else its linear method (UnquantizedLinearMethod). Run inside
    the engine (LLM.apply_model)."""
    from vllm.model_executor.layers.linear import LinearBase

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, LinearBase):
            kernel = getattr(getattr(module, "scheme", None), "kernel", None)
            out[name] = type(kernel if kernel is not None else module.quant_method).__name__
    return out


def vllm_runs(prompts: dict[str, list[list[int]]], max_tokens: int, *, dtypes: dict[str, str], tp: int) -> dict:
    """{model dir: vllm_run(...)} for each model dir in `prompts` ({dir: its prompts}), in order, each in its dtype
    (`dtypes`: {dir: dtype})."""
    if tp == 1:
        return {d: vllm_run(d, p, max_tokens, dtype=dtypes[d]) for d, p in prompts.items()}
    with tempfile.TemporaryDirectory(prefix="gac-tp-") as tmp:
        job = Path(tmp) / "job.json"
        # each engine sets up its process group afresh: a port of its own, so none waits for the last one's to close
        job.write_text(
            json.dumps(
                {
                    "prompts": prompts,
                    "max_tokens": max_tokens,
                    "dtypes": dtypes,
                    "tp": tp,
                    "ports": [_free_port() for _ in prompts],
                }
            )
        )
        outs = [Path(tmp) / f"rank{r}.json" for r in range(tp)]
        _launch(job, outs)
        return json.loads(outs[0].read_text())["results"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(job: Path, outs: list[Path]) -> None:
    """The ranks started, each with torchrun's environment, and waited for; a rank that fails stops the others (they
    would wait for it forever in a collective) and its error comes back as one GacError."""
    import torch

    tp = len(outs)
    env = {
        **os.environ,
        "WORLD_SIZE": str(tp),
        "LOCAL_WORLD_SIZE": str(tp),
        "MASTER_ADDR": "127.0.0.1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }  # the external launcher's engine runs in its rank's process
    if not torch.cuda.is_available():
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind(tp))
    ranks = [
        subprocess.Popen(
            [sys.executable, "-m", "gac.serve.vllm_runs", str(job), str(out)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r, out in enumerate(outs)
    ]
    try:
        while any(p.poll() is None for p in ranks):
            if any(p.returncode for p in ranks):
                break
            time.sleep(POLL_S)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.wait()
    for r, (p, out) in enumerate(zip(ranks, outs)):
        if p.returncode:
            failed = json.loads(out.read_text()) if out.is_file() else {}
            if "error" in failed:
                raise GacError(
                    f"vLLM failed on {failed['model']} at tensor parallel size {tp}: {failed['error']}: "
                    "its log is above; `gac serve-check DIR --tp 1` shows whether it serves unsharded"
                )
            raise GacError(
                f"vLLM's tensor-parallel rank {r} of {tp} exited with status {p.returncode}: its log is "
                "above; `gac serve-check DIR --tp 1` shows whether the models serve unsharded"
            )


def _rank_main(job_file: str, out_file: str) -> int:
    """One rank: every model's engine in this process, in the launcher's order; rank 0 writes the results."""
    job = json.loads(Path(job_file).read_text())
    results, model = {}, None
    try:
        for (model, prompts), port in zip(job["prompts"].items(), job["ports"]):
            os.environ["MASTER_PORT"] = str(port)
            results[model] = vllm_run(
                model,
                prompts,
                job["max_tokens"],
                dtype=job["dtypes"][model],
                tp=job["tp"],
                executor="external_launcher",
            )
    except Exception as e:  # noqa: BLE001 - any failure goes back to the launcher in one line
        first = str(e).strip().splitlines()
        Path(out_file).write_text(
            json.dumps({"model": model, "error": f"{type(e).__name__}: {first[0]}" if first else type(e).__name__})
        )
        return 1
    if os.environ.get("RANK") == "0":
        Path(out_file).write_text(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main(*sys.argv[1:]))
