"""What every compressor's config shares (CompressorConfig), and auto's (AutoConfig). A compressor's config is a
frozen dataclass named for it, in the compressor's own module, owning its options and checking them; its type alone
chooses the handler that compresses by it (gac.compressors.compressor_for), as torchao's quantize_ dispatches on its
config's type."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from gac.errors import ConfigError

AUTO = "auto"  # `--compressor auto`: AutoConfig's name
C = TypeVar("C", bound="CompressorConfig")


class CompressorConfig:
    """A compressor's options: subclasses are frozen dataclasses, each field an option (what `--alpha` and the other
    compressor flags set), checked in their own __post_init__ with a one-line error."""

    name: ClassVar[str]  # the compressor's name: `--compressor`, report.json's "compressor"
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # every subclass is a dataclass
    # the importance proxy (gac.calibration.importance), or None for the compressor's own: each config declares it
    # as a field with its own default
    importance: str | None

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_options(cls: type[C], **options: Any) -> C:
        """The config with `options` (by field name) set: one not among its fields refused in one line."""
        cls._check_names(options)
        return cls(**options)

    def with_options(self: C, **options: Any) -> C:
        """This config with `options` set over its own, checked as from_options checks them."""
        self._check_names(options)
        return dataclasses.replace(self, **options) if options else self

    @classmethod
    def _check_names(cls, options: dict[str, Any]) -> None:
        for key in options:
            if key not in cls.option_names():
                raise ConfigError(f"{{{key}}} does not apply to {{compressor:{cls.name}}}: leave it out")

    def options(self) -> dict[str, Any]:
        """The options set away from their defaults: what rebuilds this config from its name."""
        default = type(self)()
        return {k: v for k, v in dataclasses.asdict(self).items() if getattr(default, k) != v}

    def to_dict(self) -> dict[str, Any]:
        """Its name and every option (gac_plan.json's "compressor")."""
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class AutoConfig(CompressorConfig):
    """`--compressor auto`: every candidate compressor (gac.compressors.AUTO_CANDIDATES) at its defaults, the best
    measured kept (gac.pipelines.auto). It takes no options and has no handler of its own."""

    name: ClassVar[str] = AUTO
    importance: None = dataclasses.field(default=None, init=False, repr=False)

    @classmethod
    def _check_names(cls, options: dict[str, Any]) -> None:
        if options:
            raise ConfigError(
                f"compressor options ({', '.join(sorted(options))}) apply to only some compressors, and "
                "{compressor:auto} compares each at its defaults: drop them, or name one compressor"
            )
