"""Repair a compressed model: zero-pad every irregular low-rank rank and MLP width to an aligned size, in place.

What is padded (exact: the model computes the same function, see gac.models.padding):
  - the inner rank of every LowRankLinear (A gets zero rows, B zero columns);
  - the MLP intermediate width of each layer whose width is irregular (gate/up rows, down columns, together; in an
    MoE layer, every expert's).
What is not padded, on purpose: the attention head_dim and head widths (a zero-padded head_dim changes the
softmax scale 1/sqrt(head_dim) and the head reshape, so the function itself would change), and the hidden size
(RMSNorm averages over it). Those dims are listed in the result as left misaligned when they are.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from gac.align.profiled import profile_candidates
from gac.checkpoint.gac_dir import check_out_dir, is_gac_dir, plan_record, read_plan, save
from gac.checkpoint.loading import load_model
from gac.errors import GacError
from gac.evaluate.latency import LatencyConfig, prefill_timings
from gac.hw.cliffs import latency_table
from gac.hw.profile import load_profile
from gac.io import validate
from gac.models import surgery
from gac.models.adapters import adapter_for, attention_geometry, text_config
from gac.models.dims import inspect_model, linear_dims
from gac.models.groups import DimGroup, groups_of, is_grouped_lowrank
from gac.models.padding import next_multiple
from gac.models.structure import structure_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from gac.models.kinds.base import ChannelGroup

log = logging.getLogger(__name__)

STRATEGIES = {"minimal": 8, "optimal": 16}  # strategy -> alignment
PROFILE_WINDOW = 4  # aligned sizes above d a profile may choose among
PROFILE_TOLERANCE = 0.02  # a larger size must be this much faster (relative) to be worth its extra parameters
PROFILE_M = 512  # token count whose measured table drives the choice (prefill)
CHECK_TOKENS = 64  # tokens of the logits check in repair_dir


@dataclass(frozen=True)
class DimChange:
    name: str  # module name (a LowRankLinear for "rank", the layer's mlp for "mlp_width")
    kind: str  # "rank" | "mlp_width"
    layer: int | None
    before: int
    after: int


@dataclass
class RepairResult:
    structure: dict  # the new config.gac_structure
    alignment: int
    strategy: str | None
    dims: list[DimChange]  # every dim repair considered, changed or not
    overhead: dict  # params_before/after/added, params_added_pct, bytes_added, compressible_params_*
    left_misaligned: list[dict] = field(default_factory=list)  # dims repair does not pad (head_dim, hidden...)
    profile: str | None = None

    @property
    def changed(self) -> list[DimChange]:
        return [d for d in self.dims if d.after != d.before]

    def to_json(self) -> dict:
        return {
            "alignment": self.alignment,
            "strategy": self.strategy,
            "profile": self.profile,
            "dims": [asdict(d) for d in self.dims],
            "changed": len(self.changed),
            "overhead": self.overhead,
            "left_misaligned": self.left_misaligned,
        }


@dataclass
class RepairOutput:
    out: Path
    result: RepairResult
    report: dict  # the content of repair.json


def resolve_alignment(align: int | None, strategy: str | None) -> int:
    """--align wins when given; else the strategy's alignment (minimal 8, optimal 16); neither: 8."""
    if strategy is not None and strategy not in STRATEGIES:
        raise GacError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if align is None:
        return STRATEGIES[strategy or "minimal"]
    if isinstance(align, bool) or not isinstance(align, int) or align < 1:
        raise GacError(f"alignment {align!r} must be a positive integer, e.g. --align 8")
    return align


# --- choosing the target size ---------------------------------------------------------------------------


class _Targets:
    """Next multiple of the alignment, or with a profile the smallest aligned size >= d off any cliff."""

    def __init__(self, alignment: int, profile: dict | None) -> None:
        self.alignment, self.profile = alignment, profile
        if profile is not None:
            ops = {e.get("op") for e in profile.get("ops", [])}
            if not ops & {"lowrank", "gemm_n"}:
                raise GacError("the profile has no lowrank or gemm_n sweep: measure one with `gac profile`")
            self.ops = ops

    def _table(self, op: str, shape: dict) -> dict[int, float] | None:
        if self.profile is None or op not in self.ops:
            return None
        return latency_table(self.profile, op, m=PROFILE_M, shape=shape)

    def _pick(self, d: int, table: dict[int, float] | None) -> int:
        """The smallest aligned size >= d that the profile does not show on a cliff (selection's own rule,
        restricted to sizes padding can reach); the next multiple when the profile measures none of them."""
        base = next_multiple(d, self.alignment)
        if table is None:
            return base
        top = base + (PROFILE_WINDOW - 1) * self.alignment  # padding further costs more than it can win back
        reach = {x: ms for x, ms in table.items() if x <= top}
        kept = profile_candidates(
            reach,
            base,
            alignment=self.alignment,
            window=PROFILE_WINDOW,
            min_dim=base,
            max_dim=top,
            tolerance=PROFILE_TOLERANCE,
        )
        return min(kept.candidates)

    def group_rank(self, rank: int, fan_in: int, fan_out: int) -> int:
        """Target for the inner rank of an [fan_out, fan_in] factorization (a whole pair or one head group)."""
        table = None
        if self.profile is not None:
            table = self._table("lowrank", {"in": fan_in, "out": fan_out}) or self._table("gemm_n", {"k": fan_in})
        return self._pick(rank, table)

    def width(self, group: ChannelGroup) -> int:
        """Target for a width group (an MLP's, or a layer's experts'), timed by the group's own profile op."""
        table = self._table(group.profile_op, group.profile_shape) if self.profile is not None else None
        return self._pick(group.dim, table)


# --- repair ---------------------------------------------------------------------------------------------


def _layer(name: str) -> int | None:
    match = re.search(r"\.layers\.(\d+)\.", name + ".")
    return int(match.group(1)) if match else None


def _counts(model: nn.Module, names: list[str]) -> dict:
    params = list(model.parameters())  # unique tensors: tied embeddings count once
    return {
        "params": sum(p.numel() for p in params),
        "bytes": sum(p.numel() * p.element_size() for p in params),
        "compressible": sum(d.params for d in linear_dims(model, names)),
    }


@torch.no_grad()
def repair(
    model: PreTrainedModel,
    *,
    align: int | None = None,
    strategy: str | None = None,
    profile: dict | str | None = None,
) -> RepairResult:
    """Zero-pad, in place, every LowRankLinear rank and every irregular MLP width to an aligned size.

    align: the multiple to pad to (wins over strategy); strategy: "minimal" (8) or "optimal" (16); profile: a
    hardware profile (dict or JSON path) that picks, for each dim d, the smallest aligned size >= d that no larger
    size within the next few beats by more than 2% (selection's cliff rule); dims the profile does not cover get
    the next multiple.
    Attention head_dim and the hidden size are never padded (the function would change: the softmax scale and RMSNorm
    depend on them); the result lists them under left_misaligned when they are not aligned.
    Returns the new config.gac_structure (also set on model.config; read off the live model, merged over what
    the config already recorded) and the before/after statistics.
    """
    alignment = resolve_alignment(align, strategy)
    profile_name = None
    if isinstance(profile, (str, Path)):
        profile_name, profile = str(profile), load_profile(profile)
    targets = _Targets(alignment, profile)
    widths = [*groups_of(model, "mlp"), *groups_of(model, "experts")]  # an MLP's width, or every expert's
    ranks = [(g, g.dim) for g in groups_of(model, "rank") if g.dim is not None]
    head_ranks = [
        (g, g.dim) for g in groups_of(model, "head_rank", heads_per_group=_heads_per_group(model)) if g.dim is not None
    ]
    names = adapter_for(model.config).linear_names(model.config)
    before = _counts(model, names)
    planned: list[tuple[DimGroup, int, int]] = [(g, g.dim, targets.width(g)) for g in widths]  # (group, from, to)
    planned += [(g, d, targets.group_rank(d, g.in_features, g.out_features)) for g, d in [*ranks, *head_ranks]]
    surgery.pad(model, [(g, t) for g, _, t in planned])
    dims = [DimChange(g.name, "mlp_width" if g in widths else "rank", _layer(g.name), d, t) for g, d, t in planned]

    # read off the live model, so a compressor that did not write config.gac_structure is covered too
    structure = structure_of(model)
    model.config.gac_structure = structure
    after = _counts(model, names)
    added = after["params"] - before["params"]
    overhead = {
        "params_before": before["params"],
        "params_after": after["params"],
        "params_added": added,
        "params_added_pct": 100.0 * added / before["params"] if before["params"] else 0.0,
        "bytes_added": after["bytes"] - before["bytes"],
        "compressible_params_before": before["compressible"],
        "compressible_params_after": after["compressible"],
    }
    left = [
        {"name": d.name, "kind": d.kind, "layer": d.layer, "value": d.value}
        for d in inspect_model(model, (alignment,)).dims
        if d.kind not in ("rank", "mlp_width") and not d.aligned[alignment]
    ]
    result = RepairResult(structure, alignment, strategy, dims, overhead, left, profile_name)
    log.info(
        "repaired %d of %d dims to multiples of %d: +%d params (%.3f%%)",
        len(result.changed),
        len(dims),
        alignment,
        added,
        overhead["params_added_pct"],
    )
    return result


def _heads_per_group(model: PreTrainedModel) -> int:
    """KV heads per PaLU group of the model's grouped factorizations (1 when it has none)."""
    geo = attention_geometry(model.config)
    for _, m in model.named_modules():
        if is_grouped_lowrank(m):
            return m.out_features // len(m.ranks) // geo.head_dim
    return 1


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids, use_cache=False).logits.float()  # [B, S, V]


def logits_check(before: torch.Tensor, after: torch.Tensor) -> dict:
    """Max |after - before| relative to max |before|, and whether every position's argmax is the same."""
    scale = before.abs().max().item() or 1.0
    return {
        "max_abs_error": (after - before).abs().max().item(),
        "max_rel_error": (after - before).abs().max().item() / scale,
        "argmax_identical": bool(torch.equal(after.argmax(-1), before.argmax(-1))),
    }


def repair_dir(
    src: str,
    out: str,
    *,
    align: int | None = None,
    strategy: str | None = None,
    profile: str | None = None,
    force: bool = False,
    measure_latency: bool = True,
    latency: LatencyConfig = LatencyConfig(),
) -> RepairOutput:
    """Load `src` (gac dir, HF dir, .gguf or alias), repair it, check its logits, time prefill before vs after
    side by side (batch latency.batch, latency.prefill_tokens tokens) and save it to `out` with repair.json."""
    alignment = resolve_alignment(align, strategy)  # fail fast, before the model is loaded
    validate.not_quantized(src, "repair")
    check_out_dir(out, force)
    profile_data = None
    if profile is not None:
        profile_data = load_profile(profile)
    loaded = load_model(str(src))
    model = loaded.model
    vocab = text_config(model.config).vocab_size
    ids = torch.randint(0, vocab, (1, CHECK_TOKENS), generator=torch.Generator().manual_seed(0))
    logits_before = _logits(model, ids)
    original = copy.deepcopy(model) if measure_latency else None

    result = repair(model, align=alignment, strategy=strategy, profile=profile_data)
    result.profile = None if profile is None else str(profile)
    report = {
        "source_model": str(src),
        **result.to_json(),
        "logits_check": {"tokens": CHECK_TOKENS, **logits_check(logits_before, _logits(model, ids))},
    }
    if original is not None:
        log.info("timing prefill before vs after (batch %d, %d tokens)", latency.batch, latency.prefill_tokens)
        t = prefill_timings({"before": original, "after": model}, latency.batch, latency.prefill_tokens, latency)
        report["latency"] = {
            "device": str(next(model.parameters()).device),
            "batch": latency.batch,
            "prefill_tokens": latency.prefill_tokens,
            "prefill_ms_before": t["before"].median_ms,
            "prefill_ms_after": t["after"].median_ms,
            "prefill_spread_pct_before": t["before"].spread_pct,
            "prefill_spread_pct_after": t["after"].spread_pct,
            "speedup": t["before"].median_ms / t["after"].median_ms,
        }
        del original

    extra: dict[str, object] = {"profile": str(profile)} if profile is not None else {}
    if is_gac_dir(src):
        extra["source_plan"] = read_plan(src)
    plan = plan_record(
        variant="repaired",
        source_model=str(src),
        alignment=alignment,
        dims={d.name: d.after for d in result.dims},
        strategy=strategy,
        overhead=result.overhead,
        **extra,
    )
    saved = save(
        model, loaded.tokenizer, out, plan=plan, extra_files={"repair.json": json.dumps(report, indent=2)}, force=force
    )
    return RepairOutput(saved, result, report)
