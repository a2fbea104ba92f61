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
  value of input j (an embedding lookup); only valid as the whole body. Instead of
  ``INDIRECT`` the indexed dimension may be an axis of its own that the output lacks (a
  reduction axis, combine ``sum``): the lookup is then *sharded*, each core holding a block of
  the table's rows and contributing the rows that fall in it (zero for the others), and the
  sum over the cores that split the axis completes it (`take_axis`);
- ``(fn, arg, ...)``: one of the functions of `t10c.elementwise.FNS` (the one table of their
  arity, numpy implementation and vector cost). Comparisons and logic (``eq``, ``lt``, ``not``,
  ``and``, ...) give 1.0 for true and 0.0 for false and read any nonzero value as true;
  ``("where", c, a, b)`` is ``a`` where ``c`` is nonzero, else ``b``.

An op's ``combine`` is None (elementwise) or one of `t10c.elementwise.COMBINES`.

A reduction or contraction may carry an ``epilogue`` (fusion, `frontend/fuse.py`): a body
evaluated per output point after the combine has completed, whose leaf ``("acc",)`` is the
combined value and whose leaves ``("in", i)`` read ``extra[i]``, operands indexed by output axes
only (a bias, a residual, a mask). The planner never splits or rotates them: codegen brings
each into the layout the op's result has once its reduction is complete, and runs the epilogue
there, on the part of the output each core then owns.

A contraction may also carry a ``prologue`` (fusion, `frontend/fuse.py`): pairs ``(slot, body)``
saying that the matmul reads, in place of input ``slot``, ``body`` evaluated elementwise over
that operand's axes, whose leaves ``("in", i)`` read the op's inputs (``("in", slot)`` the stored
operand itself; inputs past the first two exist only for prologues and index a subset of that
operand's axes: Softmax's max and sum, LayerNorm's mean, variance, scale and bias). The op stays
a contraction on the matrix unit; each sub-task first transforms its tile of the operand on the
vector unit (`t10c.costs.compute_cycles`, `emulator.kernels.evaluate`), and the planner lays
out and re-lays the extra inputs like any other input.

Reshape and Transpose of a tensor are `View`s, not ops: they cost nothing by themselves and are
folded into the re-layout that feeds the next op (codegen maps element indices through them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

Body = tuple[Any, ...]

#: Marks a tensor dimension that is indexed by data (the table dimension of an embedding lookup).
#: Such a dimension is never split across cores.
INDIRECT = "@"



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
class Window:
    """A tensor dimension indexed by ``sum(coef * axis) + offset`` (convolution, pooling).

    ``x[n, c, oh*2 + kh - 1]`` is ``Window((("oh", 2), ("kh", 1)), -1)``. Coordinates outside
    the tensor read as zero (zero padding). A windowed dimension is never rotated; a split
    output axis makes each core's tile of the input overlap its neighbours' (the halo).
    """

    terms: tuple[tuple[str, int], ...]
    offset: int = 0

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.terms)

    def __str__(self) -> str:
        text = "+".join(a if c == 1 else f"{a}*{c}" for a, c in self.terms)
        return text + (f"{self.offset:+d}" if self.offset else "")


Dim = str | Window


@dataclass(frozen=True)
class Operand:
    """One tensor as an op reads or writes it: how op axes index each tensor dimension.

    A dimension is indexed by one axis (a name), by a `Window` over several, or by data
    (`INDIRECT`).
    """

    tensor: str
    axes: tuple[Dim, ...]

    @cached_property
    def axis_set(self) -> tuple[str, ...]:
        """Every op axis this operand depends on, in order of first appearance."""
        seen: list[str] = []
        for d in self.axes:
            for a in (d.axes if isinstance(d, Window) else (d,)):
                if a != INDIRECT and a not in seen:
                    seen.append(a)
        return tuple(seen)

    @cached_property
    def plain_axes(self) -> tuple[str, ...]:
        """Axes that index a dimension on their own (the ones an operand can rotate along)."""
        return tuple(d for d in self.axes if isinstance(d, str) and d != INDIRECT)


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
    #: per output point, after the combine: leaf ("acc",) is the combined value, ("in", i)
    #: reads ``extra[i]`` (fused elementwise consumers; None: the combined value as it is)
    epilogue: Body | None = None
    extra: tuple[Operand, ...] = ()
    #: (input slot, body over the inputs) pairs: the contraction reads body in place of that
    #: input (fused elementwise producers; empty: the inputs as they are)
    prologue: tuple[tuple[int, Body], ...] = ()

    @property
    def extents(self) -> dict[str, int]:
        return dict(self.axes)

    @cached_property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @property
    def reduction_axes(self) -> tuple[str, ...]:
        out = set(self.output.axes)
        return tuple(a for a in self.axis_names if a not in out)

    @cached_property
    def operands(self) -> tuple[Operand, ...]:
        """Inputs first, then the output: the order of per-operand fields in plans."""
        return (*self.inputs, self.output)

    @cached_property
    def reads(self) -> tuple[Operand, ...]:
        """Every operand the op reads: the inputs, then the epilogue's extra operands."""
        return (*self.inputs, *self.extra)

    def take_dim(self) -> int:
        """For a ``take``: the position of the indexed dimension in the table operand."""
        table = self.inputs[self.body[1]]
        for d, a in enumerate(table.axes):
            if a == INDIRECT or (isinstance(a, str) and a not in self.output.axes):
                return d
        raise ValueError(f"{self.name}: take without an indexed dimension")

    def take_axis(self) -> str | None:
        """For a sharded ``take``: the axis over the table's rows (None when held whole)."""
        a = self.inputs[self.body[1]].axes[self.take_dim()]
        return None if a == INDIRECT else str(a)

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
        """Everything that determines plans and costs; equal for repeated layers (worked out
        once per expression: the planner asks thousands of times)."""
        return self._signature

    @cached_property
    def _signature(self) -> tuple[Any, ...]:
        rename = {a: f"x{i}" for i, (a, _) in enumerate(self.axes)}
        rename[INDIRECT] = INDIRECT

        def dim(d: Dim) -> object:
            if isinstance(d, Window):
                return (tuple((rename[a], c) for a, c in d.terms), d.offset)
            return rename[d]

        ops = tuple(tuple(dim(d) for d in o.axes) for o in self.operands)
        extra = tuple(tuple(dim(d) for d in o.axes) for o in self.extra)
        return (tuple(e for _, e in self.axes), ops, self.combine, self.body, self.epilogue,
                extra, self.prologue)


def is_contraction(op: TensorExpr) -> bool:
    """True for sum-of-products of two inputs (matmul, batched matmul): runs on the matrix unit.

    With a prologue the two are inputs 0 and 1 as the prologue transforms them; further inputs
    are the prologue's."""
    return (op.combine == "sum" and (len(op.inputs) == 2 or bool(op.prologue))
            and op.body == ("mul", ("in", 0), ("in", 1)) and bool(op.reduction_axes))


def prologue_of(op: TensorExpr, slot: int) -> Body | None:
    """The prologue body that replaces input ``slot`` of a contraction, or None."""
    for k, body in op.prologue:
        if k == slot:
            return body
    return None


@dataclass(frozen=True)
class View:
    """``name`` is ``source`` reshaped (perm None) or transposed by ``perm``; no data moves."""

    name: str
    source: str
    shape: tuple[int, ...]
    perm: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Append:
    """A graph output that no op computes: graph input ``base`` grown in place, along
    dimension ``axis`` (where ``base`` has extent ``length``), by the elements of tensor
    ``rows`` (in its flat order, the output's elements past ``length`` along ``axis``). A decode
    step's ``present`` KV cache on a chip with DRAM or a mesh: the ``past`` one, which lives in
    DRAM (or on the host, which loaded it), followed by the step's new entries, which the
    program writes back (`t10c.partition.dram.grow_in_place`)."""

    base: str
    rows: str
    axis: int
    length: int


@dataclass(frozen=True)
class Gathered:
    """A graph input that the caller does not feed: the rows of constant ``table`` (along its
    first dimension) that integer graph input ``ids`` picks: the elements of ``table[ids]``
    (a negative id counts from the end, as in ONNX Gather), in order, in the tensor's shape.
    On a chip with DRAM the table stays there and the DMA engine reads only those rows, at
    addresses the ids give, where each op that reads the result loads it
    (`t10c.partition.dram.gather_by_dma`): a decode step's embedding lookup, which had
    loaded the whole table into SRAM (LLaMA-135M's 57 MB, 18% of its step on a
    Wormhole n150) to pick one row of it."""

    table: str
    ids: str

    def rows(self, table: np.ndarray, ids: np.ndarray, name: str = "") -> np.ndarray:
        """``table[ids]``: the rows the ids pick (raises `ValueError` naming the first id
        outside the table)."""
        n = table.shape[0]
        bad = np.flatnonzero((ids < -n) | (ids >= n))
        if len(bad):
            raise ValueError(f"{name or self.table} gathers row {int(ids.flat[bad[0]])} of "
                             f"{self.table}, which has {n} (ids from {self.ids})")
        return np.take(table, np.where(ids < 0, ids + n, ids).astype(np.int64), axis=0)


@dataclass(frozen=True)
class Graph:
    """The device graph: ops in topological order over tensors, views, constants and I/O.

    Every output is an op's result (or a view of one), except those in ``appends``."""

    name: str
    tensors: dict[str, TensorInfo]
    ops: tuple[TensorExpr, ...]
    views: dict[str, View]
    constants: dict[str, np.ndarray] = field(repr=False)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    appends: dict[str, Append] = field(default_factory=dict)
    gathers: dict[str, Gathered] = field(default_factory=dict)

    @property
    def fed(self) -> tuple[str, ...]:
        """The inputs the caller feeds: every input but the rows gathered from a table
        (``gathers``)."""
        return tuple(t for t in self.inputs if t not in self.gathers)

    def in_order(self, tensor: str) -> bool:
        """Whether ``tensor`` holds its root's elements in the root's order: every view on
        the way is a reshape (no transpose)."""
        while tensor in self.views:
            if self.views[tensor].perm is not None:
                return False
            tensor = self.views[tensor].source
        return True

    def transposed(self, tensor: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """How ``tensor`` reads its root where one view on the way is a transpose and the
        others reshapes: (the shape that view transposes, its permutation); ``tensor`` is
        then its root reshaped to that shape, permuted, and reshaped to its own shape. None
        for no transpose (`in_order`) or several."""
        found = None
        while tensor in self.views:
            view = self.views[tensor]
            if view.perm is not None:
                if found is not None:
                    return None
                found = (self.tensors[view.source].shape, view.perm)
            tensor = view.source
        return found

    def written(self, output: str) -> str:
        """The tensor whose values the program writes for graph output ``output``: the new
        rows of an output grown in place (`appends`), else the output itself."""
        grown = self.appends.get(output)
        return grown.rows if grown is not None else output

    def producer(self) -> dict[str, TensorExpr]:
        return {op.output.tensor: op for op in self.ops}

    def read_roots(self) -> set[str]:
        """The tensors holding the data some op reads (inputs, weights, results)."""
        return {self.root(o.tensor) for op in self.ops for o in op.reads}

    def root(self, tensor: str) -> str:
        """The tensor that actually holds the data of ``tensor`` (following views)."""
        while tensor in self.views:
            tensor = self.views[tensor].source
        return tensor

    def flops(self) -> int:
        """Two flops per multiply-accumulate of contractions, one per point of other ops (a
        lookup counts its output points, not the table rows it could have read) and of
        epilogues."""
        total = 0
        seen: set[tuple[Any, ...]] = set()
        for op in self.ops:
            axes = [e for a, e in op.axes if op.body[0] != "take" or a in op.output.axes]
            points = int(np.prod(axes, dtype=np.int64))
            total += 2 * points if is_contraction(op) else points
            if op.epilogue is not None:  # one per output point, as the unfused consumer had
                total += int(np.prod([op.extents[str(a)] for a in op.output.axes],
                                     dtype=np.int64))
            for slot, _ in op.prologue:  # one per operand point, as the unfused producer
                # had; a producer recomputed by several readers (LayerNorm's by q, k and v)
                # counts once (the same tensors transformed)
                key = tuple(sorted(o.tensor for i, o in enumerate(op.inputs) if i != 1 - slot))
                if key not in seen:
                    seen.add(key)
                    total += int(np.prod([op.extents[a] for a in op.inputs[slot].axis_set],
                                         dtype=np.int64))
        return total


def unravel(flat: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """``np.unravel_index(flat, shape)``, through a 1-d copy of ``flat``: numpy 2.4.6 returns
    wrong indices for an index array whose last dimension is 1 once it has more than 8,192
    elements (a wafer's (cores, 1) tables)."""
    flat = np.asarray(flat)
    return tuple(c.reshape(flat.shape) for c in np.unravel_index(flat.ravel(), shape))


def ranges(starts: np.ndarray | int, lengths: np.ndarray) -> np.ndarray:
    """``arange(s, s + n)`` for each start ``s`` and length ``n``, one after another (int64),
    made in place: one array of the total length and one repeat beside it (a wafer's
    broadcast is tens of millions of entries, and every temporary hundreds of MB of fresh
    pages)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.arange(int(lengths.sum()), dtype=np.int64)
    out -= np.repeat(np.cumsum(lengths) - lengths - starts, lengths)
    return out


def last_product(a: np.ndarray) -> np.ndarray:
    """``np.prod(a, axis=-1)``, the same values and dtype, a column at a time: numpy reduces
    a short last axis (a box's few dimensions, over a wafer's cores) six times slower."""
    a = np.asarray(a)
    kind, size = a.dtype.kind, a.dtype.itemsize
    dtype = np.dtype(np.int64) if kind == "b" or (kind == "i" and size < 8) else \
        np.dtype(np.uint64) if kind == "u" and size < 8 else a.dtype
    if a.shape[-1] == 0:
        return np.ones(a.shape[:-1], dtype=dtype)
    out = a[..., 0].astype(dtype)
    for d in range(1, a.shape[-1]):
        out *= a[..., d]
    return out


def row_keys(rows: np.ndarray) -> np.ndarray | None:
    """One int64 per row of the 2-d integer array ``rows``, ordered as the rows are
    lexicographically (equal rows, equal keys): the row read as one number in the mixed
    radix of its columns' ranges; None where that does not fit in 62 bits. (Each column's
    range is taken alone: numpy reduces a tall array of few columns along its rows ten
    times slower, a wafer's cores being the rows.)"""
    if rows.shape[1] == 0 or not len(rows):
        return np.zeros(len(rows), dtype=np.int64)
    lo = [int(rows[:, c].min()) for c in range(rows.shape[1])]
    span = [int(rows[:, c].max()) - low + 1 for c, low in enumerate(lo)]
    if math.prod(span) >= 1 << 62:
        return None
    key = np.zeros(len(rows), dtype=np.int64)
    for c, (low, size) in enumerate(zip(lo, span)):
        key *= size
        np.add(key, rows[:, c], out=key, casting="unsafe")  # (any integer type, exactly)
        key -= low
    return key


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows of ``rows``, in order; each row's number among them): what
    ``np.unique(rows, axis=0, return_inverse=True)`` gives, faster for integer rows, each read
    as one integer (`row_keys`; ``np.unique`` compares rows as records, several times slower
    on a wafer's cores)."""
    if not len(rows):
        return rows, np.zeros(0, dtype=np.int64)
    key = row_keys(rows) if rows.ndim == 2 and rows.dtype.kind in "iu" else None
    if key is not None:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return rows[first], inverse.reshape(-1)
    uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
    return uniq, inverse.reshape(-1)


def tile_counts(origin: np.ndarray, tile: tuple[int, ...], shape: tuple[int, ...]
                ) -> np.ndarray:
    """(ncores,): how many elements of a ``shape`` tensor each core's ``tile`` at
    ``origin[c]`` holds (the rest of the tile lies past the tensor's edge: padding, or a
    window's margin before its start)."""
    counts = np.ones(len(origin), dtype=np.int64)
    for d, (t, n) in enumerate(zip(tile, shape)):
        start = origin[:, d].astype(np.int64)
        counts *= np.clip(np.minimum(start + t, n) - np.maximum(start, 0), 0, None)
    return counts


def tile_elements(origin: np.ndarray, tile: tuple[int, ...], shape: tuple[int, ...],
                  itype: type[np.signedinteger] | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Flat indices into a tensor of ``shape`` of each core's ``tile`` at ``origin[c]``,
    row-major within the tile: the numbering of codegen's buffers.

    Returns (flat, valid), both (ncores, prod(tile)); positions outside the tensor are not
    valid (their flat index is clamped inside it). Built one dimension at a time with
    broadcasting, never materialising (ncores, elems, ndim). The indices are ``itype``; by
    default int32 where the tensor's elements fit it, else int64.
    """
    n = len(origin)
    if itype is None:
        itype = np.int32 if int(np.prod(shape, dtype=np.int64)) < 2 ** 31 else np.int64
    origin = origin.astype(itype, copy=False)
    flat = np.zeros((n,) + (1,) * len(tile), dtype=itype)
    valid = np.ones((n,) + (1,) * len(tile), dtype=bool)
    stride = 1
    for d in reversed(range(len(tile))):
        view = [n] + [1] * len(tile)
        view[d + 1] = tile[d]
        coord = (origin[:, d][:, None] + np.arange(tile[d], dtype=itype)[None, :]).reshape(view)
        valid = valid & (coord >= 0) & (coord < shape[d])
        flat = flat + np.clip(coord, 0, shape[d] - 1) * stride
        stride *= shape[d]
    full = (n, int(np.prod(tile, dtype=np.int64)))
    return (np.broadcast_to(flat, (n, *tile)).reshape(full),
            np.broadcast_to(valid, (n, *tile)).reshape(full))


def map_to_root(graph: Graph, tensor: str, flat: np.ndarray) -> tuple[str, np.ndarray]:
    """Map flat element indices of ``tensor`` through its views to flat indices of its root."""
    while tensor in graph.views:
        view = graph.views[tensor]
        if view.perm is not None:
            # view[i] = src[j] where j[perm[d]] = i[d]
            src_shape = graph.tensors[view.source].shape
            idx = unravel(flat, view.shape)
            src_idx: list[Any] = [None] * len(view.perm)
            for d, p in enumerate(view.perm):
                src_idx[p] = idx[d]
            flat = np.asarray(np.ravel_multi_index(tuple(src_idx), src_shape))
        tensor = view.source
    return tensor, flat


def expr_to_json(op: TensorExpr) -> dict[str, Any]:
    """A JSON-ready form of an expression (windows as {terms, offset})."""

    def dim(d: Dim) -> Any:
        return {"terms": [list(t) for t in d.terms], "offset": d.offset} \
            if isinstance(d, Window) else d

    def operand(o: Operand) -> dict[str, Any]:
        return {"tensor": o.tensor, "axes": [dim(d) for d in o.axes]}

    def body(b: Any) -> Any:
        return [body(x) for x in b] if isinstance(b, tuple) else b

    doc = {"name": op.name, "axes": [list(a) for a in op.axes], "output": operand(op.output),
           "inputs": [operand(o) for o in op.inputs], "combine": op.combine,
           "body": body(op.body), "source": op.source}
    if op.epilogue is not None:  # absent for unfused ops: their JSON is unchanged
        doc["epilogue"] = body(op.epilogue)
        doc["extra"] = [operand(o) for o in op.extra]
    if op.prologue:  # likewise absent for ops without one
        doc["prologue"] = [[slot, body(b)] for slot, b in op.prologue]
    return doc


def expr_from_json(d: dict[str, Any]) -> TensorExpr:
    def dim(x: Any) -> Dim:
        return Window(tuple((a, int(c)) for a, c in x["terms"]), int(x["offset"])) \
            if isinstance(x, dict) else x

    def operand(o: dict[str, Any]) -> Operand:
        return Operand(o["tensor"], tuple(dim(x) for x in o["axes"]))

    def body(b: Any) -> Any:
        return tuple(body(x) for x in b) if isinstance(b, list) else b

    epilogue = d.get("epilogue")
    return TensorExpr(d["name"], tuple((a, int(e)) for a, e in d["axes"]), operand(d["output"]),
                      tuple(operand(o) for o in d["inputs"]), d["combine"], body(d["body"]),
                      d.get("source", ""), None if epilogue is None else body(epilogue),
                      tuple(operand(o) for o in d.get("extra", ())),
                      tuple((int(slot), body(b)) for slot, b in d.get("prologue", ())))
