"""Checks at the edge, before any work starts: option values, input files (bounded reads, encodings) and output
locations (probed for writability up front). Each failure is one GacError line naming the problem and the fix.

Decisions (docs/USAGE.md):
- Text files (--calib-file, --eval-file) must be UTF-8 (a UTF-8 BOM is dropped) or UTF-16/UTF-32 with a BOM.
  Anything else (Latin-1, binary, NUL bytes) is refused with the `iconv` command that converts it, never
  decoded with replacement characters.
- Text and JSON inputs must be regular files under a size limit (no /dev/zero, FIFOs or directories).
"""

from __future__ import annotations

import codecs
import json
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import NoReturn, SupportsFloat, TypeGuard

from gac.errors import ConfigError, GacError, literal

TEXT_LIMIT = 256 * 2**20  # bytes of calibration/evaluation text read at most
JSON_LIMIT = 64 * 2**20  # bytes of a plan or profile read at most
JSON_DEPTH = 64  # nesting depth of a plan or profile JSON

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


# ---------------------------------------------------------------------------------------------------- options


def integer(
    value: object, flag: str, *, minimum: int = 1, maximum: int | None = None, example: int | None = None
) -> int:
    """`value` as an int in [minimum, maximum], or GacError naming the flag and a valid example."""
    if _in_range(value, minimum, maximum):
        return value
    raise GacError(
        f"bad {flag} {value!r}: give an integer {_range_words(minimum, maximum)}, e.g. "
        f"{flag} {minimum if example is None else example}"
    )


def field_integer(value: object, field: str, *, minimum: int = 1, example: int, also: str = "") -> int:
    """integer() for a library config's field: a ConfigError naming the field, which the CLI words as its flag;
    `also`: another value it takes ("0 for none")."""
    if _in_range(value, minimum, None):
        return value
    limits = _range_words(minimum, None) + (f" (or {also})" if also else "")
    raise ConfigError(f"bad {{{field}}} {literal(repr(value))}: give an integer {limits}, e.g. {{{field}:{example}}}")


def _in_range(value: object, minimum: int, maximum: int | None) -> TypeGuard[int]:
    """An int (not a bool) in [minimum, maximum]."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return value >= minimum and (maximum is None or value <= maximum)


def _range_words(minimum: int, maximum: int | None) -> str:
    return f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"


def real(
    value: SupportsFloat | str, flag: str, *, low: float | None = None, high: float | None = None, example: float
) -> float:
    """A finite float in the open interval (low, high) (either side may be None)."""
    x, where = _real(value, low, high)
    if where is None:
        return x
    raise GacError(f"bad {flag} {value!r}: give a finite number{where}, e.g. {flag} {example}")


def field_real(
    value: SupportsFloat | str, field: str, *, low: float | None = None, high: float | None = None, example: float
) -> float:
    """real() for a library config's field: a ConfigError naming the field, which the CLI words as its flag."""
    x, where = _real(value, low, high)
    if where is None:
        return x
    raise ConfigError(
        f"bad {{{field}}} {literal(repr(value))}: give a finite number{where}, e.g. {{{field}:{example}}}"
    )


def _real(value: SupportsFloat | str, low: float | None, high: float | None) -> tuple[float, str | None]:
    """(value as a float, None) when finite and in (low, high), else (_, the words for that interval)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if math.isfinite(x) and (low is None or x > low) and (high is None or x < high):
        return x, None
    where = {
        (True, True): f" in ({low}, {high})",
        (True, False): f" > {low}",
        (False, True): f" < {high}",
        (False, False): "",
    }[(low is not None, high is not None)]
    return x, where


# ------------------------------------------------------------------------------------------------ input files


def _regular_file(path: str | Path, what: str, flag: str) -> Path:
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise GacError(f"cannot read {what} {p}: no such file: check the path given to {flag}") from None
    except OSError as e:
        raise GacError(f"cannot read {what} {p} ({e.strerror}): check the path given to {flag}") from None
    if stat.S_ISDIR(st.st_mode):
        raise GacError(f"{what} {p} is a directory: pass a file to {flag}")
    if not stat.S_ISREG(st.st_mode):
        raise GacError(f"{what} {p} is not a regular file (a device, pipe or socket): pass a file to {flag}")
    if not os.access(p, os.R_OK):
        raise GacError(f"cannot read {what} {p} (permission denied): make it readable or copy it")
    return p


def read_bytes(path: str | Path, what: str, flag: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (the read itself is bounded too)."""
    p = _regular_file(path, what, flag)
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise GacError(f"cannot read {what} {p} ({e.strerror}): check the path given to {flag}") from None
    if len(data) > limit:
        raise GacError(f"{what} {p} is larger than {limit // 2**20} MiB: pass a smaller file to {flag}")
    return data


def decode_text(data: bytes, p: str | Path, what: str) -> str:
    """UTF-8 (BOM dropped), or UTF-16/32 with a BOM; anything else is GacError with the conversion command."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(codec)
            except UnicodeDecodeError:
                break
    else:
        if b"\x00" in data:
            raise GacError(f"{what} {p} is binary (it contains NUL bytes), not text: pass a UTF-8 text file")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GacError(
                f"{what} {p} is not UTF-8 (invalid byte at offset {e.start}): convert it, e.g. "
                f"`iconv -f LATIN1 -t UTF-8 {p} > {Path(p).stem}.utf8.txt`, and pass that"
            ) from None
    raise GacError(f"{what} {p} starts with a Unicode BOM but does not decode: pass a UTF-8 text file")


def read_text(
    path: str | Path, what: str = "text file", flag: str = "--calib-file/--eval-file", limit: int = TEXT_LIMIT
) -> str:
    p = Path(path).expanduser()
    text = decode_text(read_bytes(p, what, flag, limit), p, what)
    if not text.strip():
        raise GacError(f"{what} {p} is empty: pass a file with text in it to {flag}")
    return text


def _depth(text: str) -> int:
    """Maximum bracket nesting of a JSON text (strings skipped), without recursion."""
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def read_json(path: str | Path, what: str, flag: str, *, limit: int = JSON_LIMIT, fix: str = "") -> object:
    """Parse a JSON file: bounded size, bounded nesting, UTF-8, finite numbers only (NaN/Infinity refused)."""
    p = Path(path).expanduser()
    text = decode_text(read_bytes(p, what, flag, limit), p, what)
    fix = fix or f"pass a valid {what} to {flag}"
    if _depth(text) > JSON_DEPTH:
        raise GacError(f"{what} {p} is nested deeper than {JSON_DEPTH} levels: {fix}")

    def constant(name: str) -> NoReturn:
        raise ValueError(f"{name} is not a valid number")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as e:
        raise GacError(f"{what} {p} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): {fix}") from None
    except (ValueError, RecursionError) as e:
        raise GacError(f"{what} {p} is not valid JSON ({e}): {fix}") from None


# ----------------------------------------------------------------------------------------------- output paths


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q != q.parent:
        if q.is_symlink():  # a dangling link: the output would land wherever it points
            raise GacError(f"{q} is a broken symbolic link: remove it or choose another location")
        q = q.parent
    return q


def _probe_dir(d: Path, target: Path, flag: str) -> None:
    """Create and delete a file in `d` (the real test of writability: read-only mounts, /proc, ACLs)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".gac-probe-", dir=d)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise GacError(f"cannot write {target}: {d} is not writable ({e.strerror}): choose another {flag}") from None


def writable_location(path: str | Path, flag: str, *, is_dir: bool) -> Path:
    """Check up front that `path` (a file or a directory, created with its parents) can be written.

    Nothing is created: the nearest existing ancestor must be a directory we can write in."""
    p = Path(path).expanduser().absolute()
    if p.exists() or p.is_symlink():
        if is_dir and not p.is_dir():
            raise GacError(f"{p} exists and is not a directory: choose another {flag}")
        if not is_dir and p.is_dir():
            raise GacError(f"{p} is a directory: give a file name to {flag}")
        if not is_dir and not p.is_file():
            raise GacError(f"{p} is not a regular file (a device or pipe): give a file name to {flag}")
    base = _nearest_existing(p.parent)
    if not base.is_dir():
        raise GacError(f"cannot write {p}: {base} is a file, not a directory: choose another {flag}")
    _probe_dir(base, p, flag)
    return p


def weights_size(spec: str) -> int:
    """Bytes of a local model's weight files (0 when unknown: an alias or a hub id)."""
    p = Path(spec).expanduser()
    if p.is_file():
        return p.stat().st_size
    if p.is_dir():
        return sum(
            f.stat().st_size for f in p.iterdir() if f.suffix in (".safetensors", ".bin", ".gguf") and f.is_file()
        )
    return 0


def enough_space(path: str | Path, need: int, flag: str = "--out") -> None:
    """Refuse up front when the output's file system has less free space than `need` bytes (a lower bound of
    what will be written), instead of failing with ENOSPC after all the work."""
    if need <= 0:
        return
    base = _nearest_existing(Path(path).expanduser().absolute().parent)
    try:
        free = shutil.disk_usage(base).free
    except OSError:
        return
    if free < need:
        raise GacError(
            f"not enough space for {path}: {free / 2**20:.0f} MiB free on {base}, about "
            f"{need / 2**20:.0f} MiB needed: free space or choose another {flag}"
        )


def output_dir(path: str | Path, flag: str = "--out", *, force: bool = False) -> Path:
    """An output model directory: refused if it exists (unless force), probed for writability."""
    p = Path(path).expanduser()
    if (p.exists() or p.is_symlink()) and not force:
        raise GacError(f"output directory {p} already exists: choose another {flag} or pass --force to replace it")
    return writable_location(p, flag, is_dir=True)


def output_file(path: str | Path, flag: str) -> Path:
    return writable_location(path, flag, is_dir=False)


# ----------------------------------------------------------------------------------------------- model specs


def local_model_typo(spec: str) -> None:
    """A spec that looks like a relative path (./x, x/y/z, ../x) but is not there: a typo, not a hub id."""
    p = Path(spec).expanduser()
    if p.exists():
        return
    looks_local = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or spec.endswith(("/", ".gguf"))
    if looks_local:
        raise GacError(
            f"model {spec!r} not found: no such file or directory; pass an existing path (hub ids look like org/name)"
        )


def not_a_gac_output(spec: str, flag: str = "--model") -> None:
    """gac compress reads an original model; a gac output is already compressed."""
    p = Path(spec).expanduser()
    written = ("gac_plan.json", "modeling_gac.py", "gac_export.json")  # a gac output, or a DeciLM export of one
    if p.is_dir() and any((p / name).exists() for name in written):
        raise GacError(
            f"{spec} is a gac output (already compressed): pass the original model to {flag} "
            "(its source_model is in gac_plan.json); to fix its dims use `gac repair`"
        )


def quantization_of(path: str | Path) -> dict | None:
    """The quantization_config of a model directory's config.json (gac quantize writes one), or None."""
    config = Path(path).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        found = json.loads(config.read_text(encoding="utf-8")).get("quantization_config")
    except (OSError, ValueError, AttributeError, RecursionError):  # the config reader reports a bad config
        return None
    return found if isinstance(found, dict) else None


def not_quantized(spec: str, verb: str) -> None:
    """A quantized directory is an end product: refused as the input of a verb that rewrites weights."""
    q = quantization_of(spec)
    if q is not None:
        raise GacError(
            f"{spec} is already quantized ({q.get('quant_method', 'quantization_config')} in its "
            f"config.json): pass the unquantized model it was made from to {verb}"
        )
