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


def make_compressor(name: str, **options):
    """Build the compressor `name` from its config options (validated by the config dataclass)."""
    from gac.errors import GacError

    if name not in REGISTRY:
        raise GacError(f"unknown compressor {name!r}: choose one of {', '.join(REGISTRY)}")
    module = importlib.import_module(REGISTRY[name])
    return module.COMPRESSOR(module.CONFIG(**options))
