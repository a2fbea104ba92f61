"""Frontend: ONNX `ModelProto` -> `Graph` of tensor expressions.

Steps: load (`load_model`), check and infer shapes (`check_and_infer`), fold every node whose
inputs are all constant with the ONNX reference evaluator, then lower the rest one node at a
time through the op table in `ops.py`. Every node that cannot be lowered is collected, and one
`UnsupportedModelError` lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from t10c.ir import Graph, TensorInfo

from . import ops as _ops  # noqa: F401  (registers the lowerings)
from .context import REGISTRY, Context, Unsupported, attrs, pick
from .fuse import fuse_elementwise
from .loader import FrontendError, ModelNotFoundError, check_and_infer, load_model

__all__ = ["FrontendError", "ModelNotFoundError", "UnsupportedModelError", "UnsupportedNode",
           "load_model", "to_graph", "supported_ops"]

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
        if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            continue
        shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
        dtypes[vi.name] = ELEM_TYPES.get(t.elem_type, onnx.helper.tensor_dtype_to_np_dtype(
            t.elem_type).name if t.elem_type else "unknown")
    return shapes, dtypes


def _fold(node: onnx.NodeProto, ctx: Context, opset: int) -> None:
    try:
        evaluator = ReferenceEvaluator(node, opsets={"": opset})
        values = evaluator.run(None, {n: ctx.constants[n] for n in node.input if n})
    except Exception as exc:  # the reference evaluator raises many kinds
        raise Unsupported(f"constant folding failed: {exc}") from None
    for name, value in zip(node.output, values):
        value = np.asarray(value)
        if value.dtype.kind == "f":
            value = value.astype(np.float32)
        ctx.constants[name] = value


def to_graph(source, *, pinned: dict[str, tuple[int, ...]] | None = None,
             name: str | None = None, fuse: bool = True) -> Graph:
    """Lower a model (zoo name, path or ModelProto) to the device graph.

    With ``fuse`` (the default), single-reader elementwise ops are inlined into their reader.
    """
    model = load_model(source)
    skel = check_and_infer(model, pinned)
    opset = _opset(model)
    shapes, dtypes = _value_types(skel)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    constants = {k: (v.astype(np.float32) if v.dtype.kind == "f" else v)
                 for k, v in constants.items()}
    ctx = Context(shapes, dtypes, constants, opset)

    inputs = [i.name for i in model.graph.input if i.name not in constants]
    problems: list[UnsupportedNode] = []
    for inp in inputs:
        dtype = dtypes.get(inp)
        if dtype not in ("float32", "int64"):
            raise FrontendError(f"input {inp!r} has element type {dtype}; t10c takes float32 "
                                "and int64 inputs")
        ctx.declare(inp, shapes[inp], dtype)

    poisoned: set[str] = set()
    used_names: set[str] = set()
    for index, node in enumerate(model.graph.node):
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
        if all(n in ctx.constants for n in ins) and not poisoned.intersection(ins):
            try:
                _fold(node, ctx, opset)
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
        if poisoned.intersection(ins):
            poisoned.update(node.output)
            continue
        try:
            lowering.fn(ctx, node, **attrs(node))
        except Unsupported as exc:
            problems.append(UnsupportedNode(node.op_type, node.name, opset, str(exc)))
            poisoned.update(node.output)
        except TypeError as exc:
            problems.append(UnsupportedNode(node.op_type, node.name, opset,
                                            f"unsupported attribute ({exc})"))
            poisoned.update(node.output)
    if problems:
        raise UnsupportedModelError(problems)

    outputs = [o.name for o in model.graph.output]
    produced = {op.output.tensor for op in ctx.ops}
    for out in outputs:
        if out in ctx.constants or out not in ctx.tensors:
            raise FrontendError(f"output {out!r} is a constant; nothing to compute on chip")
        root = out
        while root in ctx.views:
            root = ctx.views[root].source
        if root not in produced:
            raise FrontendError(f"output {out!r} is its input {root!r} reshaped or transposed; "
                                "there is nothing to compute on chip")
    for inp in inputs:
        ctx.tensors.setdefault(inp, TensorInfo(inp, shapes[inp], dtypes[inp]))
    used = {o.tensor for op in ctx.ops for o in op.operands} | set(ctx.views)
    used |= {v.source for v in ctx.views.values()}
    consts = {k: v for k, v in ctx.constants.items() if k in used}
    graph = Graph(name=name or model.graph.name or "model", tensors=dict(ctx.tensors),
                  ops=tuple(ctx.ops), views=dict(ctx.views), constants=consts,
                  inputs=tuple(inputs), outputs=tuple(outputs))
    return fuse_elementwise(graph) if fuse else graph


def _renamed(node: onnx.NodeProto, name: str) -> onnx.NodeProto:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = name
    return copy
