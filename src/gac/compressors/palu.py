"""PaLU: low-rank key/value projections with heads grouped. Each group of `group_size` KV heads shares one
down-projection (its latent) and has its own up-projection; ranks are allocated per group by Fisher importance.
The irregular dims are the per-group ranks inside the factorization. SVDs are whitened by the layer's inputs
(as in SVD-LLM), so each group's truncation is optimal on calibration data. gac keeps the full K/V in the cache:
the latent-cache attention kernel of the PaLU paper is out of scope; parameters and GEMM shapes are what change."""

from __future__ import annotations

from dataclasses import dataclass

from gac.compressors.allocation import allocate_ranks
from gac.compressors.base import LowRankCompressor, LowRankUnit, normalize_scores
from gac.errors import GacError
from gac.linalg import scaled_svd, whiten
from gac.models.groups import HeadRankGroup, groups_of, linears_of


@dataclass(frozen=True)
class PaluConfig:
    group_size: int = 1  # KV heads per group (1: per-head ranks; num_kv_heads: one rank per projection)
    importance: str = "fisher"  # proxy for the per-group score that drives the rank allocation

    def __post_init__(self):
        from gac.importance import check_proxy

        if self.group_size < 1:
            raise GacError(f"palu group size {self.group_size} must be >= 1, e.g. --group-size 1")
        check_proxy(self.importance)


class PaluCompressor(LowRankCompressor):
    name = "palu"
    needs_xtx = True

    @property
    def proxy(self) -> str:
        return self.config.importance

    def groups(self, model) -> list[HeadRankGroup]:
        return groups_of(model, "head_rank", heads_per_group=self.config.group_size)

    def analyze(self, model, groups, stats, *, probe=None, keep=0.85, progress=True, windows=None):
        from gac.importance import measure

        linears = linears_of(groups)
        scores = measure(self.proxy, model, linears, stats=stats, windows=windows, progress=progress)
        whitened = {n: whiten(stats[n].xtx.to(model.get_submodule(n).weight.device)) for n in linears}
        units = []
        for g in groups:
            w = model.get_submodule(g.linear).weight.detach()[g.row0:g.row0 + g.out_features]  # [rows, hidden]
            score = float(scores[g.linear].out[g.row0:g.row0 + g.out_features].double().sum())
            units.append(LowRankUnit(g, score / g.numel, svd=scaled_svd(w, whitened[g.linear])))
        normalize_scores(units, [u.score for u in units])
        for u in units:
            u.score = max(u.score, 1e-12)
        return units

    def allocate(self, units, budget):
        ranks = allocate_ranks([u.svd.energy_fraction.cpu().numpy() for u in units], [u.score for u in units],
                               [(u.out_features, u.in_features) for u in units], budget, allow_dense=False)
        return {u.name: r for u, r in zip(units, ranks)}


CONFIG, COMPRESSOR = PaluConfig, PaluCompressor
