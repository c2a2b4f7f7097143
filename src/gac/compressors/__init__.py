"""Compressors: one module per method, each a frozen config (what it is asked) and a handler (what compresses by it)
behind one small interface (base.py). The config's type chooses its handler (HANDLERS, compressor_for); a name
chooses the config (REGISTRY, config_for: the CLI's `--compressor` and report.json's "compressor")."""

from gac.compressors.asvd import ASVDCompressor, ASVDConfig
from gac.compressors.base import Compressor
from gac.compressors.config import AUTO, AutoConfig, CompressorConfig
from gac.compressors.palu import PaluCompressor, PaluConfig
from gac.compressors.prune import PruneCompressor, PruneConfig
from gac.compressors.svd import SVDCompressor, SVDConfig
from gac.compressors.svd_llm import SVDLLMCompressor, SVDLLMConfig
from gac.errors import GacError

# config type -> its handler, in `--compressor`'s order
HANDLERS: dict[type[CompressorConfig], type[Compressor]] = {
    SVDConfig: SVDCompressor,
    ASVDConfig: ASVDCompressor,
    SVDLLMConfig: SVDLLMCompressor,
    PruneConfig: PruneCompressor,
    PaluConfig: PaluCompressor,
}
REGISTRY: dict[str, type[CompressorConfig]] = {config.name: config for config in HANDLERS}  # name -> config type

# `--compressor auto` (gac.pipelines.auto): each of these analyzed at its defaults, the best measured one kept. Plain
# svd is not among them: it is asvd at alpha 0 scored by weight magnitude, with no loss model to predict its quality by.
AUTO_CANDIDATES = ("asvd", "svd_llm", "palu", "prune")
AUTO_BUILT = 2  # of them, built (under --speedup run through the closed loop) and measured, best predicted first
CHOICES = (*REGISTRY, AUTO)  # what --compressor accepts


def config_for(name: str, **options: object) -> CompressorConfig:
    """The config of the compressor `name` with `options` set (each checked by the config; one it does not have is
    refused in one line); "auto": AutoConfig, which takes none."""
    if name == AUTO:
        return AutoConfig.from_options(**options)
    if name not in REGISTRY:
        raise GacError(f"unknown compressor {name!r}: choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name].from_options(**options)


def compressor_for(config: CompressorConfig) -> Compressor:
    """The handler registered for the config's type, built from it."""
    handler = HANDLERS.get(type(config))
    if handler is None:
        raise TypeError(f"no compressor is registered for {type(config).__name__}: add it to HANDLERS")
    return handler(config)


def make_compressor(name: str, **options: object) -> Compressor:
    """The compressor `name` built from its config options (validated by its config)."""
    return compressor_for(config_for(name, **options))


def candidates_of(name: str) -> tuple[str, ...]:
    """The compressors a run with `--compressor name` may build: auto's candidates, else the one named."""
    return AUTO_CANDIDATES if name == AUTO else (name,)


__all__ = [
    "AUTO",
    "AUTO_BUILT",
    "AUTO_CANDIDATES",
    "CHOICES",
    "HANDLERS",
    "REGISTRY",
    "ASVDConfig",
    "AutoConfig",
    "Compressor",
    "CompressorConfig",
    "PaluConfig",
    "PruneConfig",
    "SVDConfig",
    "SVDLLMConfig",
    "candidates_of",
    "compressor_for",
    "config_for",
    "make_compressor",
]
