"""`t10c.heap`: after `tune`, the planner's few-megabyte arrays come from the heap, not from
fresh ``mmap`` regions the kernel must zero again each time (glibc hosts; skipped elsewhere).
Run in a child process, which starts with the allocator's defaults (a wafer compile in
this one would have tuned it)."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest

CHILD = """
import ctypes, sys
import numpy as np
from t10c import heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def mapped_by(n):
    # bytes in mmap regions while an array of n bytes lives (one wafer row per core)
    before = libc.mallinfo2().hblkhd
    a = np.empty(n, dtype=np.uint8)
    a[:] = 1
    got = libc.mallinfo2().hblkhd - before
    del a
    return got

big = 7 * 1024 * 1024  # 850,000 cores x 8 bytes, about
print(mapped_by(big) >= big, heap.tune(), heap.tune(), mapped_by(big))
"""


def _glibc_with_mallinfo2() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc 2.33 or later only")
def test_wafer_sized_arrays_come_from_the_heap_once_tuned() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True).stdout.split()
    # by default glibc maps such a block afresh; tuned, it is carved from the heap
    assert out == ["True", "True", "True", "0"]


def test_only_a_wafer_compile_tunes_the_heap(tmp_path) -> None:
    """The emulator runs slower on the tuned heap: a compile for the IPU leaves glibc's
    defaults, one for a wafer tunes them (in a child process, which starts untuned)."""
    child = """
from t10c import heap
from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model
compile_model("mlp", PRESETS["test16"], CompileOptions(weights=False))
print(heap._done, heap.tune_for(PRESETS["ipu-mk2"]), heap.tune_for(PRESETS["wse2"]))
"""
    # (run elsewhere than the checkout, whose t10c/ folder is not the installed package)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.split()
    tuned = "True" if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" \
        else "False"
    assert out == ["False", "False", tuned]
