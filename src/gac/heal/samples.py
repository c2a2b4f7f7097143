"""Text sampled from the original model itself: healing windows of no one domain. Distilling on the calibration text
alone fits the student to that text (Python's documentation) and leaves what it lost elsewhere lost; the original's
own samples cover what the original knows, at no download (data-free distillation, as LLM-QAT trains on the
generations of the model it quantizes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from gac.heal.distill import autocast

if TYPE_CHECKING:
    from transformers import PreTrainedModel

BATCH = 32  # windows generated together


class _Ticks(LogitsProcessor):
    """Moves a progress bar by one token a sequence at each generation step; the scores pass unchanged."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.bar.update(input_ids.shape[0])
        return scores


@torch.inference_mode()
def sample_windows(
    model: PreTrainedModel,
    n: int,
    seq_len: int,
    *,
    seed: int,
    dtype: torch.dtype = torch.float32,
    progress: bool = True,
) -> torch.Tensor:
    """[n, seq_len] token windows drawn from `model`: each starts at a token drawn uniformly from the vocabulary and
    goes on with tokens sampled from the model's own next-token distribution (temperature 1, no truncation, no end
    of sequence), in `dtype` matmuls. The same seed gives the same windows."""
    device = next(model.parameters()).device
    eos = model.generation_config.eos_token_id
    how = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=seq_len - 1,
        min_new_tokens=seq_len - 1,
        pad_token_id=eos[0] if isinstance(eos, list) else eos,
    )
    bar = tqdm(total=n * seq_len, desc="sampling healing text from the original", unit="tok", disable=not progress)
    windows = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for start in range(0, n, BATCH):
            first = torch.randint(0, model.config.vocab_size, (min(BATCH, n - start), 1), device=device)
            bar.update(first.numel())
            with autocast(device, dtype):
                # a causal LM mixes GenerationMixin in; PreTrainedModel itself declares no generate
                out = model.generate(  # type: ignore[operator]
                    first,
                    attention_mask=torch.ones_like(first),
                    generation_config=how,
                    logits_processor=LogitsProcessorList([_Ticks(bar)]),
                )
            windows.append(out[:, :seq_len].cpu())  # [b, seq_len]
    bar.close()
    return torch.cat(windows)
