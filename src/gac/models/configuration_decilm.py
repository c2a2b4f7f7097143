"""The DeciLM (Nemotron-NAS) configuration that gac writes beside a pruned Llama-layout model (`gac export --format
deci`): Llama's configuration plus `block_configs`, one entry a layer, `{"attention": {...}, "ffn": {...}}`.

Self-contained on purpose: it imports transformers only, never gac, and travels with the model (config.json's
auto_map names `configuration_decilm.DeciLMConfig`). The engines that read DeciLM ask each block as an object
(`block_config.ffn.ffn_mult`, `block_config.attention.n_heads_in_group`, `.no_op`, `.replace_with_linear`), so each
entry is held as one, with exactly the keys the file has (`hasattr(block.ffn, "ffn_mult")` says which width rule a
layer uses), and written back as the same dicts.

A layer's MLP width is `find_multiple(int(2 * ffn_mult * hidden / 3), 256)` where its ffn entry has `ffn_mult`
(every engine reads that), else its `intermediate_size` (vLLM, transformers); its KV heads are
`num_attention_heads // n_heads_in_group`, its query heads the model's.
"""

from typing import Any

from transformers import LlamaConfig

FFN_MULTIPLE = 256  # the MLP widths an ffn_mult gives are rounded up to a multiple of this


def find_multiple(n: int, k: int) -> int:
    """The least multiple of k at or above n."""
    return n if n % k == 0 else n + k - n % k


def ffn_mult_width(ffn_mult: float, hidden_size: int) -> int:
    """The MLP width DeciLM's engines build for a layer of `ffn_mult` in a model of `hidden_size`."""
    return find_multiple(int(2 * ffn_mult * hidden_size / 3), FFN_MULTIPLE)


class BlockPart:
    """A block's attention or ffn entry: each key of its dict an attribute (only the keys it has)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:  # only for a key the entry lacks: hasattr() is then False
        raise AttributeError(name)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockPart) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"BlockPart({self.to_dict()})"


class BlockConfig:
    """One layer's block: `attention` and `ffn` as BlockPart objects (other keys kept as they are)."""

    def __init__(self, attention: dict, ffn: dict, **rest: Any) -> None:
        self.attention = BlockPart(**attention)
        self.ffn = BlockPart(**ffn)
        self.rest = rest

    def mlp_width(self, hidden_size: int) -> int:
        if hasattr(self.ffn, "ffn_mult"):
            return ffn_mult_width(self.ffn.ffn_mult, hidden_size)
        return int(self.ffn.intermediate_size)

    def kv_heads(self, num_attention_heads: int) -> int:
        return num_attention_heads // int(self.attention.n_heads_in_group)

    def plain(self) -> bool:
        """Attention and MLP both present and neither replaced by a linear: the blocks gac writes and builds."""
        parts = (self.attention, self.ffn)
        return not any(getattr(p, "no_op", False) or getattr(p, "replace_with_linear", False) for p in parts)

    def to_dict(self) -> dict:
        return {"attention": self.attention.to_dict(), "ffn": self.ffn.to_dict(), **self.rest}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockConfig) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"BlockConfig({self.to_dict()})"


class DeciLMConfig(LlamaConfig):
    """Llama's configuration with a block a layer; `intermediate_size` and `num_key_value_heads` stay the unpruned
    model's (what a layer without a block of its own would have)."""

    model_type = "nemotron-nas"
    block_configs: list | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        blocks = self.block_configs or []
        self.block_configs = [b if isinstance(b, BlockConfig) else BlockConfig(**b) for b in blocks]
        super().__post_init__(**kwargs)
        if self.block_configs and len(self.block_configs) != self.num_hidden_layers:
            raise ValueError(
                f"block_configs has {len(self.block_configs)} entries for {self.num_hidden_layers} layers: "
                "restore config.json"
            )

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["block_configs"] = [b.to_dict() for b in self.block_configs or []]
        return out


__all__ = ["BlockConfig", "BlockPart", "DeciLMConfig", "ffn_mult_width", "find_multiple"]
