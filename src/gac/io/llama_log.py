"""llama.cpp's log collected instead of printed: its bindings print every warning (their level table predates
llama.cpp's), which a user of gac should not see as output of a step that went right."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from types import ModuleType


@contextlib.contextmanager
def collected_log(llama_cpp: ModuleType) -> Iterator[list[str]]:
    """llama.cpp's log lines (in the pieces it writes them) appended to the list yielded, for as long as the block
    runs; llama-cpp-python's own printer is restored on exit."""
    messages: list[str] = []

    @llama_cpp.llama_log_callback
    def collect(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        messages.append(text.decode("utf-8", errors="replace"))

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        yield messages
    finally:
        from llama_cpp import _logger

        llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
