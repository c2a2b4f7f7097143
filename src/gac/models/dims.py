"""Read the compressible dims and parameter counts off a live model (measured, not taken from a plan).

`inspect_model` lists every compressible dim (ranks, linear widths, MLP width, head_dim) with its aligned flags;
its shares follow `params_and_alignment` exactly: taken over the compressed dims (ranks and pruned widths, as
the dimension groups report them) when the model has any, else over the in/out features of every linear.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from torch import nn

from gac.models.adapters import adapter_for, config_of
from gac.models.groups import compressed_dims_of, groups_of, is_grouped_lowrank, is_lowrank
from gac.models.surgery import linear_at

LINEAR_KINDS = ("in_features", "out_features")
KINDS = ("rank", "out_features", "in_features", "mlp_width", "head_dim")


@dataclass(frozen=True)
class LinearDims:
    name: str
    in_features: int
    out_features: int
    rank: int | None  # inner rank of a factorized pair; None for a dense linear
    params: int  # weight parameters (biases excluded, as in the budget)
    group_ranks: tuple[int, ...] = ()  # per-group ranks of a grouped factorization (PaLU)

    @property
    def compressed_dims(self) -> list[int]:
        return [self.rank] if self.rank is not None else list(self.group_ranks)


def linear_dims(model: nn.Module, names: list[str]) -> list[LinearDims]:
    config = config_of(model)
    transposed = {
        n for layer in adapter_for(config).layers(config) if layer.expert_transposed for n in layer.expert_weights
    }  # fused expert weights stored [E, in, out] (gpt-oss)
    out = []
    for name in names:
        try:
            m = linear_at(model, name)
        except AttributeError:  # a fused expert weight [E, out, in] or [E, in, out]: E linears of one shape
            w = model.get_parameter(name)
            n_in, n_out = (w.shape[-2], w.shape[-1]) if name in transposed else (w.shape[-1], w.shape[-2])
            out.append(LinearDims(name, n_in, n_out, None, w.numel()))
            continue
        if is_grouped_lowrank(m):  # one rank per head group
            ranks = tuple(int(r) for r in m.ranks)
            params = sum(r * (m.in_features + m.out_features // len(ranks)) for r in ranks)
            out.append(LinearDims(name, m.in_features, m.out_features, None, params, ranks))
        elif is_lowrank(m):
            out.append(
                LinearDims(name, m.in_features, m.out_features, m.rank, m.rank * (m.in_features + m.out_features))
            )
        else:
            out.append(LinearDims(name, m.in_features, m.out_features, None, m.in_features * m.out_features))
    return out


def params_and_alignment(model: nn.Module, names: list[str], alignment: int) -> tuple[int, float]:
    """(weight parameters of the linears `names`, share of compressed dims divisible by `alignment`).

    Compressed dims are the inner ranks of factorized linears and the widths of pruned MLPs and attention blocks.
    A model with no compressed dims (the baseline) is judged on its linears' own in/out dims.
    """
    dims = linear_dims(model, names)
    judged = compressed_dims_of(model) or [x for d in dims for x in (d.in_features, d.out_features)]
    aligned = sum(1 for x in judged if x % alignment == 0)
    return sum(d.params for d in dims), aligned / len(judged) if judged else 1.0


@dataclass(frozen=True)
class Dim:
    name: str  # the module the dim belongs to (a linear, a layer's mlp or attention)
    layer: int | None
    kind: str  # one of KINDS
    value: int
    aligned: dict[int, bool]  # alignment -> value % alignment == 0
    judged: bool  # counted in the summary shares


@dataclass
class InspectResult:
    alignments: tuple[int, ...]
    dims: list[Dim]
    judged_over: str  # "compressed" (ranks, pruned widths) or "linear" (in/out features of the compressible linears)
    share_misaligned: dict[int, float] = field(default_factory=dict)  # alignment -> share of judged dims

    @property
    def judged(self) -> list[Dim]:
        return [d for d in self.dims if d.judged]

    def misaligned(self, alignment: int | None = None) -> list[Dim]:
        """Dims not divisible by `alignment` (default: by any of the alignments), judged or not."""
        keys = self.alignments if alignment is None else (alignment,)
        return [d for d in self.dims if not all(d.aligned[a] for a in keys)]

    def counts(self) -> dict[int, dict[str, int]]:
        return {
            a: {"judged": len(self.judged), "misaligned": sum(not d.aligned[a] for d in self.judged)}
            for a in self.alignments
        }

    def to_json(self) -> dict:
        return {
            "alignments": list(self.alignments),
            "judged_over": self.judged_over,
            "share_misaligned": {str(a): s for a, s in self.share_misaligned.items()},
            "counts": {str(a): c for a, c in self.counts().items()},
            "dims": [{**asdict(d), "aligned": {str(a): v for a, v in d.aligned.items()}} for d in self.dims],
        }


def _layer(name: str) -> int | None:
    match = re.search(r"\.layers\.(\d+)\.", name + ".")
    return int(match.group(1)) if match else None


def inspect_model(model: nn.Module, alignments: Iterable[int] = (8, 16, 32)) -> InspectResult:
    """Every compressible dim of `model` with its aligned flags, and the share misaligned per alignment.

    Per compressible linear: out_features and in_features, plus its ranks when factorized; per layer: the MLP
    width and the attention head_dim. Judged (counted in the shares) are the compressed dims when the model has
    any (ranks; a pruned MLP's width; a pruned attention's q and k widths), else every linear's in/out features.
    """
    alignments = tuple(sorted({int(a) for a in alignments}))
    if not alignments or alignments[0] < 1:
        raise ValueError(f"alignments must be positive integers, got {alignments}")
    config = config_of(model)
    adapter = adapter_for(config)
    pruned_attn: set[str] = set()
    for g in groups_of(model, "heads"):
        pruned_attn |= {g.q} if g.live_heads != g.num_heads else set()
        pruned_attn |= {g.k} if g.live_kv_heads != g.num_kv_heads else set()
    rows: list[tuple[str, str, int, bool]] = []  # (name, kind, value, is a compressed dim)
    for d in linear_dims(model, adapter.linear_names(config)):
        rows += [
            (d.name, "out_features", d.out_features, d.name in pruned_attn),
            (d.name, "in_features", d.in_features, False),
        ]
        ranks = d.compressed_dims
        rows += [(d.name if len(ranks) == 1 else f"{d.name}[{g}]", "rank", int(r), True) for g, r in enumerate(ranks)]
    head_dim = adapter.geometry(config).head_dim
    for layer in adapter.layers(config):
        widths = [*groups_of(model, "mlp", layers=[layer.index]), *groups_of(model, "experts", layers=[layer.index])]
        for mlp in widths:
            rows.append((mlp.name, "mlp_width", mlp.dim, mlp.dim != mlp.full))  # an MoE layer: every expert's
        attn = model.get_submodule(layer.attention)
        rows.append((layer.attention, "head_dim", int(getattr(attn, "head_dim", head_dim)), False))

    judged_over = "compressed" if any(c for *_, c in rows) else "linear"

    def judged(kind: str, compressed: bool) -> bool:
        return compressed if judged_over == "compressed" else kind in LINEAR_KINDS

    dims = [
        Dim(name, _layer(name), kind, value, {a: value % a == 0 for a in alignments}, judged(kind, c))
        for name, kind, value, c in rows
    ]
    result = InspectResult(alignments, dims, judged_over)
    judged_dims = result.judged
    result.share_misaligned = {
        a: sum(not d.aligned[a] for d in judged_dims) / len(judged_dims) if judged_dims else 0.0 for a in alignments
    }
    return result
