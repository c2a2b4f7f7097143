"""The `experts` profile op: one mixture-of-experts layer's experts forward as transformers runs it, its fused weights
gate_up [E, 2w, H] and down [E, H, w] at expert width w, its M tokens routed to top_k experts each.

The routing is fixed, balanced and deterministic, so a sweep times the same work on every run and device: a learned
router's imbalance belongs to the model and its data, not to the kernel's cost at a width.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping

import torch

# expert widths that are not a multiple of this many channels run the eager loop in gac's models (fit below);
# modeling_gac.GROUPED_MM_ROW states it for saved models, which load without gac: a test holds the two equal
GROUPED_MM_ROW = 8

logger = logging.getLogger(__name__)


def balanced_routing(
    m: int, experts: int, top_k: int, device: torch.device | str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(index [M, top_k], weights [M, top_k]): token t to experts (t * top_k + j) % experts, j < top_k, each weighted
    1 / top_k. A token's experts are distinct (top_k <= experts), and the experts take turns: each receives
    M * top_k / experts tokens, give or take one."""
    index = (torch.arange(m, device=device)[:, None] * top_k + torch.arange(top_k, device=device)) % experts
    return index, torch.full((m, top_k), 1 / top_k, device=device, dtype=dtype)


@functools.cache
def loaded_implementation() -> str:
    """The experts implementation transformers gives a loaded MoE model: what its __init__ (from_pretrained,
    from_config) asks `get_correct_experts_implementation` for, "grouped_mm" where the class dispatches it, else
    "eager". A one-layer model on the meta device is asked (no memory); which kernel grouped_mm then calls on the
    tensors' device (torch's grouped GEMM, or transformers' per-expert loop where torch has none) is decided by
    transformers at each call."""
    import transformers

    # head_dim is taken through the config's **kwargs, which its dataclass signature leaves out
    small = transformers.Qwen3MoeConfig(  # type: ignore[call-arg]
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        moe_intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=2,
        num_experts_per_tok=1,
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(small)
    return model.config._experts_implementation


class ExpertsKernel:
    """Calls (x [M, H], gate_up [E, 2w, H], down [E, H, w]) -> [M, H]: transformers' Qwen3-MoE experts module (the
    fused layout gac reads; Mixtral's class is the same), held on the meta device and run on the given weights by
    torch.func.functional_call, with the implementation a loaded model gets (`loaded_implementation`; see `fit`)."""

    def __init__(
        self, m: int, dim: int, shape: Mapping[str, int], device: torch.device | str, dtype: torch.dtype
    ) -> None:
        import transformers
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

        config = transformers.Qwen3MoeConfig(
            hidden_size=shape["hidden"],
            moe_intermediate_size=dim,
            num_experts=shape["experts"],
            num_experts_per_tok=shape["top_k"],
        )
        config._experts_implementation = loaded_implementation()
        self.config = config  # the module's own (transformers' experts hold the config they were built with)
        with torch.device("meta"):
            self.module = Qwen3MoeExperts(config)
        self.names = tuple(name for name, _ in self.module.named_parameters())  # gate_up, then down, as declared
        self.routing = balanced_routing(m, shape["experts"], shape["top_k"], device, dtype)

    @property
    def implementation(self) -> str:
        return self.config._experts_implementation

    def fit(self, args: tuple) -> str:
        """The implementation that runs these inputs: the eager loop at a width gac's models run that way
        (gac.models.modeling_gac.fit_experts_implementation: any width not a multiple of GROUPED_MM_ROW channels, in
        float32 too), else the loaded model's, tried once, or the eager loop where that one refuses them (torch's
        grouped GEMM and expert rows that are not 16 bytes)."""
        if args[-1].shape[-1] % GROUPED_MM_ROW:
            self.config._experts_implementation = "eager"
            return self.implementation
        try:
            with torch.inference_mode():
                self(*args)
        except RuntimeError as e:
            logger.info("experts at width %d: %s: timing the eager loop", args[-1].shape[-1], str(e).splitlines()[0])
            self.config._experts_implementation = "eager"
        return self.implementation

    def __call__(self, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.module, dict(zip(self.names, (gate_up, down))), (x, *self.routing))
