"""Which pipeline a run takes, whole model or layer by layer, and why: the one the config names, else the whole-model
forecast (gac.pipelines.memory) against the memory available on the compute device (--max-memory, else what is free
now)."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from gac.checkpoint.placement import parse_max_memory
from gac.compressors import AUTO
from gac.config import AUTO_PIPELINE, WHOLE_MODEL, CompressConfig
from gac.errors import ConfigError, GacError, literal
from gac.hw.device import check_device
from gac.pipelines import check_pipeline, get_pipeline
from gac.pipelines.memory import GIB, forecast_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Available:
    """Memory a run may use on its compute device, and where that figure comes from."""

    bytes: int
    source: str  # e.g. "--max-memory cpu", "MemAvailable", "cgroup limit", "cuda:0 free memory"


@dataclass(frozen=True)
class PipelineChoice:
    """Which pipeline a run takes and why: report.json's pipeline_choice, the log's and --dry-run's line."""

    pipeline: str  # its gac.pipelines.PIPELINES name: "whole" or "layerwise"
    reason: str
    whole_forecast_bytes: int | None = None  # the whole-model pipeline's forecast peak (None: not forecast)
    available_bytes: int | None = None
    available_from: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


LAYERWISE = "layerwise"  # the pipeline the forecast takes when the whole model would not fit
FORCING_FLAGS = {LAYERWISE: "--layerwise", WHOLE_MODEL: "--whole-model"}  # else --pipeline NAME


def choose_pipeline(
    whole_bytes: int | None, available: Available | None, forced: str | None = None, forced_by: str | None = None
) -> PipelineChoice:
    """The pipeline of a run: `forced` (a pipeline's name) as a flag (forced_by, default its FORCING_FLAGS entry, else
    --pipeline NAME) asks, else layer by layer exactly when the whole-model forecast `whole_bytes` exceeds the memory
    `available`; whole when either figure is unknown (nothing to compare). Pure: the figures are given."""

    def chosen(pipeline: str, reason: str) -> PipelineChoice:
        return PipelineChoice(
            pipeline,
            reason,
            whole_forecast_bytes=whole_bytes,
            available_bytes=available.bytes if available is not None else None,
            available_from=available.source if available is not None else None,
        )

    if forced is not None:
        return chosen(forced, f"{forced_by or FORCING_FLAGS.get(forced, f'--pipeline {forced}')} asks for it")
    if whole_bytes is None or available is None:
        missing = "no whole-model forecast (no config to read)" if whole_bytes is None else "no memory figure"
        return chosen(WHOLE_MODEL, f"{missing}: the whole-model pipeline")
    need, have = f"{whole_bytes / GIB:.1f} GiB", f"{available.bytes / GIB:.1f} GiB ({available.source})"
    if whole_bytes > available.bytes:
        return chosen(
            LAYERWISE,
            f"the whole-model pipeline would need about {need}, more than the {have} available: layer by layer",
        )
    return chosen(WHOLE_MODEL, f"the whole-model pipeline needs about {need}, within the {have} available")


def available_memory(device: str = "cpu", max_memory: str | dict | None = None) -> Available | None:
    """The memory a run on `device` may use: --max-memory's entry for it when given, else what the device has free
    now (CUDA: the driver's free memory; CPU: the least of MemAvailable, psutil's figure when installed, and the
    room left under a cgroup limit). None when nothing can be read."""
    limits = parse_max_memory(max_memory) or {}
    key = "cpu" if not str(device).startswith("cuda") else int(str(device).partition(":")[2] or 0)
    if key in limits:
        return Available(limits[key], f"--max-memory {'cpu' if key == 'cpu' else key}")
    if key != "cpu":
        check_device(device)  # CUDA there at all, before the driver is asked
        return Available(int(torch.cuda.mem_get_info(key)[0]), f"cuda:{key} free memory")
    figures = [f for f in (_meminfo_available(), _psutil_available(), _cgroup_room()) if f is not None]
    return min(figures, key=lambda a: a.bytes) if figures else None


def _meminfo_available() -> Available | None:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    kib = next((int(x.split()[1]) for x in lines if x.startswith("MemAvailable:")), None)
    return None if kib is None else Available(kib * 1024, "MemAvailable")


def _psutil_available() -> Available | None:
    try:
        import psutil
    except ImportError:
        return None
    return Available(int(psutil.virtual_memory().available), "psutil")


CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # v2
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)  # v1


def _cgroup_room() -> Available | None:
    """Limit minus usage of this process's memory cgroup (v2, else v1); None without a limit."""
    for limit_file, usage_file in CGROUP_FILES:
        try:
            limit, usage = (Path(f).read_text().strip() for f in (limit_file, usage_file))
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max" or a huge v1 value: no limit
            return Available(max(0, int(limit) - int(usage)), "cgroup limit")
    return None


def _per_rank(available: Available | None, device: str) -> Available | None:
    """Under torchrun the ranks of one node share its CPU memory: each rank's part of what is free (a --max-memory
    figure is one process's already; each CUDA rank has its own device)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if available is None or local <= 1 or str(device).startswith("cuda") or available.source.startswith("--max"):
        return available
    return Available(available.bytes // local, f"{available.source} shared by {local} ranks")


def plan_memory(cfg: CompressConfig) -> PipelineChoice:
    """The pipeline of a CompressConfig: the one cfg.pipeline names (--layerwise / --whole-model / --pipeline NAME),
    the whole model under --speedup (timed on the device) or --compressor auto, else choose_pipeline from the
    whole-model forecast and the memory available (available_memory). Another pipeline's own forecast beyond
    --max-memory is refused before any work; beyond the memory detected it is a warning (the forecast errs above
    measured peaks)."""
    check_pipeline(cfg.pipeline)  # a name no pipeline has, before any work
    forced = None if cfg.pipeline == AUTO_PIPELINE else cfg.pipeline
    forced_by = None
    if forced is None and cfg.objective.forces_whole_model is not None:
        forced_by = cfg.objective.forces_whole_model  # --speedup: timed on the device
    elif forced is None and cfg.compressor.name == AUTO:
        forced_by = "--compressor auto"  # every compressor analyzed on one calibration of the whole model
    available = _per_rank(available_memory(cfg.device, cfg.max_memory), cfg.device)
    whole = None
    if forced is None and forced_by is None:
        try:
            whole = forecast_of(cfg, WHOLE_MODEL).peak_bytes
        except GacError as e:  # e.g. a hub id: no local config to forecast from
            log.info("no whole-model forecast: %s", e)
    choice = choose_pipeline(whole, available, forced or (WHOLE_MODEL if forced_by else None), forced_by)
    if choice.pipeline != WHOLE_MODEL and available is not None:  # the whole model's was compared, or is forced
        need = forecast_of(cfg, choice.pipeline).peak_bytes
        if need > available.bytes:
            text = (
                f"{get_pipeline(choice.pipeline).title} needs about {need / GIB:.1f} GiB but {available.source} allows "
                f"{available.bytes / GIB:.1f} GiB"
            )
            if available.source.startswith("--max-memory"):
                raise ConfigError(
                    f"{literal(text)}: fewer {{calib_windows}}, a shorter {{seq_len}} or {{dtype:bfloat16}}"
                )
            log.warning("%s: it may not fit (fewer calibration windows, shorter ones or bfloat16 need less)", text)
    return choice
