"""Layer-wise analysis: the compressor's units computed one decoder layer at a time, in memory bounded by one layer's
weights and statistics plus the calibration activations (the pattern of GPTQ and llm-compressor).

  embed the calibration windows once
  forward sweep: for each layer, load it, run the stored hidden states through it, release it; when no gradient
                 is needed, its statistics are collected and it is analyzed on the way
  reverse sweep (gradient-based importance or the loss model): from the loss on the last layer's output, for
                 each layer in reverse: load it, recompute it from its stored input with hooks (input statistics,
                 output-gradient Fisher or weight gradients), back-propagate the output gradient, analyze, release.
                 The gradients are the whole model's (the chain rule, one layer at a time), not a local proxy.
Only what selection reads is kept per unit (spectra, loss curves, channel importances); the factors are
recomputed layer by layer at materialization (gac.pipeline.materialize). Scores are normalized over all layers."""

from __future__ import annotations

import logging
import time

import torch
from tqdm.auto import tqdm

from gac.calibrate import collect_stats
from gac.errors import GacError
from gac.importance import (
    GRADIENT_PROXIES,
    OUTPUT,
    collect_gradients,
    frozen_parameters,
    output_grad_sums,
)
from gac.models.groups import linears_of
from gac.models.lazy import map_large_allocations
from gac.pipeline.layers import (
    embed,
    layer_count,
    layer_module,
    loss_from_last_hidden,
    run_layer,
)

log = logging.getLogger(__name__)
CALIB_BATCH = 4  # windows per forward batch, as gac.calibrate.calibrate
GRAD_BATCH = 2  # windows per backward batch, as gac.importance's gradient passes


def groups_by_layer(model, groups) -> dict[int, list]:
    """{layer index: the groups whose linears live in that decoder layer}, every layer present."""
    from gac.models.adapters import adapter_for

    adapter = adapter_for(model.config)
    owner = {n: layer.index for layer in adapter.layers(model.config) for n in layer.linears}
    out = {i: [] for i in range(adapter.layer_count(model.config))}
    for g in groups:
        out[owner[g.linears[0]]].append(g)
    return out


def check_layerwise(compressor) -> None:
    """Importance that needs the whole model at once (ASVD's measured sensitivity: the loss with one weight
    truncated) has no layer-wise form."""
    if compressor.measures_sensitivity:
        raise GacError(f"{compressor.name}'s measured-sensitivity importance needs the whole model at once: use "
                       "--importance output (the default) for layer-by-layer compression")


def analyze_layerwise(model, source, compressor, groups, calib: torch.Tensor, *, keep: float,
                      progress: bool = True) -> list:
    """The compressor's units for `groups`, computed layer by layer (source: gac.models.lazy Resident or
    LazyCheckpoint). calib: token ids [n, seq]."""
    check_layerwise(compressor)
    map_large_allocations()  # layer-sized blocks freed to the OS: the peak does not creep up with depth
    by_layer = groups_by_layer(model, groups)
    proxy = compressor.proxy
    start = time.perf_counter()
    if proxy in (OUTPUT, *GRADIENT_PROXIES):
        units = _reverse_sweep(model, source, compressor, by_layer, calib, keep, progress)
    else:
        units = _forward_sweep(model, source, compressor, by_layer, calib, keep, progress)
    compressor.normalize(units, [u.raw_score for u in units])  # over all layers, as a whole-model analysis
    log.info("layer-wise analysis: %d units in %.1f s", len(units), time.perf_counter() - start)
    return units


def _analyze_layer(model, compressor, groups, stats, keep) -> list:
    units = compressor.analyze(model, groups, stats, probe=None, keep=keep, progress=False)
    compressor.release_factors(units)
    return units


def _forward_sweep(model, source, compressor, by_layer, calib, keep, progress) -> list:
    batches = embed(model, calib, CALIB_BATCH)
    units = []
    for i in tqdm(range(layer_count(model)), desc="layers", unit="layer", disable=not progress):
        source.load_layer(i)
        layer, names = layer_module(model, i), linears_of(by_layer[i])
        with collect_stats(model, names, xtx=compressor.needs_xtx) as stats, torch.no_grad():
            for b in batches:
                b.hidden = run_layer(layer, b, i)  # [b, seq, D]
        if by_layer[i]:
            units += _analyze_layer(model, compressor, by_layer[i], stats, keep)
        del stats
        source.release_layer(i)
    return units


def _reverse_sweep(model, source, compressor, by_layer, calib, keep, progress) -> list:
    batches = embed(model, calib, GRAD_BATCH)
    with ActivationStore(spill=source.lazy) as inputs:  # inputs[i][k]: layer i's input of batch k [b, seq, D]
        units = _reverse_sweep_stored(model, source, compressor, by_layer, batches, inputs, keep, progress)
    return units


def _reverse_sweep_stored(model, source, compressor, by_layer, batches, inputs, keep, progress) -> list:
    n_layers = layer_count(model)
    with torch.no_grad():
        for i in tqdm(range(n_layers), desc="layers (forward)", unit="layer", disable=not progress):
            source.load_layer(i)
            layer = layer_module(model, i)
            inputs[i] = [b.hidden for b in batches]
            for b in batches:
                b.hidden = run_layer(layer, b, i)
            source.release_layer(i)
    output_loss = compressor.proxy == OUTPUT
    grads, tokens = [], 0
    for b in batches:  # d loss / d (last layer's output), per batch
        h = b.hidden.detach().requires_grad_(True)
        n = b.ids.shape[0] * (b.ids.shape[1] - 1)  # predicted tokens
        with torch.enable_grad():
            loss = loss_from_last_hidden(model, b.ids, h)
            (loss * n if output_loss else loss).backward()  # as importance.output_fisher / gradient_stats
        grads.append(h.grad)
        tokens += n
    units_by_layer = {}
    for i in tqdm(reversed(range(n_layers)), total=n_layers, desc="layers (reverse)", unit="layer",
                  disable=not progress):
        source.load_layer(i)
        layer, names = layer_module(model, i), linears_of(by_layer[i])
        stored = inputs[i]
        # activation gradients only (collect_gradients turns on the weights it needs)
        with (frozen_parameters(layer), collect_stats(model, names, xtx=compressor.needs_xtx) as stats,
              _gradient_hooks(model, names, compressor.proxy) as grad_sums, torch.enable_grad()):
            for k, b in enumerate(batches):
                h = stored[k].detach().clone().requires_grad_(True)
                run_layer(layer, b, i, h).backward(grads[k])
                grads[k] = h.grad
        for n in names:
            if output_loss:
                stats[n].extra["out_fisher"] = grad_sums[n] / max(tokens, 1)
            else:
                stats[n].extra["grads"] = grad_sums[n]
        del stored, inputs[i]
        if by_layer[i]:
            units_by_layer[i] = _analyze_layer(model, compressor, by_layer[i], stats, keep)
        del stats
        source.release_layer(i)
    return [u for i in sorted(units_by_layer) for u in units_by_layer[i]]


class ActivationStore:
    """Each layer's stored input for the reverse sweep: in memory, or (spill) one file per layer in a temporary
    directory, read back memory-mapped, so that memory does not grow with depth. Removed on exit."""

    def __init__(self, spill: bool):
        self.spill = spill
        self.items: dict = {}

    def __enter__(self):
        if self.spill:
            import tempfile

            self.dir = tempfile.TemporaryDirectory(prefix="gac-activations-")
        return self

    def __exit__(self, *exc):
        self.items.clear()
        if self.spill:
            self.dir.cleanup()

    def __setitem__(self, i: int, tensors: list) -> None:
        if not self.spill:
            self.items[i] = tensors
            return
        from pathlib import Path

        path = Path(self.dir.name) / f"layer-{i}.pt"
        torch.save([t.contiguous() for t in tensors], path)
        self.items[i] = path

    def __getitem__(self, i: int) -> list:
        item = self.items[i]
        return torch.load(item, mmap=True, weights_only=True) if self.spill else item

    def __delitem__(self, i: int) -> None:
        item = self.items.pop(i)
        if self.spill:
            item.unlink()


def _gradient_hooks(model, names, proxy):
    """Output-gradient sums for the loss model, weight-gradient channel sums for taylor and fisher."""
    return output_grad_sums(model, names) if proxy == OUTPUT else collect_gradients(model, names)
