"""Shape-only weights: an ONNX convention shared by the producers of models and the frontend.

An initializer may carry its shape without its values: data location ``EXTERNAL`` with the
external-data entry ``location`` equal to `SHAPE_ONLY_LOCATION`. Planning and code generation
need only shapes; emulation refuses such a graph. The zoo builds models past protobuf's 2 GB
limit (gpt2-xl) this way, and any producer may do the same. It lives in the core because two
stages (the zoo that writes it, the frontend that reads it) share it.
"""

from __future__ import annotations

import numpy as np
import onnx

#: the external-data location that marks an initializer as shape-only
SHAPE_ONLY_LOCATION = "t10c:shape-only"


def is_shape_only(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` is a shape-only initializer (`SHAPE_ONLY_LOCATION`)."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == SHAPE_ONLY_LOCATION for e in tensor.external_data)


def shape_only_tensor(name: str, shape: tuple[int, ...], dtype: np.dtype | type
                      ) -> onnx.TensorProto:
    """A shape-only initializer named ``name``: ``shape`` and ``dtype``, no values."""
    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.data_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    tensor.dims.extend(shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", SHAPE_ONLY_LOCATION
    return tensor


def values_unknown(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """The array a shape-only weight stands for in a graph: its shape and dtype, no values
    (zero strides: nothing is allocated)."""
    return np.broadcast_to(np.zeros((), dtype=dtype), tuple(shape))


def has_values(value: np.ndarray) -> bool:
    """False for a `values_unknown` array (one element holds its value either way)."""
    return value.strides != (0,) * value.ndim or value.size <= 1
