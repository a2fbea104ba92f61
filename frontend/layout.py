"""Layout ops: views (free) and copies through index maps.

Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Identity and inference Dropout are `View`s of
their input. The others are one elementwise copy whose operands read the input through an
affine index map (`Window`: ``coef * axis + offset``, zero outside the tensor):

- Slice: ``y[i] = x[start + step * i]`` (a negative step is a lookup, below);
- Pad (constant mode): ``y[i] = x[i - pad_begin]``, zero outside; a nonzero pad value is
  selected with a mask of ones read through the same window;
- Concat: ``y[i] = x0[i] + x1[i - n0] + x2[i - n0 - n1] + ...`` (each read is zero outside
  its tensor, so exactly one term is nonzero at every point);
- Split: one slice per output; Gather with constant indices that form an affine range: a slice
  (a scalar index: a window with no axis at all);
- Expand: a broadcast copy; Tile: a broadcast copy ([n] -> [r, n]) and a reshape view.

Gather with other indices (constant or computed), GatherElements and GatherND with other
constant indices, Slice with negative steps and Pad in reflect, edge and wrap modes are lookups
(a ``take``: the indexed dimension is held whole on every core).

The fusion pass (`fuse.py`) folds a pure copy into every op that reads it point by point (a
matmul included), and Concat or Pad into an elementwise reader, so a copy rarely runs on its
own.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from t10c.dtypes import ceil_div
from t10c.ir import INDIRECT, Body, Dim, Operand, Window

from .context import Context, Unsupported, broadcast_shape, register


def _axes(rank: int, prefix: str = "d") -> list[str]:
    return [f"{prefix}{i}" for i in range(rank)]


def copy(ctx: Context, node: onnx.NodeProto, out: str, extents: list[int],
          inputs: list[tuple[str, tuple[Dim, ...]]], name: str | None = None,
          body: Body | None = None) -> None:
    """Emit ``out[d0, d1, ...] = sum of inputs`` (or ``body``) over axes ``d*``."""
    axes = _axes(len(extents))
    operands = [Operand(ctx.float_operand(t) if ctx.is_const(t) else t, dims)
                for t, dims in inputs]
    if body is None:
        body = ("in", 0)
        for k in range(1, len(operands)):
            body = ("add", body, ("in", k))
    ctx.emit(node, name or node.name or out, list(zip(axes, extents)),
             Operand(out, tuple(axes)), operands, None, body)


def _window(axis: str, coef: int = 1, offset: int = 0) -> Dim:
    if coef == 1 and offset == 0:
        return axis
    return Window(((axis, coef),), offset)


# -- views ----------------------------------------------------------------------------------

def _reshape(ctx: Context, node: onnx.NodeProto, target: list[int], allowzero: int) -> None:
    data = node.input[0]
    src = ctx.shape(data)
    out = []
    for i, d in enumerate(target):
        out.append(src[i] if d == 0 and not allowzero else d)
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(src)) // max(known, 1)
    if int(np.prod(out)) != int(np.prod(src)):
        raise Unsupported(f"cannot reshape {src} to {tuple(out)}")
    ctx.view(node.output[0], data, tuple(out))


@register("Reshape", 1)
def Reshape_1(ctx: Context, node: onnx.NodeProto, shape: list[int] | None = None,
              consumed_inputs: list[int] | None = None) -> None:
    _reshape(ctx, node, list(shape or []), 0)


@register("Reshape", 5)
def Reshape(ctx: Context, node: onnx.NodeProto, allowzero: int = 0) -> None:
    target = [int(x) for x in ctx.const(node.input[1], "the target shape of Reshape")]
    _reshape(ctx, node, target, allowzero)


@register("Transpose", 1)
def Transpose(ctx: Context, node: onnx.NodeProto, perm: list[int] | None = None) -> None:
    src = ctx.shape(node.input[0])
    p = tuple(perm) if perm is not None else tuple(reversed(range(len(src))))
    if p == tuple(range(len(src))):
        ctx.view(node.output[0], node.input[0], src)
        return
    ctx.view(node.output[0], node.input[0], tuple(src[i] for i in p), p)


@register("Identity", 1)
def Identity(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.view(node.output[0], node.input[0], ctx.shape(node.input[0]))


@register("Dropout", 1)
def Dropout(ctx: Context, node: onnx.NodeProto, ratio: float = 0.5, is_test: int = 0,
            seed: int = 0, consumed_inputs: list[int] | None = None) -> None:
    """Inference: the identity (the ratio and training-mode inputs are ignored)."""
    ctx.view(node.output[0], node.input[0], ctx.shape(node.input[0]))
    if len(node.output) > 1 and node.output[1]:  # inference keeps every element
        ctx.constants[node.output[1]] = np.ones(ctx.shape(node.input[0]), bool)


@register("Flatten", 1)
def Flatten(ctx: Context, node: onnx.NodeProto, axis: int = 1) -> None:
    shape = ctx.shape(node.input[0])
    axis = axis % len(shape) if axis < 0 else axis
    ctx.view(node.output[0], node.input[0],
             (math.prod(shape[:axis]), math.prod(shape[axis:])))


def _axes_arg(ctx: Context, node: onnx.NodeProto, attr: list[int] | None, what: str
              ) -> list[int] | None:
    """Axes from an attribute (older opsets) or the second input (newer ones)."""
    if attr is not None:
        return list(attr)
    if len(node.input) > 1 and node.input[1]:
        return [int(a) for a in ctx.const(node.input[1], f"the axes of {what}").reshape(-1)]
    return None


@register("Squeeze", 1)
def Squeeze(ctx: Context, node: onnx.NodeProto, axes: list[int] | None = None) -> None:
    shape = ctx.shape(node.input[0])
    picked = _axes_arg(ctx, node, axes, "Squeeze")
    drop = ({a % len(shape) for a in picked} if picked is not None
            else {i for i, d in enumerate(shape) if d == 1})
    ctx.view(node.output[0], node.input[0],
             tuple(d for i, d in enumerate(shape) if i not in drop))


@register("Unsqueeze", 1)
def Unsqueeze(ctx: Context, node: onnx.NodeProto, axes: list[int] | None = None) -> None:
    shape = list(ctx.shape(node.input[0]))
    picked = _axes_arg(ctx, node, axes, "Unsqueeze") or []
    rank = len(shape) + len(picked)
    for a in sorted(x % rank for x in picked):
        shape.insert(a, 1)
    ctx.view(node.output[0], node.input[0], tuple(shape))


# -- copies through windows -----------------------------------------------------------------

@register("Concat", 4)
def Concat(ctx: Context, node: onnx.NodeProto, axis: int = 0) -> None:
    names = [n for n in node.input if n and math.prod(ctx.shape(n)) > 0]
    shapes = [ctx.shape(n) for n in names]
    rank = len(shapes[0])
    axis %= rank
    total = sum(s[axis] for s in shapes)
    out_shape = list(shapes[0])
    out_shape[axis] = total
    if len(names) == 1:
        ctx.view(node.output[0], names[0], tuple(out_shape))
        return
    axes = _axes(rank)
    inputs = []
    offset = 0
    for name, shape in zip(names, shapes):
        dims = [a for a in axes]
        dims[axis] = Window(((axes[axis], 1),), -offset)
        inputs.append((name, tuple(dims)))
        offset += shape[axis]
    copy(ctx, node, node.output[0], out_shape, inputs)


def lookup(ctx: Context, node: onnx.NodeProto, data: str, out: str, axis: int,
           idx: np.ndarray, name: str) -> None:
    """``out = data`` with dimension ``axis`` read at the constant indices ``idx`` (a
    ``take``: that dimension is held whole on every core)."""
    shape = list(ctx.shape(data))
    shape[axis] = len(idx)
    axes = _axes(len(shape))
    table = ctx.constant(f"{out}/index{axis}", idx.astype(np.int64))
    dims = tuple(INDIRECT if i == axis else a for i, a in enumerate(axes))
    ctx.emit(node, name, list(zip(axes, shape)), Operand(out, tuple(axes)),
             [Operand(data, dims), Operand(table, (axes[axis],))], None, ("take", 0, 1))


def _slice(ctx: Context, node: onnx.NodeProto, data: str, out: str, name: str,
           ranges: dict[int, range]) -> None:
    """``out = data[r]`` for the index range ``r`` of each axis in ``ranges``: one copy through
    windows for the positive steps, then a lookup per axis read backwards."""
    shape = ctx.shape(data)
    axes = _axes(len(shape))
    dims: list[Dim] = list(axes)
    extents = list(shape)
    backwards = {}
    if any(len(r) == 0 for r in ranges.values()):
        # an empty slice holds no values: a constant, which no op needs to compute
        ctx.constants[out] = np.zeros([len(ranges[d]) if d in ranges else n
                                       for d, n in enumerate(shape)], np.float32)
        return
    for axis, r in ranges.items():
        if r.step < 0 and len(r) > 1:
            backwards[axis] = r
            continue
        extents[axis] = len(r)
        dims[axis] = _window(axes[axis], r.step if len(r) > 1 else 1, r.start)
    source = data
    if extents != list(shape):
        source = out if not backwards else ctx.fresh(out)
        copy(ctx, node, source, extents, [(data, tuple(dims))], name=name)
    elif not backwards:
        ctx.view(out, data, shape)
        return
    for k, (axis, r) in enumerate(backwards.items()):
        target = out if k == len(backwards) - 1 else ctx.fresh(out)
        lookup(ctx, node, source, target, axis, np.array(r), f"{name}/reverse{axis}")
        source = target


def _slice_node(ctx: Context, node: onnx.NodeProto, starts: list[int], ends: list[int],
                axes: list[int] | None, steps: list[int] | None) -> None:
    data = node.input[0]
    shape = ctx.shape(data)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    ranges = {}
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise Unsupported("a slice step of 0")
        a %= len(shape)
        # ONNX clamps like Python slices do
        ranges[a] = range(*slice(int(s), int(e), int(st)).indices(shape[a]))
    _slice(ctx, node, data, node.output[0], node.name or node.output[0], ranges)


@register("Slice", 1)
def Slice_1(ctx: Context, node: onnx.NodeProto, starts: list[int] | None = None,
            ends: list[int] | None = None, axes: list[int] | None = None) -> None:
    _slice_node(ctx, node, list(starts or []), list(ends or []), axes, None)


@register("Slice", 10)
def Slice(ctx: Context, node: onnx.NodeProto) -> None:
    ins = list(node.input) + [""] * (5 - len(node.input))

    def arg(i: int, what: str) -> list[int] | None:
        return ([int(v) for v in ctx.const(ins[i], f"the {what} of Slice").reshape(-1)]
                if ins[i] else None)

    _slice_node(ctx, node, arg(1, "starts") or [], arg(2, "ends") or [], arg(3, "axes"),
                arg(4, "steps"))


def _split_sizes(ctx: Context, node: onnx.NodeProto, dim: int, split: list[int] | None,
                 num_outputs: int | None) -> list[int]:
    if split is None and len(node.input) > 1 and node.input[1]:
        split = [int(v) for v in ctx.const(node.input[1], "the split sizes").reshape(-1)]
    n = len(node.output)
    if split is not None:
        return list(split)
    if num_outputs is not None:  # opset 18: the last chunk may be smaller
        size = ceil_div(dim, num_outputs)
        return [min(size, dim - i * size) for i in range(num_outputs)]
    if dim % n:
        raise Unsupported(f"cannot split {dim} into {n} equal parts")
    return [dim // n] * n


@register("Split", 2)
def Split(ctx: Context, node: onnx.NodeProto, axis: int = 0, split: list[int] | None = None,
          num_outputs: int | None = None) -> None:
    data = node.input[0]
    shape = ctx.shape(data)
    axis %= len(shape)
    sizes = _split_sizes(ctx, node, shape[axis], split, num_outputs)
    if sum(sizes) != shape[axis]:
        raise Unsupported(f"split sizes {sizes} do not add up to {shape[axis]}")
    start = 0
    base = node.name or node.output[0]
    for k, (out, size) in enumerate(zip(node.output, sizes)):
        if out:
            _slice(ctx, node, data, out, f"{base}/{k}", {axis: range(start, start + size)})
        start += size


def _affine(idx: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(offset, coefficient per index dimension) if ``idx`` is affine in its coordinates."""
    offset = int(idx.reshape(-1)[0]) if idx.size else 0
    coefs = []
    for d in range(idx.ndim):
        step = [0] * idx.ndim
        step[d] = 1 if idx.shape[d] > 1 else 0
        coefs.append(int(idx[tuple(step)]) - offset if idx.shape[d] > 1 else 0)
    grid = np.indices(idx.shape) if idx.ndim else np.zeros((0,), np.int64)
    model = offset + sum(c * grid[d] for d, c in enumerate(coefs)) if idx.ndim else offset
    if not np.array_equal(np.asarray(model), idx):
        return None
    return offset, tuple(coefs)


@register("Gather", 1)
def Gather(ctx: Context, node: onnx.NodeProto, axis: int = 0) -> None:
    data, indices = node.input
    shape = ctx.shape(data)
    axis %= len(shape)
    ishape = ctx.shape(indices)
    out_shape = tuple(shape[:axis]) + tuple(ishape) + tuple(shape[axis + 1:])
    axes = _axes(len(out_shape))
    ni = len(ishape)
    iaxes = axes[axis:axis + ni]
    rest = axes[:axis] + axes[axis + ni:]
    if ctx.is_const(indices):
        idx = ctx.constants[indices].astype(np.int64)
        idx = np.where(idx < 0, idx + shape[axis], idx)
        fit = _affine(idx)
        if fit is not None and all(c >= 0 for c in fit[1]):
            offset, coefs = fit
            terms = tuple((a, c) for a, c in zip(iaxes, coefs) if c > 0)
            dims: list[Dim] = list(axes[:axis]) + [Window(terms, offset)] + list(axes[axis + ni:])
            if len(terms) == 1 and terms[0][1] == 1 and offset == 0:
                dims[axis] = terms[0][0]
            # index dimensions with coefficient 0 broadcast: the input does not vary along them
            copy(ctx, node, node.output[0], list(out_shape), [(data, tuple(dims))])
            return
    if ctx.is_const(data):
        # a weight table (an embedding) may be larger than one core's SRAM: its rows get an
        # axis of their own, which the planner may split (a sharded lookup, see `t10c.ir`)
        ctx.constants[data] = ctx.constants[data].astype(np.float32, copy=False)
        rows = f"d{len(out_shape)}"
        table_dims = tuple(rest[:axis]) + (rows,) + tuple(rest[axis:])
        ctx.emit(node, node.name or node.output[0],
                 list(zip(axes, out_shape)) + [(rows, shape[axis])],
                 Operand(node.output[0], tuple(axes)),
                 [Operand(data, table_dims), Operand(indices, tuple(iaxes))], "sum",
                 ("take", 0, 1))
        return
    table_dims = tuple(rest[:axis]) + (INDIRECT,) + tuple(rest[axis:])
    ctx.emit(node, node.name or node.output[0], list(zip(axes, out_shape)),
             Operand(node.output[0], tuple(axes)),
             [Operand(data, table_dims), Operand(indices, tuple(iaxes))], None, ("take", 0, 1))


@register("GatherND", 11)
def GatherND(ctx: Context, node: onnx.NodeProto, batch_dims: int = 0) -> None:
    """Constant index tuples: the indexed leading dimensions of the data are flattened into one
    (a view) and read at the flat positions, through a window when those form an affine range,
    by a lookup otherwise."""
    data, indices = node.input
    if batch_dims:
        raise Unsupported(f"batch_dims={batch_dims}")
    if not ctx.is_const(indices):
        raise Unsupported("GatherND with computed indices (a data-dependent read)")
    shape = ctx.shape(data)
    idx = ctx.constants[indices].astype(np.int64)
    depth = idx.shape[-1]
    lead = shape[:depth]
    idx = np.where(idx < 0, idx + np.array(lead), idx)
    flat_idx = np.ravel_multi_index(tuple(np.moveaxis(idx, -1, 0)), lead) if depth else \
        np.zeros(idx.shape[:-1], np.int64)
    flat = ctx.fresh(data)
    ctx.view(flat, data, (math.prod(lead),) + tuple(shape[depth:]))
    table = ctx.constant(f"{node.output[0]}/flat", flat_idx.astype(np.int64))
    gathered = onnx.helper.make_node("Gather", [flat, table], list(node.output), name=node.name)
    Gather(ctx, gathered, axis=0)


@register("GatherElements", 11)
def GatherElements(ctx: Context, node: onnx.NodeProto, axis: int = 0) -> None:
    """Constant indices: a copy through a window when they are affine in the output
    coordinates, otherwise a lookup in the flattened data at constant flat positions."""
    data, indices = node.input
    shape = ctx.shape(data)
    axis %= len(shape)
    if not ctx.is_const(indices):
        _gather_elements_computed(ctx, node, data, indices, axis)
        return
    idx = ctx.constants[indices].astype(np.int64)
    idx = np.where(idx < 0, idx + shape[axis], idx)
    axes = _axes(idx.ndim)
    fit = _affine(idx)
    same = all(idx.shape[d] == shape[d] for d in range(idx.ndim) if d != axis)
    if fit is not None and all(c >= 0 for c in fit[1]) and same:
        offset, coefs = fit
        dims: list[Dim] = list(axes)
        dims[axis] = Window(tuple((a, c) for a, c in zip(axes, coefs) if c > 0), offset)
        copy(ctx, node, node.output[0], list(idx.shape), [(data, tuple(dims))])
        return
    coords = list(np.indices(idx.shape))
    coords[axis] = idx
    flat_idx = np.ravel_multi_index(tuple(coords), shape)
    flat = ctx.fresh(data)
    ctx.view(flat, data, (math.prod(shape),))
    table = ctx.constant(f"{node.output[0]}/flat", flat_idx.astype(np.int64))
    ctx.emit(node, node.name or node.output[0], list(zip(axes, idx.shape)),
             Operand(node.output[0], tuple(axes)),
             [Operand(flat, (INDIRECT,)), Operand(table, tuple(axes))], None, ("take", 0, 1))


def _gather_elements_computed(ctx: Context, node: onnx.NodeProto, data: str, indices: str,
                              axis: int) -> None:
    """Computed indices: their flat positions in the data, ``index * stride + base`` (negative
    indices counted from the end; ``base``, the other coordinates' part, a constant), computed
    on chip, then one lookup in the flattened data."""
    shape = ctx.shape(data)
    ishape = ctx.shape(indices)
    coords = list(np.indices(ishape))
    coords[axis] = np.zeros(ishape, np.int64)
    base = ctx.constant(f"{node.output[0]}/base",
                        np.ravel_multi_index(tuple(coords), shape).astype(np.int64))
    stride = float(math.prod(shape[axis + 1:]))
    n = float(shape[axis])
    flat_idx = ctx.fresh(node.output[0])
    axes = _axes(len(ishape))
    operands, (i, b) = ctx.broadcast_operands([indices, base], ishape, axes)
    # stored as integers: in fp16 storage a float position above 2048 would be rounded
    ctx.emit(node, f"{node.name or node.output[0]}/positions", list(zip(axes, ishape)),
             Operand(flat_idx, tuple(axes)), operands, None, ("add", ("mul", (
                 "where", ("lt", i, ("const", 0.0)), ("add", i, ("const", n)), i),
                 ("const", stride)), b), out_dtype="int64")
    flat = ctx.fresh(data)
    ctx.view(flat, data, (math.prod(shape),))
    ctx.emit(node, node.name or node.output[0], list(zip(axes, ishape)),
             Operand(node.output[0], tuple(axes)),
             [Operand(flat, (INDIRECT,)), Operand(flat_idx, tuple(axes))], None, ("take", 0, 1))


@register("Expand", 8)
def Expand(ctx: Context, node: onnx.NodeProto) -> None:
    data = node.input[0]
    target = tuple(int(v) for v in ctx.const(node.input[1], "the shape of Expand").reshape(-1))
    shape = ctx.shape(data)
    out_shape = broadcast_shape(shape, target)
    if out_shape == tuple(shape):
        ctx.view(node.output[0], data, shape)
        return
    # the input's dimensions align with the output's trailing ones; size-1 ones broadcast
    axes = _axes(len(out_shape))
    lead = len(out_shape) - len(shape)
    keep = [d for d in range(len(shape)) if not (shape[d] == 1 and out_shape[lead + d] > 1)]
    source = data
    if len(keep) != len(shape):
        source = ctx.fresh(data)
        ctx.view(source, data, tuple(shape[d] for d in keep))
    dims = tuple(axes[lead + d] for d in keep)
    copy(ctx, node, node.output[0], list(out_shape), [(source, dims)])


@register("Tile", 6)
def Tile(ctx: Context, node: onnx.NodeProto) -> None:
    data = node.input[0]
    repeats = [int(v) for v in ctx.const(node.input[1], "the repeats of Tile").reshape(-1)]
    shape = ctx.shape(data)
    if len(repeats) != len(shape):
        raise Unsupported(f"{len(repeats)} repeats for a rank-{len(shape)} input")
    if all(r == 1 for r in repeats):
        ctx.view(node.output[0], data, shape)
        return
    # x[n] -> broadcast copy [r, n] -> view [r * n], for every repeated axis
    expanded: list[int] = []
    own: list[int] = []  # the position of each input dimension in the expanded shape
    for n, r in zip(shape, repeats):
        if r != 1:
            expanded.append(r)
        own.append(len(expanded))
        expanded.append(n)
    axes = _axes(len(expanded))
    copied = ctx.fresh(node.output[0])
    copy(ctx, node, copied, expanded, [(data, tuple(axes[j] for j in own))])
    ctx.view(node.output[0], copied, tuple(n * r for n, r in zip(shape, repeats)))


def _pad(ctx: Context, node: onnx.NodeProto, pads: list[int], mode: str, value: float | str,
         axes: list[int] | None = None) -> None:
    """Pad ``node.input[0]``; ``value`` is the constant pad value, or the name of a computed
    one-element tensor holding it."""
    data = node.input[0]
    shape = ctx.shape(data)
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    if len(pads) != 2 * len(axes):
        raise Unsupported(f"{len(pads)} pads for {len(axes)} axes")
    begin = dict.fromkeys(range(rank), 0)
    end = dict.fromkeys(range(rank), 0)
    for i, a in enumerate(axes):
        begin[a], end[a] = int(pads[i]), int(pads[i + len(axes)])
    if mode != "constant":
        _pad_by_lookup(ctx, node, data, begin, end, mode)
        return
    extents = [shape[d] + begin[d] + end[d] for d in range(rank)]
    if min(extents) <= 0:
        raise Unsupported("padding that removes a whole axis")
    names = _axes(rank)
    dims = tuple(_window(names[d], 1, -begin[d]) for d in range(rank))
    if value == 0.0:
        copy(ctx, node, node.output[0], extents, [(data, dims)])
        return
    # select the pad value where a mask of ones, read through the same window, reads zero
    padded = [d for d in range(rank) if begin[d] or end[d]]
    mask = ctx.constant(f"{node.output[0]}/inside", np.ones([shape[d] for d in padded]))
    inputs = [(data, dims), (mask, tuple(dims[d] for d in padded))]
    if isinstance(value, str):  # computed: a third operand of no dimensions
        scalar = ctx.fresh(value)
        ctx.view(scalar, value, ())
        inputs.append((scalar, ()))
        fill: Body = ("in", 2)
    else:
        fill = ("const", float(value))
    copy(ctx, node, node.output[0], extents, inputs, body=("where", ("in", 1), ("in", 0), fill))


def _pad_by_lookup(ctx: Context, node: onnx.NodeProto, data: str, begin: dict[int, int],
                   end: dict[int, int], mode: str) -> None:
    """reflect, edge and wrap padding read mirrored, clamped or wrapped indices, which are
    not affine: one lookup (``take``) per padded axis with a constant index table."""
    shape = ctx.shape(data)
    padded = [d for d in range(len(shape)) if begin[d] or end[d]]
    source = data
    for k, d in enumerate(padded):
        n = shape[d]
        j = np.arange(n + begin[d] + end[d]) - begin[d]
        if mode == "edge":
            idx = np.clip(j, 0, n - 1)
        elif mode == "reflect":
            if max(begin[d], end[d]) > n - 1:
                raise Unsupported(f"reflect padding of {max(begin[d], end[d])} on an axis of {n}")
            idx = np.where(j < 0, -j, np.where(j >= n, 2 * (n - 1) - j, j))
        elif mode == "wrap":
            idx = np.mod(j, n)
        else:
            raise Unsupported(f"mode={mode!r}")
        out = node.output[0] if k == len(padded) - 1 else ctx.fresh(node.output[0])
        lookup(ctx, node, source, out, d, idx, f"{node.name or out}/{d}")
        source = out


@register("Pad", 2)
def Pad_2(ctx: Context, node: onnx.NodeProto, pads: list[int] | None = None,
          mode: str = "constant", value: float = 0.0, paddings: list[int] | None = None) -> None:
    _pad(ctx, node, list(pads if pads is not None else paddings or []), mode, value)


@register("Pad", 11)
def Pad(ctx: Context, node: onnx.NodeProto, mode: str = "constant") -> None:
    ins = list(node.input) + [""] * (4 - len(node.input))
    pads = [int(v) for v in ctx.const(ins[1], "the pads of Pad").reshape(-1)]
    value: float | str = 0.0
    if ins[2] and ctx.is_const(ins[2]):
        value = float(ctx.constants[ins[2]].reshape(-1)[0])
    elif ins[2] and mode == "constant":  # (the other modes read no value)
        if math.prod(ctx.shape(ins[2])) != 1:
            raise Unsupported(f"a pad value of shape {ctx.shape(ins[2])} (one element)")
        value = ins[2]
    axes = ([int(v) for v in ctx.const(ins[3], "the axes of Pad").reshape(-1)]
            if ins[3] else None)
    _pad(ctx, node, pads, mode, value, axes)


@register("Trilu", 14)
def Trilu(ctx: Context, node: onnx.NodeProto, upper: int = 1) -> None:
    data = node.input[0]
    k = int(ctx.const(node.input[1], "k of Trilu").reshape(-1)[0]) \
        if len(node.input) > 1 and node.input[1] else 0
    shape = ctx.shape(data)
    rows, cols = shape[-2:]
    keep = np.triu(np.ones((rows, cols)), k) if upper else np.tril(np.ones((rows, cols)), k)
    mask = ctx.constant(f"{node.output[0]}/mask", keep)
    ctx.elementwise(node, [data, mask], lambda x, m: ("where", m, x, ("const", 0.0)))
