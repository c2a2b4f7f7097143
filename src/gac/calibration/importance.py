"""Importance proxies for any compressor: how much each element of a weight matters, summed per output and per
input channel (which channels or heads to keep) and per weight (how many to keep: the score s_i).

Element importance e by proxy:
  magnitude   w^2                         (weight norm)
  activation  mean|x_in|^2                (input activation norm, from gac.calibration.stats's mean |x|)
  taylor      sum over batches |g * w|    (first-order loss change, g = dL/dw on calibration text)
  fisher      sum over batches g^2        (empirical Fisher diagonal)
Gradients come from a language-modelling loss on the calibration windows, batch by batch; each gradient is folded
into fp32 channel sums as soon as autograd accumulates it and then freed, so no full set of gradients is held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from gac.calibration.stats import LinearStats, weight_of
from gac.distributed import all_reduce_sum, batches_share, share, sum_numbers, world
from gac.errors import ConfigError, GacError, literal

PROXIES = ("magnitude", "activation", "taylor", "fisher")
GRADIENT_PROXIES = ("taylor", "fisher")
# Low-rank compressors also take "output": no per-element proxy but the loss model of gac.compressors.loss_model
# (each weight's output error under truncation, weighted by the output-gradient Fisher of its output channels).
OUTPUT = "output"
GRAD_BATCH = 2  # windows per backward batch of the gradient passes (the layer-by-layer pipeline batches them alike)
# The output Fisher is that of the model's own predictive distribution: per predicted token, FISHER_SAMPLES labels
# drawn from its softmax (a generator seeded FISHER_SEED, in batch order: the layer-by-layer pipeline draws alike).
FISHER_SAMPLES = 4
FISHER_SEED = 0
LOWRANK_IMPORTANCE = (OUTPUT, *PROXIES)

log = logging.getLogger(__name__)


def check_proxy(proxy: str, allowed: tuple[str, ...] = PROXIES) -> str:
    if proxy not in allowed:
        raise GacError(f"unknown importance {proxy!r}: choose one of {', '.join(allowed)}")
    return proxy


@dataclass
class ChannelScores:
    """Importance of one linear's elements summed per output channel and per input channel (fp32)."""

    out: torch.Tensor  # [out]
    inp: torch.Tensor  # [in]

    @property
    def total(self) -> float:
        return float(self.out.double().sum())


@dataclass
class GradStats:
    """Per-channel gradient sums of one linear weight [out, in], accumulated batch by batch in fp32."""

    taylor_out: torch.Tensor  # [out] sum |g * w|
    taylor_in: torch.Tensor  # [in]
    fisher_out: torch.Tensor  # [out] sum g^2
    fisher_in: torch.Tensor  # [in]
    batches: int = 0

    def zero(self) -> None:
        """No batches counted: an idle rank's part of a sum over ranks."""
        self.batches = 0
        for t in (self.taylor_out, self.taylor_in, self.fisher_out, self.fisher_in):
            t.zero_()

    def copy(self) -> GradStats:
        return GradStats(
            self.taylor_out.clone(),
            self.taylor_in.clone(),
            self.fisher_out.clone(),
            self.fisher_in.clone(),
            self.batches,
        )


@contextmanager
def frozen_parameters(module: nn.Module) -> Iterator[list[nn.Parameter]]:
    """Yield `module`'s parameters with requires_grad off while the block runs (activation gradients only; the
    block may turn some back on), each flag restored on exit."""
    params = list(module.parameters())
    saved = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield params
    finally:
        for p, flag in zip(params, saved):
            p.requires_grad_(flag)


FOLD_ELEMENTS = 1 << 24  # elements of a fused expert weight folded at once: its fp32 temporaries stay ~64 MiB each


def channel_sums(grad: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(sum |g w| per output channel, per input channel, sum g^2 likewise) in fp32: [out], [in], or per expert
    [E, out], [E, in] for a fused expert weight [E, out, in], folded a block of experts at a time (whole fp32 copies
    of one would be 1.5 GiB each at Qwen3-30B-A3B's shapes)."""
    step = max(1, FOLD_ELEMENTS // grad[0].numel()) if grad.dim() == 3 else len(grad)
    blocks = []
    for g, w in zip(grad.split(step), weight.split(step)):  # [out, in] whole, or [block, out, in]
        g = g.float()
        gw = (g * w.float()).abs()
        g2 = g.square()
        blocks.append((gw.sum(-1), gw.sum(-2), g2.sum(-1), g2.sum(-2)))
    return blocks[0] if len(blocks) == 1 else tuple(torch.cat(parts) for parts in zip(*blocks))


@contextmanager
def collect_gradients(model: nn.Module, names: list[str]) -> Iterator[dict[str, GradStats]]:
    """Yield {name: GradStats} filled by every backward pass run inside the block.

    Only the named linears' weights require grad while the block runs (nothing else gets a gradient); each weight's
    gradient is reduced to channel sums when autograd has accumulated it, then dropped. On exit the hooks are
    removed and requires_grad is restored; a named weight that never received a gradient is an error.
    """
    stats: dict[str, GradStats] = {}
    handles = []

    def make_hook(name: str) -> Callable[[torch.Tensor], None]:
        def hook(w: torch.Tensor) -> None:
            if w.grad is None:  # a post-accumulate hook runs once there is one
                return
            sums = channel_sums(w.grad.detach(), w.detach())
            s = stats.get(name)
            if s is None:
                taylor_out, taylor_in, fisher_out, fisher_in = (torch.zeros_like(t) for t in sums)
                s = stats[name] = GradStats(taylor_out, taylor_in, fisher_out, fisher_in)
            s.taylor_out += sums[0]
            s.taylor_in += sums[1]
            s.fisher_out += sums[2]
            s.fisher_in += sums[3]
            s.batches += 1
            w.grad = None  # folded in: free it now

        return hook

    with frozen_parameters(model) as params:
        try:
            for name in names:
                w = weight_of(model, name)
                w.requires_grad_(True)
                handles.append(w.register_post_accumulate_grad_hook(make_hook(name)))
            yield stats
        finally:
            for h in handles:
                h.remove()
            for p in params:
                p.grad = None
    missing = [n for n in names if n not in stats]
    if missing:
        raise RuntimeError(f"the gradient pass reached no gradient for {len(missing)} weights, e.g. {missing[0]}")


def gradient_stats(
    model: nn.Module, windows: torch.Tensor, names: list[str], *, batch_size: int = GRAD_BATCH, progress: bool = True
) -> dict[str, GradStats]:
    """Language-modelling loss on the calibration windows [n, seq], backward batch by batch, per-channel sums.

    Memory-aware: gradients are folded in and freed weight by weight (collect_gradients), and a batch that runs
    out of accelerator memory is retried at half the size, with the sums it had already folded in rolled back.
    Under torchrun each rank runs its share of the batches and the sums are all-reduced: every rank calls it."""
    device = next(model.parameters()).device
    if world().active:
        world().record_batches("windows_gradients", len(windows), batch_size)
    mine = batches_share(windows, batch_size)
    idle = len(mine) == 0  # fewer batches than ranks: run the first window to shape the sums, then count nothing
    windows = windows[:1] if idle else mine
    with (
        collect_gradients(model, names) as stats,
        torch.inference_mode(False),
        torch.enable_grad(),
        tqdm(total=len(windows), desc="gradients", unit="window", disable=not progress) as bar,
    ):
        start = 0
        while start < len(windows):
            ids = windows[start : start + batch_size].to(device)  # [b, seq]
            before = {n: g.copy() for n, g in stats.items()}
            try:
                loss = model(ids, labels=ids, use_cache=False).loss
                loss.backward()
                del loss
            except torch.OutOfMemoryError:
                loss = None  # drop the graph of the failed batch before retrying
                stats.clear()
                stats.update(before)  # a backward cut short may have folded in part of this batch
                for p in model.parameters():
                    p.grad = None
                if batch_size == 1:
                    raise ConfigError(
                        "out of memory in the gradient pass with one window per batch: use a "
                        "shorter {seq_len}, a smaller {dtype}, or {importance:magnitude}"
                    ) from None
                batch_size //= 2
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                log.warning("out of memory in the gradient pass: retrying with %d window(s) per batch", batch_size)
                continue
            start += len(ids)
            bar.update(len(ids))
    if idle:
        for g in stats.values():
            g.zero()
    reduce_grads(stats)
    return stats


def reduce_grads(stats: dict[str, GradStats]) -> None:
    """Every rank's gradient sums (fp32) and batch counts summed in place; a no-op in one process."""
    if not world().active:
        return
    names = sorted(stats)
    for name, batches in zip(names, sum_numbers([stats[n].batches for n in names], "summing gradient batches")):
        g = stats[name]
        g.batches = int(batches)
        for t in (g.taylor_out, g.taylor_in, g.fisher_out, g.fisher_in):
            all_reduce_sum(t, "summing gradient statistics")


def channel_scores(
    proxy: str,
    model: nn.Module,
    names: list[str],
    *,
    stats: dict[str, LinearStats] | None = None,
    grads: dict[str, GradStats] | None = None,
) -> dict[str, ChannelScores]:
    """{name: ChannelScores} for `proxy`. activation needs calibrate's stats; taylor and fisher need `grads`."""
    check_proxy(proxy)
    out = {}
    for name in names:
        w = weight_of(model, name).detach()
        n_out = w.shape[-2]
        if proxy == "magnitude":
            e = w.float().square()  # [(E,) out, in]
            out[name] = routed_share(ChannelScores(e.sum(-1), e.sum(-2)), stats, name)
        elif proxy == "activation":
            if w.dim() > 2:
                raise ConfigError(
                    f"importance 'activation' has no per-expert input statistics for {literal(name)}: use "
                    "{importance:taylor} (the default) or magnitude for mixture-of-experts models"
                )
            if stats is None or name not in stats:
                raise GacError(f"importance 'activation' needs calibration statistics for {name}")
            x2 = stats[name].mean_abs.float().to(w.device).square()  # [in]
            out[name] = ChannelScores(torch.full((n_out,), float(x2.sum()), device=w.device), x2 * n_out)
        else:
            if grads is None or name not in grads:
                raise GacError(f"importance {proxy!r} needs calibration gradients for {name}")
            g = grads[name]
            out[name] = (
                ChannelScores(g.taylor_out, g.taylor_in)
                if proxy == "taylor"
                else ChannelScores(g.fisher_out, g.fisher_in)
            )
    return out


def routed_share(scores: ChannelScores, stats: dict[str, LinearStats] | None, name: str) -> ChannelScores:
    """A fused expert weight's channel scores [E, n], each expert's scaled by its share of the tokens calibration
    routed (mean 1 over the experts: a rarely routed expert's channels matter less). Gradient proxies need no such
    weight: an expert's gradient sums over the tokens routed to it only. Other weights are returned as they are."""
    routed = stats[name].extra.get("routed") if stats and name in stats else None
    if routed is None or scores.out.dim() < 2:
        return scores
    share = (routed.double() / max(int(routed.sum()), 1) * len(routed)).to(scores.out)  # [E]
    return ChannelScores(scores.out * share[:, None], scores.inp * share[:, None])


def measure(
    proxy: str,
    model: nn.Module,
    names: list[str],
    *,
    stats: dict[str, LinearStats] | None = None,
    windows: torch.Tensor | None = None,
    progress: bool = True,
) -> dict[str, ChannelScores]:
    """Channel scores of `proxy` for the named linears, running the gradient pass when the proxy needs one."""
    grads = None
    if (
        check_proxy(proxy) in GRADIENT_PROXIES
        and stats
        and all("grads" in getattr(stats.get(n), "extra", {}) for n in names)
    ):
        grads = {n: stats[n].extra["grads"] for n in names}  # computed layer by layer (gac.pipelines)
    elif proxy in GRADIENT_PROXIES:
        if windows is None:
            raise GacError(f"importance {proxy!r} needs calibration windows for its gradient pass")
        grads = gradient_stats(model, windows, names, progress=progress)
    return channel_scores(proxy, model, names, stats=stats, grads=grads)


def weight_scores(
    proxy: str,
    model: nn.Module,
    names: list[str],
    *,
    stats: dict[str, LinearStats] | None = None,
    windows: torch.Tensor | None = None,
    progress: bool = True,
) -> list[float]:
    """Importance per parameter of each named weight (the knapsack's s_i before normalization)."""
    scores = measure(proxy, model, names, stats=stats, windows=windows, progress=progress)
    return [scores[n].total / weight_of(model, n).numel() for n in names]


def drawn_label_losses(
    logits: torch.Tensor, generator: torch.Generator, skipped: Sequence[int] | None = None
) -> list[torch.Tensor]:
    """FISHER_SAMPLES summed cross-entropies of the next-token predictions in logits [b, seq, V] (positions 0..seq-2)
    against labels drawn from their own softmax. The squared gradients of these losses average to the Fisher of the
    model's predictive distribution, i.e. the Hessian of the KL divergence from the original's predictions: what
    healing then distils toward, and what the text's own labels (the empirical Fisher) fit to the calibration text's
    domain. The labels are drawn on the CPU (`generator` is fisher_generator's),
    whatever the logits' device: a GPU's generator draws other numbers from the same seed, so the same command
    would choose other dims on a CPU and on a GPU.

    skipped[i]: the windows other ranks took just before window i of the batch (under torchrun); the generator is
    advanced past their draws, so every window gets the labels one process draws for it."""
    log_p = logits[:, :-1].reshape(-1, logits.shape[-1]).float().log_softmax(-1)  # [N, V], one for every draw
    with torch.no_grad():
        probs = log_p.exp().cpu()
        if not skipped or not any(skipped):
            labels = torch.multinomial(probs, FISHER_SAMPLES, replacement=True, generator=generator)  # [N, K]
        else:
            rows = logits.shape[1] - 1  # predicted tokens per window
            parts = []
            for i, part in enumerate(probs.split(rows)):  # [rows, V] per window
                skip_draws(generator, skipped[i] * rows)
                parts.append(torch.multinomial(part, FISHER_SAMPLES, replacement=True, generator=generator))
            labels = torch.cat(parts)  # [N, K]
        labels = labels.to(log_p.device)
    return [-log_p.gather(1, labels[:, k : k + 1]).sum() for k in range(FISHER_SAMPLES)]


def skip_draws(generator: torch.Generator, rows: int) -> None:
    """Advance `generator` past FISHER_SAMPLES label draws for each of `rows` predicted tokens: multinomial sampling
    with replacement takes one uniform number per draw, whatever the distribution."""
    if rows:
        torch.multinomial(torch.ones(rows, 2), FISHER_SAMPLES, replacement=True, generator=generator)


def fisher_generator() -> torch.Generator:
    """The seeded CPU generator that draws the output Fisher's labels (one per pass over the windows)."""
    return torch.Generator().manual_seed(FISHER_SEED)


def output_fisher(
    model: nn.Module, windows: torch.Tensor, names: list[str], *, batch_size: int = GRAD_BATCH, progress: bool = True
) -> dict[str, torch.Tensor]:
    """{name: [out] float64}: E[(dl/dy_j)^2] per output channel j of each named linear, l the cross-entropy of a
    next-token prediction against a label drawn from the model's own softmax (drawn_label_losses), over the
    calibration windows' predicted tokens and FISHER_SAMPLES draws each.

    Only activation gradients are computed (no weight requires grad: the embeddings' output is the leaf); the
    pass costs one forward and FISHER_SAMPLES backwards. Layer by layer, the same figures come from a reverse sweep
    that recomputes one decoder layer from its stored input and back-propagates the gradients of its output.
    Under torchrun each rank runs its share of the windows, drawing the labels one process would draw for them, and
    the sums and token counts are all-reduced: every rank calls it."""
    device = next(model.parameters()).device
    terms, generator = 0, None
    mine = share(len(windows))
    idle = not mine  # fewer windows than ranks: run the first to shape the sums, then count nothing
    batches = [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)] or [[0]]  # global window indices

    def leaf(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        return output.detach().requires_grad_(True)

    with frozen_parameters(model):
        handle = input_embeddings(model).register_forward_hook(leaf)
        try:
            with (
                output_grad_sums(model, names) as sums,
                torch.inference_mode(False),
                torch.enable_grad(),
                tqdm(total=len(windows), desc="output gradients", unit="window", disable=not progress) as bar,
            ):
                drawn_to = 0  # the windows whose labels the generator has drawn
                for ids in batches:
                    batch = windows[ids[0] : ids[-1] + 1 : max(world().size, 1)]  # [b, seq]
                    logits = model(batch.to(device), use_cache=False).logits  # [b, seq, V]
                    generator = generator or fisher_generator()
                    skipped = [j - (ids[k - 1] + 1 if k else drawn_to) for k, j in enumerate(ids)]
                    losses = drawn_label_losses(logits, generator, skipped if world().active else None)
                    drawn_to = ids[-1] + 1
                    for k, loss in enumerate(losses):
                        loss.backward(retain_graph=k < len(losses) - 1)
                    del logits, losses
                    terms += batch.shape[0] * (batch.shape[1] - 1) * FISHER_SAMPLES
                    bar.update(len(batch))
        finally:
            handle.remove()
    if idle:
        terms = 0
        for t in sums.values():
            t.zero_()
    if world().active:
        (terms_all,) = sum_numbers([terms], "summing output-gradient token counts")
        terms = int(terms_all)
        for name in sorted(sums):
            all_reduce_sum(sums[name], "summing output gradients")
    return {name: s / max(terms, 1) for name, s in sums.items()}


def input_embeddings(model: nn.Module) -> nn.Module:
    """A transformers model's token embeddings, whose output the output-gradient pass starts from."""
    get = getattr(model, "get_input_embeddings", None)
    if get is None:
        raise TypeError(f"{type(model).__name__} is not a transformers model: it has no input embeddings")
    return get()


@contextmanager
def output_grad_sums(model: nn.Module, names: list[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Yield {name: [out] float64}: sum over tokens of (dl/dy_j)^2 for each named linear's output y, filled by the
    backward passes run inside the block (only outputs that require grad are tracked). Hooks removed on exit; a
    linear whose output never received a gradient is an error."""
    sums: dict[str, torch.Tensor] = {}
    handles = []

    def make_hook(name: str) -> Callable[[nn.Module, object, torch.Tensor], None]:
        def forward_hook(_module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
            if not output.requires_grad:
                return

            def grad_hook(g: torch.Tensor) -> None:
                g2 = g.detach().double().square().reshape(-1, g.shape[-1]).sum(0)  # [out]
                sums[name] = sums[name] + g2 if name in sums else g2

            output.register_hook(grad_hook)

        return forward_hook

    try:
        for name in names:
            handles.append(model.get_submodule(name).register_forward_hook(make_hook(name)))
        yield sums
    finally:
        for h in handles:
            h.remove()
    missing = [n for n in names if n not in sums]
    if missing:
        raise RuntimeError(
            f"the output-gradient pass reached no gradient for {len(missing)} linears, e.g. {missing[0]}"
        )
