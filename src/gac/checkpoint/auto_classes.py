"""gac's model types in transformers' Auto classes: after `import gac`, AutoConfig / AutoModelForCausalLM /
AutoModel `.from_pretrained(DIR)` build a gac output (model_type gac_<family>) with gac's own classes, without
trust_remote_code and without running the directory's modeling_gac.py (transformers prefers registered classes
to a directory's code even when trust_remote_code=True).

`import gac` stays light (no torch), while transformers' config classes import torch: so the registration runs
once transformers' AutoConfig module is imported (at once when it already is), at the end of the outermost import
of a transformers module: earlier, a module that the family's config class needs may still be half-initialized
(e.g. `from transformers import LlamaConfig` imports AutoConfig on its way). The model classes follow when a gac
config is first built (modeling_gac.register_model_classes), when no import is under way.

register() (`gac.register()`) is the explicit route: every family's config and model classes at once, for a
program that would rather not rely on the hook's timing (or runs where it was removed).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from gac.models.adapters import FAMILIES

log = logging.getLogger(__name__)

AUTO_CONFIG = "transformers.models.auto.configuration_auto"


def register() -> None:
    """Register gac's model types with transformers now: gac_<family> with AutoConfig, and its classes with
    AutoModelForCausalLM and AutoModel, for every family gac reads. Idempotent. Imports torch and each family's
    transformers modeling module, which is why `import gac` leaves this to its hook."""
    # lazy: `import gac` imports this module, and modeling_gac imports torch
    from gac.models.modeling_gac import gac_config_class, register_model_classes

    register_configs()
    for family in FAMILIES:
        register_model_classes(gac_config_class(family))


def register_configs() -> None:
    """Register model type gac_<family> with AutoConfig for every family gac reads (the model classes follow when
    a gac config is first built). Idempotent."""
    from transformers.models.auto.configuration_auto import AutoConfig

    # lazy: `import gac` imports this module, and modeling_gac imports torch
    from gac.models.modeling_gac import gac_config_class, gac_model_type

    for family in FAMILIES:
        AutoConfig.register(gac_model_type(family), gac_config_class(family), exist_ok=True)


def register_when_transformers_loads() -> None:
    """register_configs() now if transformers' AutoConfig is imported, else once it is (an import hook)."""
    if AUTO_CONFIG in sys.modules and _try_register():
        return
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def _try_register() -> bool:
    try:
        register_configs()
    except Exception as e:  # noqa: BLE001 - never break the user's import of transformers
        log.warning(
            "gac could not register its model types with transformers (%s: %s): load gac outputs with gac.load",
            type(e).__name__,
            e,
        )
        return False
    return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of every transformers module (found through the other finders) to count the imports
    under way; when the outermost one is done and AutoConfig is there, registers and leaves sys.meta_path."""

    def __init__(self) -> None:
        self.finding = False
        self.depth = 0

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if self.finding or fullname.partition(".")[0] != "transformers":
            return None
        self.finding = True  # the search below must not come back here
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _Counted(spec.loader, self)
        return spec

    def imported(self) -> None:
        """The outermost transformers import under way is done."""
        if AUTO_CONFIG not in sys.modules or self not in sys.meta_path:
            return
        sys.meta_path.remove(self)  # registering imports transformers modules too
        if not _try_register():
            sys.meta_path.insert(0, self)


class _Counted(importlib.abc.Loader):
    """The module's own loader; tells the finder when the outermost import is done."""

    def __init__(self, loader: importlib.abc.Loader, finder: _AfterImport) -> None:
        self.loader, self.finder = loader, finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.finder.depth += 1
        try:
            self.loader.exec_module(module)
        finally:
            self.finder.depth -= 1
        if self.finder.depth == 0:
            self.finder.imported()

    def __getattr__(self, name: str) -> object:  # get_source, get_filename, ...: the module's own loader answers
        return getattr(self.loader, name)
