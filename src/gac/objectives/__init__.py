"""What a run keeps (the objective axis): a parameter budget (`ratio`: gac.objectives.parameter) or a measured
latency (`speedup`: gac.objectives.latency, with its closed loop). Each objective turns a compressor's analysis into the
dims of every variant (gac.objectives.base); the registry is by name and lazy, as the compressors'."""

import importlib

# name -> module; each module defines select_dims(model, analyzed, cfg, ...) -> gac.objectives.base.Selected
OBJECTIVES = {
    "parameter": "gac.objectives.parameter",
    "latency": "gac.objectives.latency",
}


def objective_of(cfg) -> str:
    """The objective a run's config asks for: latency when it has a speedup, else parameters (its ratio)."""
    return "latency" if cfg.speedup is not None else "parameter"


def select_dims(model, analyzed, cfg, **options):
    """The dims of cfg's objective from analyzed units (gac.objectives.base.Selected); `options` are the objective's
    own (latency: loop=, a closed loop already fitted)."""
    return importlib.import_module(OBJECTIVES[objective_of(cfg)]).select_dims(model, analyzed, cfg, **options)
