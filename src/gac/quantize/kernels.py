"""The shape contract of vLLM's quantized linear kernels, checked before a byte is written.

Every linear vLLM builds for a saved model is listed as one rank of a tensor-parallel engine sees it (fused shards
summed, both halves of a factor pair, PaLU's per-group up-projections), from the config alone (gac.serve.layout),
and checked against the rule of the scheme's kernel on the device that will serve it. Pure: no torch, no engine.

The rules, read in vLLM's `model_executor/kernels/linear/` (K: input width per rank, N: output width per rank):
  cpu  w4a16  CPUWNA16LinearKernel    K % 32, N % 32, group even (or per channel), group divides K; else no kernel
  cpu  w8a8   CPUInt8ScaledMMLinearKernel (oneDNN)   any shape
  cuda w4a16  MarlinLinearKernel      group in {per channel, 32, 64, 128} dividing K; tiles (K % 128, N % 64)
                                      are zero-padded at load, so a misaligned shape runs on padded work
  cuda w8a8   CutlassInt8ScaledMMLinearKernel         any shape
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gac.errors import GacError
from gac.serve.layout import Projection, layer_layouts

if TYPE_CHECKING:
    from transformers import PretrainedConfig

CHANNEL = -1  # a group size of -1: one scale per output channel (compressed-tensors' channel strategy)


@dataclass(frozen=True)
class EngineLinear:
    """One linear vLLM builds, as one tensor-parallel rank holds it."""

    shards: tuple[str, ...]  # the HF modules whose weights it holds (q_proj, k_proj, v_proj of a fused qkv_proj)
    k: int  # input width per rank
    n: int  # output width per rank, shards summed
    full_k: int  # input width of the whole weight (a row-parallel linear splits it over the ranks)

    @property
    def name(self) -> str:
        """The linear as a user reads it: its one HF module, or its shards' common path with their names."""
        if len(self.shards) == 1:
            return self.shards[0]
        base = self.shards[0].rpartition(".")[0]
        return f"{base}.{{{','.join(s.rpartition('.')[2] for s in self.shards)}}}"


@dataclass(frozen=True)
class KernelRule:
    """What one quantized kernel takes; `problem` says in words why a linear does not fit, or None."""

    scheme: str
    device: str
    kernel: str
    k_multiple: int = 1
    n_multiple: int = 1
    groups: tuple[int, ...] | None = None  # the group sizes it takes (None: any even size, or per channel)
    fix: str | None = None  # the --target that makes every linear fit

    def group_problem(self, group: int) -> str | None:
        if group == CHANNEL:
            return None
        if self.groups is not None and group not in self.groups:
            sizes = ", ".join("per channel" if g == CHANNEL else str(g) for g in self.groups)
            return f"group {group} is not one {self.kernel} takes ({sizes})"
        if self.groups is None and group % 2:
            return f"group {group} is odd, and {self.kernel} takes even groups (or per channel)"
        return None

    def problem(self, linear: EngineLinear, group: int) -> str | None:
        if linear.k % self.k_multiple:
            return f"its input width K = {linear.k} is not a multiple of {self.k_multiple}"
        if linear.n % self.n_multiple:
            return f"its output width N = {linear.n} is not a multiple of {self.n_multiple}"
        if group != CHANNEL and group < linear.full_k and linear.k % group:
            return f"its input width K = {linear.k} does not split into groups of {group}"
        return None


RULES = {
    ("w4a16", "cpu"): KernelRule("w4a16", "cpu", "CPUWNA16LinearKernel", 32, 32, fix="vllm:w4a16"),
    ("w8a8", "cpu"): KernelRule("w8a8", "cpu", "CPUInt8ScaledMMLinearKernel"),
    ("w4a16", "cuda"): KernelRule(
        "w4a16", "cuda", "MarlinLinearKernel", groups=(CHANNEL, 32, 64, 128), fix="vllm:marlin"
    ),
    ("w8a8", "cuda"): KernelRule("w8a8", "cuda", "CutlassInt8ScaledMMLinearKernel"),
}
DEVICES = ("cpu", "cuda")


def rule_for(scheme: str, device: str) -> KernelRule:
    if device not in DEVICES:
        raise GacError(f"unknown serving device {device!r}: choose one of {', '.join(DEVICES)}")
    return RULES[(scheme, device)]


@dataclass(frozen=True)
class Unfit:
    linear: EngineLinear
    why: str

    def line(self, rule: KernelRule, tp: int) -> str:
        return (
            f"{self.linear.name}: {self.why}, which vLLM's {rule.device} {rule.scheme} kernel ({rule.kernel}) "
            f"needs{' per rank at tensor parallel size ' + str(tp) if tp > 1 else ''}"
        )


def unfit(linears: list[EngineLinear], rule: KernelRule, group: int) -> list[Unfit]:
    """The linears the rule's kernel refuses, each with why (the group itself is checked first: group_problem)."""
    return [Unfit(lin, why) for lin in linears if (why := rule.problem(lin, group)) is not None]


def fix_target(rule: KernelRule, tp: int) -> str | None:
    """The --target that makes every linear fit: the kernel's, composed with the tensor-parallel one."""
    if rule.fix is None:
        return None
    return f"{rule.fix},vllm:tp{tp}" if tp > 1 else rule.fix


def engine_linears(config: PretrainedConfig, tp: int = 1) -> list[EngineLinear]:
    """Every linear vLLM builds for the decoder layers of `config` (a gac output's, or an original's), per rank of
    a degree-`tp` engine, in the order of gac.serve.vllm_model: q/k/v (one fused linear when all are dense), o, the
    MLP producers (one fused linear when all are dense), the consumers. An MoE layer's experts are vLLM's FusedMoE,
    not linears (gac.quantize.targets lists them apart)."""
    out: list[EngineLinear] = []
    for lay in layer_layouts(config):
        kv_heads = lay.num_kv_heads // tp if lay.num_kv_heads % tp == 0 else 1  # fewer KV heads than ranks: replicated
        qkv_n = (lay.num_heads // tp + 2 * kv_heads) * lay.head_dim
        out += _column_block(lay.qkv, tp, fused_n=qkv_n)
        out += _row(lay.o, tp)
        if lay.producers:
            out += _column_block(lay.producers, tp, fused_n=sum(p.out_features for p in lay.producers) // tp)
            for p in lay.consumers:
                out += _row(p, tp)
    return out


def _column_block(parts: Sequence[Projection], tp: int, fused_n: int) -> list[EngineLinear]:
    """Column projections that read one input: one fused linear when all are dense, else each on its own (a
    factorized fused projection keeps the fused linear as its up-projection, at input r)."""
    if all(p.dense for p in parts):
        return [EngineLinear(tuple(p.path for p in parts), parts[0].in_features, fused_n, parts[0].in_features)]
    if len(parts) == 1 and (rank := parts[0].rank):  # one fused projection factorized whole (Phi-3)
        p = parts[0]
        return [_lin(f"{p.path}.a", p.in_features, rank), _lin(f"{p.path}.b", rank, fused_n)]
    out = []
    for p in parts:
        if p.ranks:  # PaLU: one replicated down-projection, then each KV group's up-projection (replicated)
            group_out = p.out_features // len(p.ranks)
            out.append(_lin(f"{p.path}.a", p.in_features, sum(p.ranks)))
            out += [_lin(f"{p.path}.b.{g}", r, group_out) for g, r in enumerate(p.ranks)]
        elif p.rank:
            out += [_lin(f"{p.path}.a", p.in_features, p.rank), _lin(f"{p.path}.b", p.rank, p.out_features // tp)]
        else:
            out.append(_lin(p.path, p.in_features, p.out_features // tp))
    return out


def _row(p: Projection, tp: int) -> list[EngineLinear]:
    """A row projection: its input split over the ranks (a pair: the first half row-parallel, b replicated)."""
    if p.rank:
        return [
            EngineLinear((f"{p.path}.a",), p.in_features // tp, p.rank, p.in_features),
            _lin(f"{p.path}.b", p.rank, p.out_features),
        ]
    return [EngineLinear((p.path,), p.in_features // tp, p.out_features, p.in_features)]


def _lin(name: str, k: int, n: int) -> EngineLinear:
    return EngineLinear((name,), k, n, k)
