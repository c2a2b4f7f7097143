"""Read the compressible dims and parameter counts off a live model (measured, not taken from a plan)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearDims:
    name: str
    in_features: int
    out_features: int
    rank: int | None  # inner rank of a factorized pair; None for a dense linear
    params: int  # weight parameters (biases excluded, as in the budget)

    @property
    def compressed_dims(self) -> list[int]:
        return [self.rank] if self.rank is not None else []


def linear_dims(model, names: list[str]) -> list[LinearDims]:
    out = []
    for name in names:
        m = model.get_submodule(name)
        rank = getattr(m, "rank", None)
        params = rank * (m.in_features + m.out_features) if rank is not None else m.in_features * m.out_features
        out.append(LinearDims(name, m.in_features, m.out_features, rank, params))
    return out


def params_and_alignment(model, names: list[str], alignment: int) -> tuple[int, float]:
    """(weight parameters of the compressible linears, share of compressed dims divisible by `alignment`).

    A model with no compressed dims (the baseline) is judged on its linears' own in/out dims.
    """
    dims = linear_dims(model, names)
    params = sum(d.params for d in dims)
    compressed = [r for d in dims for r in d.compressed_dims]
    judged = compressed or [x for d in dims for x in (d.in_features, d.out_features)]
    aligned = sum(1 for x in judged if x % alignment == 0)
    return params, aligned / len(judged) if judged else 1.0
