"""Convolution, pooling, normalisation, softmax and reductions.

Convolutions are contractions whose input reads spatial dimensions through windows:
``y[n, g, co, oh] = sum_{ci, kh} x[n, g, ci, oh*stride + kh*dilation - pad] * w[g, co, ci, kh]``,
the group an axis of its own through reshape views (``x`` as [N, G, Cin/G, H], ``w`` as
[G, Cout/G, Cin/G, kh], ``y`` viewed back as [N, Cout, OH]). Axes of extent one are left out
(a 1x1 convolution with stride one is a plain batched matmul).

ConvTranspose is lowered exactly as one contraction over phases: output position
``o = q*stride + r`` receives ``x[q + m] * w[kh]`` for every tap with
``m*stride = r + pad - kh*dilation``, so ``y[.., q, r] = sum_{ci, t} x[.., ci, q + t + m0] *
w'[ci, co, t, r]`` where ``w'`` is the constant weight rearranged per phase (zero where a tap
does not reach a phase); ``y`` is then viewed as [.., Q*stride] and cut to the output size.

Reads outside a tensor are zero, which is the right padding for sums but not for a maximum:
MaxPool selects ``-inf`` where a constant mask of ones, read through the same window, reads
zero. AveragePool divides by the number of counted positions (a constant per output position
when ``count_include_pad=0`` or ``ceil_mode`` makes windows uneven).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from t10c.dtypes import ceil_div
from t10c.ir import Body, Dim, Operand, Window

from .context import Context, Unsupported, register
from .layout import copy


def _spatial(ctx: Context, node: onnx.NodeProto, x_shape: tuple[int, ...],
             kernel: list[int], strides: list[int] | None, dilations: list[int] | None,
             pads: list[int] | None, auto_pad: str, ceil_mode: int = 0
             ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """(strides, dilations, pad_begin, pad_end, output size) per spatial dimension, per the
    ONNX spec (the output size is the shape inference's when it has one)."""
    spatial = list(x_shape[2:])
    nd = len(spatial)
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [ceil_div(s, st) for s, st in zip(spatial, strides)]
        total = [max(0, (o - 1) * st + (k - 1) * d + 1 - s)
                 for o, st, k, d, s in zip(out, strides, kernel, dilations, spatial)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    elif auto_pad in ("NOTSET", "VALID"):
        full = list(pads or [0] * 2 * nd) if auto_pad == "NOTSET" else [0] * 2 * nd
        begin, end = full[:nd], full[nd:]
        out = []
        for s, k, st, d, b, e in zip(spatial, kernel, strides, dilations, begin, end):
            span = s + b + e - ((k - 1) * d + 1)
            o = (ceil_div(span, st) if ceil_mode else span // st) + 1
            if ceil_mode and (o - 1) * st >= s + b:  # the last window must start inside
                o -= 1
            out.append(o)
    else:
        raise Unsupported(f"auto_pad={auto_pad!r}")
    inferred = ctx.shapes.get(node.output[0])
    if inferred is not None and len(inferred) == nd + 2:
        out = list(inferred[2:])
    if min(out) < 1:
        raise Unsupported(f"an empty output (spatial size {out})")
    return strides, dilations, begin, end, out


def _emit(ctx: Context, node: onnx.NodeProto, name: str, axes: list[tuple[str, int]],
          out: str, out_dims: list[str], inputs: list[tuple[str, list[Dim]]],
          combine: str | None, body: Body) -> None:
    """Emit one op (axes of extent one are left out by `Context.emit`)."""
    ctx.emit(node, name, axes, Operand(out, tuple(out_dims)),
             [Operand(t, tuple(dims)) for t, dims in inputs], combine, body)


def _add_channel_bias(ctx: Context, node: onnx.NodeProto, y: str, bias: str, out: str,
                      name: str) -> None:
    rank = len(ctx.shape(y))
    shaped = ctx.fresh(bias)
    ctx.view(shaped, bias, (ctx.shape(bias)[0],) + (1,) * (rank - 2))
    ctx.elementwise(node, [y, shaped], lambda a, b: ("add", a, b), out=out, name=name)


@register("Conv", 1)
def Conv(ctx: Context, node: onnx.NodeProto, auto_pad: str = "NOTSET",
         dilations: list[int] | None = None, group: int = 1,
         kernel_shape: list[int] | None = None, pads: list[int] | None = None,
         strides: list[int] | None = None) -> None:
    x, w = node.input[:2]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    xs, ws = ctx.shape(x), ctx.shape(w)
    n, cin = xs[:2]
    cout, cg = ws[:2]
    kernel = list(ws[2:])
    if kernel_shape is not None and list(kernel_shape) != kernel:
        raise Unsupported(f"kernel_shape {kernel_shape} differs from the weight's {kernel}")
    if cin != cg * group or cout % group:
        raise Unsupported(f"channels {cin} -> {cout} do not divide into {group} groups")
    st, dil, begin, _, out = _spatial(ctx, node, xs, kernel, strides, dilations, pads,
                                      auto_pad)
    nd = len(kernel)
    g, co = group, cout // group
    o_axes = [f"o{i}" for i in range(nd)]
    k_axes = [f"k{i}" for i in range(nd)]
    axes = ([("n", n), ("g", g), ("co", co)] + list(zip(o_axes, out)) + [("ci", cg)]
            + list(zip(k_axes, kernel)))
    windows: list[Dim] = [
        o if (k == 1 and s == 1 and b == 0 and osz == size) else
        Window(((o, s), (kk, d)), -b)
        for o, kk, s, d, b, k, osz, size in zip(o_axes, k_axes, st, dil, begin, kernel, out,
                                                xs[2:])]
    xg, wg = ctx.fresh(x), ctx.fresh(w)
    ctx.view(xg, x, (n, g, cg) + tuple(xs[2:]))
    ctx.view(wg, w, (g, co, cg) + tuple(kernel))
    base = node.name or node.output[0]
    y = ctx.fresh(node.output[0]) if bias else node.output[0]
    yg = ctx.fresh(y)
    _emit(ctx, node, base, axes, yg, ["n", "g", "co", *o_axes],
          [(xg, ["n", "g", "ci", *windows]), (ctx.float_operand(wg), ["g", "co", "ci", *k_axes])],
          "sum", ("mul", ("in", 0), ("in", 1)))
    ctx.view(y, yg, (n, cout) + tuple(out))
    if bias:
        _add_channel_bias(ctx, node, y, bias, node.output[0], f"{base}/bias")


@register("ConvTranspose", 1)
def ConvTranspose(ctx: Context, node: onnx.NodeProto, auto_pad: str = "NOTSET",
                  dilations: list[int] | None = None, group: int = 1,
                  kernel_shape: list[int] | None = None, output_padding: list[int] | None = None,
                  output_shape: list[int] | None = None, pads: list[int] | None = None,
                  strides: list[int] | None = None) -> None:
    x, w = node.input[:2]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    xs, ws = ctx.shape(x), ctx.shape(w)
    n, cin = xs[:2]
    co = ws[1]  # the weight is [Cin, Cout / group, k...]
    kernel = list(ws[2:])
    nd = len(kernel)
    if cin != ws[0] or cin % group:
        raise Unsupported(f"{cin} input channels do not divide into {group} groups")
    cg = cin // group
    st = list(strides or [1] * nd)
    dil = list(dilations or [1] * nd)
    opad = list(output_padding or [0] * nd)
    full = [s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in
            zip(st, xs[2:], opad, kernel, dil)]
    if output_shape is not None:
        out = list(output_shape)[-nd:]
        total = [f - o for f, o in zip(full, out)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [i * s for i, s in zip(xs[2:], st)]
        total = [f - o for f, o in zip(full, out)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
    else:
        p = list(pads or [0] * 2 * nd) if auto_pad == "NOTSET" else [0] * 2 * nd
        begin = p[:nd]
        out = [f - b - e for f, b, e in zip(full, begin, p[nd:])]
    inferred = ctx.shapes.get(node.output[0])
    if inferred is not None and list(inferred[2:]) != out:
        raise Unsupported(f"output size {out} disagrees with shape inference's "
                          f"{list(inferred[2:])}")
    # per dimension: the tap each (phase r, offset t) pair reads, as a 0/1 table [t, r, kh]
    tables, m0s, qs = [], [], []
    for s, d, b, k, o in zip(st, dil, begin, kernel, out):
        taps = [((kh * d - b) % s, (((kh * d - b) % s) + b - kh * d) // s) for kh in range(k)]
        m0 = min(m for _, m in taps)
        t_count = max(m for _, m in taps) - m0 + 1
        table = np.zeros((t_count, s, k), np.float32)
        for kh, (r, m) in enumerate(taps):
            table[m - m0, r, kh] = 1.0
        tables.append(table)
        m0s.append(m0)
        qs.append(ceil_div(o, s))
    phased = _phased_weight(ctx, node, w, group, cg, co, kernel, tables)
    t_axes = [f"t{i}" for i in range(nd)]
    r_axes = [f"r{i}" for i in range(nd)]
    q_axes = [f"q{i}" for i in range(nd)]
    axes = [("n", n), ("g", group), ("co", co)]
    for i in range(nd):
        axes += [(q_axes[i], qs[i]), (r_axes[i], st[i])]
    axes += [("ci", cg)] + [(t_axes[i], tables[i].shape[0]) for i in range(nd)]
    xg = ctx.fresh(x)
    ctx.view(xg, x, (n, group, cg) + tuple(xs[2:]))
    x_dims: list[Dim] = ["n", "g", "ci"] + [Window(((q, 1), (t, 1)), m0)
                                           for q, t, m0 in zip(q_axes, t_axes, m0s)]
    w_dims: list[Dim] = ["g", "ci", "co"] + [a for i in range(nd) for a in (t_axes[i],
                                                                            r_axes[i])]
    out_dims = ["n", "g", "co"] + [a for i in range(nd) for a in (q_axes[i], r_axes[i])]
    base = node.name or node.output[0]
    phases = ctx.fresh(node.output[0])
    _emit(ctx, node, base, axes, phases, out_dims, [(xg, x_dims), (phased, w_dims)], "sum",
          ("mul", ("in", 0), ("in", 1)))
    whole = tuple(q * s for q, s in zip(qs, st))
    y = ctx.fresh(node.output[0])
    ctx.view(y, phases, (n, group * co) + whole)
    final = ctx.fresh(node.output[0]) if bias else node.output[0]
    if list(whole) != out:  # cut the last phase row to the output size
        rank = nd + 2
        names = [f"d{i}" for i in range(rank)]
        copy(ctx, node, final, [n, group * co] + out, [(y, tuple(names))], name=f"{base}/cut")
    else:
        ctx.view(final, y, (n, group * co) + whole)
    if bias:
        _add_channel_bias(ctx, node, final, bias, node.output[0], f"{base}/bias")


def _argmax(ctx: Context, node: onnx.NodeProto, base: str, axes: list[tuple[str, int]],
            windows: list[Dim], o_axes: list[str], inputs: list[tuple[str, list[Dim]]],
            storage_order: int) -> None:
    """MaxPool's Indices: the flat position in the input of the first element equal to the
    window's maximum, as ``-max over the window of (-position where x == max, else -inf)``
    with a constant table of positions read through the same windows."""
    xs = ctx.shape(node.input[0])
    order = np.arange(math.prod(xs), dtype=np.int64).reshape(
        xs if not storage_order else (*xs[:2], *reversed(xs[2:])))
    positions = order if not storage_order else np.swapaxes(order, 2, -1)
    pos = ctx.constant(f"{node.output[1]}/positions", positions)
    mx = node.output[0]
    found: Body = ("eq", ("in", 0), ("in", 2))
    if len(inputs) > 1:  # padded: a position outside the tensor is never the maximum
        found = ("and", found, ("in", 3))
    # positions are stored as integers: in fp16 storage a float above 2048 would be rounded
    neg = ctx.fresh(node.output[1])
    out_dims = ("n", "c", *o_axes)
    ctx.emit(node, f"{base}/indices", axes, Operand(neg, out_dims),
             [Operand(t, tuple(d)) for t, d in
              [inputs[0], (pos, ["n", "c", *windows]), (mx, list(out_dims)), *inputs[1:]]],
             "max", ("where", found, ("neg", ("in", 1)), ("const", float("-inf"))),
             out_dtype="int64")
    extents = [e for a, e in axes if a in out_dims]
    ctx.emit(node, f"{base}/indices/neg", list(zip(out_dims, extents)),
             Operand(node.output[1], out_dims), [Operand(neg, out_dims)], None,
             ("neg", ("in", 0)), out_dtype="int64")


def _phased_weight(ctx: Context, node: onnx.NodeProto, w: str, group: int, cg: int, co: int,
                   kernel: list[int], tables: list[np.ndarray]) -> str:
    """``w'[g, ci, co, t0, r0, t1, r1, ...] = sum_kh w[g, ci, co, kh...] * table_i[t_i, r_i,
    kh_i]``: evaluated at compile time for a constant weight, else one contraction on chip
    with the product of the tables (a constant)."""
    nd = len(kernel)
    letters = "abcdefghij"
    if ctx.is_const(w):
        weight = ctx.constants[w].astype(np.float32, copy=False)
        weight = weight.reshape((group, cg, co) + tuple(kernel))
        spec = "GIO" + letters[:nd]
        outs = "GIO"
        args = [weight]
        for i in range(nd):
            spec += f",{'tuvwxyz'[i]}{'RSTUVW'[i]}{letters[i]}"
            outs += f"{'tuvwxyz'[i]}{'RSTUVW'[i]}"
            args.append(tables[i])
        return ctx.constant(f"{w}/phased", np.einsum(f"{spec}->{outs}", *args))
    table = tables[0]  # the tables' product, [t0, r0, kh0, t1, r1, kh1, ...]
    for t in tables[1:]:
        table = np.multiply.outer(table, t)
    table_name = ctx.constant(f"{w}/phases", table)
    t_axes = [f"pt{i}" for i in range(nd)]
    r_axes = [f"pr{i}" for i in range(nd)]
    k_axes = [f"pk{i}" for i in range(nd)]
    wg = ctx.fresh(w)
    ctx.view(wg, w, (group, cg, co) + tuple(kernel))
    axes = [("g", group), ("ci", cg), ("co", co)]
    axes += [(a, n) for i in range(nd)
             for a, n in ((t_axes[i], tables[i].shape[0]), (r_axes[i], tables[i].shape[1]))]
    axes += list(zip(k_axes, kernel))
    phased = ctx.fresh(f"{w}/phased")
    _emit(ctx, node, f"{node.name or node.output[0]}/phases", axes, phased,
          ["g", "ci", "co", *[a for i in range(nd) for a in (t_axes[i], r_axes[i])]],
          [(wg, ["g", "ci", "co", *k_axes]),
           (table_name, [a for i in range(nd) for a in (t_axes[i], r_axes[i], k_axes[i])])],
          "sum", ("mul", ("in", 0), ("in", 1)))
    return phased


def _pool(ctx: Context, node: onnx.NodeProto, kind: str, kernel: list[int],
          strides: list[int] | None, dilations: list[int] | None, pads: list[int] | None,
          auto_pad: str, ceil_mode: int, count_include_pad: int = 0,
          storage_order: int = 0) -> None:
    x = node.input[0]
    xs = ctx.shape(x)
    st, dil, begin, end, out = _spatial(ctx, node, xs, kernel, strides, dilations, pads,
                                        auto_pad, ceil_mode)
    nd = len(kernel)
    o_axes = [f"o{i}" for i in range(nd)]
    k_axes = [f"k{i}" for i in range(nd)]
    axes = [("n", xs[0]), ("c", xs[1])] + list(zip(o_axes, out)) + list(zip(k_axes, kernel))
    windows: list[Dim] = [Window(((o, s), (k, d)), -b)
                          for o, k, s, d, b in zip(o_axes, k_axes, st, dil, begin)]
    # per dimension and output position: how many window positions are inside the tensor
    # (and inside the explicit padding, for count_include_pad)
    inside, padded = [], []
    for size, s, d, b, e, k, o in zip(xs[2:], st, dil, begin, end, kernel, out):
        pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d - b
        inside.append(((pos >= 0) & (pos < size)).sum(axis=1))
        padded.append(((pos >= -b) & (pos < size + e)).sum(axis=1))
    base = node.name or node.output[0]
    inputs: list[tuple[str, list[Dim]]] = [(x, ["n", "c", *windows])]
    if kind == "max":
        if all((c == k).all() for c, k in zip(inside, kernel)):
            body: Body = ("in", 0)
        else:  # padding must not win the maximum
            mask = ctx.constant(f"{node.output[0]}/inside", np.ones(xs[2:]))
            inputs.append((mask, list(windows)))
            body = ("where", ("in", 1), ("in", 0), ("const", float("-inf")))
        _emit(ctx, node, base, axes, node.output[0], ["n", "c", *o_axes], inputs, "max", body)
        if len(node.output) > 1 and node.output[1]:
            _argmax(ctx, node, base, axes, windows, o_axes, inputs, storage_order)
        return
    counts = padded if count_include_pad else inside
    total = counts[0].astype(np.float64)
    for c in counts[1:]:
        total = np.multiply.outer(total, c)
    if (total == total.reshape(-1)[0]).all():
        body = ("mul", ("in", 0), ("const", 1.0 / float(total.reshape(-1)[0])))
    else:
        count = ctx.constant(f"{node.output[0]}/count", total)
        inputs.append((count, list(o_axes)))
        body = ("div", ("in", 0), ("in", 1))
    _emit(ctx, node, base, axes, node.output[0], ["n", "c", *o_axes], inputs, "sum", body)


@register("MaxPool", 1)
def MaxPool(ctx: Context, node: onnx.NodeProto, kernel_shape: list[int] | None = None,
            auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations: list[int] | None = None,
            pads: list[int] | None = None, storage_order: int = 0,
            strides: list[int] | None = None) -> None:
    if storage_order and len(node.output) > 1 and node.output[1] and len(kernel_shape or []) != 2:
        raise Unsupported("MaxPool's Indices in column-major order (storage_order=1) of a "
                          "pooling that is not 2-D")
    _pool(ctx, node, "max", list(kernel_shape or []), strides, dilations, pads, auto_pad,
          ceil_mode, storage_order=storage_order)


@register("AveragePool", 1)
def AveragePool(ctx: Context, node: onnx.NodeProto, kernel_shape: list[int] | None = None,
                auto_pad: str = "NOTSET", ceil_mode: int = 0, count_include_pad: int = 0,
                dilations: list[int] | None = None, pads: list[int] | None = None,
                strides: list[int] | None = None) -> None:
    _pool(ctx, node, "avg", list(kernel_shape or []), strides, dilations, pads, auto_pad,
          ceil_mode, count_include_pad)


def _global_pool(ctx: Context, node: onnx.NodeProto, combine: str) -> None:
    x = node.input[0]
    xs = ctx.shape(x)
    count = math.prod(xs[2:])
    body: Body = ("mul", ("in", 0), ("const", 1.0 / count)) if combine == "sum" \
        else ("in", 0)
    reduce(ctx, node, x, list(range(2, len(xs))), True, combine, lambda v: body)


@register("GlobalAveragePool", 1)
def GlobalAveragePool(ctx: Context, node: onnx.NodeProto) -> None:
    _global_pool(ctx, node, "sum")


@register("GlobalMaxPool", 1)
def GlobalMaxPool(ctx: Context, node: onnx.NodeProto) -> None:
    _global_pool(ctx, node, "max")


# -- reductions -----------------------------------------------------------------------------

def reduce(ctx: Context, node: onnx.NodeProto, x: str, red: list[int], keepdims: bool,
           combine: str, body: object, out: str | None = None, name: str | None = None) -> None:
    """``out = combine over red of body(x)`` (``body`` maps the input leaf to the summand)."""
    shape = ctx.shape(x)
    axes = [f"d{i}" for i in range(len(shape))]
    kept = [a for i, a in enumerate(axes) if i not in red]
    out = out or node.output[0]
    full = tuple(1 if i in red else d for i, d in enumerate(shape))
    reduced = ctx.fresh(out) if keepdims and len(kept) != len(shape) else out
    ctx.emit(node, name or node.name or out, list(zip(axes, shape)),
             Operand(reduced, tuple(kept)), [Operand(ctx.float_operand(x), tuple(axes))],
             combine, body(("in", 0)))  # type: ignore[operator]
    if reduced != out:
        ctx.view(out, reduced, full)


def _reduce_axes(ctx: Context, node: onnx.NodeProto, rank: int, axes: list[int] | None,
                 noop_with_empty_axes: int) -> list[int] | None:
    """The reduced dimensions, or None for the identity (empty axes with the noop flag)."""
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.const(node.input[1], "the axes of a reduction").reshape(-1)]
    if not axes:
        return None if noop_with_empty_axes else list(range(rank))
    return sorted({a % rank for a in axes})


def _reduction(ctx: Context, node: onnx.NodeProto, combine: str, summand,
               post: str | None, axes: list[int] | None, keepdims: int,
               noop_with_empty_axes: int) -> None:
    """``post(combine over the axes of summand(x, count))`` (axes as an attribute before
    opset 13 or 18, as the second input after)."""
    x = node.input[0]
    shape = ctx.shape(x)
    red = _reduce_axes(ctx, node, len(shape), axes, noop_with_empty_axes)
    if red is None:
        ctx.view(node.output[0], x, shape)
        return
    count = math.prod(shape[i] for i in red)
    if post is None:
        reduce(ctx, node, x, red, bool(keepdims), combine, lambda v: summand(v, count))
        return
    tmp = ctx.fresh(node.output[0])
    reduce(ctx, node, x, red, bool(keepdims), combine, lambda v: summand(v, count), out=tmp)
    ctx.elementwise(node, [tmp], lambda v: (post, v),
                    name=f"{node.name or node.output[0]}/{post}")


@register("ReduceSum", 1)
def ReduceSum(ctx: Context, node: onnx.NodeProto, axes: list[int] | None = None,
              keepdims: int = 1, noop_with_empty_axes: int = 0) -> None:
    _reduction(ctx, node, "sum", lambda v, n: v, None, axes, keepdims, noop_with_empty_axes)


@register("ReduceMean", 1)
def ReduceMean(ctx: Context, node: onnx.NodeProto, axes: list[int] | None = None,
               keepdims: int = 1, noop_with_empty_axes: int = 0) -> None:
    _reduction(ctx, node, "sum", lambda v, n: ("mul", v, ("const", 1.0 / n)), None, axes,
               keepdims, noop_with_empty_axes)


@register("ReduceMax", 1)
def ReduceMax(ctx: Context, node: onnx.NodeProto, axes: list[int] | None = None,
              keepdims: int = 1, noop_with_empty_axes: int = 0) -> None:
    _reduction(ctx, node, "max", lambda v, n: v, None, axes, keepdims, noop_with_empty_axes)


@register("ReduceMin", 1)
def ReduceMin(ctx: Context, node: onnx.NodeProto, axes: list[int] | None = None,
              keepdims: int = 1, noop_with_empty_axes: int = 0) -> None:
    # min x = -max(-x)
    _reduction(ctx, node, "max", lambda v, n: ("neg", v), "neg", axes, keepdims,
               noop_with_empty_axes)


@register("ReduceSumSquare", 1)
def ReduceSumSquare(ctx: Context, node: onnx.NodeProto, axes: list[int] | None = None,
                    keepdims: int = 1, noop_with_empty_axes: int = 0) -> None:
    _reduction(ctx, node, "sum", lambda v, n: ("square", v), None, axes, keepdims,
               noop_with_empty_axes)


@register("ReduceL2", 1)
def ReduceL2(ctx: Context, node: onnx.NodeProto, axes: list[int] | None = None,
             keepdims: int = 1, noop_with_empty_axes: int = 0) -> None:
    _reduction(ctx, node, "sum", lambda v, n: ("square", v), "sqrt", axes, keepdims,
               noop_with_empty_axes)


# -- softmax --------------------------------------------------------------------------------

def softmax(ctx: Context, node: onnx.NodeProto, red: list[int], log: bool) -> None:
    x = node.input[0]
    shape = ctx.shape(x)
    axes = [f"d{i}" for i in range(len(shape))]
    full = list(zip(axes, shape))
    kept = tuple(a for i, a in enumerate(axes) if i not in red)
    base = node.name or node.output[0]
    mx, total = f"{base}/max", f"{base}/sum"
    xin = Operand(x, tuple(axes))
    ctx.emit(node, mx, full, Operand(mx, kept), [xin], "max", ("in", 0))
    # x - max, except on rows whose maximum is -inf: there every x counts as equal (a row
    # masked with float32's lowest value is all equal in float32, but its maximum is -inf
    # once stored in fp16), so that such a row comes out uniform in both
    shifted = ("where", ("eq", ("in", 1), ("const", float("-inf"))), ("const", 0.0),
               ("sub", ("in", 0), ("in", 1)))
    ctx.emit(node, total, full, Operand(total, kept), [xin, Operand(mx, kept)], "sum",
             ("exp", shifted))
    body = ("sub", shifted, ("log", ("in", 2))) if log else ("div", ("exp", shifted), ("in", 2))
    ctx.emit(node, base, full, Operand(node.output[0], tuple(axes)),
             [xin, Operand(mx, kept), Operand(total, kept)], None, body)


def _softmax_node(ctx: Context, node: onnx.NodeProto, axis: int, log: bool,
                  coerced: bool) -> None:
    rank = len(ctx.shape(node.input[0]))
    axis %= rank
    # before opset 13 the input is read as a 2-D matrix split at `axis`
    softmax(ctx, node, list(range(axis, rank)) if coerced else [axis], log)


@register("Softmax", 1)
def Softmax_1(ctx: Context, node: onnx.NodeProto, axis: int = 1) -> None:
    _softmax_node(ctx, node, axis, log=False, coerced=True)


@register("Softmax", 13)
def Softmax(ctx: Context, node: onnx.NodeProto, axis: int = -1) -> None:
    _softmax_node(ctx, node, axis, log=False, coerced=False)


@register("LogSoftmax", 1)
def LogSoftmax_1(ctx: Context, node: onnx.NodeProto, axis: int = 1) -> None:
    _softmax_node(ctx, node, axis, log=True, coerced=True)


@register("LogSoftmax", 13)
def LogSoftmax(ctx: Context, node: onnx.NodeProto, axis: int = -1) -> None:
    _softmax_node(ctx, node, axis, log=True, coerced=False)


# -- normalisation --------------------------------------------------------------------------

def normalize(ctx: Context, node: onnx.NodeProto, x: str, red: list[int], epsilon: float,
              affine: list[str]) -> None:
    """``(x - mean) / sqrt(var + eps) [* scale] [+ bias]`` over dimensions ``red``: a sum
    reduce, a sum reduce and one elementwise step (``affine`` tensors broadcast to ``x``)."""
    shape = ctx.shape(x)
    axes = [f"d{i}" for i in range(len(shape))]
    full = list(zip(axes, shape))
    kept = tuple(a for i, a in enumerate(axes) if i not in red)
    count = float(math.prod(shape[i] for i in red))
    base = node.name or node.output[0]
    mean, var = f"{base}/mean", f"{base}/var"
    xin = Operand(x, tuple(axes))
    ctx.emit(node, mean, full, Operand(mean, kept), [xin], "sum",
             ("mul", ("in", 0), ("const", 1.0 / count)))
    centred = ("sub", ("in", 0), ("in", 1))
    ctx.emit(node, var, full, Operand(var, kept), [xin, Operand(mean, kept)], "sum",
             ("mul", ("square", centred), ("const", 1.0 / count)))
    operands, leaves = ctx.broadcast_operands(affine, shape, axes)
    inputs = [xin, Operand(mean, kept), Operand(var, kept)]
    shift = len(inputs)
    leaves = [(leaf[0], leaf[1] + shift) if leaf[0] == "in" else leaf for leaf in leaves]
    body: Body = ("mul", centred, ("rsqrt", ("add", ("in", 2), ("const", float(epsilon)))))
    body = ("mul", body, leaves[0]) if leaves else body
    body = ("add", body, leaves[1]) if len(leaves) > 1 else body
    ctx.emit(node, base, full, Operand(node.output[0], tuple(axes)), inputs + operands, None,
             body)


@register("LayerNormalization", 17)
def LayerNormalization(ctx: Context, node: onnx.NodeProto, axis: int = -1,
                       epsilon: float = 1e-5, stash_type: int = 1) -> None:
    shape = ctx.shape(node.input[0])
    rank = len(shape)
    axis %= rank
    normalize(ctx, node, node.input[0], list(range(axis, rank)), epsilon,
              [n for n in node.input[1:3] if n])
    # the optional outputs are steps of the chain: the mean, and 1 / sqrt(var + eps), both
    # with the normalised dimensions kept as ones
    base = node.name or node.output[0]
    stats = tuple(shape[:axis]) + (1,) * (rank - axis)
    outs = list(node.output) + [""] * (3 - len(node.output))
    if outs[1]:
        ctx.view(outs[1], f"{base}/mean", stats)
    if outs[2]:
        var = ctx.fresh(outs[2])
        ctx.view(var, f"{base}/var", stats)
        ctx.elementwise(node, [var], lambda v: ("rsqrt", ("add", v, ("const", float(epsilon)))),
                        out=outs[2], name=f"{base}/inv_std_dev")


def _per_channel(ctx: Context, name: str, rank: int) -> str:
    """A [C] tensor viewed as [C, 1, ...] to broadcast along dimension 1 of a rank-``rank``
    tensor."""
    shaped = ctx.fresh(name)
    ctx.view(shaped, name, (ctx.shape(name)[0],) + (1,) * (rank - 2))
    return shaped


@register("InstanceNormalization", 6)
def InstanceNormalization(ctx: Context, node: onnx.NodeProto, epsilon: float = 1e-5) -> None:
    x, scale, bias = node.input
    rank = len(ctx.shape(x))
    normalize(ctx, node, x, list(range(2, rank)), epsilon,
              [_per_channel(ctx, scale, rank), _per_channel(ctx, bias, rank)])


@register("BatchNormalization", 6)
def BatchNormalization(ctx: Context, node: onnx.NodeProto, epsilon: float = 1e-5,
                       momentum: float = 0.9, spatial: int = 1, is_test: int = 0,
                       training_mode: int = 0,
                       consumed_inputs: list[int] | None = None) -> None:
    """Inference: ``x * s + t`` per channel with constant ``s = scale / sqrt(var + eps)`` and
    ``t = bias - mean * s`` (after a Conv it was folded into the Conv's weights instead)."""
    if training_mode or any(node.output[1:]):
        raise Unsupported("BatchNormalization in training mode (running statistics outputs)")
    if not spatial:
        raise Unsupported("spatial=0 (per-element statistics)")
    x, scale, bias, mean, var = node.input
    rank = len(ctx.shape(x))
    if not all(ctx.is_const(n) for n in (scale, bias, mean, var)):
        # computed statistics: the same formula, evaluated on chip
        params = [_per_channel(ctx, n, rank) for n in (scale, bias, mean, var)]
        ctx.elementwise(node, [x, *params], lambda a, s, b, m, v: (
            "add", ("mul", ("mul", ("sub", a, m), s),
                    ("rsqrt", ("add", v, ("const", float(epsilon))))), b))
        return
    values = [ctx.const(n, "BatchNormalization's scale, bias, mean and variance")
              .astype(np.float64) for n in (scale, bias, mean, var)]
    s = values[0] / np.sqrt(values[3] + epsilon)
    t = values[1] - values[2] * s
    shape = (len(s),) + (1,) * (rank - 2)
    s_name = ctx.constant(f"{scale}/bn_scale", s.reshape(shape))
    t_name = ctx.constant(f"{bias}/bn_shift", t.reshape(shape))
    ctx.elementwise(node, [x, s_name, t_name], lambda a, b, c: ("add", ("mul", a, b), c))


@register("LRN", 1)
def LRN(ctx: Context, node: onnx.NodeProto, size: int = 0, alpha: float = 0.0001,
        beta: float = 0.75, bias: float = 1.0) -> None:
    """``y = x / (bias + alpha / size * sum of x^2 over the size channels around c)^beta``:
    a sum of squares read through a window along the channels (reads outside the tensor are
    zero, as the spec's sum leaves them out), then one elementwise step."""
    if size < 1:
        raise Unsupported(f"size={size} (the attribute is required and positive)")
    x = node.input[0]
    xs = ctx.shape(x)
    lo = (size - 1) // 2
    rest = [f"s{i}" for i in range(len(xs) - 2)]
    axes = [("n", xs[0]), ("c", xs[1])] + list(zip(rest, xs[2:])) + [("k", size)]
    base = node.name or node.output[0]
    sums = ctx.fresh(node.output[0])
    _emit(ctx, node, f"{base}/sum", axes, sums, ["n", "c", *rest],
          [(x, ["n", Window((("c", 1), ("k", 1)), -lo), *rest])], "sum",
          ("square", ("in", 0)))
    ctx.elementwise(node, [x, sums], lambda v, s: ("div", v, (
        "pow", ("add", ("const", float(bias)), ("mul", s, ("const", alpha / size))),
        ("const", float(beta)))), name=base)
