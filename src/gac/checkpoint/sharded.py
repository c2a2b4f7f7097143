"""Weights written as they become final, as transformers' sharded safetensors: one shard per `add` (a decoder layer,
then the rest), renamed model-0000k-of-0000n.safetensors on close, with model.safetensors.index.json. Lets the
layer-by-layer pipeline save a model that never exists whole in memory; the files are those `save_pretrained`
writes (same names, same index), so transformers and `gac.load` read them as usual."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gac.checkpoint.lazy import SAFE_INDEX
from gac.io.atomic import new_file_mode


class ShardWriter:
    """Collects shards in directory `d` (normally an atomic_dir's temporary directory)."""

    def __init__(self, d: str | Path) -> None:
        self.d = Path(d)
        self.parts: list[tuple[Path, list[str]]] = []
        self.total_size = 0

    def add(self, tensors: dict) -> None:
        """Write {name: tensor} as the next shard (tensors sharing storage, e.g. tied weights, written once)."""
        from safetensors.torch import save_file

        unique, seen = {}, set()
        for name, t in tensors.items():
            if t.device.type == "meta":
                raise ValueError(f"{name} is on the meta device: nothing to write")
            key = (t.data_ptr(), t.dtype, tuple(t.shape))
            if key not in seen:
                seen.add(key)
                unique[name] = t.detach().contiguous()
        if not unique:
            return
        path = self.d / f"part-{len(self.parts):05d}.safetensors"
        save_file(unique, str(path), metadata={"format": "pt"})
        os.chmod(path, new_file_mode())  # safetensors writes 0600: a saved model's files are readable as usual
        self.parts.append((path, list(unique)))
        self.total_size += sum(t.numel() * t.element_size() for t in unique.values())

    def close(self) -> list[Path]:
        """Rename the shards to transformers' names and write the index; returns the shard paths."""
        n = len(self.parts)
        weight_map, paths = {}, []
        for k, (path, names) in enumerate(self.parts, start=1):
            final = self.d / f"model-{k:05d}-of-{n:05d}.safetensors"
            path.rename(final)
            paths.append(final)
            weight_map.update(dict.fromkeys(names, final.name))
        index = {"metadata": {"total_size": self.total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (self.d / SAFE_INDEX).write_text(json.dumps(index, indent=2))
        return paths
