"""Atomic, signal-safe writes: a reader sees the old output or the new one, never half of one, and an
interrupted run (Ctrl-C, SIGTERM from a scheduler or `timeout`, SIGHUP from a closed terminal) leaves no hidden
temporary behind.

- `terminate_as_interrupt()`: while active, SIGTERM and SIGHUP raise `Terminated` (a KeyboardInterrupt), so the
  same cleanup that handles Ctrl-C runs for them too. The CLI wraps every verb in it.
- `critical()`: signals are held (deferred, not lost) while an output is swapped into place, so a rename pair is
  never cut in half; they are delivered right after.
- `atomic_dir(out, force)`: yields a temporary sibling directory to fill; on success it replaces `out`
  (created with the usual 0777 & ~umask permissions, not mkdtemp's 0700); on any exception it is removed.
- `write_file(path, write)`: the same for one file (`write(tmp_path)` fills it; the suffix is kept for
  matplotlib and friends).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from gac.errors import GacError

HANDLED = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)
HELD = tuple(s for s in (signal.SIGINT, *HANDLED))


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so that every `except BaseException` cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum, frame):
    raise Terminated(signum)


@contextlib.contextmanager
def _handling(signals, handler):
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
def terminate_as_interrupt():
    """SIGTERM/SIGHUP -> Terminated while inside (main thread only; elsewhere a no-op)."""
    with _handling(HANDLED, _raise):
        yield


@contextlib.contextmanager
def critical():
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


def _oserror(path, e: OSError, flag: str) -> GacError:
    reason = e.strerror or str(e)
    return GacError(f"cannot write {path} ({reason}): free space or choose another {flag}")


@contextlib.contextmanager
def atomic_dir(out, *, force: bool = False, flag: str = "--out"):
    """Yield a temporary directory beside `out`; on success it becomes `out` (replacing it when force)."""
    out = Path(out).expanduser().absolute()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as e:
        raise _oserror(out, e, flag) from None
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # a saved model is readable like any directory, not 0700
        yield tmp
        _swap_in(tmp, out, force)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _oserror(out, e, flag) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


def write_file(path, write, *, flag: str = "--out") -> Path:
    """Fill a temporary sibling with `write(tmp_path)`, then rename it over `path`."""
    path = Path(path).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix or ".tmp", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise _oserror(path, e, flag) from None
    try:
        os.chmod(tmp, new_file_mode())  # mkstemp creates 0600; give the usual permissions of a new file
        write(Path(tmp))
        with critical():
            os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _oserror(path, e, flag) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path, text: str, *, flag: str = "--out") -> Path:
    return write_file(path, lambda p: p.write_text(text, encoding="utf-8"), flag=flag)
