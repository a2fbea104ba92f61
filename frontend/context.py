"""The lowering context: what lowerings read (shapes, constants) and emit (ops, views)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from t10c.ir import Body, Operand, TensorExpr, TensorInfo, View


class Unsupported(Exception):
    """Raised by a lowering for a node it cannot compile; collected, not fatal on its own."""


@dataclass(frozen=True)
class Lowering:
    op_type: str
    since: int
    fn: Callable[..., None]


#: (op_type) -> lowerings sorted by since_version; filled by `register`
REGISTRY: dict[str, list[Lowering]] = {}


def register(op_type: str, since: int):
    """Register a lowering of ``op_type`` for models whose opset is at least ``since``."""

    def wrap(fn):
        REGISTRY.setdefault(op_type, []).append(Lowering(op_type, since, fn))
        REGISTRY[op_type].sort(key=lambda x: x.since)
        return fn

    return wrap


def pick(op_type: str, opset: int) -> Lowering | None:
    """The lowering for the newest version at or below the model's opset."""
    found = None
    for low in REGISTRY.get(op_type, []):
        if low.since <= opset:
            found = low
    return found


def attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class Context:
    """Shapes and constants known so far, and the ops and views emitted."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str],
                 constants: dict[str, np.ndarray], opset: int) -> None:
        self.shapes = shapes
        self.dtypes = dtypes
        self.constants = constants
        self.opset = opset
        self.ops: list[TensorExpr] = []
        self.views: dict[str, View] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._fresh = 0

    # -- queries --------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.constants:
            return tuple(self.constants[name].shape)
        if name not in self.shapes:
            raise Unsupported(f"the shape of {name!r} is unknown (shape inference gave none)")
        return self.shapes[name]

    def dtype(self, name: str) -> str:
        if name in self.constants:
            return str(self.constants[name].dtype)
        return self.dtypes.get(name, "float32")

    def is_const(self, name: str) -> bool:
        return name in self.constants

    def const(self, name: str, what: str) -> np.ndarray:
        if name not in self.constants:
            raise Unsupported(f"{what} ({name!r}) must be a constant")
        return self.constants[name]

    def fresh(self, base: str) -> str:
        self._fresh += 1
        return f"{base}~{self._fresh}"

    # -- emission -------------------------------------------------------------------------
    def declare(self, name: str, shape: tuple[int, ...], dtype: str = "float32") -> None:
        self.tensors[name] = TensorInfo(name, tuple(int(d) for d in shape), dtype)
        self.shapes[name] = tuple(int(d) for d in shape)
        self.dtypes[name] = dtype

    def view(self, name: str, source: str, shape: tuple[int, ...],
             perm: tuple[int, ...] | None = None) -> None:
        if source in self.constants:
            value = self.constants[source]
            self.constants[name] = (np.transpose(value, perm) if perm is not None
                                    else value.reshape(shape))
            return
        self.declare(name, shape, self.dtype(source))
        self.views[name] = View(name, source, tuple(int(d) for d in shape), perm)

    def emit(self, node: onnx.NodeProto, name: str, axes: list[tuple[str, int]],
             output: Operand, inputs: list[Operand], combine: str | None, body: Body,
             out_dtype: str = "float32") -> None:
        shape = tuple(dict(axes)[a] for a in output.axes)
        self.declare(output.tensor, shape, out_dtype)
        for o in inputs:
            if o.tensor in self.constants and o.tensor not in self.tensors:
                value = self.constants[o.tensor]
                self.tensors[o.tensor] = TensorInfo(o.tensor, tuple(value.shape),
                                                    str(value.dtype) if value.dtype.kind != "f"
                                                    else "float32")
        self.ops.append(TensorExpr(name, tuple(axes), output, tuple(inputs), combine, body,
                                   source=f"{node.op_type} node {node.name!r}"))

    def broadcast_operands(self, names: list[str], out_shape: tuple[int, ...],
                           axes: list[str]) -> tuple[list[Operand], list[Body]]:
        """Operands and body leaves for elementwise inputs broadcast to ``out_shape``.

        Scalar constants become ``("const", x)`` leaves; dimensions of size 1 that broadcast
        are squeezed away through a view, so that operands index only real axes.
        """
        operands: list[Operand] = []
        leaves: list[Body] = []
        rank = len(out_shape)
        for name in names:
            shape = self.shape(name)
            if name in self.constants and self.constants[name].size == 1:
                leaves.append(("const", float(self.constants[name].reshape(-1)[0])))
                continue
            if len(shape) > rank:
                raise Unsupported(f"{name!r} of shape {shape} does not broadcast to {out_shape}")
            lead = rank - len(shape)
            keep = [d for d in range(len(shape)) if not (shape[d] == 1 and out_shape[lead + d] > 1)]
            tensor = name
            if len(keep) != len(shape):
                tensor = self.fresh(name)
                self.view(tensor, name, tuple(shape[d] for d in keep))
            leaves.append(("in", len(operands)))
            operands.append(Operand(tensor, tuple(axes[lead + d] for d in keep)))
        return operands, leaves
