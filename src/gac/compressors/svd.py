"""Plain truncated SVD: every compressible linear as its best rank-r approximation; importance = weight magnitude."""

from __future__ import annotations

from dataclasses import dataclass

from gac.compressors.base import LowRankCompressor


@dataclass(frozen=True)
class SVDConfig:
    pass


class SVDCompressor(LowRankCompressor):
    name = "svd"


CONFIG, COMPRESSOR = SVDConfig, SVDCompressor
