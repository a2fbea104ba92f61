"""The device graph: tensor expressions over named axes, and free views between tensors.

Every stage after the frontend speaks this IR. An op is one `TensorExpr`:

    C[m, n] = sum_k A[m, k] * B[k, n]

is ``TensorExpr(axes=(("m", 128), ("k", 768), ("n", 3072)), output=Operand("C", ("m", "n")),
inputs=(Operand("A", ("m", "k")), Operand("B", ("k", "n"))), combine="sum",
body=("mul", ("in", 0), ("in", 1)))``. Axes that the output lacks are reduction axes.

A body is a small expression tree of tuples, evaluated elementwise over the op's axes:

- ``("in", i)``: the value of input i at the current point;
- ``("const", x)``: a float constant;
- ``("take", i, j)``: input i, whose one dimension marked ``INDIRECT`` is indexed by the integer
  value of input j (an embedding lookup); only valid as the whole body;
- ``(fn, arg, ...)``: one of `UNARY_FNS` or `BINARY_FNS`.

Reshape and Transpose of a tensor are `View`s, not ops: they cost nothing by themselves and are
folded into the re-layout that feeds the next op (codegen maps element indices through them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Body = tuple[Any, ...]

#: Marks a tensor dimension that is indexed by data (the table dimension of an embedding lookup).
#: Such a dimension is never split across cores.
INDIRECT = "@"

UNARY_FNS = ("neg", "exp", "log", "sqrt", "rsqrt", "recip", "erf", "tanh", "relu", "sigmoid",
             "abs", "square")
BINARY_FNS = ("add", "sub", "mul", "div", "max", "min", "pow")
COMBINES = ("sum", "max")


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of the graph: its logical shape and element type ("float32" or "int64")."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class Operand:
    """One tensor as an op reads or writes it: the op axis that indexes each tensor dimension."""

    tensor: str
    axes: tuple[str, ...]


@dataclass(frozen=True)
class TensorExpr:
    """One operator: ``output[out axes] = combine over the other axes of body(inputs)``."""

    name: str
    axes: tuple[tuple[str, int], ...]
    output: Operand
    inputs: tuple[Operand, ...]
    combine: str | None
    body: Body
    source: str = ""  # where it came from, for messages: "MatMul node 'layer0/q'"

    @property
    def extents(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @property
    def reduction_axes(self) -> tuple[str, ...]:
        out = set(self.output.axes)
        return tuple(a for a in self.axis_names if a not in out)

    @property
    def operands(self) -> tuple[Operand, ...]:
        """Inputs first, then the output: the order of per-operand fields in plans."""
        return (*self.inputs, self.output)

    @property
    def kind(self) -> str:
        """A coarse class for tables and costs: contraction, reduce, gather or elementwise."""
        if self.body and self.body[0] == "take":
            return "gather"
        if self.combine is None:
            return "elementwise"
        if is_contraction(self):
            return "contraction"
        return "reduce"

    def signature(self) -> tuple[Any, ...]:
        """Everything that determines plans and costs; equal for repeated layers."""
        rename = {a: f"x{i}" for i, (a, _) in enumerate(self.axes)}
        rename[INDIRECT] = INDIRECT
        ops = tuple(tuple(rename[a] for a in o.axes) for o in self.operands)
        return (tuple(e for _, e in self.axes), ops, self.combine, self.body)


def is_contraction(op: TensorExpr) -> bool:
    """True for sum-of-products of two inputs (matmul, batched matmul): runs on the matrix unit."""
    return (op.combine == "sum" and len(op.inputs) == 2
            and op.body == ("mul", ("in", 0), ("in", 1)) and bool(op.reduction_axes))


@dataclass(frozen=True)
class View:
    """``name`` is ``source`` reshaped (perm None) or transposed by ``perm``; no data moves."""

    name: str
    source: str
    shape: tuple[int, ...]
    perm: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Graph:
    """The device graph: ops in topological order over tensors, views, constants and I/O."""

    name: str
    tensors: dict[str, TensorInfo]
    ops: tuple[TensorExpr, ...]
    views: dict[str, View]
    constants: dict[str, np.ndarray] = field(repr=False)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def producer(self) -> dict[str, TensorExpr]:
        return {op.output.tensor: op for op in self.ops}

    def root(self, tensor: str) -> str:
        """The tensor that actually holds the data of ``tensor`` (following views)."""
        while tensor in self.views:
            tensor = self.views[tensor].source
        return tensor

    def flops(self) -> int:
        """Two flops per multiply-accumulate of contractions, one per point of other ops."""
        total = 0
        for op in self.ops:
            points = int(np.prod([e for _, e in op.axes], dtype=np.int64))
            total += 2 * points if is_contraction(op) else points
        return total


def map_to_root(graph: Graph, tensor: str, flat: np.ndarray) -> tuple[str, np.ndarray]:
    """Map flat element indices of ``tensor`` through its views to flat indices of its root."""
    while tensor in graph.views:
        view = graph.views[tensor]
        if view.perm is not None:
            # view[i] = src[j] where j[perm[d]] = i[d]
            src_shape = graph.tensors[view.source].shape
            idx = np.unravel_index(flat, view.shape)
            src_idx = [None] * len(view.perm)
            for d, p in enumerate(view.perm):
                src_idx[p] = idx[d]
            flat = np.ravel_multi_index(tuple(src_idx), src_shape)
        tensor = view.source
    return tensor, flat


def view_value(graph: Graph, tensor: str, root_value: np.ndarray) -> np.ndarray:
    """The value of ``tensor`` given the value of its root (for references and tests)."""
    chain = []
    while tensor in graph.views:
        chain.append(graph.views[tensor])
        tensor = graph.views[tensor].source
    value = root_value
    for view in reversed(chain):
        if view.perm is not None:
            value = np.transpose(value, view.perm)
        else:
            value = value.reshape(view.shape)
    return value
