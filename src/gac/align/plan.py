"""The selection plan contract (input of `gac select` and `gac.select()`) and the selection step itself.

A plan lists weights with the compressor's dim d* and score; `select` picks one aligned dim per weight.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from gac.align.candidates import WINDOW, aligned_candidates, aligned_fraction
from gac.align.knapsack import solve_mckp
from gac.errors import GacError, InfeasibleBudget
from gac.hw.device import ALIGNMENT

_REQUIRED_WEIGHT_KEYS = ("name", "dim", "score", "params_per_dim")


@dataclass(frozen=True)
class WeightSpec:
    """One compressible weight: |W(d)| = fixed_params + d * params_per_dim; d* and score come from the compressor.

    Given `candidates` are used as they are; otherwise aligned dims near `dim` within [min_dim, max_dim].
    `values` (optional, with `candidates`): the objective gained at each candidate relative to d*, e.g. minus
    the predicted loss change from a compressor's loss model; without it the gain is linear, score * (|W(d)| - |W(d*)|).
    """

    name: str
    dim: float
    score: float
    params_per_dim: int
    fixed_params: int = 0
    candidates: tuple[int, ...] | None = None
    min_dim: int | None = None
    max_dim: int | None = None
    values: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise GacError(f"weight name must be a non-empty string, got {self.name!r}")
        where = f"weight {self.name!r}"
        put = partial(object.__setattr__, self)  # normalize fields of a frozen dataclass once, here
        put("dim", _real(self.dim, f"{where}: dim", minimum=0))
        put("score", _real(self.score, f"{where}: score"))
        put("params_per_dim", _integer(self.params_per_dim, f"{where}: params_per_dim", minimum=1))
        put("fixed_params", _integer(self.fixed_params, f"{where}: fixed_params", minimum=0))
        for key in ("min_dim", "max_dim"):
            if getattr(self, key) is not None:
                put(key, _integer(getattr(self, key), f"{where}: {key}", minimum=0))
        if self.min_dim is not None and self.max_dim is not None and self.min_dim > self.max_dim:
            raise GacError(f"{where}: min_dim {self.min_dim} > max_dim {self.max_dim}; swap or fix the bounds")
        if self.candidates is not None:
            if isinstance(self.candidates, (str, bytes, Mapping)) or not isinstance(self.candidates, Iterable):
                raise GacError(f"{where}: candidates must be a list of integer dims, got {self.candidates!r}")
            dims = sorted({_integer(d, f"{where}: candidate", minimum=0) for d in self.candidates})
            if not dims:
                raise GacError(f"{where}: candidates is empty; list at least one dim or leave the key out")
            if self.values is not None:
                if isinstance(self.values, (str, bytes, Mapping)) or not isinstance(self.values, Iterable):
                    raise GacError(f"{where}: values must be a list of numbers, one per candidate")
                pairs = dict(zip(self.candidates, self.values))
                if len(list(self.values)) != len(list(self.candidates)) or len(pairs) != len(dims):
                    raise GacError(f"{where}: values must list one number per (distinct) candidate")
                put("values", tuple(_real(pairs[d], f"{where}: value") for d in dims))
            put("candidates", tuple(dims))
        elif self.values is not None:
            raise GacError(f"{where}: values need the candidates they belong to")

    def params(self, dim: int) -> int:
        """|W(d)|: the parameter count of this weight at dim `dim`."""
        return self.fixed_params + dim * self.params_per_dim


@dataclass(frozen=True)
class Plan:
    """Weights to resize under one parameter budget, with the alignment their candidates must meet."""

    budget: int
    weights: tuple[WeightSpec, ...]
    alignment: int = ALIGNMENT
    window: int = WINDOW

    def __post_init__(self) -> None:
        put = partial(object.__setattr__, self)
        put("budget", _integer(self.budget, "plan: budget (a parameter count)", minimum=0))
        put("alignment", _integer(self.alignment, "plan: alignment", minimum=1))
        put("window", _integer(self.window, "plan: window", minimum=1))
        put("weights", tuple(self.weights))
        if not self.weights:
            raise GacError("plan: 'weights' is empty; list at least one weight to select a dim for")
        seen: set[str] = set()
        for w in self.weights:
            if not isinstance(w, WeightSpec):
                raise GacError(f"plan: weights must be WeightSpec objects, got {type(w).__name__}")
            if w.name in seen:
                raise GacError(f"plan: duplicate weight name {w.name!r}; every weight needs a unique name")
            seen.add(w.name)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """Build and validate a plan from its JSON object (a contract, docs/DESIGN.md)."""
        if not isinstance(d, Mapping):
            raise GacError(f"plan must be a JSON object with 'budget' and 'weights', got {type(d).__name__}")
        for key in ("budget", "weights"):
            if key not in d:
                raise GacError(f"plan: missing key {key!r} (a plan needs 'budget' and 'weights')")
        raw = d["weights"]
        if not isinstance(raw, list):
            raise GacError(f"plan: 'weights' must be a list of weight objects, got {type(raw).__name__}")
        weights = []
        for k, w in enumerate(raw):
            if not isinstance(w, Mapping):
                raise GacError(f"plan: weight #{k} must be an object with {', '.join(_REQUIRED_WEIGHT_KEYS)}")
            label = f"weight {w['name']!r}" if "name" in w else f"weight #{k}"
            for key in _REQUIRED_WEIGHT_KEYS:
                if key not in w:
                    raise GacError(
                        f"{label}: missing key {key!r} (every weight needs {', '.join(_REQUIRED_WEIGHT_KEYS)})"
                    )
            weights.append(
                WeightSpec(
                    name=w["name"],
                    dim=w["dim"],
                    score=w["score"],
                    params_per_dim=w["params_per_dim"],
                    fixed_params=_default(w.get("fixed_params"), 0),
                    candidates=w.get("candidates"),
                    min_dim=w.get("min_dim"),
                    max_dim=w.get("max_dim"),
                    values=w.get("values"),
                )
            )
        return cls(
            budget=d["budget"],
            weights=tuple(weights),
            alignment=_default(d.get("alignment"), 8),
            window=_default(d.get("window"), 4),
        )

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> Plan:
        """Read and validate a plan file; errors name the file."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise GacError(f"cannot read plan {path}: {reason}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise GacError(f"plan {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        try:
            return cls.from_dict(data)
        except GacError as e:
            raise GacError(f"{path}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The plan as its JSON object; `Plan.from_dict(plan.to_dict()) == plan`."""
        weights = []
        for w in self.weights:
            entry = {"name": w.name, "dim": w.dim, "score": w.score, "params_per_dim": w.params_per_dim}
            if w.fixed_params:
                entry["fixed_params"] = w.fixed_params
            if w.candidates is not None:
                entry["candidates"] = list(w.candidates)
            if w.values is not None:
                entry["values"] = list(w.values)
            for key in ("min_dim", "max_dim"):
                if getattr(w, key) is not None:
                    entry[key] = getattr(w, key)
            weights.append(entry)
        return {"budget": self.budget, "alignment": self.alignment, "window": self.window, "weights": weights}


@dataclass(frozen=True)
class SelectionResult:
    """The chosen dim per weight and how it scores against the budget."""

    dims: dict[str, int]
    params: int  # sum of |W_i(d_i)| at the chosen dims, <= budget
    budget: int
    objective: float  # sum_i s_i * (|W_i(d_i)| - |W_i(d_i*)|)
    aligned_fraction: float  # share of chosen dims divisible by the plan's alignment
    exact: bool  # False when the solver coarsened its cost unit (still within budget)
    solver_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "dims": dict(self.dims),
            "params": self.params,
            "budget": self.budget,
            "objective": self.objective,
            "aligned_fraction": self.aligned_fraction,
            "exact": self.exact,
            "solver_ms": self.solver_ms,
        }


def select(plan: Plan | Mapping[str, Any] | str | os.PathLike) -> SelectionResult:
    """Pick one candidate dim per weight maximizing sum_i s_i (|W_i(d_i)| - |W_i(d_i*)|) within the budget.

    `plan` is a Plan, its JSON object, or the path of a JSON file. Raises GacError naming the smallest
    feasible budget when even the smallest candidates do not fit.
    """
    plan = _as_plan(plan)
    dims = [_candidates(w, plan) for w in plan.weights]
    costs = [[w.params(d) for d in ds] for w, ds in zip(plan.weights, dims)]
    # s_i * (|W(d)| - |W(d*)|): the fixed params cancel, which keeps large counts out of the float maths.
    values = [
        list(w.values) if w.values is not None else [w.score * w.params_per_dim * (d - w.dim) for d in ds]
        for w, ds in zip(plan.weights, dims)
    ]
    smallest = sum(min(row) for row in costs)
    if smallest > plan.budget:
        raise InfeasibleBudget(
            f"budget {plan.budget} params is infeasible: the smallest candidates already need {smallest}; "
            f"raise the budget to at least {smallest} or allow smaller dims (min_dim, candidates)",
            smallest,
        )
    start = time.perf_counter()
    solution = solve_mckp(costs, values, plan.budget)
    solver_ms = (time.perf_counter() - start) * 1e3
    chosen = [ds[j] for ds, j in zip(dims, solution.choice)]
    return SelectionResult(
        dims={w.name: d for w, d in zip(plan.weights, chosen)},
        params=solution.cost,
        budget=plan.budget,
        objective=solution.value,
        aligned_fraction=aligned_fraction(chosen, plan.alignment),
        exact=solution.exact,
        solver_ms=solver_ms,
    )


def _as_plan(plan: Plan | Mapping[str, Any] | str | os.PathLike) -> Plan:
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, Mapping):
        return Plan.from_dict(plan)
    if isinstance(plan, (str, os.PathLike)):
        return Plan.from_json(plan)
    raise GacError(f"select() takes a Plan, a plan dict or a JSON path, got {type(plan).__name__}")


def _candidates(w: WeightSpec, plan: Plan) -> list[int]:
    if w.candidates is not None:
        return list(w.candidates)
    try:
        return aligned_candidates(w.dim, plan.alignment, window=plan.window, min_dim=w.min_dim, max_dim=w.max_dim)
    except GacError as e:
        raise GacError(f"weight {w.name!r}: {e}") from None


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value  # JSON null means "use the default", 0 does not


def _integer(value: Any, what: str, *, minimum: int | None = None) -> int:
    """An exact integer; integral floats (1e9 in JSON) are accepted, 1.5 and "100" are not."""
    if isinstance(value, bool):
        raise GacError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise GacError(f"{what} must be an integer, got {value!r}")
        value = math.floor(value)  # integral: its floor is itself
    try:
        value = operator.index(value)
    except TypeError:
        raise GacError(f"{what} must be an integer, got {value!r}") from None
    if minimum is not None and value < minimum:
        raise GacError(f"{what} must be >= {minimum}, got {value}")
    return value


def _real(value: Any, what: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise GacError(f"{what} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise GacError(f"{what} must be >= {minimum}, got {value!r}")
    return float(value)
