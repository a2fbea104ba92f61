"""The lowering context: what lowerings read (shapes, constants) and emit (ops, views)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import onnx

from t10c.ir import Body, Operand, TensorExpr, TensorInfo, View, Window


class Unsupported(Exception):
    """Raised by a lowering for a node it cannot compile; collected, not fatal on its own."""


@dataclass(frozen=True)
class Lowering:
    """One lowering: ``fn(ctx, node, **attributes)`` for models whose opset is at least
    ``since``. ``attributes`` are the keyword parameters of ``fn`` (None: it takes any)."""

    op_type: str
    since: int
    fn: Callable[..., None]
    attributes: frozenset[str] | None

    def unknown(self, names: Iterable[str]) -> list[str]:
        """The attribute names among ``names`` that this lowering does not take."""
        if self.attributes is None:
            return []
        return sorted(set(names) - self.attributes)


#: (op_type) -> lowerings sorted by since_version; filled by `register`
REGISTRY: dict[str, list[Lowering]] = {}


def register(op_type: str, since: int):
    """Register ``fn`` as the lowering of ``op_type`` for models whose opset is at least
    ``since``. The function is named after the op (``Softmax``, or ``Softmax_1`` for an older
    version) and takes the node's attributes as keyword arguments with the ONNX defaults."""

    def wrap(fn):
        if fn.__name__ != op_type and not fn.__name__.startswith(f"{op_type}_"):
            raise ValueError(f"the lowering of {op_type} is named {fn.__name__}")
        if any(low.since == since for low in REGISTRY.get(op_type, [])):
            raise ValueError(f"{op_type} since opset {since} is registered twice")
        params = list(inspect.signature(fn).parameters.values())[2:]  # after ctx, node
        names = (None if any(p.kind is p.VAR_KEYWORD for p in params) else
                 frozenset(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD
                           or p.kind is p.KEYWORD_ONLY))
        REGISTRY.setdefault(op_type, []).append(Lowering(op_type, since, fn, names))
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
    """The node's attributes as Python values (strings decoded)."""
    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


class Context:
    """Shapes and constants known so far, and the ops and views emitted."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str],
                 constants: dict[str, np.ndarray], opset: int) -> None:
        self.shapes = shapes
        self.dtypes = dtypes
        #: element types as ONNX declares them ("bool", "int64", "float32", ...): on chip every
        #: computed tensor is float32, so bool and integer values are stored as floats
        self.onnx_dtypes = dict(dtypes)
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

    def onnx_dtype(self, name: str) -> str:
        """The element type the model gives ``name`` (bool stays bool, unlike `dtype`)."""
        if name in self.constants:
            return str(self.constants[name].dtype)
        return self.onnx_dtypes.get(name, self.dtypes.get(name, "float32"))

    def is_const(self, name: str) -> bool:
        return name in self.constants

    def const(self, name: str, what: str) -> np.ndarray:
        if name not in self.constants:
            raise Unsupported(f"{what} ({name!r}) must be a constant")
        return self.constants[name]

    def fresh(self, base: str) -> str:
        self._fresh += 1
        return f"{base}~{self._fresh}"

    def constant(self, base: str, value: np.ndarray) -> str:
        """A new constant (float values as float32); returns its name."""
        name = self.fresh(base)
        value = np.asarray(value)
        if value.dtype.kind in "fb":
            value = value.astype(np.float32, copy=False)
        self.constants[name] = value
        return name

    def matmul_operand(self, name: str) -> str:
        """`float_operand`, except that an int8 constant (a quantized weight,
        `rewrite.keep_quantized_weights`) stays int8: a contraction computes in float
        whatever its operands are stored as, and int8 values are exact in any float."""
        if name in self.constants and self.constants[name].dtype == np.int8:
            return name
        return self.float_operand(name)

    def float_operand(self, name: str) -> str:
        """``name`` itself, or for a bool or integer constant a float32 copy of it: on chip,
        elementwise operands are floats."""
        if name in self.constants and self.constants[name].dtype != np.float32:
            return self.constant(name, self.constants[name].astype(np.float32, copy=False))
        return name

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
        """Append one op. Axes of extent one are left out (the tensors they index are viewed
        without those dimensions, the output written squeezed and viewed back), and operands
        read through views that do not move anything read the underlying tensor, so that
        a batch of one or a ``keepdims`` reduction never stands between two ops."""
        full = output
        ones = {a for a, e in axes if e == 1}
        if not [a for a in output.axes if a not in ones]:
            # a scalar result: one-dimensional, [1], on a unit axis of its own
            unit = "u"
            axes = [(unit, 1), *axes]
            # a rank-0 input, or one indexed by unit axes only (a ``keepdims`` statistic):
            # read on the unit axis, through the views down to the [1] tensor that holds it,
            # so that a chain of scalar steps (``1/sqrt(mean + eps)``) reads its producer
            # point by point and folds into it as an epilogue
            inputs = [self._lifted(o, unit)
                      if all(isinstance(d, str) and d in ones for d in o.axes) else o
                      for o in inputs]
            output = Operand(self.fresh(full.tensor), (unit,))
        if ones:
            axes = [(a, e) for a, e in axes if a not in ones]
            inputs = [self._squeezed(o, ones) for o in inputs]
            if output is full:
                output = self._squeezed(output, ones, declare=False)
            if combine is not None and set(output.axes) >= {a for a, _ in axes}:
                combine = None  # only unit axes were reduced
        shape = tuple(dict(axes)[a] for a in output.axes)
        self.declare(output.tensor, shape, out_dtype)
        if output.tensor != full.tensor:
            self.view(full.tensor, output.tensor, self._full_shape(full, dict(axes)))
        inputs = [Operand(self._unviewed(o.tensor), o.axes) for o in inputs]
        for o in inputs:
            if o.tensor in self.constants and o.tensor not in self.tensors:
                value = self.constants[o.tensor]
                self.tensors[o.tensor] = TensorInfo(o.tensor, tuple(value.shape),
                                                    str(value.dtype) if value.dtype.kind != "f"
                                                    else "float32")
        self.ops.append(TensorExpr(name, tuple(axes), output, tuple(inputs), combine, body,
                                   source=f"{node.op_type} node {node.name!r}"))

    @staticmethod
    def _full_shape(full: Operand, extents: dict[str, int]) -> tuple[int, ...]:
        return tuple(extents.get(d, 1) if isinstance(d, str) else 1 for d in full.axes)

    def _squeezed(self, operand: Operand, ones: set[str], declare: bool = True) -> Operand:
        """``operand`` without its dimensions indexed by the unit axes ``ones`` (a view of the
        tensor, or for the output a fresh name to be viewed back)."""
        dims: list = []
        keep: list[int] = []
        for i, d in enumerate(operand.axes):
            if isinstance(d, Window):
                dims.append(Window(tuple((a, c) for a, c in d.terms if a not in ones),
                                   d.offset))
                keep.append(i)
            elif d not in ones:
                dims.append(d)
                keep.append(i)
        if len(keep) == len(operand.axes):
            return Operand(operand.tensor, tuple(dims))
        if not declare:
            return Operand(self.fresh(operand.tensor), tuple(dims))
        shape = self.shape(operand.tensor)
        squeezed = self.fresh(operand.tensor)
        self.view(squeezed, operand.tensor, tuple(shape[i] for i in keep))
        return Operand(squeezed, tuple(dims))

    def _lifted(self, operand: Operand, unit: str) -> Operand:
        """A rank-0 operand as a [1] view indexed by ``unit``."""
        lifted = self.fresh(operand.tensor)
        self.view(lifted, operand.tensor, (1,))
        return Operand(lifted, (unit,))

    def _unviewed(self, tensor: str) -> str:
        """The farthest tensor ``tensor`` is a view of with the same shape and the same element
        order (reshapes, and transposes that move only unit dimensions): the same data."""
        if tensor not in self.views:
            return tensor
        best, cur = tensor, tensor
        shape = self.shape(tensor)
        while cur in self.views:
            v = self.views[cur]
            if v.perm is not None:
                src = self.shape(v.source)
                moved = [p for p in v.perm if src[p] != 1]
                if moved != sorted(moved):
                    break
            cur = v.source
            if self.shape(cur) == shape:
                best = cur
        return best

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
            name = self.float_operand(name)
            if len(shape) > rank:
                raise Unsupported(f"{name!r} of shape {shape} does not broadcast to {out_shape}")
            lead = rank - len(shape)
            keep = [d for d in range(len(shape)) if not (shape[d] == 1 and out_shape[lead + d] > 1)]
            tensor = name
            if len(keep) != len(shape):
                tensor = self.fresh(name)
                self.view(tensor, name, tuple(shape[d] for d in keep))
            operand = Operand(tensor, tuple(axes[lead + d] for d in keep))
            if operand in operands:  # the same tensor twice (x * x): one operand
                leaves.append(("in", operands.index(operand)))
                continue
            leaves.append(("in", len(operands)))
            operands.append(operand)
        return operands, leaves

    def elementwise(self, node: onnx.NodeProto, names: list[str],
                    body: Callable[..., Body], out: str | None = None,
                    name: str | None = None) -> None:
        """Emit ``out = body(*leaves)`` over ``names`` broadcast numpy-style (one op)."""
        out_shape = broadcast_shape(*(self.shape(n) for n in names))
        axes = [f"d{i}" for i in range(len(out_shape))]
        operands, leaves = self.broadcast_operands(names, out_shape, axes)
        if not operands:
            raise Unsupported("all inputs are constant (should have been folded)")
        out = out or node.output[0]
        self.emit(node, name or node.name or out, list(zip(axes, out_shape)),
                  Operand(out, tuple(axes)), operands, None, body(*leaves))


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast of ``shapes``, or `Unsupported` when they do not broadcast."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise Unsupported(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None
