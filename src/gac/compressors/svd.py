"""Plain truncated SVD: every compressible linear as its best rank-r approximation; importance = weight magnitude
(or any proxy of gac.calibration.importance)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gac.calibration.importance import LOWRANK_IMPORTANCE, check_proxy
from gac.compressors.base import LowRankCompressor
from gac.compressors.config import CompressorConfig


@dataclass(frozen=True)
class SVDConfig(CompressorConfig):
    name: ClassVar[str] = "svd"
    importance: str | None = None  # a gac.calibration.importance proxy for the per-weight score; None: weight magnitude

    def __post_init__(self) -> None:
        if self.importance is not None:
            check_proxy(self.importance, LOWRANK_IMPORTANCE)


class SVDCompressor(LowRankCompressor[SVDConfig]):
    name = "svd"
