"""Public pipeline: `compress` = load -> calibrate -> compress -> select aligned dims -> evaluate -> save."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import platform
from dataclasses import dataclass, field
from pathlib import Path

from gac.data import TextConfig
from gac.errors import GacError
from gac.evaluate.latency import LatencyConfig

log = logging.getLogger(__name__)

# a variant's measured keys, null in the report under --no-eval
NOT_EVALUATED = ("ppl", "prefill_ms", "prefill_spread_pct", "decode_ms_per_token", "decode_spread_pct")


@dataclass(frozen=True)
class CompressConfig:
    """Every default of `gac compress` lives here; the CLI passes only what the user gave."""

    model: str = "smollm2-135m"
    compressor: str = "asvd"
    ratio: float = 0.15
    out: str | None = None
    alignment: int = 8
    align: bool = True  # False (--no-align): save the compressor's own dims
    window: int = 1  # aligned candidates each side of d*: re-selection stays within one alignment step
    profile: str | None = None  # hardware profile JSON driving the candidates
    dtype: str = "float32"
    device: str = "cpu"
    compressor_options: dict = field(default_factory=dict)
    text: TextConfig = TextConfig()
    latency: LatencyConfig = LatencyConfig()
    evaluate: bool = True
    force: bool = False
    progress: bool = True

    def __post_init__(self):
        if not (isinstance(self.ratio, (int, float)) and 0.0 < self.ratio < 1.0):
            raise GacError(f"ratio {self.ratio} is outside (0, 1): pass the share of parameters to remove, e.g. --ratio 0.15")
        if self.alignment < 1:
            raise GacError(f"alignment {self.alignment} must be a positive integer, e.g. --align 8")


@dataclass
class CompressResult:
    report: dict
    out: Path | None
    models: dict  # variant name -> model (kept for callers that go on using them)


def build_plan(units, dims: dict, budget: int, cfg: CompressConfig, candidates_for=None) -> dict:
    """The selection plan (DESIGN.md contract) for the units the compressor reduced (None: left whole)."""
    untouched = sum(u.numel for u in units if dims[u.name] is None)
    weights = []
    for u in units:
        if dims[u.name] is None:
            continue
        score = u.marginal_score(dims[u.name]) if hasattr(u, "marginal_score") else u.score
        w = {"name": u.name, "dim": float(dims[u.name]), "score": score, "params_per_dim": u.params_per_dim,
             "fixed_params": u.fixed_params, "min_dim": max(u.min_dim, min(cfg.alignment, u.max_dim)),
             "max_dim": u.max_dim}
        step = getattr(u, "dim_step", 1)
        if step > 1:  # dims on a grid (whole heads, KV groups): its points in the usual neighbourhood of d*
            w["candidates"] = [d for d in range(u.min_dim, u.max_dim + 1, step)
                               if abs(d - dims[u.name]) <= cfg.window * cfg.alignment]
        elif candidates_for is not None:
            w["candidates"] = candidates_for(u, dims[u.name], cfg.window)
        if getattr(u, "curve", None) is not None:  # a loss model: the knapsack weighs its predicted loss exactly
            from gac.align.candidates import aligned_candidates

            if "candidates" not in w:
                w["candidates"] = aligned_candidates(w["dim"], cfg.alignment, window=cfg.window,
                                                     min_dim=w["min_dim"], max_dim=w["max_dim"])
            loss = u.options()[0]
            w["values"] = [float(loss[dims[u.name]] - loss[min(d, u.max_dim)]) for d in w["candidates"]]
        weights.append(w)
    return {"budget": budget - untouched, "alignment": cfg.alignment, "window": cfg.window, "weights": weights}


def _covered(names: list[str], units) -> list[str]:
    """The linears among `names` that some unit covers: the unit itself, or a block whose name prefixes them."""
    unit_names = {getattr(u, "module", u.name) for u in units}  # a head-group unit belongs to its module
    prefixes = tuple(f"{n}." for n in unit_names)
    return [n for n in names if n in unit_names or n.startswith(prefixes)]


def _reduced(dims: dict) -> dict:
    return {name: int(d) for name, d in dims.items() if d is not None}


@dataclass
class Selected:
    """What the compressor found and GAC chose, before any model is cut."""

    compressor: object
    units: list  # the compressor's units (see gac.compressors.base.WeightAnalysis)
    names: list[str]  # the linears the units cover: params and alignment are measured over these
    compressible: int
    budget: int
    dims: dict  # variant ("unaligned", "gac") -> {unit name: dim or None}
    selection: object  # gac.align.plan.SelectionResult
    profile_excluded: dict | None = None  # {unit name: {dim: reason}}: aligned dims the profile ruled out


def analyze_and_select(model, calib, cfg: CompressConfig, compressor=None) -> Selected:
    """Calibrate on `calib` [n, seq], let the compressor find its dims d* under the budget, then select aligned
    dims with the knapsack (candidates from the static rule or a hardware profile). The model is not changed."""
    from gac.calibrate import calibrate
    from gac.compressors import make_compressor
    from gac.models.adapters import adapter_for

    compressor = compressor or make_compressor(cfg.compressor, **cfg.compressor_options)
    names = adapter_for(model.config).linear_names(model.config)
    names = compressor.targets(names) if hasattr(compressor, "targets") else names  # e.g. palu: K/V only
    stats = calibrate(model, calib, names, xtx=compressor.needs_xtx, progress=cfg.progress)
    probe = calib[:1, : min(256, calib.shape[1])]  # one short window: the loss probe for measured importance
    grads = {"windows": calib} if getattr(compressor, "needs_windows", False) else {}  # gradient-based importance
    units = compressor.analyze(model, names, stats, probe=probe, keep=1.0 - cfg.ratio, progress=cfg.progress,
                               **grads)
    del stats
    compressible = sum(u.numel for u in units)
    budget = math.floor((1.0 - cfg.ratio) * compressible)
    unaligned = compressor.allocate(units, budget)

    candidates_for = None
    if cfg.profile:
        from gac.align.profiled import candidates_from_profile, profile_for_model

        profile = profile_for_model(cfg.profile, units, unaligned, device=cfg.device, dtype=cfg.dtype,
                                    m=cfg.latency.prefill_tokens, alignment=cfg.alignment, window=cfg.window,
                                    progress=cfg.progress)
        if profile:  # empty: auto found nothing to measure (only head-grid units), the static rule applies
            candidates_for = candidates_from_profile(profile, m=cfg.latency.prefill_tokens,
                                                     alignment=cfg.alignment, window=cfg.window)
    selection = _select_within_budget(units, unaligned, budget, cfg, candidates_for)
    excluded = None
    if candidates_for is not None:
        excluded = {name: why for name, why in candidates_for.excluded.items() if why}
        log.info("the profile ruled out %d aligned dim(s) in %d of %d weight(s) (report.json: profile_excluded)",
                 sum(map(len, excluded.values())), len(excluded), len(candidates_for.excluded))
    return Selected(compressor, units, _covered(names, units), compressible, budget,
                    {"unaligned": unaligned, "gac": {**unaligned, **selection.dims}}, selection, excluded)


def _select_within_budget(units, unaligned: dict, budget: int, cfg: CompressConfig, candidates_for):
    """Select with the narrowest candidate window that fits the budget: small d* rounded up to the first
    aligned dim can need room taken from other weights, further than one alignment step away.

    A profile measured around d* (e.g. --profile auto) cannot offer the widened dims it never swept: when its
    candidates cannot fit the budget at any window, the static rule gets the same chance, with a warning."""
    try:
        return _select_widening(units, unaligned, budget, cfg, candidates_for)
    except GacError as e:
        if candidates_for is None or "infeasible" not in str(e):
            raise
    log.warning("the profile's candidates cannot fit the budget: using the static alignment rule")
    return _select_widening(units, unaligned, budget, cfg, None)


def _select_widening(units, unaligned: dict, budget: int, cfg: CompressConfig, candidates_for):
    """select() at windows cfg.window .. cfg.window + 3, the first that is feasible."""
    from gac.align.plan import select

    for window in range(cfg.window, cfg.window + 4):
        try:
            return select(build_plan(units, unaligned, budget, dataclasses.replace(cfg, window=window),
                                     candidates_for))
        except GacError as e:
            if "infeasible" not in str(e) or window == cfg.window + 3:
                raise
            log.info("no aligned choice fits the budget within %d step(s) of d*: widening", window)


def materialize_variants(model, selected: Selected) -> tuple[dict, dict]:
    """({variant: model}, {variant: structure}) for "unaligned" and "gac": each a deep copy of `model`, cut."""
    models, structures = {}, {}
    for variant, dims in selected.dims.items():
        m = copy.deepcopy(model)
        structures[variant] = selected.compressor.materialize(m, selected.units, dims)
        models[variant] = m.eval()
    return models, structures


def compress(cfg: CompressConfig) -> CompressResult:
    import torch

    from gac.compressors import make_compressor
    from gac.data import load_windows
    from gac.models.io import check_out_dir
    from gac.models.loading import load_model

    compressor = make_compressor(cfg.compressor, **cfg.compressor_options)
    if cfg.out is not None:
        check_out_dir(cfg.out, cfg.force)  # fail before the long work, not after
    if cfg.profile and cfg.profile != "auto":
        from gac.hw.profile import load_profile

        load_profile(cfg.profile)  # a bad profile fails now, not after calibration

    loaded = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
    model, tokenizer = loaded.model, loaded.tokenizer
    calib, held_out = load_windows(tokenizer, cfg.text)
    selected = analyze_and_select(model, calib, cfg, compressor)
    variants, structures = materialize_variants(model, selected)
    models = {"baseline": model, **variants}
    selected.units = None  # free the SVD factors before evaluation
    compressible, budget, names = selected.compressible, selected.budget, selected.names

    report = _report_header(cfg, loaded.source, compressible, budget, torch)
    report["variants"] = _evaluate(models, names, held_out, cfg)
    report["dims"] = {v: _reduced(d) for v, d in selected.dims.items()}
    report["selection"] = {k: v for k, v in selected.selection.to_dict().items() if k != "dims"}
    saved = "gac" if cfg.align else "unaligned"
    report["saved_variant"] = saved
    if selected.profile_excluded is not None:
        report["profile_excluded_dims"] = sum(map(len, selected.profile_excluded.values()))
        report["profile_excluded"] = {name: {str(d): why for d, why in sorted(dims.items())}  # JSON keys
                                      for name, dims in selected.profile_excluded.items()}

    out = None
    if cfg.out is not None:
        out = _save(models[saved], tokenizer, cfg, structures[saved], report, compressor)
    return CompressResult(report, out, models)


def _evaluate(models: dict, names: list[str], held_out, cfg: CompressConfig) -> dict:
    from gac.evaluate.latency import measure_latency
    from gac.evaluate.perplexity import perplexity
    from gac.models.dims import params_and_alignment

    variants = {}
    for name, m in models.items():
        params, aligned = params_and_alignment(m, names, cfg.alignment)
        variants[name] = {"params": params, "aligned_fraction": aligned}
    if not cfg.evaluate:  # the same keys as an evaluated report, unmeasured
        for v in variants.values():
            v.update(dict.fromkeys(NOT_EVALUATED))
        return variants
    for name, m in models.items():
        variants[name]["ppl"] = perplexity(m, held_out, desc=f"perplexity {name}", progress=cfg.progress)
    log.info("timing %s side by side", ", ".join(models))
    for name, lat in measure_latency(models, cfg.latency).items():
        variants[name].update(lat)
    return variants


def _report_header(cfg: CompressConfig, source: str, compressible: int, budget: int, torch) -> dict:
    import transformers

    device_name = torch.cuda.get_device_name(cfg.device) if cfg.device.startswith("cuda") else platform.processor() or platform.machine()
    return {
        "model": source, "compressor": cfg.compressor, "ratio": cfg.ratio, "alignment": cfg.alignment,
        "device": cfg.device, "device_name": device_name, "dtype": cfg.dtype,
        "compressible_params": compressible, "budget_params": budget,
        "compressor_options": dict(cfg.compressor_options), "profile": cfg.profile,
        "latency": dataclasses.asdict(cfg.latency), "eval_tokens": cfg.text.eval_windows * cfg.text.seq_len,
        "versions": {"gac": _gac_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "threads": torch.get_num_threads(),
    }


def _gac_version() -> str:
    from gac import __version__

    return __version__


def _save(model, tokenizer, cfg: CompressConfig, structure: dict, report: dict, compressor) -> Path:
    from gac.evaluate.report import report_json, report_markdown
    from gac.models.io import save

    plan = {
        "gac_plan": 1,
        "variant": report["saved_variant"],
        "source_model": report["model"],
        "compressor": {"name": cfg.compressor, **dataclasses.asdict(compressor.config)},
        "ratio": cfg.ratio, "alignment": cfg.alignment,
        "compressible_params": report["compressible_params"], "budget_params": report["budget_params"],
        "dims": report["dims"][report["saved_variant"]],
        "versions": report["versions"],
    }
    files = {"report.json": report_json(report), "report.md": report_markdown(report)}
    files["dims.png"] = _dims_plot(model, alignments={cfg.alignment, 8, 16, 32})
    return save(model, tokenizer, cfg.out, structure=structure, plan=plan, extra_files=files, force=cfg.force)


def _dims_plot(model, alignments) -> bytes:
    """PNG bytes of `gac inspect`'s dims scatter for the saved model, written with it."""
    import io

    from gac.inspect import inspect_model, plot_dims

    buf = io.BytesIO()
    plot_dims(inspect_model(model, alignments), buf)
    return buf.getvalue()
