"""Forward hooks that collect per-linear input statistics on calibration windows (fp32/fp64, streaming)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from gac.calibration.gram import Gram
from gac.distributed import all_gather_rows, all_reduce_sum, sum_numbers, windows_share, world
from gac.errors import GacError

CALIB_BATCH = 4  # calibration windows per forward batch (the layer-by-layer pipeline batches them alike)


def weight_of(model: nn.Module, name: str) -> torch.Tensor:
    """The weight a group names: a linear's `.weight` [out, in], or a parameter itself (an MoE layer's fused expert
    weights, [E, out, in])."""
    try:
        weight = model.get_submodule(name).weight
    except AttributeError:
        return model.get_parameter(name)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"{name}.weight is a {type(weight).__name__}, not a tensor")
    return weight


def fed_module(model: nn.Module, name: str) -> nn.Module:
    """The module whose forward input is the named weight's input: the linear itself, or the module owning a fused
    expert weight (the experts, called with the hidden states and each token's routed experts)."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        return model.get_submodule(name.rpartition(".")[0])


@dataclass
class LinearStats:
    """Running statistics of one linear's input x [tokens, in]."""

    abs_sum: torch.Tensor  # [in] fp32: sum of |x| per input channel
    tokens: int = 0
    xtx: Gram | None = None  # sum of x^T x (fp64), when asked for
    out_fisher: torch.Tensor | None = None  # [out] the output-gradient Fisher, where a pass computed it ahead of the
    # loss model (gac.compressors.base.add_loss_curves; computed once for several compressors or layer by layer)
    extra: dict = field(default_factory=dict)

    @property
    def mean_abs(self) -> torch.Tensor:
        return self.abs_sum / max(self.tokens, 1)

    @property
    def gram(self) -> Gram:
        """X^T X, which calibration collects where asked to (xtx=True)."""
        if self.xtx is None:
            raise GacError("this linear's X^T X was not collected: calibrate with xtx=compressor.needs_xtx")
        return self.xtx


def calibrated(stats: LinearStats | None) -> LinearStats:
    """A linear's statistics, which a compressor scaling by its inputs needs."""
    if stats is None:
        raise GacError("a weight has no calibration statistics: calibrate every linear the compressor resizes")
    return stats


@contextmanager
def collect_stats(model: nn.Module, names: list[str], *, xtx: bool = False) -> Iterator[dict[str, LinearStats]]:
    """Yield {name: LinearStats} filled by forward hooks while the block runs; hooks are removed on exit. A fused
    expert weight's statistics are those of its experts module's input (the hidden states before routing), and
    extra["routed"] [E] counts the tokens routed to each expert."""
    stats: dict[str, LinearStats] = {}
    handles = []
    # q/k/v (and gate/up) see the same input tensor: the first linear fed by it owns one X^T X accumulator, the
    # others share it and add nothing (one sum and one product per input, not three)
    # "input": the last input seen, "stats": the LinearStats of the linear that owns its X^T X
    owner: dict[str, Any] = {}
    shared: set[str] = set()

    def make_hook(name: str, num_experts: int) -> Callable[[nn.Module, tuple[torch.Tensor, ...], object], None]:
        def hook(_module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: object) -> None:
            raw = inputs[0]  # the same object for every linear fed by this activation
            x = raw.detach().reshape(-1, raw.shape[-1])  # [tokens, in]
            in_features = x.shape[1]
            s = stats.get(name)
            if s is None:
                s = stats[name] = LinearStats(torch.zeros(in_features, dtype=torch.float32, device=x.device))
                if xtx and owner.get("input") is raw:
                    s.xtx = owner["stats"].xtx  # the same sums as the first linear fed by this input
                    shared.add(name)
                elif xtx:
                    s.xtx = Gram(in_features)
            s.abs_sum += x.abs().float().sum(0)
            s.tokens += x.shape[0]
            if num_experts and len(inputs) > 1:  # a fused expert weight: tokens routed per expert (top-k ids)
                routed = torch.bincount(inputs[1].reshape(-1), minlength=num_experts)[:num_experts]  # [E]
                s.extra["routed"] = s.extra.get("routed", 0) + routed.cpu()
            if xtx and name not in shared and s.xtx is not None:
                s.xtx.add(x)
                owner["input"], owner["stats"] = raw, s

        return hook

    try:
        for name in names:
            weight = weight_of(model, name)
            experts = weight.shape[0] if weight.dim() == 3 else 0
            handles.append(fed_module(model, name).register_forward_hook(make_hook(name, experts)))
        yield stats
    finally:
        for h in handles:
            h.remove()
        owner.clear()
    missing = [n for n in names if n not in stats]
    if missing:
        raise RuntimeError(f"calibration saw no input for {len(missing)} layers, e.g. {missing[0]}")


def calibrate(
    model: nn.Module,
    windows: torch.Tensor,
    names: list[str],
    *,
    batch_size: int = CALIB_BATCH,
    xtx: bool = False,
    progress: bool = True,
) -> dict[str, LinearStats]:
    """Run the calibration windows [n, seq] through the model and return per-linear input statistics. Under torchrun
    each rank runs its share of the windows (r, r + N, ...) and the sums are all-reduced (reduce_stats): every rank
    calls it and gets the statistics of all the windows."""
    device = next(model.parameters()).device
    mine = windows_share(windows)
    idle = len(mine) == 0  # fewer windows than ranks: run the first to shape the statistics, then count nothing
    batches = (windows[:1] if idle else mine).split(batch_size)
    with collect_stats(model, names, xtx=xtx) as stats, torch.inference_mode():
        for batch in tqdm(batches, desc="calibrating", unit="batch", disable=not progress):
            model(batch.to(device), use_cache=False)
        if idle:
            zero_stats(stats)
    if world().active:
        world().record_shares("windows_calibration", len(windows))
        reduce_stats(stats)
    return stats


def zero_stats(stats: dict[str, LinearStats]) -> None:
    """Statistics of no tokens, in the shapes (and X^T X sharing) a pass gave them: an idle rank's part of a sum."""
    for s in stats.values():
        s.abs_sum.zero_()
        s.tokens = 0
        if isinstance(s.extra.get("routed"), torch.Tensor):
            s.extra["routed"].zero_()
        if s.xtx is not None:
            s.xtx.rows = [r[:0] for r in s.xtx.rows]  # no rows, in their dtype (the gather sends that dtype)
            if s.xtx.sum is not None:
                s.xtx.sum.zero_()


def reduce_stats(stats: dict[str, LinearStats]) -> None:
    """Sum every rank's statistics in place (SUM, in the dtype they accumulate in: fp32 |x| sums, fp64 X^T X, token
    and routing counts), each shared X^T X once; a no-op in one process."""
    names = sorted(stats)
    tokens = sum_numbers([stats[n].tokens for n in names], "summing calibration token counts")
    for n, t in zip(names, tokens):
        s = stats[n]
        s.tokens = int(t)
        all_reduce_sum(s.abs_sum, "summing calibration statistics")
        routed = s.extra.get("routed")
        if isinstance(routed, torch.Tensor):
            all_reduce_sum(routed, "summing routed token counts")
    grams = list({id(s.xtx): s.xtx for n in names if (s := stats[n]).xtx is not None}.values())
    for gram in grams:
        reduce_gram(gram)


def reduce_gram(gram: Gram) -> None:
    """One X^T X summed over the ranks in place: the rows of every rank gathered while all of them together stay
    fewer than the columns (as one process keeps them), else the [in, in] float64 sums all-reduced."""
    rows, summed = sum_numbers([gram.row_count, float(gram.sum is not None)], "summing X^T X row counts")
    if not summed and rows <= gram.width:
        stacked = torch.cat(gram.rows) if gram.rows else torch.zeros(0, gram.width)
        gram.rows = [r for r in all_gather_rows(stacked, "gathering X^T X rows") if r.shape[0]]
        return
    total = gram.matrix().clone()
    gram.rows, gram.sum = [], all_reduce_sum(total, "summing X^T X")
