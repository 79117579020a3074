"""A CPU run's resident memory: give large freed blocks back to the operating system.

glibc's malloc serves a request of at least its *mmap threshold* (128 KiB at start) from
a fresh mapping and unmaps it when freed. But every time such a block is freed, glibc
raises the threshold to that block's size (up to 32 MiB), so a training step's large
transient tensors soon come from the heap instead, and the heap only shrinks from its
top. With tensor sizes that change every packed batch, freed fragments pile up: the peak
RSS keeps climbing for tens of steps, well above what the step needs with its blocks
unmapped when freed (BENCHMARKS.md, "Memory").

Fixing the threshold (``mallopt(M_MMAP_THRESHOLD, n)``, the same as starting the process
with ``MALLOC_MMAP_THRESHOLD_=n``) stops the raising: every block of ``n`` bytes or more is
its own mapping again and goes back to the system when freed. The price is a system call
and freshly zeroed pages for each such block, and a step allocates many: the lower the
threshold, the less memory and the slower the step (per setting: BENCHMARKS.md, "Memory"). So
nothing is set unless ``train.mmap_threshold_mib`` asks; it is a knob for runs whose
memory matters more than their speed (GradCache at large batches).

Only glibc's malloc has this knob: elsewhere (macOS, Windows, musl, a preloaded
jemalloc/tcmalloc) the setting is reported as not applied and changes nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from dataclasses import dataclass

__all__ = ["ENV_VAR", "HeapChoice", "apply_mmap_threshold", "set_mmap_threshold"]

ENV_VAR = "MALLOC_MMAP_THRESHOLD_"  # glibc reads it at start-up (note the trailing underscore)
_M_MMAP_THRESHOLD = -3  # from glibc's <malloc.h>


@dataclass(frozen=True)
class HeapChoice:
    """The mmap threshold this run fixed (None: glibc's default behaviour), and why."""

    mmap_threshold_mib: int | None
    reason: str


def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (whose ``mallopt`` this module sets)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)  # the symbols already loaded: the malloc this process uses
    if not hasattr(libc, "gnu_get_libc_version"):
        return None
    return libc


def set_mmap_threshold(nbytes: int) -> bool:
    """Fix glibc's mmap threshold at ``nbytes`` for this process; False where that is not
    possible (no glibc, or ``mallopt`` refused the value)."""
    libc = _glibc()
    return libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(nbytes)) == 1


def apply_mmap_threshold(mib: int | None) -> HeapChoice:
    """Apply ``train.mmap_threshold_mib`` (None: leave malloc as it is) to this process."""
    if mib is None:
        where = f"{ENV_VAR}={os.environ[ENV_VAR]} from the environment" if ENV_VAR in os.environ else "glibc's default"
        return HeapChoice(None, f"malloc as it is ({where})")
    if _glibc() is None:
        return HeapChoice(None, f"mmap_threshold_mib {mib} not applied: no glibc malloc here ({sys.platform})")
    if not set_mmap_threshold(mib << 20):
        return HeapChoice(None, f"mmap_threshold_mib {mib} not applied: glibc's mallopt refused it")
    return HeapChoice(mib, f"glibc mmap threshold fixed at {mib} MiB: freed blocks of that size or more go back to the OS")
