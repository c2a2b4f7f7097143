"""Weights brought in one decoder layer at a time: a model directory's safetensors read lazily (memory-mapped, by
tensor name), into a skeleton built on the meta device by accelerate; or a model already whole in memory.

Both sources answer the same two calls, so the layer-wise pipeline never knows which it has:
  load_layer(i)     the layer's weights, on the source's `device` (the CPU or a GPU), in the working dtype
  release_layer(i)  back to the meta device (memory freed); a resident model keeps its weights
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gac.checkpoint import verify
from gac.checkpoint.loading import load_model
from gac.checkpoint.placement import input_device
from gac.checkpoint.verify import SAFE_INDEX
from gac.checkpoint.verify import SAFETENSORS as SAFE_SINGLE
from gac.errors import GacError
from gac.hw.device import check_device, torch_dtype
from gac.hw.heap import map_large_allocations, return_freed_memory
from gac.models.adapters import LayerModules, adapter_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


class Resident:
    """A model already loaded whole: every layer is there; loading and releasing are no-ops."""

    lazy = False

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = input_device(model)

    def load_layer(self, i: int) -> None:
        pass

    def release_layer(self, i: int) -> None:
        pass


def weight_files(path: str | Path) -> dict[str, Path]:
    """{tensor name: safetensors file} of a model directory (sharded with an index, or one file)."""
    d = Path(path)
    if (d / SAFE_INDEX).is_file():
        index = json.loads((d / SAFE_INDEX).read_text())
        return {name: d / file for name, file in index["weight_map"].items()}
    if (d / SAFE_SINGLE).is_file():
        from safetensors import safe_open

        with safe_open(d / SAFE_SINGLE, "pt") as f:
            return dict.fromkeys(f.keys(), d / SAFE_SINGLE)
    raise GacError(
        f"{d} has no safetensors weights ({SAFE_SINGLE} or {SAFE_INDEX}): layer-by-layer loading reads "
        "safetensors only; convert the checkpoint, or load it whole"
    )


class LazyCheckpoint:
    """A model directory read layer by layer onto `device`: embeddings, final norm and head loaded at once, each
    decoder layer's weights only between load_layer and release_layer (streamed from the memory-mapped files)."""

    lazy = True

    def __init__(self, path: str | Path, dtype: str = "float32", device: str = "cpu") -> None:
        import torch
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM

        self.path = Path(path)
        self.dtype = torch_dtype(dtype)
        self.device = torch.device(device)
        config = AutoConfig.from_pretrained(self.path)
        self.adapter = adapter_for(config)
        self.files = weight_files(self.path)
        self.keys = {self.adapter.model_name(k): k for k in self.files}  # model name -> checkpoint tensor name
        # before the empty model: init_empty_weights allocates each parameter (untouched) before moving it to meta,
        # and under glibc's dynamic threshold these blocks would grow the heap by about a layer's weights per layer
        map_large_allocations()
        with init_empty_weights():  # parameters on meta; buffers (rotary frequencies) real
            self.model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=self.dtype)
        self.model.eval()
        for module in self.model.modules():  # the real buffers onto the device (parameters stay on meta)
            for name, b in module._buffers.items():
                if b is not None and b.device.type != "meta":
                    module._buffers[name] = b.to(self.device)
        layers = self.adapter.layers_path + "."
        self._load([n for n in self.keys if not n.startswith(layers)])
        self.model.tie_weights()
        missing = [n for n, p in self.model.named_parameters() if p.device.type == "meta" and not n.startswith(layers)]
        if missing:
            raise GacError(
                f"{self.path}: no weights for {missing[0]} in the safetensors files: the checkpoint is "
                "incomplete or of another architecture"
            )

    def _load(self, names: list[str]) -> None:
        from accelerate.utils import set_module_tensor_to_device
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for n in names:
            by_file.setdefault(self.files[self.keys[n]], []).append(n)
        known = {n for n, _ in self.model.named_parameters(remove_duplicate=False)}
        known |= {n for n, _ in self.model.named_buffers()}
        for file, keys in by_file.items():
            with safe_open(file, "pt", device="cpu") as f:
                for key in keys:
                    if key not in known:
                        continue  # e.g. a saved rotary buffer the model recomputes
                    set_module_tensor_to_device(
                        self.model, key, self.device, value=f.get_tensor(self.keys[key]), dtype=self.dtype
                    )

    def load_layer(self, i: int) -> None:
        prefix = self.adapter.layer_prefix(i) + "."
        self._load([n for n in self.keys if n.startswith(prefix)])
        self._load_fused_experts(self.adapter.layer(self.model.config, i))
        layer = self.model.get_submodule(prefix[:-1])
        missing = [n for n, p in layer.named_parameters() if p.device.type == "meta"]
        if missing:
            raise GacError(
                f"{self.path}: no weights for {prefix}{missing[0]} in the safetensors files: the "
                "checkpoint is incomplete or of another architecture"
            )

    def _load_fused_experts(self, layer: LayerModules) -> None:
        """An MoE layer's fused expert weights from a checkpoint that stores them per expert (as Hugging Face's do):
        each expert's tensors concatenated (gate and up rows), the experts stacked, as transformers fuses them."""
        import torch
        from accelerate.utils import set_module_tensor_to_device
        from safetensors import safe_open

        if not layer.experts:
            return
        num_experts = self.adapter.expert_geometry(self.model.config)[0]
        for fused, per_expert in self.adapter.expert_checkpoint_names(layer, num_experts).items():
            if fused in self.keys or any(n not in self.files for parts in per_expert for n in parts):
                continue  # stored fused (loaded above), or not at all (load_layer names what is missing)
            tensors = []
            for parts in per_expert:
                loaded = []
                for n in parts:
                    with safe_open(self.files[n], "pt", device="cpu") as f:
                        loaded.append(f.get_tensor(n))
                tensors.append(torch.cat(loaded, dim=0))  # [2I, H] (gate rows, then up) or [H, I]
            set_module_tensor_to_device(self.model, fused, self.device, value=torch.stack(tensors), dtype=self.dtype)

    def release_layer(self, i: int) -> None:
        from accelerate.utils import set_module_tensor_to_device

        prefix = self.adapter.layer_prefix(i)
        for name, _ in list(self.model.get_submodule(prefix).named_parameters()):
            set_module_tensor_to_device(self.model, f"{prefix}.{name}", "meta")
        return_freed_memory()


def open_source(
    spec: str, *, dtype: str = "float32", device: str = "cpu"
) -> tuple[Resident | LazyCheckpoint, PreTrainedTokenizerBase | None, str]:
    """(weight source, tokenizer, model name) for the layer-by-layer pipeline: a safetensors model directory is
    read lazily (LazyCheckpoint, checked as a whole load would be), anything else (alias, .gguf) loaded whole."""
    path = Path(spec).expanduser()
    if not (path.is_dir() and (path / "config.json").is_file() and _has_safetensors(path)):
        loaded = load_model(spec, dtype=dtype, device=device)
        return Resident(loaded.model), loaded.tokenizer, loaded.source
    check_device(device)
    from transformers import AutoTokenizer

    verify.check_weight_files(path)
    source = LazyCheckpoint(path, dtype, device)
    verify.check_config(source.model.config, spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise GacError(f"no usable tokenizer for {spec!r}: put the tokenizer files beside the weights") from e
    verify.check_tokenizer_fits(source.model, tokenizer, spec)
    return source, tokenizer, spec


def _has_safetensors(d: Path) -> bool:
    return (d / SAFE_INDEX).is_file() or (d / SAFE_SINGLE).is_file()
