"""A random-weight model of a transformers config, written as safetensors shards one decoder layer at a time (never
whole in memory), with the tests' byte-level tokenizer: the input of the real-size runs (an 8B-shaped model on a
24 GiB machine). Linear and embedding weights ~ N(0, 0.02), norms 1.

    python benchmarks/big_model.py --config docs/configs/llama-3-8b --dtype bfloat16 --out /tmp/llama-3-8b
    python benchmarks/big_model.py --config docs/configs/llama-3-8b --layers 2 --out /tmp/llama-3-8b-2l
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing
sys.path.insert(0, str(ROOT))


def write_random_model(config_dir: str, out: Path, *, dtype: str = "bfloat16", layers: int | None = None,
                       seed: int = 0, device: str = "cpu") -> int:
    """Write the model to `out` (config, tokenizer, shards, index); returns the bytes of weights written. `device`:
    where the random numbers are drawn (cuda: seconds instead of minutes at 8B; other numbers than the CPU's)."""
    import torch
    from accelerate import init_empty_weights
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM

    from gac.checkpoint.sharded import ShardWriter
    from gac.models.adapters import adapter_for
    from tests.helpers_tiny import tiny_tokenizer

    config = AutoConfig.from_pretrained(config_dir)
    if layers is not None:
        config.num_hidden_layers = layers
    config.torch_dtype = dtype
    with init_empty_weights():
        shapes = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    adapter = adapter_for(config)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device).manual_seed(seed)
    torch_dtype = getattr(torch, dtype)

    def tensor(name: str, shape: tuple) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return torch.ones(shape, dtype=torch_dtype)
        return (torch.randn(shape, generator=gen, device=device) * 0.02).to(torch_dtype).cpu()

    writer = ShardWriter(out)
    for i in tqdm(range(config.num_hidden_layers), desc="writing layers", unit="layer"):
        prefix = adapter.layer_prefix(i) + "."
        writer.add({k: tensor(k, s) for k, s in shapes.items() if k.startswith(prefix)})
    layers_prefix = adapter.layers_path + "."
    writer.add({k: tensor(k, s) for k, s in shapes.items() if not k.startswith(layers_prefix)})
    writer.close()
    config.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return writer.total_size


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "docs" / "configs" / "llama-3-8b"), help="a directory with config.json")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the config's)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the random numbers are drawn (cuda: much faster)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    start = time.perf_counter()
    size = write_random_model(args.config, args.out, dtype=args.dtype, layers=args.layers, seed=args.seed,
                              device=args.device)
    print(f"wrote {size / 2**30:.2f} GiB of {args.dtype} weights to {args.out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
