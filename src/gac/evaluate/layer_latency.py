"""Latency of models timed one decoder layer at a time, for runs that never hold a model whole (the layer-by-layer
pipeline): at some layers, each variant's layer is put alone in its model (embeddings, final norm and head are the
model's own) and timed side by side with the others and with a pass-through in its place, at the report's shape
(gac.evaluate.latency: prefill, decode on a static cache). A layer's time is its model's minus the pass-through's;
a variant's figure is the pass-through's (what is outside the layers) plus its layers' times, summed over the layers
timed and scaled by depth. Memory: one layer of each variant, as the pipeline holds anyway."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from gac.evaluate.latency import LatencyConfig, measure_latency

LAYERS_TIMED = 4  # evenly spaced over the depth (all of them in a model this shallow or shallower)
OUTSIDE = "(outside the layers)"  # the pass-through's name among the timed models
FIGURES = ("prefill_ms", "decode_ms_per_token")


class PassThrough(nn.Module):
    """Stands in for a decoder layer: returns its hidden states unchanged (what the model costs without it)."""

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return hidden_states


def layers_to_time(depth: int, count: int = LAYERS_TIMED) -> list[int]:
    """`count` layer indices evenly spaced from the first to the last (every layer when depth <= count)."""
    if depth <= count:
        return list(range(depth))
    return sorted({round(k * (depth - 1) / (count - 1)) for k in range(count)})


@dataclass(frozen=True)
class LatencyMethod:
    """How a run's latencies were obtained (report.json's latency_method): whole models, or layer by layer."""

    method: str  # "whole_model" or "per_layer"
    how: str
    layers_timed: list[int] | None = None  # per layer: the layers timed, of `depth`
    depth: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: out[k] for k in ("method", "layers_timed", "depth", "how") if out[k] is not None}


WHOLE_MODEL = LatencyMethod("whole_model", "every variant timed whole on the device, side by side")


@dataclass
class LayerLatency:
    """Collects per-layer timings as the layers go by (time_layer), then each variant's figures (figures)."""

    cfg: LatencyConfig
    depth: int
    layers: list[int] = field(default_factory=list)  # the layers timed; default: layers_to_time(depth)
    timings: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)  # {layer: measure_latency(...)}

    def __post_init__(self) -> None:
        self.layers = self.layers or layers_to_time(self.depth)

    def wants(self, i: int) -> bool:
        return i in self.layers

    def time_layer(
        self, i: int, layers: dict[str, nn.Module], one_layer_model: Callable[[nn.Module], nn.Module]
    ) -> None:
        """Time layer i of every variant side by side. layers: {variant: its layer i (nn.Module)};
        one_layer_model(layer): a model whose decoder layers are [layer] alone (tensors shared, no copy)."""
        models = {name: one_layer_model(layer) for name, layer in {**layers, OUTSIDE: PassThrough()}.items()}
        self.timings[i] = measure_latency(models, self.cfg)

    def figures(self) -> dict[str, dict[str, float]]:
        """{variant: {prefill_ms, prefill_spread_pct, decode_ms_per_token, decode_spread_pct}}: outside the layers
        (the mean over the layers timed) plus the layers' times scaled to the depth; the spread is the largest of the
        timed layers' (a whole-model timing of its own is not made)."""
        if not self.timings:
            return {}
        timed = [self.timings[i] for i in sorted(self.timings)]
        scale = self.depth / len(timed)
        out = {}
        for name in (n for n in timed[0] if n != OUTSIDE):
            figures = {}
            for key in FIGURES:
                outside = sum(t[OUTSIDE][key] for t in timed) / len(timed)
                layers = sum(t[name][key] - t[OUTSIDE][key] for t in timed)
                spread = key.replace("_ms_per_token", "_spread_pct").replace("_ms", "_spread_pct")
                figures[key] = outside + scale * layers
                figures[spread] = max(t[name][spread] for t in timed)
            out[name] = figures
        return out

    def method(self) -> LatencyMethod:
        """How these figures were obtained."""
        return LatencyMethod(
            "per_layer",
            "each variant's decoder layer timed alone in its model, side by side with the others and with a "
            "pass-through in its place; layer time = difference, summed over the layers timed and scaled by depth, "
            "plus the pass-through's time (embeddings, final norm, head)",
            layers_timed=sorted(self.timings),
            depth=self.depth,
        )
