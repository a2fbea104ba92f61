"""The process's heap, tuned for the planner's arrays (glibc only; elsewhere nothing changes).

On a wafer the planner and codegen build and drop arrays of a few megabytes per call (one
row per core of 850,000), tens of thousands of times in a compile. glibc's malloc serves
such blocks with ``mmap`` and gives them back with ``munmap`` (or trims the heap's top),
so every one is paged in again, zeroed by the kernel: a fifth of a wafer compile's time
went to the system (``t10c compile llama3-8b-decode --chip wse2 --timing-only``: 18 s of
system time beside 68 s of user time). `tune` keeps such blocks in the heap and the freed top
for reuse, as glibc's own tunables ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` and
``MALLOC_TOP_PAD_`` would if set before the process started (``mallopt``, the same
parameters, takes effect from the call on). What the compiler computes does not change;
the peak resident memory grew by under 2% where measured (README, Compile speed and memory).

Only for wafers (`tune_for`): the emulator, whose buffers are reused from its own pool, runs
slower on a tuned heap (``t10c run`` of bert-base on ipu-mk2: 1.09 s against 0.73 s, medians
of eight pairs), as it does with any of the three thresholds set alone (setting one turns
glibc's own sliding mmap threshold off).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from t10c.chips import Chip

# mallopt's parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: blocks below this come from the heap (glibc's ceiling for the threshold on 64-bit hosts)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: the heap's free top is kept up to this (a wafer compile's working set, not its peak)
TRIM_THRESHOLD = 1024 * 1024 * 1024
#: the heap grows by at least this at a time
TOP_PAD = 64 * 1024 * 1024

#: chips from this many cores on get the tuned heap: a row of 8 bytes per core is 1 MiB
TUNED_FROM_CORES = 131072

_done = False


def tune_for(chip: Chip) -> bool:
    """`tune` when ``chip`` is a wafer (at least `TUNED_FROM_CORES` cores); whether the heap
    is tuned."""
    return tune() if chip.cores >= TUNED_FROM_CORES else _done


def tune() -> bool:
    """Set the allocator's thresholds for this process once (idempotent); whether they took.
    A host without glibc (macOS, musl) keeps its allocator as it is."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # (mallopt returns 1 on success; musl has no mallopt and took the except above)
    _done = all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_TOP_PAD, TOP_PAD)))
    return _done


__all__ = ["MMAP_THRESHOLD", "TOP_PAD", "TRIM_THRESHOLD", "TUNED_FROM_CORES", "tune", "tune_for"]
