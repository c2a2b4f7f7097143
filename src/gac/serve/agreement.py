"""Does vLLM serve the model gac saved? For each model directory: greedy tokens and prompt log-probabilities from
vLLM against gac's own transformers forward on the same token ids (8 prompts from the embedded Python docs).
`gac serve-check DIR [DIR...] [--tp 2]` prints it.

Reported per model: the share of generated positions whose tokens agree, the mean share of each prompt's tokens
before the first disagreement (the greedy prefix), the same with transformers fed vLLM's own tokens (teacher-forced:
a divergence at a near-tie does not count its whole tail), the largest prompt log-probability difference, vLLM's
load time, and the kernel vLLM runs each linear with (a quantized checkpoint: its quantized kernel on every linear
the checkpoint quantized).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gac.checkpoint.gac_dir import QUANTIZE_FILE
from gac.checkpoint.loading import load_model
from gac.serve.vllm_engine import check_installed, check_servable, engine_dtype
from gac.serve.vllm_runs import vllm_runs

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

PROMPTS = 8
PROMPT_TOKENS = 24
MAX_TOKENS = 32


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase, count: int = PROMPTS, tokens: int = PROMPT_TOKENS
) -> list[list[int]]:
    """The first `tokens` tokens of `count` topics of Python's docs (embedded: no download)."""
    from pydoc_data.topics import topics

    keys = sorted(topics)[:: max(1, len(topics) // count)][:count]
    return [tokenizer(" ".join(topics[k].split()), add_special_tokens=False).input_ids[:tokens] for k in keys]


def hf_run(model_dir: str | Path, prompts: list[list[int]], max_tokens: int) -> dict:
    """Greedy tokens (no stop token) and prompt log-probabilities from transformers, as gac loads the model."""
    import torch

    model = load_model(str(model_dir), dtype="float32", device="cpu").model
    tokens, logprobs = [], []
    with torch.inference_mode():
        for ids in prompts:
            out = model(torch.tensor([ids]), use_cache=True)
            lp = out.logits[0, :-1].float().log_softmax(-1)  # [S - 1, V]
            logprobs.append(lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist())
            past, nxt, gen = out.past_key_values, int(out.logits[0, -1].argmax()), []
            for _ in range(max_tokens):
                gen.append(nxt)
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, int(out.logits[0, -1].argmax())
            tokens.append(gen)
    return {"tokens": tokens, "prompt_logprobs": logprobs, "model": model}


def teacher_forced(model: nn.Module, prompts: list[list[int]], generated: list[list[int]]) -> list[list[int]]:
    """transformers' greedy choice at each generated position, given vLLM's own tokens before it."""
    import torch

    with torch.inference_mode():
        return [
            model(torch.tensor([ids + gen[:-1]])).logits[0, len(ids) - 1 :].argmax(-1).tolist()
            for ids, gen in zip(prompts, generated)
        ]


def compare(hf: dict, vl: dict, forced: list[list[int]]) -> dict:
    pairs = [(a, b) for x, y in zip(hf["tokens"], vl["tokens"]) for a, b in zip(x, y)]
    forced_pairs = [(a, b) for x, y in zip(forced, vl["tokens"]) for a, b in zip(x, y)]
    diffs = [abs(a - b) for x, y in zip(hf["prompt_logprobs"], vl["prompt_logprobs"]) for a, b in zip(x, y)]
    prefixes = [
        next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) / max(len(x), 1)
        for x, y in zip(hf["tokens"], vl["tokens"])
    ]
    return {
        "positions": len(pairs),
        "token_agreement": sum(a == b for a, b in pairs) / len(pairs),
        "greedy_prefix": sum(prefixes) / len(prefixes),
        "teacher_forced_agreement": sum(a == b for a, b in forced_pairs) / len(forced_pairs),
        "prompt_logprob_max_abs_diff": max(diffs),
        "prompt_logprob_mean_abs_diff": sum(diffs) / len(diffs),
        "vllm_load_s": vl["load_s"],
        "kernels": vl["kernels"],
        "vllm_tokens": vl["tokens"],
        "hf_tokens": hf["tokens"],
    }


def agreement(
    model_dirs: Sequence[str | Path], *, dtype: str = "auto", tp: int = 1, max_tokens: int = MAX_TOKENS
) -> dict:
    """{model dir: compare(...)}: vLLM first for every model (each engine shut down before the next: see
    gac.serve.vllm_runs) in `dtype` (auto: gac.serve.vllm_engine.engine_dtype), then transformers."""
    from transformers import AutoTokenizer

    check_installed()
    dtypes = {str(d): engine_dtype(d, dtype) for d in model_dirs}
    for d in model_dirs:
        check_servable(d, tp, dtypes[str(d)])
    prompts = {str(d): prompt_ids(AutoTokenizer.from_pretrained(d)) for d in model_dirs}
    served = vllm_runs(prompts, max_tokens, dtypes=dtypes, tp=tp)
    results = {}
    for d, vl in served.items():
        hf = hf_run(d, prompts[d], max_tokens)
        results[d] = compare(hf, vl, teacher_forced(hf["model"], prompts[d], vl["tokens"]))
        results[d]["kernels_planned"] = planned_kernels(d)
        results[d]["dtype"] = dtypes[d]
    return results


def kernel_counts(kernels: dict[str, str]) -> dict[str, int]:
    """{kernel: linears it runs} of linear_kernels' answer."""
    return dict(Counter(kernels.values()))


def planned_kernels(model_dir: str | Path) -> dict[str, int] | None:
    """{kernel: linears} that a quantized checkpoint's quantize.json plans vLLM to run (None: not quantized by gac):
    the rule's kernel on every linear it quantized, vLLM's unquantized method on those it left."""
    path = Path(model_dir) / QUANTIZE_FILE
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    planned = {report["rule"]["kernel"]: report["quantized"]}
    if report["unquantized"]:
        planned["UnquantizedLinearMethod"] = report["unquantized"]
    return planned
