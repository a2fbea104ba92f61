"""The element types a program stores, in one table (every stage reads sizes from here).

``fp16`` and ``fp32`` are storage types the user picks with ``--dtype`` (products and
reductions accumulate in fp32 whatever the storage); ``int32`` holds integer operands on chip
(embedding indices: ONNX's int64 indices are narrowed, as every ICCA chip's integer unit is
32-bit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DType:
    """One on-chip element type: its name, size and numpy twin."""

    name: str
    bytes: int
    numpy: type[np.generic]
    #: a value no correct program leaves in a buffer it reads (the reference executor fills
    #: fresh buffers with it, so a read of unwritten memory shows)
    poison: float | int


DTYPES: dict[str, DType] = {
    "fp16": DType("fp16", 2, np.float16, float("nan")),
    "fp32": DType("fp32", 4, np.float32, float("nan")),
    "int32": DType("int32", 4, np.int32, int(np.iinfo(np.int32).min)),
}

#: the storage types ``--dtype`` offers (integers are never a storage choice)
STORAGE_DTYPES = ("fp16", "fp32")

#: integer operands (embedding indices) live on chip as this type
INDEX_DTYPE = "int32"


def dtype_bytes(name: str) -> int:
    """Bytes per element of ``name`` (``fp16``, ``fp32`` or ``int32``)."""
    return DTYPES[name].bytes


def ceil_div(a: Any, b: Any) -> Any:
    """``ceil(a / b)`` for integers (or integer numpy arrays, elementwise), without floats:
    the one rounding-up division every stage uses."""
    return -(-a // b)


def fmt_bytes(n: float) -> str:
    """Bytes as KiB below 10 MiB (one decimal: SRAM sizes differ by KiB), MiB above."""
    return f"{n / 1024:.1f} KiB" if n < 10 * 1024 ** 2 else f"{n / 1024 ** 2:.2f} MiB"
