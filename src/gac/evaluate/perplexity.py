"""Perplexity on held-out token windows (the same windows for every variant)."""

from __future__ import annotations

import math

import torch
from torch import nn
from tqdm.auto import tqdm

from gac.checkpoint.placement import input_device
from gac.distributed import sum_numbers, windows_share, world


@torch.inference_mode()
def perplexity(
    model: nn.Module,
    windows: torch.Tensor,
    *,
    batch_size: int = 4,
    desc: str = "perplexity",
    progress: bool = True,
    ledger: str = "windows_held_out",
) -> float:
    """exp(mean next-token NLL) over all predicted tokens of windows [n, seq]. Under torchrun each rank runs its
    share of the windows and the NLL sums and token counts are all-reduced: every rank calls it (`ledger` names the
    windows in the report's record of what each rank computed)."""
    device = input_device(model)  # a model dispatched by accelerate moves the batch on from there
    nll, count = 0.0, 0
    if world().active:
        world().record_shares(ledger, len(windows))
    mine = windows_share(windows)  # none where there are fewer windows than ranks
    for batch in tqdm(mine.split(batch_size) if len(mine) else (), desc=desc, unit="batch", disable=not progress):
        batch = batch.to(device)
        logits = model(batch, use_cache=False).logits[:, :-1].float()  # [B, S-1, V]
        target = batch[:, 1:]  # [B, S-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum"
        )
        nll += float(loss)
        count += target.numel()
    if world().active:
        nll, total = sum_numbers([nll, count], "summing perplexity")
        return math.exp(nll / total)
    return math.exp(nll / count)


def mean_loss(model: nn.Module, windows: torch.Tensor) -> float:
    """Mean next-token loss in nats on token windows [n, seq] (log perplexity): how --compressor auto and the
    --speedup guard compare models, on held-back calibration windows (gac.calibration.texts.held_back_windows)."""
    return math.log(perplexity(model, windows, desc="held-back loss", progress=False))
