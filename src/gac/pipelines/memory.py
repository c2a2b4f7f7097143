"""The memory, disk and time forecast of `gac compress`, from the model's config alone (no weight is read): what
`--dry-run` prints and what the choice of pipeline (gac.pipelines.choice) compares with the memory available.

Here the shared arithmetic, pure: a Workload, the terms of compressing a model of one config with one compressor
(bytes b per value of the working dtype). Each pipeline adds them up its own way (gac.pipelines.base.Pipeline's
forecast: the whole model's in gac.pipelines.whole_model, layer by layer's in gac.pipelines.layerwise.pipeline), plus
the interpreter with torch and transformers imported (measured ~0.6 GB on CPU). Which terms apply is read off the
compressor the run builds (gac.compressors.make_compressor): X^T X when it needs_xtx (own_xtx: the whitened SVD's
work), the loss model's work for importance "output", a gradient pass when it needs_windows, factors where it
factorizes (and the layer-wise cache: its cut_state_bytes), one probe pass per weight for measured sensitivity.
Disk: the output, and what a pipeline keeps beside it.
Time: forward-pass FLOPs over the calibration tokens (each pipeline counts its passes) and the probe passes at this
device's measured matmul rate; the factorizations (factorization_cost: LAPACK's SVD, or the Gram path's products and
eigh) at their share of it; the loss model's and the statistics' float64 products (loss_model_flops, X^T X once rows
outnumber an input's columns) at FP64_SHARE of it. `--compressor auto`: each kind of pass once, every candidate's own
work, and the built candidates' factorizations once more (_auto_forecast). Rough by design: within a few tens of per
cent (docs/results/layerwise-8b.md compares it with measured peaks and times)."""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gac.calibration.importance import FISHER_SAMPLES, FOLD_ELEMENTS, GRADIENT_PROXIES, OUTPUT
from gac.checkpoint.loading import EMBEDDED, gguf_of, kept_copy, read_config_checked
from gac.compressors import AUTO_BUILT, candidates_of, make_compressor
from gac.compressors.sensitivity import PROBE_TOKENS
from gac.config import CompressConfig
from gac.errors import GacError
from gac.hw.threads import workers
from gac.models.adapters import adapter_for
from gac.pipelines import get_pipeline

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from gac.compressors.base import Compressor

log = logging.getLogger(__name__)
GIB = 2**30
RUNTIME_BYTES = int(0.6 * GIB)  # python + torch + transformers + tokenizer, as measured on a CPU
# rates relative to the measured float32 matmul rate, fitted on an 8B-shaped layer timed alone: LAPACK's SVDs side by
# side, the float32 Gram path, and the loss model's float64 products each run below the matmul rate
# (the fit: docs/results/layerwise-8b.md)
SVD_SHARE = 0.68
GRAM32_SHARE = 0.88
FP64_SHARE = 0.40
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
BUILT_COPY, FACTORS = "two variants (copies)", "all factors"  # whole-model parts that auto holds twice
FACTORIZING = "factorizations"  # the work auto repeats for each candidate it builds
WORK = "SVD / loss model / whitening work (largest weight)"  # a part of either pipeline's peak


@dataclass(frozen=True)
class Shapes:
    """What the forecast reads off a config."""

    layers: int
    hidden: int
    intermediate: int
    q_width: int
    kv_width: int
    vocab: int
    tied: bool
    experts: int = 0  # experts of a mixture-of-experts layer (0: dense); intermediate is then the expert width
    routed: int = 0  # experts each token runs through

    @classmethod
    def of(cls, config: PretrainedConfig) -> Shapes:
        adapter = adapter_for(config)
        geo = adapter.geometry(config)
        n = adapter.layer_count(config)
        experts, width, routed = 0, adapter.intermediate_size(config), 0
        if any(adapter.is_moe_layer(config, i) for i in range(n)):  # the forecast's layer: an MoE one, the larger
            experts, width, routed = adapter.expert_geometry(config)
        return cls(
            n,
            adapter.hidden_size(config),
            width,
            geo.num_heads * geo.head_dim,
            geo.num_kv_heads * geo.head_dim,
            adapter.vocab_size(config),
            bool(getattr(config, "tie_word_embeddings", False)),
            experts,
            routed,
        )

    def linears(self) -> list[tuple[int, int]]:
        """[out, in] of one layer's compressible linears (gated MLP: gate and up; an ungated one is close; an MoE
        layer: every expert's)."""
        h, i = self.hidden, self.intermediate
        mlp = [(i, h), (i, h), (h, i)] * max(self.experts, 1)
        return [(self.q_width, h), (self.kv_width, h), (self.kv_width, h), (h, self.q_width), *mlp]

    @property
    def largest_weight(self) -> int:
        """Elements of the layer's largest weight: a linear, or an MoE layer's fused gate_up [E, 2I, H]."""
        if self.experts:
            return self.experts * 2 * self.intermediate * self.hidden
        return max(o * i for o, i in self.linears())

    def factorized(self) -> list[tuple[int, int]]:
        """[out, in] of the linears a low-rank compressor factorizes: all of them, or an MoE layer's attention (its
        fused expert weights are pruned, never factorized)."""
        return self.linears()[:4] if self.experts else self.linears()

    @property
    def active_layer_params(self) -> int:
        """Parameters one token's forward pass runs through in a layer: its attention and its routed experts."""
        if not self.experts:
            return self.layer_params
        return self.layer_params - (self.experts - self.routed) * 3 * self.hidden * self.intermediate

    @property
    def layer_params(self) -> int:
        return sum(o * i for o, i in self.linears()) + 2 * self.hidden + self.experts * self.hidden  # norms, router

    @property
    def outer_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.outer_params


@dataclass(frozen=True)
class Forecast:
    pipeline: str  # its gac.pipelines.PIPELINES name: "whole" or "layerwise"
    peak_bytes: int  # resident memory on the compute device (the CPU here)
    weights_bytes: int
    disk_bytes: int  # the output directory
    seconds: float
    parts: dict  # name -> bytes, what the peak is made of
    # name -> seconds, what the time is made of: passes over the calibration text (--compressor auto runs each kind
    # once for every candidate), and the work each candidate does on its own weights
    pass_seconds: dict = field(default_factory=dict)
    work_seconds: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Workload:
    """What compressing a model of one config with one compressor costs, whichever the pipeline: the terms each
    pipeline's forecast (gac.pipelines.base.Pipeline.forecast) adds up its own way. Bytes unless named otherwise."""

    shapes: Shapes
    compressor: Compressor  # built as the run builds it: what it does is read off it
    value_bytes: int  # per value of the working dtype (weights, hidden states)
    ratio: float
    tokens: int  # calibration tokens
    backwards: int  # backward passes per gradient batch (the loss model's: one per drawn label)
    probe: int  # tokens of one measured-sensitivity probe pass (0: none)
    layer_factors: int  # one layer's SVD factors (float32)
    cached: int  # one layer's cut state, what layer-wise materialization reads instead of factorizing again
    layer_xtx: int  # one layer's X^T X (or its input rows)
    largest: int  # the SVD, loss model and whitening work on the largest weight(s) at once
    transient: int  # one layer's activations of one batch
    logits: int  # the head's logits, gradient and softmax of one gradient batch
    flight: int  # calibration hidden states (and gradients) carried between layers
    output_bytes: int  # the output directory
    one_pass_s: float  # one forward pass over the calibration tokens
    statistics_s: float  # X^T X summed in the calibration pass
    work_seconds: dict  # name -> seconds of each candidate's own work on its weights

    @property
    def reverse(self) -> bool:
        """A gradient pass over the calibration text (whole), the reverse sweep (layer-wise)."""
        return self.compressor.needs_windows

    @property
    def weights(self) -> int:
        return self.shapes.params * self.value_bytes

    def forecast(self, pipeline: str, parts: dict, disk_bytes: int, pass_seconds: dict) -> Forecast:
        """The Forecast of `pipeline` (its name) from its peak's `parts`, its disk and its passes' seconds."""
        return Forecast(
            pipeline,
            int(sum(parts.values())),
            int(self.weights),
            disk_bytes,
            sum(pass_seconds.values()) + sum(self.work_seconds.values()),
            {k: int(v) for k, v in parts.items()},
            pass_seconds,
            dict(self.work_seconds),
        )


def _factor_bytes(o: int, i: int) -> int:
    k = min(o, i)
    return 4 * (o * k + k + k * i)  # U, S, Vh in float32


def forecast(
    config: PretrainedConfig,
    *,
    compressor: str = "asvd",
    options: dict | None = None,
    ratio: float = 0.15,
    dtype: str = "float32",
    calib_windows: int = 16,
    seq_len: int = 512,
    pipeline: str = "layerwise",
    factorization: str = "gram32",
    flops_per_s: float | None = None,
) -> Forecast:
    """Predicted peak memory, output size and time of compressing a model of this config with the compressor
    `compressor` built from `options` (its config options, as CompressConfig.compressor_options) through the
    pipeline registered as `pipeline` (gac.pipelines.PIPELINES), which adds up the workload its own way."""
    chosen = get_pipeline(pipeline)
    c = make_compressor(compressor, **(options or {}))  # what the run does is read off the compressor itself
    chosen.check(c)  # the same one-line refusal as the run
    work = workload(
        config,
        c,
        ratio=ratio,
        dtype=dtype,
        calib_windows=calib_windows,
        seq_len=seq_len,
        factorization=factorization,
        flops_per_s=flops_per_s,
    )
    return chosen.forecast(work)


def workload(
    config: PretrainedConfig,
    c: Compressor,
    *,
    ratio: float,
    dtype: str,
    calib_windows: int,
    seq_len: int,
    factorization: str,
    flops_per_s: float | None = None,
) -> Workload:
    """The terms of compressing a model of this config with the compressor `c`, from the config alone (pure but for
    this machine's matmul rate, measured once where `flops_per_s` is not given)."""
    s = Shapes.of(config)
    b = BYTES[dtype]
    lowrank = c.factorizes
    xtx, own = c.needs_xtx, c.own_xtx  # X^T X collected in the analysis; own: the SVD is whitened by it
    loss_model = lowrank and c.proxy == OUTPUT
    reverse = c.needs_windows  # a gradient pass (whole), the reverse sweep (layer-wise)
    backwards = FISHER_SAMPLES if loss_model else 1  # the loss model's gradients: one per drawn label
    probe = min(PROBE_TOKENS, seq_len) if c.measures_sensitivity else 0  # whole model only: one probe pass per weight
    tokens = calib_windows * seq_len
    act = b  # hidden states in the model's dtype
    layer_factors = sum(_factor_bytes(o, i) for o, i in s.factorized()) if lowrank else 0
    cached = c.cut_state_bytes(s, b)  # layer-wise: what materialization reads instead of factorizing again
    # linears fed by one activation share one X^T X (q/k/v, gate/up): inputs of width hidden, q width, intermediate;
    # kept as the input rows [tokens, i] while they are no more than the columns, else summed [i, i] in float64
    # (gac.calibration.gram.Gram)
    layer_xtx = (
        sum(act * tokens * i if tokens <= i else 8 * i * i for i in (s.hidden, s.q_width, s.intermediate)) if xtx else 0
    )
    big_o, big_i = max(s.factorized(), key=lambda oi: oi[0] * oi[1])
    # the loss model's float64 work on one weight [o, i], k = min(o, i): Vh S^-1 and its product with X^T X [k, i]
    # each, U and U^T diag(f) [o, k] each, P and Q [k, k], and the curve's own [k, k] temporaries (3)
    curve = max(8 * min(o, i) * (2 * (i + o) + 5 * min(o, i)) for o, i in s.factorized()) if loss_model else 0
    whiten = 8 * (big_o * big_i + big_i * big_i) if own else 0  # float64 W S and S
    svd_work = 3 * 4 * big_o * big_i if lowrank else 0  # float32 copy, scaled copy, LAPACK workspace
    # a weight-gradient proxy (taylor, fisher): the largest weight's gradient, folded into fp32 sums a block at a
    # time (gac.calibration.importance.channel_sums: its fp32 copy, |g w| and g^2 of one block)
    fold = b * s.largest_weight + 3 * 4 * min(s.largest_weight, FOLD_ELEMENTS) if c.proxy in GRADIENT_PROXIES else 0
    # a layer's SVDs all end before its loss curves begin: the larger of the two phases, not their sum; each phase
    # works on gac.hw.threads.workers() weights at once (bounded by the largest)
    largest = max(max(svd_work + whiten, curve) * workers(), fold)
    batch = 4  # calibration's batches (the reverse sweep's gradient passes run halves of them)
    transient = 6 * batch * seq_len * max(s.intermediate, s.hidden) * act  # one layer's activations
    logits = 3 * 2 * seq_len * s.vocab * 4 if reverse else 0  # float logits, grad, softmax of a gradient batch
    flight = (2 + backwards if reverse else 1) * tokens * s.hidden * act  # hidden states, gradients; inputs on disk
    compressible = s.layers * sum(o * i for o, i in (s.factorized() if lowrank else s.linears()))
    output = int((s.params - compressible * ratio) * b)
    forward_flops = 2 * tokens * s.layers * s.active_layer_params + 2 * tokens * s.vocab * s.hidden
    # a whitened weight takes the exact SVD (gac.compressors.linalg.scaled_svd)
    method = "svd" if own and factorization == "gram32" else factorization
    factorizing = [factorization_cost(o, i, method) for o, i in s.factorized()] if lowrank else []
    active = s.layers * s.active_layer_params + s.outer_params
    probe_flops = (s.layers * len(s.factorized()) + 1) * 2 * probe * active  # the probe loss, each weight truncated
    fp64_flops = s.layers * sum(loss_model_flops(o, i, tokens) for o, i in s.factorized()) if loss_model else 0
    # the statistics, collected in the calibration pass: X^T X summed only once an input's rows outnumber its columns
    # (gac.calibration.gram.Gram)
    xtx_flops = (
        s.layers * sum(2 * tokens * i * i for i in (s.hidden, s.q_width, s.intermediate) if tokens > i) if xtx else 0
    )
    rate = flops_per_s or matmul_rate()
    work = {
        "probe passes": probe_flops / rate,
        FACTORIZING: s.layers * sum(f / (rate * share) for f, share in factorizing),
        "loss model (float64)": fp64_flops / (rate * FP64_SHARE),
    }
    return Workload(
        s,
        c,
        b,
        ratio,
        tokens,
        backwards,
        probe,
        layer_factors,
        cached,
        layer_xtx,
        largest,
        transient,
        logits,
        flight,
        output,
        forward_flops / rate,
        xtx_flops / (rate * FP64_SHARE),
        work,
    )


def factorization_cost(o: int, i: int, method: str) -> tuple[int, float]:
    """(FLOPs, their rate as a share of the float32 matmul rate) of factorizing one [o, i] weight, k = min(o, i):
    LAPACK's SVD, ~12 o i k; the Gram path (gac.compressors.linalg.gram_svd), the Gram matrix and a V
    (2 max(o, i) k^2 each) and eigh (~11 k^3, as measured), in float32 (gram32, presumed to hold for every weight)
    or float64 (gram)."""
    k = min(o, i)
    if method == "svd":
        return 12 * o * i * k, SVD_SHARE
    return 4 * max(o, i) * k * k + 11 * k**3, GRAM32_SHARE if method == "gram32" else FP64_SHARE


def loss_model_flops(o: int, i: int, tokens: int) -> int:
    """float64 FLOPs of one [o, i] weight's loss-model factors (compressors/loss_model.py), k = min(o, i):
    Q = A X^T X A^T from the input rows while fewer than the columns (gac.calibration.gram.Gram), else from
    X^T X [i, i]; P = U^T diag(f) U."""
    k, c = min(o, i), min(tokens, i)
    return 2 * k * i * c + 2 * k * k * c + 2 * o * k * k


@functools.cache
def matmul_rate(seconds: float = 0.3) -> float:
    """This CPU's float32 matmul rate in FLOP/s, measured for `seconds` on 1024 x 1024 products (once per process)."""
    a = torch.randn(1024, 1024)
    a @ a  # warm-up
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ a
        n += 1
    return 2 * 1024**3 * n / (time.perf_counter() - start)


def config_of(spec: str) -> PretrainedConfig:
    """The transformers config of a model spec (alias, directory, .gguf) without reading its weights."""
    if spec in EMBEDDED and (copy_dir := kept_copy(spec)) is not None:  # written by its first load
        return read_config_checked(str(copy_dir), spec)
    if (gguf := gguf_of(spec)) is not None:
        return read_config_checked(str(gguf.parent), spec, gguf.name)
    path = Path(spec).expanduser()
    if (path.is_dir() and (path / "config.json").is_file()) or (path.is_file() and path.suffix == ".json"):
        return read_config_checked(str(path), spec)
    raise GacError(f"no config for {spec!r}: pass a model directory, a .gguf file, a config.json or an alias")


def forecast_of(cfg: CompressConfig, pipeline: str) -> Forecast:
    """The forecast for a CompressConfig (gac.config) run through the pipeline registered as `pipeline`; under
    `--compressor auto` (_auto_forecast), its heaviest candidate's memory and the time of every candidate's
    analysis."""
    config = config_of(cfg.model)
    forecasts = []
    for name in candidates_of(cfg.compressor.name):
        try:
            forecasts.append(
                forecast(
                    config,
                    compressor=name,
                    options=cfg.compressor_options,
                    ratio=cfg.analysis_ratio,
                    dtype=cfg.dtype,
                    calib_windows=cfg.text.calib_windows,
                    seq_len=cfg.text.seq_len,
                    pipeline=pipeline,
                    factorization=cfg.factorization_method,
                )
            )
        except GacError:
            if len(candidates_of(cfg.compressor.name)) == 1:
                raise  # a candidate that cannot run on this model is skipped by auto, and not forecast
    if not forecasts:
        raise GacError(f"no compressor can run on {cfg.model}: name one compressor to see why")
    return forecasts[0] if len(forecasts) == 1 else _auto_forecast(forecasts)


def _auto_forecast(forecasts: list[Forecast]) -> Forecast:
    """gac.pipelines.auto over candidates forecast each as its own run: the heaviest one's memory (auto holds one
    calibration's statistics, as each of them does) and, on the whole model, a second built candidate's model and
    factors (it builds gac.compressors.AUTO_BUILT); the time of each kind of pass over the calibration text once (the
    statistics and the loss model's output gradients are shared; prune's taylor gradients are its own), every
    candidate's own work (each one is analyzed), and the factorizations of the AUTO_BUILT that take longest once more
    (each built one is factorized again). The closed loops' timings under --speedup are not counted, as in a single
    run's forecast."""
    heaviest = max(forecasts, key=lambda f: f.peak_bytes)
    passes = {k: max(f.pass_seconds.get(k, 0.0) for f in forecasts) for f in forecasts for k in f.pass_seconds}
    work = {k: sum(f.work_seconds[k] for f in forecasts) for k in heaviest.work_seconds}
    longest = sorted((f.work_seconds[FACTORIZING] for f in forecasts), reverse=True)
    work[f"{FACTORIZING} again ({AUTO_BUILT} built, auto)"] = sum(longest[:AUTO_BUILT])
    timed = replace(heaviest, seconds=sum(passes.values()) + sum(work.values()), pass_seconds=passes, work_seconds=work)
    if BUILT_COPY not in heaviest.parts:  # a pipeline that holds no built copies (layer by layer) holds no second
        return timed
    # the whole model: auto holds a second built candidate beside the first, its built model and the copy its
    # held-back pass measures, and its factors
    extra = max(f.parts[BUILT_COPY] + f.parts[FACTORS] for f in forecasts if f is not heaviest)
    parts = {**heaviest.parts, "a second built candidate (auto)": extra}
    return replace(timed, peak_bytes=heaviest.peak_bytes + extra, parts=parts)


def describe(f: Forecast, reason: str | None = None) -> str:
    """The dry run's printout: the pipeline (and why: gac.pipelines.choice.PipelineChoice.reason), peak per device,
    disk, time, and what the peak is made of."""
    lines = [
        f"pipeline: {f.pipeline}" + (f" ({reason})" if reason else ""),
        f"peak memory (cpu): {f.peak_bytes / GIB:.2f} GiB",
        f"model weights: {f.weights_bytes / GIB:.1f} GiB",
        f"disk needed (output and temporary): {f.disk_bytes / GIB:.1f} GiB",
        f"rough time: {_duration(f.seconds)}",
        "peak made of:",
    ]
    lines += [f"  {name}: {size / GIB:.2f} GiB" for name, size in f.parts.items()]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, math.ceil(seconds))} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
