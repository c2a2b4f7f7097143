"""PaLU: low-rank key/value projections with heads grouped. Each group of `group_size` KV heads shares one
down-projection (its latent) and has its own up-projection; ranks are allocated per group by gac's loss model
(compressors/loss_model.py). The irregular dims are the per-group ranks inside the factorization. SVDs are whitened by the layer's inputs
(as in SVD-LLM), so each group's truncation is optimal on calibration data. gac keeps the full K/V in the cache:
the latent-cache attention kernel of the PaLU paper is out of scope; parameters and GEMM shapes are what change."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gac.compressors.allocation import allocate_ranks
from gac.compressors.base import LowRankCompressor, WeightAnalysis
from gac.errors import GacError
from gac.linalg import factorize_from_svd, scaled_svd, whiten

KV = ("self_attn.k_proj", "self_attn.v_proj")


@dataclass(frozen=True)
class PaluConfig:
    group_size: int = 1  # KV heads per group (1: per-head ranks; num_kv_heads: one rank per projection)
    importance: str = "output"  # the loss model, or a proxy for the per-group score, that drives the rank allocation

    def __post_init__(self):
        from gac.importance import LOWRANK_IMPORTANCE, check_proxy

        if self.group_size < 1:
            raise GacError(f"palu group size {self.group_size} must be >= 1, e.g. --group-size 1")
        check_proxy(self.importance, LOWRANK_IMPORTANCE)


@dataclass
class GroupAnalysis(WeightAnalysis):
    """One head group of a K or V projection: rows [row0, row0 + out_features) of the module's weight."""

    module: str = ""
    group: int = 0
    row0: int = 0
    allow_dense = False  # the grouped factorization has no dense member

    @property
    def max_dim(self) -> int:
        """Up to full rank, past break-even: a group cannot be kept dense, but rank = its rows (whole heads, an
        aligned dim) reconstructs it exactly; capping at break-even (57 of 64 here) left GAC only 56 for every
        group the allocation wanted whole."""
        return min(self.out_features, self.in_features)


class PaluCompressor(LowRankCompressor):
    name = "palu"
    own_xtx = True

    @property
    def proxy(self) -> str:
        return self.config.importance

    def targets(self, names: list[str]) -> list[str]:
        return [n for n in names if n.endswith(KV)]

    def analyze(self, model, names, stats, *, probe=None, keep=0.85, progress=True, windows=None):
        from gac.importance import measure
        from gac.models.adapters import adapter_for

        geometry = adapter_for(model.config).geometry(model.config)
        if geometry.num_kv_heads % self.config.group_size:
            raise GacError(f"palu group size {self.config.group_size} does not divide the "
                           f"{geometry.num_kv_heads} KV heads: choose a divisor")
        rows = self.config.group_size * geometry.head_dim
        from gac.compressors.base import output_curve, output_fishers
        from gac.importance import OUTPUT

        names = self.targets(names)
        if self.proxy == OUTPUT:
            fishers = output_fishers(model, names, stats, windows, progress)
        else:
            scores = measure(self.proxy, model, names, stats=stats, windows=windows, progress=progress)
        units = []
        for name in names:
            w = model.get_submodule(name).weight.detach()  # [kv * head_dim, hidden]
            S = whiten(stats[name].xtx.to(w.device))
            for g, row0 in enumerate(range(0, w.shape[0], rows)):
                unit = GroupAnalysis(f"{name}#g{g}", rows, w.shape[1], scaled_svd(w[row0:row0 + rows], S), 0.0,
                                     module=name, group=g, row0=row0)
                if self.proxy == OUTPUT:
                    unit.curve = output_curve(unit.svd, stats[name], fishers[name], unit.max_dim,
                                              slice(row0, row0 + rows))
                    score = float(unit.curve[0])
                else:
                    score = float(scores[name].out[row0:row0 + rows].double().sum())
                unit.score = score / (rows * w.shape[1])
                units.append(unit)
        mean = float(np.mean([u.score for u in units])) or 1.0
        for u in units:
            u.score = max(u.score / mean, 1e-12)
        return units

    def allocate(self, units, budget):
        if all(u.curve is not None for u in units):
            from gac.compressors.base import allocate_by_loss_model

            return allocate_by_loss_model(units, budget)
        ranks = allocate_ranks([u.svd.energy_fraction.cpu().numpy() for u in units], [u.score for u in units],
                               [(u.out_features, u.in_features) for u in units], budget, allow_dense=False)
        return {u.name: r for u, r in zip(units, ranks)}

    def materialize(self, model, units, ranks):
        from gac.models.surgery import replace_with_grouped_lowrank

        by_module: dict[str, list] = {}
        for u in units:
            by_module.setdefault(u.module, []).append(u)
        grouped = {}
        for module, groups in by_module.items():
            groups.sort(key=lambda u: u.group)
            factors = [factorize_from_svd(u.svd, ranks[u.name]) for u in groups]  # [(A [r, in], B [rows, r])]
            replace_with_grouped_lowrank(model, module, factors)
            grouped[module] = [int(ranks[u.name]) for u in groups]
        return {"grouped_lowrank": grouped}


CONFIG, COMPRESSOR = PaluConfig, PaluCompressor
