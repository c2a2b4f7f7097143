"""What `gac export` takes: `ExportConfig` and its `FORMATS`, checked before any work. Light (no torch): the CLI
reads FORMATS as it starts."""

from __future__ import annotations

from dataclasses import dataclass

from gac.errors import ConfigError, GacError
from gac.export.quantize import check_type

FORMATS = ("gguf", "hf", "deci")


@dataclass(frozen=True)
class ExportConfig:
    """Every default of `gac export`; the CLI passes only what the user gave."""

    model: str
    out: str
    format: str = "gguf"  # "hf": a Hugging Face directory (safetensors, config, tokenizer); "deci": DeciLM's
    type: str = "f16"
    report: str | None = None  # where to write the JSON type report (default: none)
    threads: int = 0  # quantizer threads; 0: llama.cpp's default (all cores)
    pad_mlp: bool = False  # an architecture holding one MLP width (gemma3): zero-pad every layer to the widest
    force: bool = False

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise GacError(f"unknown format {self.format!r}: use one of {', '.join(FORMATS)}")
        check_type(self.type)
        if self.format != "gguf" and (self.type != "f16" or self.report):
            raise ConfigError(
                "{type} and {report} are for {format:gguf}: a model directory keeps the weights as loaded "
                "(float32); drop them"
            )
        if self.format != "gguf" and self.pad_mlp:
            raise ConfigError(
                "{pad_mlp:True} is for {format:gguf}: a model directory keeps each layer's own MLP width; drop it"
            )
