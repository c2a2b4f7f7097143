"""The `experts` kind: a mixture-of-experts layer's expert width, one width for all the layer's experts (what vLLM's
FusedMoE and llama.cpp's mul_mat_id hold), each expert keeping its own channels: entries of the gate and the up part
of its fused gate_up weight and of its down weight. Where the channels sit is the layout's (read off the family's
adapter): transformers 5's gate_up [E, 2I, H] (gate rows, then up rows) and down [E, H, I], or gpt-oss's transposed
gate_up [E, H, 2I] with gate and up interleaved (gate = [..., ::2]) and down [E, I, H], each with its bias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gac.errors import GacError
from gac.models.kinds.base import ChannelGroup, DimGroup, Term, shape


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
    num_experts: int = 0
    top_k: int = 0  # experts routed per token
    gate_up_bias: str = ""  # gate_up's bias [E, 2I] (parameter name), if the layout has one; down's is not resized
    transposed: bool = False  # weights [E, in, out]: the channels are gate_up's columns and down's rows
    interleaved: bool = False  # gate and up alternate along gate_up's channels, else gate's then up's

    @classmethod
    def read(cls, model, adapter, layer, **_) -> list[DimGroup]:
        if layer.experts is None:
            return []
        gate_up, down = layer.expert_weights
        num_experts, full, top_k = adapter.expert_geometry(model.config)
        hidden = adapter.hidden_size(model.config)
        live = model.get_parameter(down).shape[channel_axes(layer.expert_transposed)[1]]
        expected = layer.expert_shapes(hidden, num_experts, live)
        found = {n: tuple(model.get_parameter(n).shape) for n in expected}
        if found != expected:
            raise GacError(f"{layer.experts}: its fused expert weights {found} are not the layout gac reads "
                           f"({expected}): this is not a model gac can resize")
        return [cls(layer.experts, live, block=layer.experts, gate_up=gate_up, down=down, num_experts=num_experts,
                    top_k=top_k, hidden=hidden, full=full, gate_up_bias=(layer.expert_biases or ("",))[0],
                    transposed=layer.expert_transposed, interleaved=layer.expert_interleaved)]

    @property
    def linears(self):
        """The fused expert weights (parameter names: what calibration and the gradient pass resolve)."""
        return (self.gate_up, self.down)

    @property
    def params_per_dim(self):  # per channel: a gate row, an up row and a down column of every expert
        return 3 * self.hidden * self.num_experts

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

    def gate_up_entries(self, channels):
        """[E, k] channels -> [E, 2k]: their gate and up entries along gate_up's channel axis (and its bias)."""
        import torch

        if self.interleaved:  # channel c is entries 2c (gate) and 2c + 1 (up)
            return torch.stack([2 * channels, 2 * channels + 1], dim=-1).flatten(-2)
        return torch.cat([channels, channels + self.dim], dim=-1)  # gate's, then up's (offset by the live width)

    def per_channel(self, gate_up, down):
        """Each expert's channel sums [E, w] from the fused weights' sums over each row and each column, (rows,
        columns) of each as stored ([E, rows] and [E, columns]): a channel's gate, up and down entries added."""
        gate_up, down = gate_up[self.channel_axes[0] - 1], down[self.channel_axes[1] - 1]
        if self.interleaved:
            return gate_up[:, 0::2] + gate_up[:, 1::2] + down
        return gate_up[:, :self.dim] + gate_up[:, self.dim:] + down

    def cut(self, model, cut) -> None:
        """Keep channels `cut.channels` [E, w] of each expert: its gate and up entries of gate_up (and of its bias)
        and its down entries."""
        from gac.models.surgery import keep_expert_entries

        ch = cut.channels  # [E, w]
        gate_up_axis, down_axis = self.channel_axes
        entries = self.gate_up_entries(ch)
        keep_expert_entries(model, self.gate_up, gate_up_axis, entries)
        if self.gate_up_bias:
            keep_expert_entries(model, self.gate_up_bias, 1, entries)
        keep_expert_entries(model, self.down, down_axis, ch)

    def pad(self, model, dim: int) -> None:
        """Zero gate and up entries at the end of each part (interleaved: zero pairs at the end), zero biases and
        zero down entries: act(0) * 0 (gpt-oss: (0 + 1) * 0 * sigmoid(0)) adds nothing."""
        from gac.models.surgery import widen_expert_entries

        parts = 1 if self.interleaved else 2
        gate_up_axis, down_axis = self.channel_axes
        widen_expert_entries(model, self.gate_up, gate_up_axis, 2 * dim, parts=parts)
        if self.gate_up_bias:
            widen_expert_entries(model, self.gate_up_bias, 1, 2 * dim, parts=parts)
        widen_expert_entries(model, self.down, down_axis, dim)

    # --- latency: the layer's experts forward as transformers runs it (gac.hw.experts), measured at each width
    profile_op: ClassVar[str] = "experts"

    @property
    def profile_shape(self):
        return {"hidden": self.hidden, "experts": self.num_experts, "top_k": self.top_k}

    def latency_terms(self):
        """One term: the whole experts forward of the layer's tokens at the width, its grouped GEMMs' per-expert
        tiling, routing and gating included (top-k dense GEMMs of the tokens would time none of these)."""
        return None, [Term(self.profile_op, shape(**self.profile_shape))]
