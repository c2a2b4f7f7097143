"""Atomic, signal-safe writes: a reader sees the old output or the new one, never half of one, and an
interrupted run (Ctrl-C, SIGTERM from a scheduler or `timeout`, SIGHUP from a closed terminal) leaves no hidden
temporary behind.

- `terminate_as_interrupt()`: while active, SIGTERM and SIGHUP raise `Terminated` (a KeyboardInterrupt), so the
  same cleanup that handles Ctrl-C runs for them too. The CLI wraps every verb in it.
- `critical()`: signals are held (deferred, not lost) while an output is swapped into place, so a rename pair is
  never cut in half; they are delivered right after.
- `atomic_dir(out, force)`: yields a temporary sibling directory to fill; on success it replaces `out`, every file
  in it 0666 and every directory 0777 minus the umask, whatever its writer used (mkdtemp's 0700, safetensors'
  0600); on any exception it is removed. Only SIGKILL or a power cut can leave that sibling
  (`.NAME.RAND.HOST-PID.partial`) behind: the next atomic_dir in the same parent names each such leftover and
  removes those whose writer process is gone.
- `write_file(path, write)`: the same for one file (`write(tmp_path)` fills it; the suffix is kept for
  matplotlib and friends).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Protocol

from gac.errors import GacError

log = logging.getLogger(__name__)

HANDLED = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
HELD = tuple(s for s in (signal.SIGINT, *HANDLED))


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so that every `except BaseException` cleanup runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def _handling(signals: Iterable[int], handler: Callable[[int, FrameType | None], object]) -> Iterator[None]:
    """`handler` for `signals` while inside, the previous handlers after (main thread only; elsewhere a no-op)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in signals:
            try:
                previous[s] = signal.signal(s, handler)
            except (OSError, ValueError):
                pass
    try:
        yield
    finally:
        for s, handler_before in previous.items():
            signal.signal(s, handler_before)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP -> Terminated while inside (main thread only; elsewhere a no-op)."""
    with _handling(HANDLED, _raise):
        yield


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP during a short step that must not be cut in half; a signal that arrives
    meanwhile is re-raised right after. (Python-level deferral, not a thread signal mask: in a process with
    other threads, as torch's, the kernel may deliver a masked signal to another thread.)"""
    pending: list[int] = []
    with _handling(HELD, lambda signum, frame: pending.append(signum)):
        yield
    if pending:
        signal.raise_signal(pending[0])  # now handled as usual: Terminated, KeyboardInterrupt, or exit


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The permissions of a new file under the current umask (0666 minus it)."""
    return 0o666 & ~_umask()


def io_failure(e: BaseException) -> str | None:
    """Why a write failed, where `e` is a failed write: an OSError's reason, or the operating system's words for the
    error number a library's own error carries (safetensors' SafetensorError ends `... (os error 28)` for a full
    disk, as Rust prints an I/O error); None for anything else."""
    if isinstance(e, OSError):
        return e.strerror or str(e)
    code = re.search(r"\(os error (\d+)\)", str(e))
    return os.strerror(int(code.group(1))) if code else None


def _oserror(path: str | Path, reason: str | None, flag: str) -> GacError:
    return GacError(f"cannot write {path} ({reason}): free space or choose another {flag}")


@contextlib.contextmanager
def atomic_dir(out: str | Path, *, force: bool = False, flag: str = "--out") -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it becomes `out` (replacing it when force)."""
    out = Path(out).expanduser().absolute()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(out.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=f".{_writer()}.partial", dir=out.parent))
    except OSError as e:
        raise _oserror(out, io_failure(e), flag) from None
    try:
        yield tmp
        usual_modes(tmp)
        _swap_in(tmp, out, force)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if (reason := io_failure(e)) is not None:
            raise _oserror(out, reason, flag) from None
        raise


def usual_modes(d: Path) -> None:
    """Every file under `d` 0666 and every directory (d included) 0777 minus the umask: a saved model is readable
    like anything else the user writes, whichever library wrote each file."""
    file_mode, dir_mode = new_file_mode(), 0o777 & ~_umask()
    os.chmod(d, dir_mode)
    for root, dirs, files in os.walk(d):
        for name in dirs:
            os.chmod(os.path.join(root, name), dir_mode)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, file_mode)


def _writer() -> str:
    """HOST-PID of this process, as the name of its temporary directories carries it (the host without dots)."""
    return f"{re.sub(r'[^A-Za-z0-9-]', '-', socket.gethostname())}-{os.getpid()}"


def _writer_of(name: str) -> tuple[str, int] | None:
    """(host, pid) from `.NAME.RAND.HOST-PID.partial`; None for a name without them (an earlier gac's)."""
    host, _, pid = name.removesuffix(".partial").rpartition(".")[2].rpartition("-")
    return (host, int(pid)) if host and pid.isdigit() else None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_stale_partials(parent: Path) -> list[Path]:
    """Remove the `.*.partial` directories in `parent` whose writer (a process on this host) is gone, as a killed
    run leaves them; log each one found, removed or left (a writer still running, another host's, an earlier
    gac's without a writer in its name). Returns the removed ones."""
    removed: list[Path] = []
    try:
        found = sorted(p for p in Path(parent).glob(".*.partial") if p.is_dir() and not p.is_symlink())
    except OSError:
        return removed
    here = _writer().rpartition("-")[0]
    for p in found:
        writer = _writer_of(p.name)
        if writer is None:
            log.warning(
                "%s: left by an earlier interrupted run of unknown writer; remove it if no run is writing there", p
            )
        elif writer[0] != here:
            log.warning("%s: left, written by host %s", p, writer[0])
        elif os.name != "posix":  # os.kill(pid, 0) would end the process there, not ask about it
            log.warning("%s: left, written by pid %d; remove it if that process is gone", p, writer[1])
        elif _running(writer[1]):
            log.info("%s: left, its writer (pid %d) is running", p, writer[1])
        else:
            shutil.rmtree(p, ignore_errors=True)
            if p.exists():  # another user's, say
                log.warning(
                    "%s: left by a killed run (pid %d is gone) but could not be removed: remove it by hand",
                    p,
                    writer[1],
                )
            else:
                removed.append(p)
                log.warning("removed %s, left by a killed run (pid %d is gone)", p, writer[1])
    return removed


def _swap_in(tmp: Path, out: Path, force: bool) -> None:
    with critical():
        if out.exists() or out.is_symlink():
            if not force:
                raise GacError(f"output directory {out} already exists: choose another --out or pass --force")
            if not out.is_dir() or out.is_symlink():
                raise GacError(f"{out} exists and is not a directory: choose another --out")
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old, out)  # put the old output back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)


class FileWriter(Protocol):
    """Fills the file at the path it is given."""

    def __call__(self, path: Path, /) -> object: ...


def write_file(path: str | Path, write: FileWriter, *, flag: str = "--out") -> Path:
    """Fill a temporary sibling with `write(tmp_path)`, then rename it over `path`."""
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix or ".tmp", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise _oserror(path, io_failure(e), flag) from None
    try:
        os.chmod(tmp, new_file_mode())  # mkstemp creates 0600; give the usual permissions of a new file
        write(Path(tmp))
        with critical():
            os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if (reason := io_failure(e)) is not None:
            raise _oserror(path, reason, flag) from None
        raise
    return path


def write_text(path: str | Path, text: str, *, flag: str = "--out") -> Path:
    return write_file(path, lambda p: p.write_text(text, encoding="utf-8"), flag=flag)
