"""Running a decoder model one layer at a time through its own forward code: the inputs every layer receives are
captured per batch (hidden states of layer 0, and each layer's keyword arguments: masks, rotary embeddings), a
single layer is applied to stored hidden states, and the loss is computed from the last layer's output.

The model's ModuleList of layers is swapped for stand-ins while its forward runs, so embeddings, mask creation,
final norm, output head, logit scaling and loss are the family's own code, whatever the family."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from gac.checkpoint.placement import input_device
from gac.models.adapters import adapter_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Call = tuple[tuple[object, ...], dict[str, object]]  # what the model passes a layer besides its hidden states


class _Stop(Exception):
    """Raised by the last capture stand-in: nothing past the layers needs computing."""


class _Capture(nn.Module):
    """Stands in for one decoder layer: records the arguments it is called with and passes hidden states on."""

    def __init__(self, calls: list[Call], last: bool) -> None:
        super().__init__()
        self.calls, self.last = calls, last

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        self.calls.append((args, kwargs))
        if self.last:
            raise _Stop
        return hidden_states


class _Inject(nn.Module):
    """Stands in for all decoder layers: returns the given last-layer output whatever its input."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self.hidden


@contextmanager
def swapped_layers(model: PreTrainedModel, stand_ins: Sequence[nn.Module]) -> Iterator[None]:
    """The model's decoder layers replaced by `stand_ins` while the block runs; restored on exit."""
    parent_path, _, attr = adapter_for(model.config).layers_path.rpartition(".")
    parent = model.get_submodule(parent_path)
    saved = getattr(parent, attr)
    setattr(parent, attr, nn.ModuleList(stand_ins))
    try:
        yield
    finally:
        setattr(parent, attr, saved)


@dataclass
class Batch:
    """One batch of calibration windows on its way through the layers."""

    ids: torch.Tensor  # [b, seq] token ids
    hidden: torch.Tensor | None  # [b, seq, D]: the input of the next layer to run (None: kept apart, the reverse
    # sweep's gradient batches)
    calls: list[Call]  # per layer: (args, kwargs) the model passes to it besides the hidden states

    def states(self) -> torch.Tensor:
        """`hidden`, which a batch on its way through the layers has."""
        if self.hidden is None:
            raise ValueError("this batch's hidden states are kept apart: pass them")
        return self.hidden


def layer_count(model: PreTrainedModel) -> int:
    return adapter_for(model.config).layer_count(model.config)


def layer_module(model: PreTrainedModel, i: int) -> nn.Module:
    return model.get_submodule(adapter_for(model.config).layer_prefix(i))


@torch.no_grad()  # not inference mode: the reverse sweep differentiates through what is captured here
def embed(model: PreTrainedModel, windows: torch.Tensor, batch_size: int) -> list[Batch]:
    """The calibration windows [n, seq] embedded once, in batches, with every layer's call arguments."""
    n = layer_count(model)
    device = input_device(model)
    batches = []
    for ids in windows.split(batch_size):
        calls: list[Call] = []
        stand_ins = [_Capture(calls, last=(i == n - 1)) for i in range(n)]
        first: list = []  # the hidden states layer 0 receives
        stand_ins[0].register_forward_pre_hook(lambda _m, args, seen=first: seen.append(args[0]))
        with swapped_layers(model, stand_ins):
            try:
                model(ids.to(device), use_cache=False)
            except _Stop:
                pass
        batches.append(Batch(ids, first[0], calls))
    return batches


def run_layer(layer: nn.Module, batch: Batch, i: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """Layer i applied to `hidden` (default: the batch's current hidden states) [b, seq, D] -> [b, seq, D]."""
    args, kwargs = batch.calls[i]
    return layer(batch.states() if hidden is None else hidden, *args, **kwargs)


def logits_from_last_hidden(model: PreTrainedModel, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The model's logits [b, seq, V] from the last layer's output [b, seq, D], through its final norm and head."""
    with swapped_layers(model, [_Inject(hidden)]):
        return model(ids.to(hidden.device), use_cache=False).logits


def loss_from_last_hidden(model: PreTrainedModel, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The model's language-modelling loss (mean over the batch's predicted tokens) from the last layer's output
    [b, seq, D], through the model's final norm, head and loss code."""
    with swapped_layers(model, [_Inject(hidden)]):
        return model(ids.to(hidden.device), labels=ids.to(hidden.device), use_cache=False).loss
