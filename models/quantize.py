"""Weight-only int8 quantization of a model's matmul weights, in ONNX's own terms.

``quantize_weights(model)`` replaces every float matrix ``W`` (``[K, N]``, an initializer)
that only matmuls read as their weights by ``DequantizeLinear(W~int8, W~scale, axis=1)``:
symmetric, a scale per output column (``max |W[:, n]| / 127``), values rounded to nearest
and kept in -127..127, no zero point. The model's arithmetic is then the dequantized
weights' (onnxruntime runs it as it is: the reference the emulator is checked against), and
the frontend reads the int8 matrix itself (`t10c.frontend.rewrite.keep_quantized_weights`):
a byte an element on chip and in off-chip memory, half of fp16's.

This is the storage that lets LLaMA-3-8B's decode step fit a 12 GB Wormhole n150: Tenstorrent
runs it there with block-float weights (bfp8, bfp4 in the MLP); int8 with a scale per column
is the format ONNX itself can state (opset 13's per-axis ``DequantizeLinear``).

Weights that something else reads too (a tied embedding, which a Gather also reads), vectors,
batched weights, weights of other ops and weights not in float32 stay as they are. A
shape-only weight (`t10c.shape_only`) gives shape-only int8 weights and scales, unless its
values are given apart (``apart``, `t10c.models.build_apart`): they are quantized there, and
the int8 values take their place.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from t10c.shape_only import is_shape_only, shape_only_tensor

#: the weight types ``--quantize`` offers
QUANTIZED_TYPES = ("int8",)

#: DequantizeLinear takes a scale per axis from this opset
PER_AXIS_OPSET = 13

#: the largest magnitude a symmetric int8 weight takes (-128 is left unused)
INT8_MAX = 127


class QuantizeError(ValueError):
    """The model cannot be quantized as asked (its opset predates per-axis scales)."""


def quantize_matrix(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, float32 scale per column) of the float matrix ``w``: ``w`` is close to
    ``values * scale``. An all-zero column gets scale 1 (its values are zero)."""
    peak = np.abs(w.astype(np.float32, copy=False)).max(axis=0)
    scale = np.where(peak > 0, peak / INT8_MAX, 1).astype(np.float32)
    values = np.clip(np.rint(w / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return values, scale


def quantize_weights(model: onnx.ModelProto, kind: str = "int8",
                     apart: MutableMapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` whose matmul weights are stored as ``kind`` (see the module).
    ``apart``: the values of shape-only initializers, by name (`t10c.models.build_apart`),
    updated in place: a quantized weight's int8 values replace its float ones.

    Raises:
        QuantizeError: ``kind`` is not in `QUANTIZED_TYPES`, or the model imports an ONNX
            opset older than `PER_AXIS_OPSET`.
    """
    if kind not in QUANTIZED_TYPES:
        raise QuantizeError(f"cannot quantize weights to {kind!r}: use one of "
                            f"{', '.join(QUANTIZED_TYPES)}")
    opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), 1)
    if opset < PER_AXIS_OPSET:
        raise QuantizeError(f"the model imports ONNX opset {opset}; weights quantized per "
                            f"column need opset {PER_AXIS_OPSET} or later (DequantizeLinear's "
                            "axis): convert the model with onnx.version_converter first")
    apart = {} if apart is None else apart
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    chosen = _matmul_weights(graph)
    if not chosen:
        return out
    kept = [t for t in graph.initializer if t.name not in chosen]
    used = {t.name for t in graph.initializer} | {i.name for i in graph.input} | {
        o for n in graph.node for o in n.output}
    dequantize = []
    added: list[onnx.TensorProto] = []
    for t in graph.initializer:
        if t.name not in chosen:
            continue
        q_name, s_name = _fresh(f"{t.name}~int8", used), _fresh(f"{t.name}~scale", used)
        shape = tuple(t.dims)
        values = apart.pop(t.name, None) if is_shape_only(t) else numpy_helper.to_array(t)
        if values is None:  # shape-only: so are its quantized values and scales
            added += [shape_only_tensor(q_name, shape, np.int8),
                      shape_only_tensor(s_name, shape[1:], np.float32)]
        else:
            q, s = quantize_matrix(values)
            if is_shape_only(t):
                apart[q_name] = q
                added.append(shape_only_tensor(q_name, shape, np.int8))
            else:
                added.append(numpy_helper.from_array(q, q_name))
            added.append(numpy_helper.from_array(s, s_name))
        dequantize.append(helper.make_node("DequantizeLinear", [q_name, s_name], [t.name],
                                           name=f"{t.name}/dequantize", axis=1))
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    inputs = [i for i in graph.input if i.name not in chosen]  # (IR < 4 lists initializers)
    del graph.input[:]
    graph.input.extend(inputs)
    nodes = dequantize + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def _matmul_weights(graph: onnx.GraphProto) -> set[str]:
    """The float32 matrices among ``graph``'s initializers that only MatMul nodes read, and only
    as their second input, and that are no graph output."""
    floats = {t.name for t in graph.initializer
              if len(t.dims) == 2 and t.data_type == onnx.TensorProto.FLOAT}
    outputs = {o.name for o in graph.output}
    read_as_weight: set[str] = set()
    read_otherwise: set[str] = set(outputs)
    for node in graph.node:
        for k, name in enumerate(node.input):
            if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and k == 1 \
                    and node.input[0] != name:
                read_as_weight.add(name)
            else:
                read_otherwise.add(name)
        for attr in node.attribute:  # a subgraph's reads count as other reads
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                read_otherwise.update(n for s in sub.node for n in s.input)
    return (floats & read_as_weight) - read_otherwise


def _fresh(name: str, used: set[str]) -> str:
    """``name``, or ``name`` with a number, not in ``used``; then in it."""
    candidate, k = name, 1
    while candidate in used:
        k += 1
        candidate = f"{name}{k}"
    used.add(candidate)
    return candidate
