"""The `experts` kind: a mixture-of-experts layer's expert width, one width for all the layer's experts (what vLLM's
FusedMoE and llama.cpp's mul_mat_id hold), each expert keeping its own channels: entries of the gate and the up part
of its fused gate_up weight and of its down weight. Where the channels sit is the layout's (read off the family's
adapter): transformers 5's gate_up [E, 2I, H] (gate rows, then up rows) and down [E, H, I], or gpt-oss's transposed
gate_up [E, H, 2I] with gate and up interleaved (gate = [..., ::2]) and down [E, I, H], each with its bias..

A group may also drop whole experts (`dropped`, prune's --drop-experts): its cut then keeps E - dropped experts,
their slices of the fused weights (and biases) and their router rows, renumbered, and the config's expert count
follows (every engine holds one expert count per model, so every MoE layer drops as many). Its parameters at a width
count the kept experts only; its numel, the budget's unit, stays the original layer's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from gac.errors import GacError
from gac.models.adapters import Adapter, LayerModules, config_of, text_config
from gac.models.cuts import Cut, KeepExperts, cut_as
from gac.models.kinds.base import ChannelGroup, DimGroup, Term, shape
from gac.models.surgery import keep_expert_entries, keep_experts, widen_expert_entries


def channel_axes(transposed: bool) -> tuple[int, int]:
    """The axis of (gate_up, down) holding the expert channels: rows of gate_up [E, 2I, H] and columns of down
    [E, H, I], or, transposed (gpt-oss), the columns of gate_up [E, H, 2I] and the rows of down [E, I, H]."""
    return (2, 1) if transposed else (1, 2)


@dataclass(frozen=True)
class ExpertWidthGroup(ChannelGroup):
    """A layer's expert width: dim = channels kept in every expert (the same count, each expert its own channels)."""

    kind: ClassVar[str] = "experts"

    block: str = ""  # the experts module
    gate_up: str = ""  # its fused weights (parameter names)
    down: str = ""
    num_experts: int = 0  # the layer's experts as the model has them
    top_k: int = 0  # experts routed per token
    transposed: bool = False  # weights [E, in, out]: the channels are gate_up's columns and down's rows
    interleaved: bool = False  # gate and up alternate along gate_up's channels, else gate's then up's
    biases: tuple[str, ...] = ()  # the fused weights' biases (gate_up's [E, 2I], down's [E, H]), if the layout has them
    router: str = ""  # the router module (one row per expert)
    count_key: str = ""  # the config's key for the expert count (num_experts, num_local_experts)
    dropped: int = 0  # whole experts the cut removes (the least important, chosen by the compressor)

    @classmethod
    def read(cls, model: nn.Module, adapter: Adapter, layer: LayerModules, **_: Any) -> list[DimGroup]:
        if layer.experts is None:
            return []
        gate_up, down = layer.expert_weights
        num_experts, full, top_k = adapter.expert_geometry(config_of(model))
        hidden = adapter.hidden_size(config_of(model))
        live = model.get_parameter(down).shape[channel_axes(layer.expert_transposed)[1]]
        expected = layer.expert_shapes(hidden, num_experts, live)
        found = {n: tuple(model.get_parameter(n).shape) for n in expected}
        if found != expected:
            raise GacError(
                f"{layer.experts}: its fused expert weights {found} are not the layout gac reads "
                f"({expected}): this is not a model gac can resize"
            )
        return [
            cls(
                layer.experts,
                live,
                block=layer.experts,
                gate_up=gate_up,
                down=down,
                num_experts=num_experts,
                top_k=top_k,
                hidden=hidden,
                full=full,
                transposed=layer.expert_transposed,
                interleaved=layer.expert_interleaved,
                biases=layer.expert_biases,
                router=layer.router or "",
                count_key=adapter.layout.expert_count,
            )
        ]

    @property
    def gate_up_bias(self) -> str:
        """gate_up's bias, resized with the width (down's [E, H] is not), or "" where the layout has none."""
        return self.biases[0] if self.biases else ""

    def dropping(self, count: int) -> ExpertWidthGroup:
        """This group with `count` whole experts removed by its cut (at least top_k experts must stay)."""
        if not 0 <= count <= self.num_experts - self.top_k:
            raise GacError(
                f"{self.name}: dropping {count} of its {self.num_experts} experts would leave fewer than "
                f"the {self.top_k} each token is routed to: drop at most {self.num_experts - self.top_k}"
            )
        return replace(self, dropped=count)

    @property
    def kept_experts(self) -> int:
        """Experts the layer has after the cut."""
        return self.num_experts - self.dropped

    @property
    def changes_whole(self) -> bool:
        """Dropping experts changes the layer even at its whole width: the cut runs at the full width too."""
        return self.dropped > 0

    @property
    def linears(self) -> tuple[str, ...]:
        """The fused expert weights (parameter names: what calibration and the gradient pass resolve)."""
        return (self.gate_up, self.down)

    @property
    def params_per_dim(self) -> int:  # per channel: a gate row, an up row and a down column of every kept expert
        return 3 * self.hidden * self.kept_experts

    @property
    def numel(self) -> int:
        """The layer's expert parameters as the model has them (the budget's unit: dropped experts count in it)."""
        return 3 * self.hidden * self.num_experts * self.full

    def params(self, dim: int | None) -> int:
        """Parameters after the cut at `dim` (None: the whole width), of the kept experts."""
        return (self.full if dim is None else dim) * self.params_per_dim

    def row_lengths(self, dim: int) -> list[int]:
        """down reads the width (K); gate and up compute it (N)."""
        return [dim]

    def shard_row_lengths(self, dim: int, tp: int) -> list[int] | None:
        """Tensor-parallel MoE (vLLM's FusedMoE) splits every expert's channels over the ranks."""
        return None if dim % tp else [dim // tp]

    def shard_out_lengths(self, dim: int, tp: int) -> list[int] | None:
        return self.shard_row_lengths(dim, tp)

    # --- where the channels sit (the layout's facts)
    @property
    def channel_axes(self) -> tuple[int, int]:
        """The axis of gate_up and of down that holds the channels (1: rows, 2: columns, of [E, rows, columns])."""
        return channel_axes(self.transposed)

    def gate_up_entries(self, channels: torch.Tensor) -> torch.Tensor:
        """[E, k] channels -> [E, 2k]: their gate and up entries along gate_up's channel axis (and its bias)."""
        if self.interleaved:  # channel c is entries 2c (gate) and 2c + 1 (up)
            return torch.stack([2 * channels, 2 * channels + 1], dim=-1).flatten(-2)
        return torch.cat([channels, channels + self.dim], dim=-1)  # gate's, then up's (offset by the live width)

    def per_channel(self, gate_up: tuple[np.ndarray, np.ndarray], down: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Each expert's channel sums [E, w] from the fused weights' sums over each row and each column, (rows,
        columns) of each as stored ([E, rows] and [E, columns]): a channel's gate, up and down entries added."""
        g, d = gate_up[self.channel_axes[0] - 1], down[self.channel_axes[1] - 1]
        if self.interleaved:
            return g[:, 0::2] + g[:, 1::2] + d
        return g[:, : self.dim] + g[:, self.dim :] + d

    def cut(self, model: nn.Module, cut: Cut) -> None:
        """Keep channels `cut.channels` [E, w] of each expert: its gate and up entries of gate_up (and of its bias)
        and its down entries; first, with `cut.experts`, only those experts (their fused slices, biases and router
        rows), and the config's expert count follows."""
        cut = cut_as(cut, KeepExperts, self.name)
        experts = cut.experts
        if experts is not None or self.dropped:
            if experts is None or len(experts) != self.kept_experts:
                given = "every one of its" if experts is None else len(experts)
                raise GacError(
                    f"{self.name}: a cut keeping {given} experts for a group keeping "
                    f"{self.kept_experts}: re-run the compression"
                )
            keep_experts(model, (self.gate_up, self.down, *self.biases), self.router, experts)
            setattr(text_config(config_of(model)), self.count_key, len(experts))
        ch = cut.channels  # [E, w]
        gate_up_axis, down_axis = self.channel_axes
        entries = self.gate_up_entries(ch)
        keep_expert_entries(model, self.gate_up, gate_up_axis, entries)
        if self.gate_up_bias:
            keep_expert_entries(model, self.gate_up_bias, 1, entries)
        keep_expert_entries(model, self.down, down_axis, ch)

    def pad(self, model: nn.Module, dim: int) -> None:
        """Zero gate and up entries at the end of each part (interleaved: zero pairs at the end), zero biases and
        zero down entries: act(0) * 0 (gpt-oss: (0 + 1) * 0 * sigmoid(0)) adds nothing."""
        parts = 1 if self.interleaved else 2
        gate_up_axis, down_axis = self.channel_axes
        widen_expert_entries(model, self.gate_up, gate_up_axis, 2 * dim, parts=parts)
        if self.gate_up_bias:
            widen_expert_entries(model, self.gate_up_bias, 1, 2 * dim, parts=parts)
        widen_expert_entries(model, self.down, down_axis, dim)

    # --- latency: the layer's experts forward as transformers runs it (gac.hw.experts), measured at each width
    profile_op: ClassVar[str] = "experts"

    @property
    def profile_shape(self) -> dict[str, int]:
        return {"hidden": self.hidden, "experts": self.kept_experts, "top_k": self.top_k}

    def latency_terms(self) -> tuple[None, list[Term]]:
        """One term: the whole experts forward of the layer's tokens at the width, its grouped GEMMs' per-expert
        tiling, routing and gating included (top-k dense GEMMs of the tokens would time none of these)."""
        return None, [Term(self.profile_op, shape(**self.profile_shape))]
