"""Compressors: one module per method behind one small interface (see base.py). Registry by name, lazy."""

import importlib

# name -> module; each module defines CONFIG (a frozen dataclass) and COMPRESSOR (its handler class).
REGISTRY = {
    "svd": "gac.compressors.svd",
    "asvd": "gac.compressors.asvd",
    "svd_llm": "gac.compressors.svd_llm",
    "prune": "gac.compressors.prune",
    "palu": "gac.compressors.palu",
}

# `--compressor auto` (gac.pipelines.auto): each of these analyzed at its defaults, the best measured one kept. Plain
# svd is not among them: it is asvd at alpha 0 scored by weight magnitude, with no loss model to predict its quality by.
AUTO = "auto"
AUTO_CANDIDATES = ("asvd", "svd_llm", "palu", "prune")
AUTO_BUILT = 2  # of them, built (under --speedup run through the closed loop) and measured, best predicted first
CHOICES = (*REGISTRY, AUTO)  # what --compressor accepts


def candidates_of(name: str) -> tuple[str, ...]:
    """The compressors a run with `--compressor name` may build: auto's candidates, else the one named."""
    return AUTO_CANDIDATES if name == AUTO else (name,)


def make_compressor(name: str, **options):
    """Build the compressor `name` from its config options (validated by the config dataclass)."""
    from gac.errors import GacError

    if name not in REGISTRY:
        raise GacError(f"unknown compressor {name!r}: choose one of {', '.join(REGISTRY)}")
    module = importlib.import_module(REGISTRY[name])
    return module.COMPRESSOR(module.CONFIG(**options))
