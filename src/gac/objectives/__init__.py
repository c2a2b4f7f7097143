"""What a run keeps (the objective axis): a parameter budget (`ratio`: gac.objectives.parameter) or a measured
latency (`speedup`: gac.objectives.latency, with its closed loop). Each is one gac.objectives.base.Objective, registered
here by name: it turns a compressor's analysis into the dims of every variant and answers every choice a run makes
differently under it. A run's is its config's (`CompressConfig.objective`, objective_for)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gac.errors import ConfigError
from gac.objectives.base import Analyzed, Objective, RunConfig, Selected
from gac.objectives.latency import LATENCY
from gac.objectives.parameter import PARAMETER

if TYPE_CHECKING:
    from torch import nn

# name -> the objective (both modules are light: config.py imports their settings anyway)
OBJECTIVES: dict[str, Objective[Any]] = {o.name: o for o in (PARAMETER, LATENCY)}


def objective_for(cfg: RunConfig) -> Objective[Any]:
    """The objective a run's config asks for: latency where it gives a speedup, else parameters (its ratio, a default
    where none is given); a ConfigError where it gives both."""
    if cfg.speedup is not None and cfg.ratio is not None:
        raise ConfigError(
            "{speedup} and {ratio} exclude each other ({ratio} is for the parameter objective): give one of them"
        )
    return OBJECTIVES[LATENCY.name if cfg.speedup is not None else PARAMETER.name]


def select_dims(model: nn.Module, analyzed: Analyzed, cfg: RunConfig) -> Selected[Any]:
    """The dims of cfg's objective from analyzed units (objective_for(cfg).select_dims)."""
    return objective_for(cfg).select_dims(model, analyzed, cfg)
