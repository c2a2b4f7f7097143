"""gac: GPU-Aligned Compression. Compress, then pick hardware-aligned dims under the same parameter budget.

Public verbs (imported lazily so `import gac` stays light): compress, select, load, save, profile, bench,
repair_dir (named apart from the `gac.repair` package), heal_dir, inspect_model and register.

Importing gac also registers gac's model types with transformers' Auto classes (when transformers loads them), so
that AutoModelForCausalLM.from_pretrained(DIR) builds a gac output without trust_remote_code; gac.register() does
the same at once, explicitly.
"""

__version__ = "0.1.0"

import importlib
from typing import Any

from gac.checkpoint.auto_classes import register_when_transformers_loads

_EXPORTS = {
    "select": "gac.align.plan",
    "compress": "gac.api",
    "load": "gac.checkpoint.gac_dir",
    "save": "gac.checkpoint.gac_dir",
    "profile": "gac.hw.profile",
    "bench": "gac.evaluate.bench",
    "repair_dir": "gac.repair",
    "heal_dir": "gac.heal",
    "inspect_model": "gac.models.dims",
    "register": "gac.checkpoint.auto_classes",
}


def __getattr__(name: str) -> Any:  # one of the verbs above
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gac' has no attribute {name!r}")


register_when_transformers_loads()
