"""glibc's heap, where it shapes memory or timing: freed memory handed back to the OS, large allocations mapped
one by one (the layer-wise pipeline's and --compressor auto's flat peak), and the heap as glibc keeps it by default
while models are timed. A no-op on another OS or C library."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
LARGE_ALLOCATION = 1 << 20  # bytes: one [2, 128, 1024] float32 activation; weights and X^T X are larger
DYNAMIC_MAX = 32 << 20  # bytes: the largest mmap threshold glibc's dynamic one reaches on a 64-bit machine
DEFAULT_TRIM = 128 << 10  # bytes: glibc's trim threshold, which its dynamic rule sets to twice the mmap threshold
_mapped: list[int] = []  # the threshold map_large_allocations set in this process, if it did


def return_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's malloc_trim). Layer-sized tensors fall under glibc's dynamic
    mmap threshold once a few have been freed, so without this the heap keeps each released layer's pages and the
    resident size creeps up with depth. A no-op elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def map_large_allocations(threshold: int = LARGE_ALLOCATION) -> bool:
    """Serve every allocation of `threshold` bytes or more with its own mmap, unmapped when freed (glibc's
    mallopt(M_MMAP_THRESHOLD)), for the rest of the process (timing_heap lifts it while models are timed). glibc's
    default threshold is dynamic: each freed mmapped block raises it (up to 32 MiB), after which layer-sized tensors
    are carved from the heap, whose freed blocks stay resident and fragment; the layer-by-layer peak then crept up
    with depth (with a fixed threshold it stays flat over the layers). Returns whether it was set (False off
    glibc)."""
    libc = _glibc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, threshold):
        return False
    _mapped[:] = [threshold]
    return True


@contextlib.contextmanager
def timing_heap() -> Iterator[None]:
    """While models are timed, allocations below glibc's largest dynamic threshold come from the heap and stay there
    when freed, as in a process that never called map_large_allocations; after, the threshold it set is back and the
    freed heap goes to the OS. With every activation of a megabyte or more mapped and unmapped anew, each forward
    pass pays its page faults, and a model timed under that threshold measures a slower machine than a user runs."""
    libc = _glibc() if _mapped else None
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, DYNAMIC_MAX)
    libc.mallopt(M_TRIM_THRESHOLD, 2 * DYNAMIC_MAX)  # freed activations at the heap's top stay for the next call
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, _mapped[0])
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM)
        return_freed_memory()


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc through ctypes, or None (another OS, or another C library such as musl). Opened by glibc's soname:
    ctypes.util.find_library would start `ldconfig -p` to find it."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # musl's is libc.so, and has neither function below
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None  # musl has neither
