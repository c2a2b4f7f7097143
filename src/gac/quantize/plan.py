"""What a quantization run will do, decided from the config alone before any weight is touched: every linear vLLM
will build, checked against the kernel's rule; the linears left unquantized (compressed-tensors `ignore`: the
output head, and the linears the kernel refuses under --skip-unfit) and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gac.errors import ConfigError, GacError, literal
from gac.models.adapters import adapter_for
from gac.quantize.kernels import EngineLinear, KernelRule, Unfit, engine_linears, fix_target, rule_for, unfit
from gac.quantize.schemes import QuantizeConfig
from gac.serve.layout import check_tensor_parallel, layer_layouts

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig

HEAD = "lm_head"  # the output head: kept in the model's dtype, as every compressed-tensors recipe does
# Neither way out holds: llm-compressor quantizes experts only unfused, one linear each at the config's one width (a
# pruned expert width breaks it), and experts left unquantized beside quantized attention are a checkpoint vLLM
# serves but transformers' compressed-tensors loader cannot read (it takes every expert as quantized)
MOE_REFUSED = (
    "quantizing a mixture of experts is not supported yet: llm-compressor quantizes experts only at the "
    "config's one width, and with the experts left unquantized transformers cannot load the checkpoint; "
    "serve this model unquantized (gac serve-check), or quantize a dense model"
)


@dataclass
class QuantPlan:
    cfg: QuantizeConfig
    rule: KernelRule
    linears: list[EngineLinear]
    unfit: list[Unfit]
    ignore: list[str]  # compressed-tensors `ignore`: module names left unquantized

    @property
    def quantized(self) -> list[EngineLinear]:
        left = {u.linear for u in self.unfit}
        return [lin for lin in self.linears if lin not in left]

    def report(self) -> dict:
        """quantize.json's "plan": the rule, every linear with its K, N and whether it is quantized, and why not."""
        why = {u.linear: u.why for u in self.unfit}
        return {
            "rule": {
                "device": self.rule.device,
                "kernel": self.rule.kernel,
                "k_multiple": self.rule.k_multiple,
                "n_multiple": self.rule.n_multiple,
                "tp": self.cfg.tp,
            },
            "linears": [
                {
                    "name": lin.name,
                    "shards": list(lin.shards),
                    "k": lin.k,
                    "n": lin.n,
                    "quantized": lin not in why,
                    **({"why_not": why[lin]} if lin in why else {}),
                }
                for lin in self.linears
            ],
            "quantized": len(self.quantized),
            "unquantized": len(self.unfit),
            "ignore": list(self.ignore),
        }


def plan(config: PretrainedConfig, cfg: QuantizeConfig) -> QuantPlan:
    """The plan for a model of `config`; raises one GacError when the scheme's kernel refuses a linear (unless
    cfg.skip_unfit) or the group itself."""
    if adapter_for(config).layout.experts:
        raise GacError(MOE_REFUSED)
    rule = rule_for(cfg.scheme, cfg.device)
    group = cfg.group if cfg.group is not None else -1
    if (why := rule.group_problem(group)) is not None:
        raise ConfigError(f"{literal(why)}: pass {{group:32}} (or another group the kernel takes)")
    check_tensor_parallel(layer_layouts(config), cfg.tp)
    linears = engine_linears(config, cfg.tp)
    refused = unfit(linears, rule, group)
    if refused and not cfg.skip_unfit:
        first = refused[0].line(rule, cfg.tp)
        more = f" (and {len(refused) - 1} more linears)" if len(refused) > 1 else ""
        target = fix_target(rule, cfg.tp)
        raise ConfigError(
            f"{literal(first)}{more}: compress with {{target:{literal(target)}}} so every linear fits, or pass "
            "{skip_unfit:True} to leave such linears unquantized"
        )
    return QuantPlan(cfg, rule, linears, refused, [HEAD] + [s for u in refused for s in u.linear.shards])


def check_covers(plan: QuantPlan, model: nn.Module) -> None:
    """Every linear compressed-tensors will quantize in the live model is one vLLM builds (the plan's), so the
    checkpoint holds no quantized tensor vLLM would not read, nor a dense one it would."""
    from torch import nn

    live = {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in plan.ignore}
    known = {s for lin in plan.quantized for s in lin.shards}
    if live != known:
        name = sorted(live ^ known)[0]
        raise GacError(
            f"{name}: the model's linears and those vLLM builds for its config differ there, so vLLM "
            "would not read the checkpoint: restore the model's structure (re-run `gac compress`), or "
            "quantize a model of a family gac serves"
        )
