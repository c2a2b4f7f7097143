"""The layer rules of src/gac: which package may import which. tests/test_layers.py enforces them on the code,
tests/test_design.py checks that docs/DESIGN.md states the same table."""

# leaves, below every layer: they import nothing of gac's but each other
LEAVES = {"gac.io", "gac.distributed", "gac.errors"}
# the top, unchecked: the package's root (which anything may import for __version__), the CLI and `python -m gac`
ABOVE = {"gac", "gac.cli", "gac.__main__"}
# layer -> packages/modules it may import (besides itself, the leaves and the root gac)
ALLOWED = {
    "gac.hw": set(),
    "gac.calibration": set(),
    "gac.models": {"gac.hw"},
    "gac.checkpoint": {"gac.hw", "gac.models"},
    "gac.align": {"gac.hw", "gac.models"},
    "gac.compressors": {"gac.hw", "gac.models", "gac.calibration"},
    "gac.evaluate": {"gac.hw", "gac.models", "gac.checkpoint"},
    "gac.serve": {"gac.hw", "gac.models", "gac.checkpoint"},
    "gac.quantize": {"gac.hw", "gac.models", "gac.checkpoint", "gac.calibration", "gac.serve"},
    "gac.export": {"gac.hw", "gac.models", "gac.checkpoint", "gac.compressors"},
    "gac.repair": {"gac.hw", "gac.models", "gac.checkpoint", "gac.align", "gac.evaluate"},
    "gac.heal": {"gac.hw", "gac.models", "gac.checkpoint", "gac.calibration", "gac.evaluate"},
    # the objective axis: what a run keeps (a parameter budget, or a measured latency with its closed loop)
    "gac.objectives": {"gac.hw", "gac.models", "gac.align", "gac.compressors", "gac.evaluate"},
    "gac.config": {"gac.hw", "gac.calibration", "gac.align", "gac.compressors", "gac.evaluate", "gac.objectives",
                   "gac.heal", "gac.quantize"},
    # the pipeline axis: how a run reads, analyzes, cuts and writes a model (whole, or layer by layer)
    "gac.pipelines": {"gac.hw", "gac.calibration", "gac.models", "gac.checkpoint", "gac.align", "gac.compressors",
                      "gac.evaluate", "gac.objectives", "gac.heal", "gac.quantize", "gac.config"},
    "gac.api": {"gac.config", "gac.pipelines"},
    **{leaf: set() for leaf in LEAVES},
}
