"""Layer-wise analysis: the compressor's units computed one decoder layer at a time, in memory bounded by one layer's
weights and statistics plus the calibration activations (the pattern of GPTQ and llm-compressor).

  embed the calibration windows once, in calibration's batches
  forward sweep: for each layer, load it, run the stored hidden states through it, release it; when no gradient
                 is needed, its statistics are collected and it is analyzed on the way
  reverse sweep (gradient-based importance or the loss model): from the loss on the last layer's output, for
                 each layer in reverse: load it, run its stored input through it (input statistics, in the batches
                 of calibration: the same sums as the whole model's), recompute it with hooks (output-gradient
                 Fisher or weight gradients), back-propagate the output gradient, analyze, release.
                 The gradients are the whole model's (the chain rule, one layer at a time), not a local proxy.
Under torchrun each rank carries its share of the windows (whole gradient batches) from layer to layer; each layer's
statistics and gradient sums are all-reduced before it is analyzed, and its factorizations are spread over the ranks
(gac.hw.threads.map_over_ranks). Only what selection reads is kept per unit (spectra, loss curves, channel importances);
what `cut` needs (the compressor's cut_state: factors at the largest rank) goes to a FactorCache on disk, one file per
layer, which materialization (gac.pipelines.layerwise.materialize) reads instead of factorizing again. Scores are
normalized over all layers."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
from tqdm.auto import tqdm

from gac.calibration.importance import (
    GRAD_BATCH,
    GRADIENT_PROXIES,
    OUTPUT,
    collect_gradients,
    drawn_label_losses,
    fisher_generator,
    frozen_parameters,
    output_grad_sums,
    reduce_grads,
)
from gac.calibration.stats import CALIB_BATCH, collect_stats, reduce_stats, zero_stats
from gac.distributed import all_reduce_sum, sum_numbers, world
from gac.errors import ConfigError, GacError
from gac.hw.heap import map_large_allocations
from gac.io.atomic import io_failure
from gac.models.adapters import adapter_for
from gac.models.groups import linears_of
from gac.pipelines.layerwise.layers import (
    Batch,
    embed,
    layer_count,
    layer_module,
    logits_from_last_hidden,
    loss_from_last_hidden,
    run_layer,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from typing_extensions import Self

    from gac.checkpoint.lazy import LazyCheckpoint, Resident
    from gac.compressors.base import Compressor, Unit
    from gac.models.groups import DimGroup

log = logging.getLogger(__name__)
assert CALIB_BATCH % GRAD_BATCH == 0  # a calibration batch splits into whole gradient batches


def groups_by_layer(model: PreTrainedModel, groups: Sequence[DimGroup]) -> dict[int, list[DimGroup]]:
    """{layer index: the groups whose linears live in that decoder layer}, every layer present."""
    adapter = adapter_for(model.config)
    owner = {n: layer.index for layer in adapter.layers(model.config) for n in layer.weights}
    out: dict[int, list[DimGroup]] = {i: [] for i in range(adapter.layer_count(model.config))}
    for g in groups:
        out[owner[g.linears[0]]].append(g)
    return out


def check_layerwise(compressor: Compressor) -> None:
    """Importance that needs the whole model at once (ASVD's measured sensitivity: the loss with one weight
    truncated) has no layer-wise form."""
    if compressor.measures_sensitivity:
        raise ConfigError(
            f"{compressor.name}'s measured-sensitivity importance needs the whole model at once: use "
            "{importance:output} (the default) for layer-by-layer compression"
        )


@dataclass
class RankWindows:
    """The calibration windows this rank carries through the layers: under torchrun whole gradient batches r, r + N,
    ... (so the batches one process forms, calibration's and the gradient passes', are formed here too), with their
    indices among all windows; all of them in one process. A rank with none (fewer batches than ranks) runs the first
    window to shape its sums and counts nothing."""

    windows: torch.Tensor  # [n_r, seq]
    indices: list[int]  # of each of `windows` among all windows
    idle: bool = False

    @classmethod
    def of(cls, calib: torch.Tensor) -> RankWindows:
        w = world()
        if not w.active:
            return cls(calib, list(range(len(calib))))
        w.record_batches("windows_calibration", len(calib), GRAD_BATCH)
        mine = w.batch_windows(len(calib), GRAD_BATCH)
        return cls(calib[mine], mine) if mine else cls(calib[:1], [0], idle=True)

    def skipped(self, k: int) -> list[int] | None:
        """Gradient batch k's windows that other ranks drew labels for just before each of its own (the output
        Fisher's draws: drawn_label_losses); None in one process."""
        if not world().active or self.idle:
            return None
        ids = self.indices[k * GRAD_BATCH : (k + 1) * GRAD_BATCH]
        before = self.indices[k * GRAD_BATCH - 1] + 1 if k else 0
        return [ids[0] - before] + [0] * (len(ids) - 1)


def _finish_stats(stats: dict, share: RankWindows) -> None:
    """A layer's input statistics: an idle rank's zeroed, then every rank's summed (under torchrun)."""
    if share.idle:
        zero_stats(stats)
    if world().active:
        reduce_stats(stats)


def _finish_grad_sums(grad_sums: dict, output_loss: bool, share: RankWindows) -> None:
    """A layer's gradient sums (output gradients, or GradStats of the weights): an idle rank's zeroed, then every
    rank's summed (under torchrun)."""
    if output_loss:
        for name in sorted(grad_sums):
            if share.idle:
                grad_sums[name].zero_()
            if world().active:
                all_reduce_sum(grad_sums[name], "summing output gradients")
        return
    if share.idle:
        for g in grad_sums.values():
            g.zero()
    reduce_grads(grad_sums)


class LayerwiseUnits(list):
    """The units of a layer-wise analysis and its FactorCache (`factors`), which materialize_layerwise reads."""

    def __init__(self, units: list[Unit], factors: FactorCache) -> None:
        super().__init__(units)
        self.factors = factors


def analyze_layerwise(
    model: PreTrainedModel,
    source: LazyCheckpoint | Resident,
    compressor: Compressor,
    groups: Sequence[DimGroup],
    calib: torch.Tensor,
    *,
    keep: float,
    progress: bool = True,
) -> LayerwiseUnits:
    """The compressor's units for `groups`, computed layer by layer (source: gac.checkpoint.lazy Resident or
    LazyCheckpoint). calib: token ids [n, seq]. What `cut` needs is cached on disk until materialize_layerwise
    has read it (or the units are dropped)."""
    check_layerwise(compressor)
    map_large_allocations()  # layer-sized blocks freed to the OS: the peak does not creep up with depth
    by_layer = groups_by_layer(model, groups)
    proxy = compressor.proxy
    start = time.perf_counter()
    factors = FactorCache(device=source.device)
    try:
        sweep = _reverse_sweep if proxy in (OUTPUT, *GRADIENT_PROXIES) else _forward_sweep
        units = sweep(model, source, compressor, by_layer, RankWindows.of(calib), keep, factors, progress)
    except BaseException:  # KeyboardInterrupt included: no cache left behind
        factors.close()
        raise
    compressor.normalize(units, [u.raw_score for u in units])  # over all layers, as a whole-model analysis
    log.info("layer-wise analysis: %d units in %.1f s", len(units), time.perf_counter() - start)
    return LayerwiseUnits(units, factors)


def _analyze_layer(
    model: PreTrainedModel,
    compressor: Compressor,
    groups: list[DimGroup],
    stats: dict[str, Any],
    keep: float,
    factors: FactorCache,
    i: int,
) -> list[Unit]:
    """Layer i's units; what `cut` needs of them is written to the cache, each unit's factors released as soon as
    its cut state is taken (at most one weight's both held)."""
    units = compressor.analyze(model, groups, stats, probe=None, keep=keep, progress=False) if groups else []
    state = {}
    for u in units:
        state.update(compressor.cut_state(model, [u]))
        compressor.release_factors([u])
    factors[i] = state
    return units


def _forward_sweep(
    model: PreTrainedModel,
    source: LazyCheckpoint | Resident,
    compressor: Compressor,
    by_layer: dict[int, list[DimGroup]],
    share: RankWindows,
    keep: float,
    factors: FactorCache,
    progress: bool,
) -> list[Unit]:
    batches = embed(model, share.windows, CALIB_BATCH)
    units = []
    for i in tqdm(range(layer_count(model)), desc="layers", unit="layer", disable=not progress):
        source.load_layer(i)
        layer, names = layer_module(model, i), linears_of(by_layer[i])
        with collect_stats(model, names, xtx=compressor.needs_xtx) as stats, torch.no_grad():
            for b in batches:
                b.hidden = run_layer(layer, b, i)  # [b, seq, D]
            _finish_stats(stats, share)
        units += _analyze_layer(model, compressor, by_layer[i], stats, keep, factors, i)
        del stats
        source.release_layer(i)
    return units


def _reverse_sweep(
    model: PreTrainedModel,
    source: LazyCheckpoint | Resident,
    compressor: Compressor,
    by_layer: dict[int, list[DimGroup]],
    share: RankWindows,
    keep: float,
    factors: FactorCache,
    progress: bool,
) -> list[Unit]:
    batches = embed(model, share.windows, CALIB_BATCH)  # the forward pass and the statistics: as calibration batches
    grad_batches = embed(model, share.windows, GRAD_BATCH)  # the gradient passes: their ids and call arguments
    if world().active:
        world().ledger["windows_gradients"] = world().ledger["windows_calibration"]
    for b in grad_batches:
        b.hidden = None  # their inputs are the stored ones, split
    # inputs[i][k]: layer i's input of batch k [b, seq, D]
    with ActivationStore(spill=source.lazy, device=source.device) as inputs:
        units = _reverse_sweep_stored(
            model, source, compressor, by_layer, batches, grad_batches, inputs, keep, factors, progress, share
        )
    return units


def _split(hidden: list) -> list:
    """Hidden states of calibration batches [CALIB_BATCH, seq, D] as those of gradient batches [GRAD_BATCH, seq, D]."""
    return [part for h in hidden for part in h.split(GRAD_BATCH)]


def _reverse_sweep_stored(
    model: PreTrainedModel,
    source: LazyCheckpoint | Resident,
    compressor: Compressor,
    by_layer: dict[int, list[DimGroup]],
    batches: list[Batch],
    grad_batches: list[Batch],
    inputs: ActivationStore,
    keep: float,
    factors: FactorCache,
    progress: bool,
    share: RankWindows,
) -> list[Unit]:
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
    grads, terms, generator = [], 0, None  # grads[k]: d loss / d (last layer's output) of batch k, one per loss
    for k, (b, last) in enumerate(zip(grad_batches, _split([b.hidden for b in batches]))):
        h = last.detach().requires_grad_(True)
        with torch.enable_grad():
            if output_loss:  # as importance.output_fisher: labels drawn from the model's own softmax
                logits = logits_from_last_hidden(model, b.ids, h)
                generator = generator or fisher_generator()
                losses = drawn_label_losses(logits, generator, share.skipped(k))
                del logits  # the losses hold what the backwards need; the next batch's head must not meet this one
            else:  # as importance.gradient_stats: the text's own labels
                losses = [loss_from_last_hidden(model, b.ids, h)]
            grads.append(
                [torch.autograd.grad(loss, h, retain_graph=k < len(losses) - 1)[0] for k, loss in enumerate(losses)]
            )
        del losses, h
        terms += b.ids.shape[0] * (b.ids.shape[1] - 1) * len(grads[-1])
    if share.idle:
        terms = 0
    if world().active:
        terms = int(sum_numbers([terms], "summing output-gradient token counts")[0])
    units_by_layer = {}
    for i in tqdm(
        reversed(range(n_layers)), total=n_layers, desc="layers (reverse)", unit="layer", disable=not progress
    ):
        source.load_layer(i)
        layer, names = layer_module(model, i), linears_of(by_layer[i])
        stored = inputs[i]
        with collect_stats(model, names, xtx=compressor.needs_xtx) as stats, torch.no_grad():
            for k, b in enumerate(batches):
                run_layer(layer, b, i, stored[k])  # the statistics of calibration, to the bit: exact cached factors
            _finish_stats(stats, share)
        # activation gradients only (collect_gradients turns on the weights it needs)
        with (
            frozen_parameters(layer),
            _gradient_hooks(model, names, compressor.proxy) as grad_sums,
            torch.enable_grad(),
        ):
            for k, (b, x) in enumerate(zip(grad_batches, _split(stored))):
                h = x.detach().clone().requires_grad_(True)
                y, passed = run_layer(layer, b, i, h), []
                for j, g in enumerate(grads[k]):
                    h.grad = None
                    y.backward(g, retain_graph=j < len(grads[k]) - 1)
                    passed.append(h.grad)
                grads[k] = passed
        _finish_grad_sums(grad_sums, output_loss, share)
        for n in names:
            if output_loss:
                stats[n].out_fisher = grad_sums[n] / max(terms, 1)
            else:
                stats[n].extra["grads"] = grad_sums[n]
        del stored, inputs[i]
        units_by_layer[i] = _analyze_layer(model, compressor, by_layer[i], stats, keep, factors, i)
        del stats
        source.release_layer(i)
    return [u for i in sorted(units_by_layer) for u in units_by_layer[i]]


def _save_tensors(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}, path)


def _load_tensors(path: Path, device: torch.device) -> dict:
    from safetensors import safe_open

    with safe_open(path, "pt", device=str(device)) as f:  # memory-mapped on the CPU
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - a safe_open handle is no mapping


ItemT = TypeVar("ItemT", dict, list)  # what a store keeps per layer: {key: tensor}, or [tensor per batch]


class _LayerFiles(Generic[ItemT]):
    """Tensors per layer index, kept until read: in memory, or (spill) one file per layer in a temporary directory
    (TMPDIR), read back memory-mapped (onto `device`: the CPU's pages, or a copy on the GPU), so that memory does not
    grow with depth. An empty item takes no file. A layer's file goes with del, the directory with close(), the end
    of a with block, or when the store is dropped. The files are safetensors ({key: tensor}), not torch.save's: a
    failed write's error carries the operating system's reason (gac.io.atomic.io_failure)."""

    prefix = what = ""
    suffix = ".safetensors"

    def _save(self, item: ItemT, path: Path) -> None:
        raise NotImplementedError

    def _load(self, path: Path, device: torch.device) -> ItemT:
        raise NotImplementedError

    def __init__(self, spill: bool = True, device: str | torch.device = "cpu") -> None:
        self.spill, self.device = spill, torch.device(device)
        self.items: dict[int, ItemT | Path] = {}
        if spill:
            self.dir = tempfile.TemporaryDirectory(prefix=self.prefix)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.items.clear()
        if self.spill:
            self.dir.cleanup()

    def __contains__(self, i: int) -> bool:
        return i in self.items

    def __setitem__(self, i: int, item: ItemT) -> None:
        stored: ItemT | Path = item
        if self.spill and item:
            path = Path(self.dir.name) / f"layer-{i}{self.suffix}"
            with _disk_errors(path, self.what):
                self._save(item, path)
            stored = path
        self.items[i] = stored

    def __getitem__(self, i: int) -> ItemT:
        item = self.items[i]
        return self._load(item, self.device) if isinstance(item, Path) else item

    def __delitem__(self, i: int) -> None:
        item = self.items.pop(i)
        if isinstance(item, Path):
            item.unlink()


class ActivationStore(_LayerFiles[list]):
    """Each layer's stored input for the reverse sweep: [tensor per batch], in memory or spilled to disk."""

    prefix, what = "gac-activations-", "the stored calibration activations"

    def _save(self, item: list, path: Path) -> None:
        _save_tensors({str(j): t for j, t in enumerate(item)}, path)

    def _load(self, path: Path, device: torch.device) -> list:
        stored = _load_tensors(path, device)
        return [stored[str(j)] for j in range(len(stored))]


class FactorCache(_LayerFiles[dict]):
    """What `cut` needs of each analyzed layer (Compressor.cut_state, {key: tensor}), one safetensors file per layer,
    read back at materialization instead of factorizing again; a layer with nothing to keep (prune) has no file."""

    prefix, what = "gac-factors-", "the factor cache"

    def _save(self, item: dict, path: Path) -> None:
        _save_tensors(item, path)

    def _load(self, path: Path, device: torch.device) -> dict:
        return _load_tensors(path, device)


@contextlib.contextmanager
def _disk_errors(path: Path, what: str) -> Iterator[None]:
    """A full or unwritable temporary directory as one line naming TMPDIR (the layer-wise temporaries go there)."""
    try:
        yield
    except Exception as e:
        if (reason := io_failure(e)) is None:
            raise
        raise GacError(
            f"could not write {what} to {path.parent} ({reason}): point TMPDIR at a directory "
            "with room for it (`gac compress --dry-run` forecasts the disk needed)"
        ) from e


def _gradient_hooks(
    model: PreTrainedModel, names: list[str], proxy: str | None
) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """Output-gradient sums for the loss model, weight-gradient channel sums for taylor and fisher."""
    return output_grad_sums(model, names) if proxy == OUTPUT else collect_gradients(model, names)
