"""A CPU run's resident memory: give large freed blocks back to the operating system.

glibc's malloc serves a request of at least its *mmap threshold* (128 KiB at start) from
a fresh mapping and unmaps it when freed. But every time such a block is freed, glibc
raises the threshold to that block's size (up to 32 MiB), so a training step's large
transient tensors soon come from the heap instead, and the heap only shrinks from its
top. With tensor sizes that change every packed batch, freed fragments pile up: on the
unsup recipe the RSS climbs by ~1.2 GiB over 30 steps at batch 64, and by ~1.6 GiB in 4
GradCache steps at batch 1024, none of it live tensors (``benchmarks/gradcache_rss.py``).

Fixing the threshold (``mallopt(M_MMAP_THRESHOLD, 1 MiB)``, the same as starting the
process with ``MALLOC_MMAP_THRESHOLD_=1048576``) stops the raising: every block of 1 MiB
or more is its own mapping again and goes back to the system when freed. The price is a
system call and fresh zeroed pages per large tensor; ``BENCHMARKS.md`` has both sides.

``release_memory: auto`` fixes it for CPU runs on Linux with glibc, and leaves the process
alone where the user already chose (the variable is set) or where there is no glibc (macOS,
Windows, musl, a preloaded jemalloc/tcmalloc). On CUDA the big tensors live on the GPU.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
from dataclasses import dataclass

__all__ = ["ENV_VAR", "MMAP_THRESHOLD", "HeapChoice", "resolve_release_memory", "set_mmap_threshold"]

logger = logging.getLogger(__name__)

MMAP_THRESHOLD = 1 << 20  # bytes; a block this large is worth its own mapping
ENV_VAR = "MALLOC_MMAP_THRESHOLD_"  # glibc reads it at start-up (note the trailing underscore)
_M_MMAP_THRESHOLD = -3  # from glibc's <malloc.h>


@dataclass(frozen=True)
class HeapChoice:
    """Whether this run fixed glibc's mmap threshold, and why (one line for the log)."""

    release_memory: bool
    reason: str


def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (whose ``mallopt`` this module sets)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)  # the symbols already loaded: the malloc this process uses
    if not hasattr(libc, "gnu_get_libc_version"):
        return None
    return libc


def set_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``nbytes`` for this process; False where that is not
    possible (no glibc, or ``mallopt`` refused the value)."""
    libc = _glibc()
    return libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(nbytes)) == 1


def resolve_release_memory(setting: bool | str, device: str) -> HeapChoice:
    """Decide and apply ``train.release_memory`` (True, False or ``"auto"``) for a run on
    ``device`` (``"cpu"`` or ``"cuda"``)."""
    if setting is False:
        return HeapChoice(False, "release_memory: false in the config")
    if setting == "auto":
        if device != "cpu":
            return HeapChoice(False, f"{device}: host memory is not where the tensors live; malloc left as it is")
        if ENV_VAR in os.environ:
            return HeapChoice(False, f"{ENV_VAR}={os.environ[ENV_VAR]} set in the environment; malloc left as it is")
    if _glibc() is None:
        return HeapChoice(False, f"no glibc malloc here ({sys.platform}); the allocator is left as it is")
    if not set_mmap_threshold():
        return HeapChoice(False, "glibc's mallopt refused M_MMAP_THRESHOLD; malloc left as it is")
    return HeapChoice(True, f"glibc mmap threshold fixed at {MMAP_THRESHOLD >> 20} MiB: freed large blocks go back to the OS")
