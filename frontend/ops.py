"""ONNX op lowerings: one function per op, registered by (op_type, since_version).

Each takes the context, the node and the node's attributes as keyword arguments with the ONNX
defaults, and emits tensor expressions and views. Semantics follow the ONNX operator docs.
"""

from __future__ import annotations

import numpy as np
import onnx

from t10c.ir import INDIRECT, Operand

from .context import Context, Unsupported, register


def _axes(rank: int, prefix: str = "d") -> list[str]:
    return [f"{prefix}{i}" for i in range(rank)]


def _broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise Unsupported(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None


def _elementwise(ctx: Context, node: onnx.NodeProto, fn: str) -> None:
    names = list(node.input)
    out_shape = _broadcast_shape(*(ctx.shape(n) for n in names))
    axes = _axes(len(out_shape))
    operands, leaves = ctx.broadcast_operands(names, out_shape, axes)
    if not operands:
        raise Unsupported("all inputs are constant (should have been folded)")
    body = (fn, *leaves)
    ctx.emit(node, node.name or node.output[0], list(zip(axes, out_shape)),
             Operand(node.output[0], tuple(axes)), operands, None, body)


def _binary(fn: str):
    def lower(ctx: Context, node: onnx.NodeProto) -> None:
        _elementwise(ctx, node, fn)
    return lower


def _unary(fn: str):
    def lower(ctx: Context, node: onnx.NodeProto) -> None:
        _elementwise(ctx, node, fn)
    return lower


for _op, _fn in (("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "div"),
                 ("Pow", "pow")):
    register(_op, 7)(_binary(_fn))
for _op, _fn in (("Relu", "relu"), ("Erf", "erf"), ("Tanh", "tanh"), ("Sigmoid", "sigmoid"),
                 ("Exp", "exp"), ("Log", "log"), ("Sqrt", "sqrt"), ("Neg", "neg"),
                 ("Abs", "abs"), ("Reciprocal", "recip")):
    register(_op, 6)(_unary(_fn))


@register("MatMul", 9)
def MatMul(ctx: Context, node: onnx.NodeProto) -> None:
    a, b = node.input
    sa, sb = ctx.shape(a), ctx.shape(b)
    if len(sa) < 2 or len(sb) < 2:
        raise Unsupported("MatMul with a 1-D operand is not supported yet")
    if sa[-1] != sb[-2]:
        raise Unsupported(f"MatMul shapes {sa} and {sb} do not agree")
    batch = _broadcast_shape(sa[:-2], sb[:-2])
    baxes = _axes(len(batch), "b")
    axes = list(zip(baxes, batch)) + [("m", sa[-2]), ("k", sa[-1]), ("n", sb[-1])]

    def operand(name: str, shape: tuple[int, ...], last: tuple[str, str]) -> Operand:
        lead = len(batch) - (len(shape) - 2)
        keep = [d for d in range(len(shape) - 2)
                if not (shape[d] == 1 and batch[lead + d] > 1)]
        tensor = name
        if len(keep) != len(shape) - 2:
            tensor = ctx.fresh(name)
            ctx.view(tensor, name, tuple(shape[d] for d in keep) + shape[-2:])
        return Operand(tensor, tuple(baxes[lead + d] for d in keep) + last)

    ctx.emit(node, node.name or node.output[0], axes,
             Operand(node.output[0], (*baxes, "m", "n")),
             [operand(a, sa, ("m", "k")), operand(b, sb, ("k", "n"))], "sum",
             ("mul", ("in", 0), ("in", 1)))


@register("Gather", 1)
def Gather(ctx: Context, node: onnx.NodeProto, axis: int = 0) -> None:
    data, indices = node.input
    if not ctx.is_const(data):
        raise Unsupported("Gather from a computed tensor is not supported yet (only lookups in "
                          "a constant table)")
    shape = ctx.shape(data)
    axis = axis % len(shape)
    if axis != 0:
        raise Unsupported(f"Gather along axis {axis} is not supported yet (only axis 0)")
    ishape = ctx.shape(indices)
    out_shape = tuple(ishape) + tuple(shape[1:])
    axes = _axes(len(out_shape))
    ni = len(ishape)
    table = ctx.constants[data].astype(np.float32)
    ctx.constants[data] = table
    ctx.emit(node, node.name or node.output[0], list(zip(axes, out_shape)),
             Operand(node.output[0], tuple(axes)),
             [Operand(data, (INDIRECT, *axes[ni:])), Operand(indices, tuple(axes[:ni]))],
             None, ("take", 0, 1))


@register("Reshape", 5)
def Reshape(ctx: Context, node: onnx.NodeProto, allowzero: int = 0) -> None:
    data, shape_name = node.input
    target = [int(x) for x in ctx.const(shape_name, "the target shape of Reshape")]
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


@register("Transpose", 1)
def Transpose(ctx: Context, node: onnx.NodeProto, perm: list[int] | None = None) -> None:
    src = ctx.shape(node.input[0])
    p = tuple(perm) if perm is not None else tuple(reversed(range(len(src))))
    ctx.view(node.output[0], node.input[0], tuple(src[i] for i in p), p)


@register("Identity", 1)
def Identity(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.view(node.output[0], node.input[0], ctx.shape(node.input[0]))


@register("Dropout", 12)
def Dropout(ctx: Context, node: onnx.NodeProto, seed: int = 0) -> None:
    if len(node.output) > 1 and node.output[1]:
        raise Unsupported("Dropout's mask output is not supported (inference only)")
    ctx.view(node.output[0], node.input[0], ctx.shape(node.input[0]))


@register("Softmax", 13)
def Softmax(ctx: Context, node: onnx.NodeProto, axis: int = -1) -> None:
    x = node.input[0]
    shape = ctx.shape(x)
    axis %= len(shape)
    axes = _axes(len(shape))
    full = list(zip(axes, shape))
    kept = tuple(a for i, a in enumerate(axes) if i != axis)
    base = node.name or node.output[0]
    mx, total = f"{base}/max", f"{base}/sum"
    xin = Operand(x, tuple(axes))
    ctx.emit(node, mx, full, Operand(mx, kept), [xin], "max", ("in", 0))
    shifted = ("exp", ("sub", ("in", 0), ("in", 1)))
    ctx.emit(node, total, full, Operand(total, kept), [xin, Operand(mx, kept)], "sum", shifted)
    ctx.emit(node, base, full, Operand(node.output[0], tuple(axes)),
             [xin, Operand(mx, kept), Operand(total, kept)], None, ("div", shifted, ("in", 2)))


@register("LayerNormalization", 17)
def LayerNormalization(ctx: Context, node: onnx.NodeProto, axis: int = -1,
                       epsilon: float = 1e-5, stash_type: int = 1) -> None:
    if len(node.output) > 1 and any(node.output[1:]):
        raise Unsupported("LayerNormalization's Mean and InvStdDev outputs are not supported")
    x = node.input[0]
    shape = ctx.shape(x)
    axis %= len(shape)
    axes = _axes(len(shape))
    full = list(zip(axes, shape))
    kept = tuple(axes[:axis])
    count = float(np.prod(shape[axis:]))
    base = node.name or node.output[0]
    mean, var = f"{base}/mean", f"{base}/var"
    xin = Operand(x, tuple(axes))
    ctx.emit(node, mean, full, Operand(mean, kept), [xin], "sum",
             ("mul", ("in", 0), ("const", 1.0 / count)))
    centred = ("sub", ("in", 0), ("in", 1))
    ctx.emit(node, var, full, Operand(var, kept), [xin, Operand(mean, kept)], "sum",
             ("mul", ("square", centred), ("const", 1.0 / count)))
    extra = list(node.input[1:3])
    extra = [n for n in extra if n]
    operands, leaves = ctx.broadcast_operands(extra, shape, axes)
    inputs = [xin, Operand(mean, kept), Operand(var, kept)]
    shift = len(inputs)
    leaves = [(leaf[0], leaf[1] + shift) if leaf[0] == "in" else leaf for leaf in leaves]
    body = ("mul", centred, ("rsqrt", ("add", ("in", 2), ("const", float(epsilon)))))
    body = ("mul", body, leaves[0]) if leaves else body
    body = ("add", body, leaves[1]) if len(leaves) > 1 else body
    ctx.emit(node, base, full, Operand(node.output[0], tuple(axes)), inputs + operands, None,
             body)
