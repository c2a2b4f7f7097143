"""Quality values for the latency objective: from the loss model's curve, a spectrum, or pruned importance; higher
is better, the original scores 0, more dim never scores less."""

import numpy as np
import pytest
import torch

from gac.compressors.base import LowRankUnit
from gac.compressors.linalg import ScaledSVD
from gac.compressors.prune import MLPUnit
from gac.models.groups import RankGroup, WidthGroup


def test_lowrank_values_follow_the_loss_curve():
    g = RankGroup("w", None, linear="w", in_features=8, out_features=6)  # break-even rank 3
    curve = np.array([4.0, 2.0, 1.5, 0.5])
    u = LowRankUnit(g, score=1.0, curve=curve)
    assert u.quality_values([1, 2, 3, None]) == [-2.0, -1.5, -0.5, 0.0]


def test_lowrank_values_without_a_curve_follow_the_spectrum():
    g = RankGroup("w", None, linear="w", in_features=8, out_features=6)
    s = torch.tensor([3.0, 2.0, 1.0, 0.5, 0.1, 0.05])
    svd = ScaledSVD(torch.eye(6), s, torch.eye(6, 8), None)
    u = LowRankUnit(g, score=2.0, svd=svd)
    values = u.quality_values([1, 2, 3, None])
    assert values == sorted(values) and values[-1] == 0.0 and values[0] < 0.0


def test_pruned_values_sum_the_importance_cut_away():
    g = WidthGroup("mlp", 4, block="mlp", producers=("a", "b"), consumers=("c",), hidden=2, full=4)
    u = MLPUnit(g, score=1.0, channel_importance=np.array([1.0, 4.0, 2.0, 3.0]))
    values = u.quality_values([1, 2, 3, None])
    scale = u.score * u.numel / 10.0
    assert values == pytest.approx([-6.0 * scale, -3.0 * scale, -1.0 * scale, 0.0])
