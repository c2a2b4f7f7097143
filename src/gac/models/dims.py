"""Read the compressible dims and parameter counts off a live model (measured, not taken from a plan)."""

from __future__ import annotations

from dataclasses import dataclass

from gac.models.adapters import attention_geometry


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


def linear_dims(model, names: list[str]) -> list[LinearDims]:
    out = []
    for name in names:
        m = model.get_submodule(name)
        ranks = getattr(m, "ranks", None)  # GroupedLowRankLinear: one rank per head group
        if ranks is not None:
            params = sum(r * (m.in_features + m.out_features // len(ranks)) for r in ranks)
            out.append(LinearDims(name, m.in_features, m.out_features, None, params, tuple(ranks)))
            continue
        rank = getattr(m, "rank", None)
        params = rank * (m.in_features + m.out_features) if rank is not None else m.in_features * m.out_features
        out.append(LinearDims(name, m.in_features, m.out_features, rank, params))
    return out


def pruned_widths(model, names: list[str]) -> list[int]:
    """Widths of the pruned blocks among `names`, read off the live modules: a gated MLP's intermediate width
    (its gate_proj output) and an attention block's query and KV widths, where they differ from the config's."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_attention_heads"):
        return []
    geo = attention_geometry(config)
    full = {"mlp.gate_proj": getattr(config, "intermediate_size", None),
            "self_attn.q_proj": geo.num_heads * geo.head_dim, "self_attn.k_proj": geo.num_kv_heads * geo.head_dim}
    widths = []
    for name in names:
        suffix = name.split(".", name.count(".") - 1)[-1]  # e.g. "mlp.gate_proj"
        if suffix not in full or full[suffix] is None:
            continue
        m = model.get_submodule(name)
        factorized = getattr(m, "rank", None) is not None or getattr(m, "ranks", None) is not None
        if not factorized and m.out_features != full[suffix]:
            widths.append(m.out_features)
    return widths


def params_and_alignment(model, names: list[str], alignment: int) -> tuple[int, float]:
    """(weight parameters of the compressible linears, share of compressed dims divisible by `alignment`).

    Compressed dims are the inner ranks of factorized linears and the widths of pruned MLPs and attention blocks.
    A model with no compressed dims (the baseline) is judged on its linears' own in/out dims.
    """
    dims = linear_dims(model, names)
    params = sum(d.params for d in dims)
    compressed = [r for d in dims for r in d.compressed_dims] + pruned_widths(model, names)
    judged = compressed or [x for d in dims for x in (d.in_features, d.out_features)]
    aligned = sum(1 for x in judged if x % alignment == 0)
    return params, aligned / len(judged) if judged else 1.0
