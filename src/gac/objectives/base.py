"""The objective interface: what an objective selects from (Analyzed: a compressor's calibrated units) and what it
chose (Selected: the dims of every variant). An objective is a module with

    select_dims(model, analyzed: Analyzed, cfg) -> Selected

registered in gac.objectives.OBJECTIVES; the pipelines analyze, the objective selects, the pipelines cut."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

    from gac.align.plan import SelectionResult
    from gac.compressors.base import Compressor, Unit
    from gac.objectives.latency.outcome import LatencyOutcome


@dataclass
class Analyzed:
    """The compressor's calibrated units: what every objective and ratio selects from."""

    compressor: Compressor
    units: list[Unit]  # the compressor's units, one per dimension group
    names: list[str]  # the linears the units cover: params and alignment are measured over these
    compressible: int
    windows: torch.Tensor | None  # held-back calibration windows [n, seq] the guard compares on (None: no guard)


@dataclass
class Selected(Analyzed):
    """What the compressor found and GAC chose; models are cut later, except those the selection built itself."""

    budget: int
    dims: dict  # variant ("unaligned", "gac") -> {unit name: dim or None}
    selection: SelectionResult | LatencyOutcome  # the parameter objective's, or the latency objective's closed loop's
    profile_excluded: dict | None = None  # {unit name: {dim: reason}}: aligned dims the profile ruled out
    target: dict | None = None  # report.json's "target": which dims the deployment target constrained, and why
    built: dict[str, nn.Module] = field(default_factory=dict)  # {variant: model} already cut at its dims (the closed
    # loop's kept one)
