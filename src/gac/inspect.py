"""List every compressible dim of a model (ranks, linear widths, MLP width, head_dim) and whether it is aligned.

The summary share follows gac.models.dims.params_and_alignment: it is taken over the compressed dims (ranks and
pruned widths) when the model has any, else over the in/out features of every compressible linear.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

LINEAR_KINDS = ("in_features", "out_features")
KINDS = ("rank", "out_features", "in_features", "mlp_width", "head_dim")


@dataclass(frozen=True)
class Dim:
    name: str  # the module the dim belongs to (a linear, a layer's mlp or self_attn)
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
        return {a: {"judged": len(self.judged), "misaligned": sum(not d.aligned[a] for d in self.judged)}
                for a in self.alignments}

    def to_json(self) -> dict:
        return {"alignments": list(self.alignments), "judged_over": self.judged_over,
                "share_misaligned": {str(a): s for a, s in self.share_misaligned.items()},
                "counts": {str(a): c for a, c in self.counts().items()},
                "dims": [{**asdict(d), "aligned": {str(a): v for a, v in d.aligned.items()}} for d in self.dims]}


def _layer(name: str) -> int | None:
    match = re.search(r"\.layers\.(\d+)\.", name + ".")
    return int(match.group(1)) if match else None


def inspect_model(model, alignments=(8, 16, 32)) -> InspectResult:
    """Every compressible dim of `model` with its aligned flags, and the share misaligned per alignment.

    Listed per compressible linear: out_features and in_features, plus its compressed ranks (a LowRankLinear's
    rank); per layer: the MLP width (gate's out_features) and the attention head_dim.
    The shares follow gac.models.dims.params_and_alignment exactly (1 - its aligned fraction): they are taken
    over the compressed dims when the model has any (the ranks, and the widths of pruned blocks: a pruned
    layer's mlp_width row, a pruned attention's q/k out_features rows), else over every linear's in/out features.
    The other rows are listed for reading only (judged False).
    """
    from gac.models.adapters import adapter_for
    from gac.models.dims import linear_dims, pruned_widths

    alignments = tuple(sorted({int(a) for a in alignments}))
    if not alignments or alignments[0] < 1:
        raise ValueError(f"alignments must be positive integers, got {alignments}")
    config = model.config
    adapter = adapter_for(config)
    names = adapter.linear_names(config)
    pruned = {n for n in names if pruned_widths(model, [n])}  # the same rule params_and_alignment applies
    rows: list[tuple[str, str, int, bool]] = []  # (name, kind, value, is a compressed dim)
    for d in linear_dims(model, names):
        pruned_attn = d.name in pruned and not d.name.endswith("mlp.gate_proj")
        rows += [(d.name, "out_features", d.out_features, pruned_attn), (d.name, "in_features", d.in_features, False)]
        ranks = d.compressed_dims
        rows += [(d.name if len(ranks) == 1 else f"{d.name}[{g}]", "rank", int(r), True) for g, r in enumerate(ranks)]
    head_dim = adapter.geometry(config).head_dim
    for i in range(adapter.layer_count(config)):
        prefix = f"{adapter.layers_path}.{i}"
        gate = f"{prefix}.mlp.gate_proj"
        rows.append((f"{prefix}.mlp", "mlp_width", model.get_submodule(gate).out_features, gate in pruned))
        attn = model.get_submodule(f"{prefix}.self_attn")
        rows.append((f"{prefix}.self_attn", "head_dim", int(getattr(attn, "head_dim", head_dim)), False))

    judged_over = "compressed" if any(c for *_, c in rows) else "linear"

    def judged(kind: str, compressed: bool) -> bool:
        return compressed if judged_over == "compressed" else kind in LINEAR_KINDS

    dims = [Dim(name, _layer(name), kind, value, {a: value % a == 0 for a in alignments}, judged(kind, c))
            for name, kind, value, c in rows]
    result = InspectResult(alignments, dims, judged_over)
    judged_dims = result.judged
    result.share_misaligned = {a: sum(not d.aligned[a] for d in judged_dims) / len(judged_dims) if judged_dims
                               else 0.0 for a in alignments}
    return result


def _category(d: Dim, alignments: tuple[int, ...]) -> str:
    fits = [a for a in alignments if d.aligned[a]]
    return f"multiple of {max(fits)}" if fits else f"not a multiple of {alignments[0]}"


def plot_dims(result: InspectResult, path) -> None:
    """Scatter of the listed dims by layer (log scale), coloured by the largest alignment each dim meets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KINDS if any(d.kind == k for d in result.dims)]
    offsets = {k: (j - (len(kinds) - 1) / 2) * 0.12 for j, k in enumerate(kinds)}  # spread kinds within a layer
    markers = dict(zip(KINDS, ("o", "^", "v", "s", "D")))
    cats = [f"not a multiple of {result.alignments[0]}"] + [f"multiple of {a}" for a in result.alignments]
    palette = ("#d62728", "#ffbf00", "#2ca02c", "#1f77b4", "#9467bd", "#8c564b")
    colours = {c: palette[i % len(palette)] for i, c in enumerate(cats)}
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for kind in kinds:
        for cat in cats:
            pts = [d for d in result.dims if d.kind == kind and _category(d, result.alignments) == cat]
            if pts:
                ax.scatter([(d.layer or 0) + offsets[kind] for d in pts], [d.value for d in pts], s=22,
                           marker=markers[kind], c=colours[cat], alpha=0.8, label=f"{kind}: {cat}",
                           edgecolors="none")
    shares = ", ".join(f"{100 * s:.0f}% not /{a}" for a, s in result.share_misaligned.items())
    ax.set_title(f"Compressible dims by layer ({result.judged_over} dims judged: {shares})")
    ax.set_xlabel("layer")
    ax.set_ylabel("dim")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
