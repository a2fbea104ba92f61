"""Frontend: ONNX `ModelProto` -> `Graph` of tensor expressions.

The pipeline, as `to_graph` runs it:

1. `load_model`: an ONNX path or a ModelProto (zoo names are resolved by the driver);
2. `check_and_infer`: pin dynamic input dimensions (``--shape``), check, infer every shape;
3. `fold_batchnorm` (`rewrite.py`): BatchNormalization after a Conv with constant weights is
   folded into the Conv; `keep_quantized_weights`: a matmul reading int8 weights through a
   DequantizeLinear reads them as they are and scales its result; `fold_scale_into_matmuls`:
   a constant per-column scale read only by matmuls with constant float weights (RMSNorm's
   weight) is folded into them; with ``siblings`` `fuse_sibling_matmuls`: matmuls that read
   one activation with constant weights of their own (q, k and v) become one, its result
   sliced, and `slice_heads_after_split`: a Split's pieces read as heads are sliced after
   the heads' views;
   `fold_repeat_kv`: grouped-query attention's keys and values, repeated to every query head
   (Expand, Reshape), are read unrepeated by matmuls whose rows are the query heads of a
   group; on mesh chips and chips with DRAM `split_cache_concat`: attention matmuls
   read a decode step's cache input itself, not its Concat with the new entries;
4. `lower`, node by node in order: a node whose inputs are all constant is evaluated with the
   ONNX reference evaluator (shape arithmetic, masks, RoPE tables: Shape and Size of any tensor
   are constants too, since shapes are static); the others go through the op table, one
   lowering per (op type, opset) in `ops.py` (elementwise, matmul), `layout.py` (views and
   copies), `nn.py` (convolution, pooling, normalisation, softmax, reductions) and
   `shapes.py`. Every node that cannot be lowered is collected, and one
   `UnsupportedModelError` lists them all. Zero-size tensors are constants (an empty result
   needs no op), and a graph output that is a constant is copied out by one op on chip;
5. `fuse_elementwise` (`fuse.py`): elementwise ops are inlined into their readers, so that
   decomposed GELU, LayerNorm and RMSNorm become one expression chain and copies fold into
   the ops that read them; and elementwise consumers (bias, scale, GELU, residual) fold into
   the matmul or reduction before them as its epilogue.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from t10c.ir import Graph, Operand
from t10c.shape_only import SHAPE_ONLY_LOCATION, has_values, is_shape_only, values_unknown

from . import layout as _layout  # noqa: F401  (each module registers its lowerings)
from . import nn as _nn  # noqa: F401
from . import ops as _ops  # noqa: F401
from . import shapes as _shapes  # noqa: F401
from .context import REGISTRY, Context, Unsupported, attrs, pick
from .fuse import fuse_elementwise, prune
from .loader import FrontendError, ModelNotFoundError, check_and_infer, load_model
from .rewrite import (
    fold_batchnorm,
    fold_repeat_kv,
    fold_scale_into_matmuls,
    fuse_sibling_matmuls,
    keep_quantized_weights,
    slice_heads_after_split,
    split_cache_concat,
    split_large_matmuls,
    split_softmax_over_parts,
)

__all__ = ["FrontendError", "ModelNotFoundError", "UnsupportedModelError", "UnsupportedNode",
           "Lowered", "device_graph", "load_model", "lower", "to_graph", "supported_ops",
           "has_weights", "is_shape_only", "SHAPE_ONLY_LOCATION"]

ELEM_TYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT64: "int64",
              onnx.TensorProto.INT32: "int64"}


@dataclass(frozen=True)
class UnsupportedNode:
    op_type: str
    name: str
    opset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.op_type} node {self.name!r} (opset {self.opset}): {self.reason}"


class UnsupportedModelError(FrontendError):
    """The model has nodes t10c cannot compile; ``nodes`` lists every one of them."""

    def __init__(self, nodes: list[UnsupportedNode]) -> None:
        self.nodes = nodes
        kinds = sorted({n.op_type for n in nodes})
        super().__init__(
            f"{len(nodes)} unsupported node(s) ({', '.join(kinds)}):\n  "
            + "\n  ".join(str(n) for n in nodes)
            + f"\nSupported ops: {', '.join(supported_ops())}")


def supported_ops() -> list[str]:
    return sorted(REGISTRY)


def _opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


def _value_types(skel: onnx.ModelProto) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for vi in [*skel.graph.input, *skel.graph.value_info, *skel.graph.output]:
        t = vi.type.tensor_type
        if t.elem_type:
            dtypes[vi.name] = ELEM_TYPES.get(t.elem_type, onnx.helper.tensor_dtype_to_np_dtype(
                t.elem_type).name)
        if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            continue
        shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    return shapes, dtypes


def _gather_elements(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> list[np.ndarray]:
    axis %= data.ndim
    indices = np.where(indices < 0, indices + data.shape[axis], indices)
    return [np.take_along_axis(data, indices, axis=axis)]


def _dequantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None,
                axis: int = 1, block_size: int = 0, output_dtype: int = 0) -> list[np.ndarray]:
    """``DequantizeLinear`` of a constant: ``(x - zero_point) * scale``, the scale and zero
    point per tensor or along ``axis``."""
    if block_size:
        raise Unsupported("blocked DequantizeLinear (block_size) is not supported")
    if output_dtype not in (0, onnx.TensorProto.FLOAT):
        raise Unsupported("DequantizeLinear to a type other than float32 is not supported")
    zero = np.zeros((), np.float32) if zero_point is None else zero_point.astype(np.float32)
    if scale.ndim == 1 and x.ndim > 0:
        shape = [1] * x.ndim
        shape[axis % x.ndim] = scale.shape[0]
        scale, zero = scale.reshape(shape), (zero.reshape(shape) if zero.ndim else zero)
    return [((x.astype(np.float32) - zero) * scale.astype(np.float32)).astype(np.float32)]


#: numpy folds for ops whose reference implementation fails on inputs exporters produce
#: (onnx 1.17-1.23's GatherElements cannot take a [1, n] data tensor with [1, m] indices;
#: onnx 1.19's reference evaluator has no DequantizeLinear before opset 19)
FOLDS = {"GatherElements": _gather_elements, "DequantizeLinear": _dequantize}


def _fold(node: onnx.NodeProto, ctx: Context, opsets: dict[str, int]) -> None:
    """Evaluate ``node`` on its constant inputs with the ONNX reference evaluator, as a
    one-node model carrying the model's opset imports (handed a bare node, the evaluator
    picks the newest version of the op, not the model's)."""
    args = [ctx.constants[n] for n in node.input if n]
    try:
        with np.errstate(all="ignore"):  # log(0) folds to -inf as ONNX says: no warning
            if node.op_type in FOLDS:
                values = FOLDS[node.op_type](*args, **attrs(node))
            else:
                values = ReferenceEvaluator(_one_node_model(node, ctx, opsets)).run(
                    None, {n: ctx.constants[n] for n in node.input if n})
    except Exception as exc:  # the reference evaluator raises many kinds
        raise Unsupported(f"constant folding failed: {exc}") from None
    for name, value in zip(node.output, values):
        value = np.asarray(value)
        if value.dtype.kind == "f":
            value = value.astype(np.float32, copy=False)
        ctx.constants[name] = value


def _one_node_model(node: onnx.NodeProto, ctx: Context, opsets: dict[str, int]
                    ) -> onnx.ModelProto:
    helper = onnx.helper
    inputs = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(ctx.constants[n].dtype), ctx.constants[n].shape)
        for n in dict.fromkeys(n for n in node.input if n)]
    outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    graph = helper.make_graph([node], "fold", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                   for d, v in opsets.items()])


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if imp.domain == "ai.onnx" else imp.domain): imp.version
            for imp in model.opset_import}


@dataclass
class Lowered:
    """What lowering a model produced: the context (ops, views, constants, tensors), every
    node that could not be lowered, and the model's opset. ``problems`` empty means the graph
    is complete."""

    model: onnx.ModelProto
    ctx: Context
    problems: list[UnsupportedNode]
    opset: int
    inputs: list[str]


def lower(model: onnx.ModelProto, pinned: dict[str, tuple[int, ...]] | None = None,
          weights: Mapping[str, np.ndarray] | None = None, split_cache: bool = False,
          split_weights: tuple[int, str] | None = None, siblings: bool = False) -> Lowered:
    """Lower every node that can be lowered, collecting the ones that cannot (no exception
    for unsupported nodes; `to_graph` raises them all at once). ``weights``: the values of
    shape-only initializers, by name (`to_graph`); ``split_cache``: `split_cache_concat`;
    ``split_weights``: ``(max_bytes, storage dtype)`` for `split_large_matmuls`;
    ``siblings``: `fuse_sibling_matmuls`."""
    skel = check_and_infer(model, pinned)
    opset = _opset(model)
    opsets = _opsets(model)
    shapes, dtypes = _value_types(skel)
    constants = {t.name: _initializer(t, weights or {}) for t in model.graph.initializer}
    constants = {k: (v.astype(np.float32, copy=False) if v.dtype.kind == "f" else v)
                 for k, v in constants.items()}
    ctx = Context(shapes, dtypes, constants, opset)

    inputs = [i.name for i in model.graph.input if i.name not in constants]
    problems: list[UnsupportedNode] = []
    for inp in inputs:
        dtype = dtypes.get(inp)
        if dtype not in ("float32", "int64"):
            raise FrontendError(f"input {inp!r} has element type {dtype}; t10c takes float32 "
                                "and int64 inputs")
        if inp in shapes and math.prod(shapes[inp]) == 0:
            # a zero-size input holds no values: a constant, so everything computed from it
            # alone folds at compile time
            ctx.constants[inp] = np.zeros(shapes[inp], np.dtype(dtype))
            continue
        ctx.declare(inp, shapes[inp], dtype)
    inputs = [i for i in inputs if i not in ctx.constants]

    outputs = {o.name for o in model.graph.output}
    nodes = fold_batchnorm(list(model.graph.node), ctx.constants, outputs)
    nodes = keep_quantized_weights(nodes, ctx.constants, ctx.shapes, outputs)
    nodes = fold_scale_into_matmuls(nodes, ctx.constants, ctx.shapes, outputs)
    if siblings:
        max_bytes, storage = split_weights if split_weights is not None else (None, "fp16")
        nodes = fuse_sibling_matmuls(nodes, ctx.constants, ctx.shapes, outputs, opset,
                                     max_bytes, storage)
        nodes = slice_heads_after_split(nodes, ctx.constants, ctx.shapes, opset)
    if split_weights is not None and opset >= 4:  # (Concat takes any axis from opset 4)
        nodes = split_large_matmuls(nodes, ctx.constants, ctx.shapes, *split_weights)
    if opset >= 5:  # (Reshape takes its shape as an input from opset 5)
        nodes = fold_repeat_kv(nodes, ctx.constants, ctx.shapes, outputs)
    if split_cache and opset >= 10:  # (Slice takes its bounds as inputs from opset 10)
        nodes = split_cache_concat(nodes, ctx.constants, ctx.shapes, set(inputs), outputs)
        nodes = split_softmax_over_parts(nodes, ctx.constants, ctx.shapes, outputs, opset)
    poisoned: set[str] = set()
    used_names: set[str] = set()
    for index, node in enumerate(nodes):
        if not node.name or node.name in used_names:
            node = _renamed(node, f"{node.op_type}_{index}")
        used_names.add(node.name)
        if node.domain not in ("", "ai.onnx"):
            problems.append(UnsupportedNode(node.op_type, node.name, opset,
                                            f"operator domain {node.domain!r} is not supported"))
            poisoned.update(node.output)
            continue
        lowering = pick(node.op_type, opset)
        ins = [n for n in node.input if n]
        outs = [o for o in node.output if o]
        if outs and all(o in ctx.shapes and math.prod(ctx.shapes[o]) == 0 for o in outs) \
                and not poisoned.intersection(ins):
            for o in outs:  # an empty result needs no op: it is an (empty) constant
                ctx.constants[o] = np.zeros(ctx.shapes[o], np.dtype(ctx.dtypes.get(o, "float32")))
            continue
        if all(n in ctx.constants for n in ins) and not poisoned.intersection(ins):
            try:
                _fold(node, ctx, opsets)
                continue
            except Unsupported as exc:
                problems.append(UnsupportedNode(node.op_type, node.name, opset, str(exc)))
                poisoned.update(node.output)
                continue
        if lowering is None:
            known = REGISTRY.get(node.op_type)
            reason = ("not supported" if not known else
                      f"supported from opset {known[0].since}, the model uses {opset}")
            problems.append(UnsupportedNode(node.op_type, node.name, opset, reason))
            poisoned.update(node.output)
            continue
        # the shape of a tensor that could not be computed is still known
        shape_only = node.op_type in ("Shape", "Size") and ins[0] in ctx.shapes
        if poisoned.intersection(ins) and not shape_only:
            poisoned.update(node.output)
            continue
        given = attrs(node)
        unknown = lowering.unknown(given)
        if unknown:
            problems.append(UnsupportedNode(
                node.op_type, node.name, opset,
                f"unsupported attribute{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"))
            poisoned.update(node.output)
            continue
        try:  # a lowering raises Unsupported for what it cannot compile; anything else is a bug
            lowering.fn(ctx, node, **given)
        except Unsupported as exc:
            problems.append(UnsupportedNode(node.op_type, node.name, opset, str(exc)))
            poisoned.update(node.output)
    return Lowered(model, ctx, problems, opset, inputs)


def to_graph(source, *, pinned: dict[str, tuple[int, ...]] | None = None,
             name: str | None = None, fuse: bool = True, epilogues: bool = True,
             prologues: bool = False, weights: Mapping[str, np.ndarray] | None = None,
             split_cache: bool = False, split_weights: tuple[int, str] | None = None,
             siblings: bool = False) -> Graph:
    """Lower a model (an ONNX path or a ModelProto) to the device graph.

    ``weights`` gives the values of shape-only initializers by name (a zoo model built apart,
    `t10c.models.build_apart`): the graph's constants are those arrays, not copies.

    With ``fuse`` (the default), single-reader elementwise ops are inlined into their reader
    and, with ``epilogues`` too, elementwise consumers fold into the reduction or contraction
    before them, and with ``prologues`` as well elementwise producers into the contractions
    that read them (`fuse.py`).

    With ``split_cache``, attention matmuls read a decode step's key/value cache input
    itself, not its Concat with the step's new entries (`rewrite.split_cache_concat`): the
    compiler asks for it on mesh chips, where re-laying the cache out every step costs its
    distance, and on chips with DRAM, where the cache lives off chip (`t10c.driver.chip_graph`);
    on an all-to-all chip without DRAM the two more ops cost more than the re-layout saves.
    ``split_weights`` (``(max_bytes, storage dtype)``): matmuls with larger constant weights are
    split over column blocks (`rewrite.split_large_matmuls`; the compiler asks for it on
    chips with DRAM). With ``siblings`` (the compiler asks for it under ``--fuse all``, its
    default, and ``prologues``), matmuls that read one activation with constant weights of
    their own become one (`rewrite.fuse_sibling_matmuls`). Raises `UnsupportedModelError`
    listing every node that cannot be lowered.
    """
    model = load_model(source)
    low = lower(model, pinned, weights, split_cache, split_weights, siblings)
    if low.problems:
        raise UnsupportedModelError(low.problems)
    return device_graph(low, name, fuse, epilogues, prologues)


def device_graph(low: Lowered, name: str | None = None, fuse: bool = True,
                 epilogues: bool = True, prologues: bool = False) -> Graph:
    """The device graph of a completely lowered model (``low.problems`` must be empty)."""
    if low.problems:
        raise UnsupportedModelError(low.problems)
    graph = _graph(low, name)
    return fuse_elementwise(graph, epilogues=epilogues, prologues=prologues) if fuse \
        else prune(graph)


def _graph(low: Lowered, name: str | None) -> Graph:
    ctx, model, inputs = low.ctx, low.model, low.inputs
    outputs = [o.name for o in model.graph.output]
    produced = {op.output.tensor for op in ctx.ops}
    for out in outputs:
        shape = ctx.constants[out].shape if out in ctx.constants else ctx.shapes.get(out)
        if shape is not None and math.prod(shape) == 0:
            raise FrontendError(f"output {out!r} is zero-size (shape {tuple(shape)}); t10c "
                                "computes no empty tensors: drop the output from the model")
        if out in ctx.constants:
            _constant_out(ctx, out)  # known at compile time: one copy of it on chip
            continue
        if out not in ctx.tensors:
            raise FrontendError(f"output {out!r} was not computed")
        root = out
        while root in ctx.views:
            root = ctx.views[root].source
        if root not in produced:
            _copy_out(ctx, out)  # an input reshaped or transposed: one on-chip re-layout
    used = {o.tensor for op in ctx.ops for o in op.operands} | set(ctx.views)
    used |= {v.source for v in ctx.views.values()}
    consts = {k: v for k, v in ctx.constants.items() if k in used}
    return Graph(name=name or model.graph.name or "model", tensors=dict(ctx.tensors),
                 ops=tuple(ctx.ops), views=dict(ctx.views), constants=consts,
                 inputs=tuple(inputs), outputs=tuple(outputs))


def _copy_out(ctx: Context, out: str) -> None:
    """Make output ``out``, a view of an input (or the input itself), a copy computed on chip."""
    source = ctx.fresh(out)
    if out in ctx.views:
        view = ctx.views.pop(out)
        ctx.views[source] = replace(view, name=source)
        ctx.tensors[source] = replace(ctx.tensors[out], name=source)
        ctx.shapes[source] = ctx.shapes[out]
    else:
        raise FrontendError(f"output {out!r} is an input; there is nothing to compute on chip")
    shape = ctx.shapes[out]
    axes = [f"d{i}" for i in range(len(shape))]
    node = onnx.helper.make_node("Identity", [source], [out], name=f"{out}/copy")
    ctx.emit(node, f"{out}/copy", list(zip(axes, shape)), Operand(out, tuple(axes)),
             [Operand(source, tuple(axes))], None, ("in", 0))


def _constant_out(ctx: Context, out: str) -> None:
    """Make output ``out``, a constant (a Shape, a Size, a Constant, anything folded), a copy
    of that constant computed on chip: the program then writes it as it writes any output
    (as float32, like every computed tensor)."""
    value = ctx.constants.pop(out)
    source = ctx.float_operand(ctx.constant(out, value))
    axes = [f"d{i}" for i in range(value.ndim)]
    node = onnx.helper.make_node("Identity", [source], [out], name=f"{out}/constant")
    ctx.emit(node, f"{out}/constant", list(zip(axes, value.shape)), Operand(out, tuple(axes)),
             [Operand(source, tuple(axes))], None, ("in", 0))


def _initializer(t: onnx.TensorProto, weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """An initializer's value; a shape-only one (`is_shape_only`) is its array in ``weights``,
    else a zero-stride array of its shape, which planning and codegen need and emulation
    refuses."""
    if is_shape_only(t):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        value = weights.get(t.name)
        if value is None:
            return values_unknown(tuple(t.dims), dtype)
        if value.shape != tuple(t.dims) or value.dtype != dtype:
            raise FrontendError(f"the weights given for initializer {t.name!r} are {value.dtype}"
                                f" {list(value.shape)}; the model declares {dtype} "
                                f"{list(t.dims)}")
        return value
    return numpy_helper.to_array(t)


def has_weights(graph: Graph) -> bool:
    """False when some constant is shape-only (its values were never drawn)."""
    return all(has_values(v) for v in graph.constants.values())


def _renamed(node: onnx.NodeProto, name: str) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = name
    return copy
