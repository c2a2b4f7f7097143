"""Schema of a hardware profile (`gac profile` output): field types, finite positive latencies, and the dtype and
device it was measured for against the ones in use. Pure Python (no torch), so checks run before any work.

Decision (docs/USAGE.md): a profile measured for another dtype or device type (cpu vs cuda) than the run uses
is an error; `--allow-profile-mismatch` turns it into a warning that names both. Another machine of the same
device type (another CPU model, another GPU) is fine: that is what sharing profiles is for.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, NoReturn

from gac.errors import GacError

log = logging.getLogger(__name__)

PROFILE_VERSION = 1
OPS = (
    "gemm_n",
    "gemm_k",
    "sdpa",
    "lowrank",
    "sdpa_heads",
    "experts",  # gac.hw.profile.ALL_OPS, torch-free
    "int8_n",
    "int8_k",
    "fp8_n",
    "fp8_k",
)
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
REGENERATE = "re-measure it with `gac profile --out FILE`"


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _positive_ms(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def check_profile(profile: Any, path: str | os.PathLike[str]) -> dict[str, Any]:
    """`profile` (parsed JSON) if it is a well-formed gac profile; else a one-line GacError naming the field."""

    def bad(what: str) -> NoReturn:
        raise GacError(f"profile {path}: {what}: {REGENERATE}")

    if not isinstance(profile, dict) or "gac_profile" not in profile:
        raise GacError(f'{path} is not a gac profile (no "gac_profile" key): pass a file written by `gac profile`')
    if profile["gac_profile"] != PROFILE_VERSION:
        bad(f"format {profile['gac_profile']!r}, this gac reads {PROFILE_VERSION}")
    ops = profile.get("ops")
    if not isinstance(ops, list):
        bad('"ops" must be a list of sweeps')
    if not ops:
        bad('no measurements (empty "ops")')
    for i, e in enumerate(ops):
        where = f"op entry {i}"
        if not isinstance(e, dict) or not {"op", "m", "dims", "ms"} <= e.keys():
            bad(f"{where} is malformed (needs op, m, dims, ms)")
        if e["op"] not in OPS:
            bad(f"{where}: unknown op {e['op']!r} (one of {', '.join(OPS)})")
        if not (_int(e["m"]) and e["m"] >= 1):
            bad(f'{where}: "m" must be a positive integer, got {e["m"]!r}')
        if "shape" in e and not (isinstance(e["shape"], dict) and all(_int(v) and v >= 1 for v in e["shape"].values())):
            bad(f'{where}: "shape" must map names to positive integers')
        dims, ms = e["dims"], e["ms"]
        if not isinstance(dims, list) or not dims or not all(_int(d) and d >= 1 for d in dims):
            bad(f'{where}: "dims" must be a non-empty list of positive integers')
        if len(set(dims)) != len(dims):
            bad(f'{where}: "dims" has duplicates')
        if not isinstance(ms, list) or len(ms) != len(dims):
            bad(f'{where} is malformed: "ms" must be a list as long as "dims" ({len(dims)})')
        refused = e.get("refused") or {}  # a quantized kernel's refused shapes: no latency
        for d, t in zip(dims, ms):
            if t is None and str(d) in refused:
                continue
            if not _positive_ms(t):
                bad(f"{where}: latency at dim {d} is {t!r}; latencies must be finite positive numbers")
        for key in ("p10_ms", "p90_ms"):
            if key in e and not (
                isinstance(e[key], list)
                and len(e[key]) == len(dims)
                and all(_positive_ms(t) or (t is None and str(d) in refused) for d, t in zip(dims, e[key]))
            ):
                bad(f'{where}: "{key}" must be finite positive numbers, one per dim')
    if profile.get("dtype") not in DTYPES:
        bad(f'"dtype" is {profile.get("dtype")!r}, not one of {", ".join(DTYPES)}')
    if profile.get("device") not in DEVICES:
        bad(f'"device" is {profile.get("device")!r}, not one of {", ".join(DEVICES)}')
    for key in ("device_name", "torch", "date"):
        if key in profile and not isinstance(profile[key], str):
            bad(f'"{key}" must be a string, got {type(profile[key]).__name__}')
    if "threads" in profile and not (_int(profile["threads"]) and profile["threads"] >= 1):
        bad(f'"threads" must be a positive integer, got {profile["threads"]!r}')
    if "spec" in profile and not isinstance(profile["spec"], dict):
        bad('"spec" must be an object')
    return profile


def check_profile_matches(
    profile: dict[str, Any], path: str | os.PathLike[str], *, device: str, dtype: str, allow: bool = False
) -> None:
    """The profile's dtype and device type against the run's: an error, or with `allow` a warning naming both."""
    used_type = "cuda" if str(device).startswith("cuda") else "cpu"
    problems = []
    if profile.get("dtype") != dtype:
        problems.append(f"dtype {profile.get('dtype')} (this run uses {dtype})")
    if profile.get("device") != used_type:
        problems.append(f"device {profile.get('device')} (this run uses {used_type})")
    if not problems:
        return
    what = f"profile {path} was measured for {' and '.join(problems)}"
    if allow:
        log.warning("%s; using it anyway (--allow-profile-mismatch)", what)
        return
    raise GacError(
        f"{what}: measure one with `gac profile --device {used_type} --dtype {dtype}`, or pass "
        "--allow-profile-mismatch to use it anyway"
    )
