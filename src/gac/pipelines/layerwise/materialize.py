"""Layer-wise materialization: every variant cut one decoder layer at a time from the same analysis (the factors its
cache holds: nothing is factorized twice), without copying the model. A variant is a shell sharing the original's
tensors; only the cut linears of a layer are new. With a writer, the saved variant's layer is written out as soon as
it is cut and every shell's layer is released (the model never exists whole in memory)."""

from __future__ import annotations

import copy
import functools
import logging
import math
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn
from tqdm.auto import tqdm

from gac.distributed import barrier, node_threads, sum_numbers, windows_share, world
from gac.errors import GacError
from gac.hw.heap import map_large_allocations, return_freed_memory
from gac.models.adapters import adapter_for, config_of, text_config
from gac.pipelines.layerwise.analyze import CALIB_BATCH, FactorCache, groups_by_layer
from gac.pipelines.layerwise.layers import (
    Batch,
    embed,
    layer_count,
    layer_module,
    loss_from_last_hidden,
    run_layer,
    swapped_layers,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from gac.checkpoint.lazy import LazyCheckpoint, Resident
    from gac.checkpoint.sharded import ShardWriter
    from gac.compressors.base import Compressor, Unit
    from gac.evaluate.layer_latency import LayerLatency

log = logging.getLogger(__name__)
M = TypeVar("M", bound=nn.Module)


def shared_copy(module: M) -> M:
    """A copy of the module tree sharing every parameter and buffer with `module` (no tensor is copied)."""
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)


def shell_of(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of `model` sharing its tensors, with its decoder layers still those of `model` (replaced one by one)."""
    layers = [layer_module(model, i) for i in range(layer_count(model))]
    with swapped_layers(model, []):  # not even the layers' module objects are copied
        shell = shared_copy(model)
    parent_path, _, attr = _layers_parent(model)
    setattr(shell.get_submodule(parent_path), attr, nn.ModuleList(layers))
    return shell


def one_layer_model(model: PreTrainedModel, layer: nn.Module, index: int = 0) -> PreTrainedModel:
    """A copy of `model` sharing its tensors whose decoder layers are [layer] alone (its own index kept: its KV cache
    entry is its own). `index`: the layer's index in `model`; where layers differ in kind (config.layer_types:
    sliding-window or full attention, Gemma 3's and gpt-oss's), the copy runs its one layer with that layer's kind
    of mask and rotary embedding, which the family's forward picks by the position in its list of layers."""
    with swapped_layers(model, [layer]):
        one = shared_copy(model).eval()
    config = text_config(config_of(one))  # the copy's own: editing it leaves `model` as it is
    types = getattr(config, "layer_types", None)
    if types:
        config.layer_types = [types[index], *types[1:]]
    return one


def _layers_parent(model: PreTrainedModel) -> tuple[str, str, str]:
    return adapter_for(model.config).layers_path.rpartition(".")


def release_module(module: nn.Module) -> None:
    """Every parameter and buffer of `module` moved to the meta device (its memory freed; shapes kept)."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                sub._parameters[name] = nn.Parameter(p.detach().to("meta"), requires_grad=False)
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = b.to("meta")


def materialize_layerwise(
    model: PreTrainedModel,
    source: LazyCheckpoint | Resident,
    compressor: Compressor,
    units: list[Unit],
    dims: dict[str, dict[str, int | None]],
    *,
    writer: tuple[str, ShardWriter] | None = None,
    held_out: torch.Tensor | None = None,
    timer: LayerLatency | None = None,
    progress: bool = True,
    release: bool = False,
) -> dict[str, Any]:
    """{variant: model} for each variant of dims ({variant: {unit name: dim or None}}), cut layer by layer.

    units: analyze_layerwise's, whose factor cache (units.factors) holds each layer's cut state; each layer's file
    is removed once the layer is cut, the cache at the end. writer: (variant, gac.checkpoint.sharded.ShardWriter) to
    stream that variant's layers to; every variant's layers are then released as soon as they are written (shapes
    kept, for counting). held_out: evaluation windows [n, seq] run through the baseline's and every variant's layers
    on the way; their perplexities are returned under the key "ppl" ({variant or "baseline": float}). timer: a
    gac.evaluate.layer_latency.LayerLatency; at the layers it wants, the baseline's and every variant's layer are
    handed to it together, before any is released. release: every variant's layers released once cut, written or
    not (a rank that writes nothing keeps no model).

    Under torchrun every rank cuts every layer (from the factors every rank has); each carries its share of the
    held-out windows (the perplexity sums are all-reduced), rank 0 alone times the layers while the others wait, and
    the writer is rank 0's."""
    factors = getattr(units, "factors", None)
    if factors is None or not all(i in factors for i in range(layer_count(model))):
        raise GacError(
            "layer-wise materialization cuts from the factor cache of one analyze_layerwise run, which "
            "is read once: analyze again (gac.pipelines.layerwise.analyze) before materializing again"
        )
    try:
        return _materialize(model, source, compressor, units, dims, factors, writer, held_out, timer, progress, release)
    finally:
        factors.close()


def _materialize(
    model: PreTrainedModel,
    source: LazyCheckpoint | Resident,
    compressor: Compressor,
    units: list[Unit],
    dims: dict[str, dict[str, int | None]],
    factors: FactorCache,
    writer: tuple[str, ShardWriter] | None,
    held_out: torch.Tensor | None,
    timer: LayerLatency | None,
    progress: bool,
    release: bool,
) -> dict[str, Any]:
    map_large_allocations()  # layer-sized blocks freed to the OS, not kept in a fragmenting heap
    by_layer = groups_by_layer(model, [u.group for u in units])
    unit_of = {u.group.name: u for u in units}
    shells = {v: shell_of(model) for v in dims}
    evals = None
    if held_out is not None:  # embedded once; each variant gets its own Batch objects (only `hidden` is replaced)
        if world().active:
            world().record_shares("windows_held_out", len(held_out))
        mine = windows_share(held_out)  # none where there are fewer windows than ranks
        embedded = embed(model, mine, CALIB_BATCH) if len(mine) else []
        evals = {v: [Batch(b.ids, b.states().clone(), list(b.calls)) for b in embedded] for v in ("baseline", *dims)}
    for i in tqdm(range(layer_count(model)), desc="materializing", unit="layer", disable=not progress):
        source.load_layer(i)
        layer = layer_module(model, i)
        layer_units = [unit_of[g.name] for g in by_layer[i]]
        compressor.load_cut_state(layer_units, factors[i])
        if evals is not None:
            _advance(layer, evals["baseline"], i)
        cuts = {}
        for variant, shell in shells.items():
            parent_path, _, attr = _layers_parent(shell)
            getattr(shell.get_submodule(parent_path), attr)[i] = shared_copy(layer)
            compressor.materialize_units(shell, layer_units, dims[variant])
            cuts[variant] = layer_module(shell, i)
            if evals is not None:
                _advance(cuts[variant], evals[variant], i)
        if timer is not None and timer.wants(i):
            barrier(f"waiting for rank 0 to time layer {i}")  # the others idle while it times: no shared cores
            if world().is_main:
                with node_threads():
                    timer.time_layer(i, {"baseline": layer, **cuts}, functools.partial(one_layer_model, model, index=i))
            barrier(f"waiting for rank 0 to time layer {i}")
        if writer is not None or release:
            for variant, cut in cuts.items():
                if writer is not None and variant == writer[0]:
                    prefix = adapter_for(model.config).layer_prefix(i)
                    writer[1].add({f"{prefix}.{k}": v for k, v in cut.state_dict().items()})
                release_module(cut)
        del cuts
        compressor.release_factors(layer_units)
        del factors[i]  # its disk is what the output grows into
        source.release_layer(i)
        if writer is not None or release:
            return_freed_memory()
    models: dict[str, Any] = {v: s.eval() for v, s in shells.items()}  # and "ppl": {variant: perplexity}
    if evals is not None:
        models["ppl"] = {v: _perplexity(model, eval_batches) for v, eval_batches in evals.items()}
    return models


@torch.no_grad()
def _advance(layer: nn.Module, batches: list[Batch], i: int) -> None:
    for b in batches:
        b.hidden = run_layer(layer, b, i)  # [b, seq, D]


@torch.no_grad()
def _perplexity(model: PreTrainedModel, batches: list[Batch]) -> float:
    """exp(mean next-token NLL) from the last layer's outputs, as gac.evaluate.perplexity computes it whole (under
    torchrun over every rank's batches: every rank calls it)."""
    nll, count = 0.0, 0.0
    for b in batches:
        n = b.ids.shape[0] * (b.ids.shape[1] - 1)  # predicted tokens; the loss is their mean
        nll += float(loss_from_last_hidden(model, b.ids, b.states())) * n
        count += n
    if world().active:
        nll, count = sum_numbers([nll, count], "summing perplexity")
    return math.exp(nll / count)


def outer_tensors(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """{name: tensor} of everything outside the decoder layers (embeddings, final norm, head), as saved."""
    prefix = adapter_for(model.config).layers_path + "."
    return {k: v for k, v in model.state_dict().items() if not k.startswith(prefix)}
