"""The element types a program stores, in one table (every stage reads sizes from here).

``fp16`` and ``fp32`` are storage types the user picks with ``--dtype`` (products and
reductions accumulate in fp32 whatever the storage); ``int32`` holds integer operands on chip
(embedding indices: ONNX's int64 indices are narrowed, as every ICCA chip's integer unit is
32-bit); ``int8`` holds quantized weights (a ``DequantizeLinear`` of an int8 constant read by
a matmul, `t10c.frontend.rewrite.keep_quantized_weights`), a byte each, their values exact in
any float type the matmul computes in.

A float tensor takes the storage type; an integer tensor's type is fixed by the model
(`on_chip_dtype`), and the planner carries those per tensor (`IntTensors`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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
    # symmetric quantization stops at -127 (`t10c.models.quantize.INT8_MAX`): -128 is no weight
    "int8": DType("int8", 1, np.int8, int(np.iinfo(np.int8).min)),
}

#: the storage types ``--dtype`` offers (integers are never a storage choice)
STORAGE_DTYPES = ("fp16", "fp32")

#: integer operands (embedding indices) live on chip as this type
INDEX_DTYPE = "int32"


def dtype_bytes(name: str) -> int:
    """Bytes per element of ``name`` (``fp16``, ``fp32``, ``int32`` or ``int8``)."""
    return DTYPES[name].bytes


def on_chip_dtype(graph_dtype: str, storage: str) -> str:
    """The type a graph tensor of element type ``graph_dtype`` (`t10c.ir.TensorInfo`:
    ``float32``, ``int64``, ``int8``, ...) has on chip under the storage type ``storage``:
    floats take the storage type, int8 stays int8 (quantized weights), every other integer
    is an index (`INDEX_DTYPE`)."""
    if graph_dtype == "float32":
        return storage
    return "int8" if graph_dtype == "int8" else INDEX_DTYPE


class IntTensors(Mapping[str, str]):
    """The integer tensors of a graph and the type each has on chip (`on_chip_dtype`): the
    tensors whose size ``--dtype`` does not set. Immutable and hashable, so that it keys the
    planner's caches as the frozenset of names it replaces did."""

    __slots__ = ("_types", "_hash")

    def __init__(self, types: Mapping[str, str] | None = None) -> None:
        self._types = dict(types or {})
        self._hash = hash(frozenset(self._types.items()))

    def __getitem__(self, tensor: str) -> str:
        return self._types[tensor]

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def __len__(self) -> int:
        return len(self._types)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IntTensors) and self._types == other._types

    def __repr__(self) -> str:
        return f"IntTensors({self._types!r})"

    def bytes_of(self, tensor: str, storage: str) -> int:
        """Bytes per element of ``tensor`` on chip when floats are stored as ``storage``."""
        return DTYPES[self._types.get(tensor, storage)].bytes


def ceil_div(a: Any, b: Any) -> Any:
    """``ceil(a / b)`` for integers (or integer numpy arrays, elementwise), without floats:
    the one rounding-up division every stage uses."""
    return -(-a // b)


def fmt_bytes(n: float) -> str:
    """Bytes as KiB below 10 MiB (one decimal: SRAM sizes differ by KiB), MiB above."""
    return f"{n / 1024:.1f} KiB" if n < 10 * 1024 ** 2 else f"{n / 1024 ** 2:.2f} MiB"
