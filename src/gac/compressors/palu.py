"""PaLU: low-rank key/value projections with heads grouped. Each group of `group_size` KV heads shares one
down-projection (its latent) and has its own up-projection; ranks are allocated per group by gac's loss model
(compressors/loss_model.py). The irregular dims are the per-group ranks inside the factorization. SVDs are
whitened by the layer's inputs (as in SVD-LLM), so each group's truncation is optimal on calibration data. gac
keeps the full K/V in the cache: the latent-cache attention kernel of the PaLU paper is out of scope; parameters
and GEMM shapes are what change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from gac.calibration.importance import LOWRANK_IMPORTANCE, OUTPUT, check_proxy, measure
from gac.calibration.stats import weight_of
from gac.compressors.base import (
    LayerShapes,
    LowRankCompressor,
    LowRankUnit,
    Stats,
    add_loss_curves,
    normalize_scores,
)
from gac.compressors.config import CompressorConfig
from gac.compressors.linalg import ScaledSVD, scaled_svd, whiten
from gac.errors import ConfigError
from gac.hw.threads import map_over_ranks
from gac.models.groups import HeadRankGroup, RankGroup, groups_of, linears_of


@dataclass(frozen=True)
class PaluConfig(CompressorConfig):
    name: ClassVar[str] = "palu"
    group_size: int = 1  # KV heads per group (1: per-head ranks; num_kv_heads: one rank per projection)
    importance: str = "output"  # the loss model, or a proxy for the per-group score, that drives the rank allocation

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ConfigError(f"palu {{group_size}} {self.group_size} must be >= 1, e.g. {{group_size:1}}")
        check_proxy(self.importance, LOWRANK_IMPORTANCE)


class PaluCompressor(LowRankCompressor[PaluConfig]):
    name = "palu"
    own_xtx = True

    @property
    def proxy(self) -> str:
        return self.config.importance

    def groups(self, model: nn.Module) -> Sequence[HeadRankGroup]:
        return groups_of(model, "head_rank", heads_per_group=self.config.group_size)

    def analyze(
        self,
        model: nn.Module,
        groups: Sequence[RankGroup],
        stats: Stats,
        *,
        probe: torch.Tensor | None = None,
        keep: float = 0.85,
        progress: bool = True,
        windows: torch.Tensor | None = None,
    ) -> list[LowRankUnit]:
        linears = linears_of(groups)
        units = [LowRankUnit(g) for g in groups]
        self.factorize_units(model, units, stats)
        if self.proxy == OUTPUT:
            add_loss_curves(model, units, stats, windows, progress)
            scores = [float(u.loss_curve[0]) / u.numel for u in units]  # predicted loss of the group removed, per param
        else:
            measured = measure(self.proxy, model, linears, stats=stats, windows=windows, progress=progress)
            scores = [float(measured[u.group.linear].out[u.group.rows].double().sum()) / u.numel for u in units]
        return self.normalize(units, scores)

    def normalize(self, units: list[LowRankUnit], scores: Sequence[float]) -> list[LowRankUnit]:
        normalize_scores(units, scores)
        for u in units:
            u.score = max(u.score, 1e-12)
        return units

    def cut_state_bytes(self, shapes: LayerShapes, value_bytes: int) -> int:
        """K and V only, each head group up to full rank: A [kv, hidden], B blocks [rows, rows] (at most [kv, kv])."""
        return 2 * value_bytes * shapes.kv_width * (shapes.hidden + shapes.kv_width)

    def factorize_units(self, model: nn.Module, units: list[LowRankUnit], stats: Stats, progress: bool = False) -> None:
        """Each head group's rows, whitened by its linear's inputs (one Cholesky per linear)."""
        whitened: dict[str, torch.Tensor] = {}
        device: str | torch.device = "cpu"
        for u in units:
            g = u.group
            if g.linear not in whitened:
                device = weight_of(model, g.linear).device
                whitened[g.linear] = whiten(stats[g.linear].gram.matrix().to(device))

        def factorize(u: LowRankUnit) -> ScaledSVD:
            w = weight_of(model, u.group.linear).detach()[u.group.rows]  # [rows, hidden]
            return scaled_svd(w, whitened[u.group.linear], self.factorization, u.max_dim)

        for u, svd in zip(
            units,
            map_over_ranks(
                factorize, units, cost=lambda u: u.factorization_work, label=lambda u: u.name, device=device
            ),
        ):
            u.svd = svd
