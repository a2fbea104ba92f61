"""ONNX op lowerings, elementwise and contraction ops: one function per op, registered by
(op_type, since_version).

Each takes the context, the node and the node's attributes as keyword arguments with the ONNX
defaults, and emits tensor expressions and views. Semantics follow the ONNX operator docs. The
other lowerings live in `layout` (views and copies), `nn` (convolution, pooling, normalisation,
reductions) and `shapes` (what is decided at compile time); importing this module registers
them all.

Booleans are 0.0/1.0 floats on chip: comparisons produce them, and ``where``, ``and`` and
``not`` read any nonzero value as true.
"""

from __future__ import annotations

import math
import string

import numpy as np
import onnx

from t10c.ir import Body, Operand

from .context import Context, Unsupported, broadcast_shape, register


def _axes(rank: int, prefix: str = "d") -> list[str]:
    return [f"{prefix}{i}" for i in range(rank)]


def _const(x: float) -> Body:
    return ("const", float(x))


# -- arithmetic -----------------------------------------------------------------------------

def _binary(ctx: Context, node: onnx.NodeProto, fn: str) -> None:
    """``fn(A, B)`` with numpy broadcasting."""
    ctx.elementwise(node, list(node.input), lambda a, b: (fn, a, b))


def _legacy_binary(ctx: Context, node: onnx.NodeProto, fn: str, broadcast: int,
                   axis: int | None) -> None:
    """Opset 1-6 arithmetic: no numpy broadcasting, but ``broadcast=1`` aligns B with A at
    ``axis`` (by default at A's trailing dimensions)."""
    a, b = node.input
    sa, sb = ctx.shape(a), ctx.shape(b)
    if broadcast and len(sb) < len(sa) and sb:
        start = len(sa) - len(sb) if axis is None else axis % len(sa)
        trailing = len(sa) - start - len(sb)
        if trailing:
            shaped = ctx.fresh(b)
            ctx.view(shaped, b, tuple(sb) + (1,) * trailing)
            b = shaped
    elif not broadcast and sa != sb and math.prod(sb) != 1:
        raise Unsupported(f"shapes {sa} and {sb} differ and broadcast=0")
    ctx.elementwise(node, [a, b], lambda x, y: (fn, x, y))


def _unary(ctx: Context, node: onnx.NodeProto, fn: str) -> None:
    ctx.elementwise(node, [node.input[0]], lambda x: (fn, x))


@register("Add", 1)
def Add_1(ctx: Context, node: onnx.NodeProto, broadcast: int = 0, axis: int | None = None,
          consumed_inputs: list[int] | None = None) -> None:
    _legacy_binary(ctx, node, "add", broadcast, axis)


@register("Add", 7)
def Add(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "add")


@register("Sub", 1)
def Sub_1(ctx: Context, node: onnx.NodeProto, broadcast: int = 0, axis: int | None = None,
          consumed_inputs: list[int] | None = None) -> None:
    _legacy_binary(ctx, node, "sub", broadcast, axis)


@register("Sub", 7)
def Sub(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "sub")


@register("Mul", 1)
def Mul_1(ctx: Context, node: onnx.NodeProto, broadcast: int = 0, axis: int | None = None,
          consumed_inputs: list[int] | None = None) -> None:
    _legacy_binary(ctx, node, "mul", broadcast, axis)


@register("Mul", 7)
def Mul(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "mul")


@register("Div", 1)
def Div_1(ctx: Context, node: onnx.NodeProto, broadcast: int = 0, axis: int | None = None,
          consumed_inputs: list[int] | None = None) -> None:
    _legacy_binary(ctx, node, "div", broadcast, axis)


@register("Div", 7)
def Div(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "div")


@register("Pow", 1)
def Pow_1(ctx: Context, node: onnx.NodeProto, broadcast: int = 0,
          axis: int | None = None) -> None:
    if broadcast:
        _legacy_binary(ctx, node, "pow", broadcast, axis)
    else:
        Pow(ctx, node)


@register("Pow", 7)
def Pow(ctx: Context, node: onnx.NodeProto) -> None:
    base, exponent = node.input
    if ctx.is_const(exponent) and ctx.constants[exponent].size == 1:
        e = float(ctx.constants[exponent].reshape(-1)[0])
        simple = {1.0: lambda x: x, 2.0: lambda x: ("square", x), 0.5: lambda x: ("sqrt", x),
                  3.0: lambda x: ("mul", x, ("square", x)), -1.0: lambda x: ("recip", x)}
        if e in simple:  # the common exponents as cheaper functions
            ctx.elementwise(node, [base], simple[e])
            return
    ctx.elementwise(node, [base, exponent], lambda a, b: ("pow", a, b))
@register("Relu", 6)
def Relu(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "relu")


@register("Erf", 6)
def Erf(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "erf")


@register("Tanh", 6)
def Tanh(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "tanh")


@register("Sigmoid", 6)
def Sigmoid(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "sigmoid")


@register("Exp", 6)
def Exp(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "exp")


@register("Log", 6)
def Log(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "log")


@register("Sqrt", 6)
def Sqrt(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "sqrt")


@register("Neg", 6)
def Neg(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "neg")


@register("Abs", 6)
def Abs(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "abs")


@register("Reciprocal", 6)
def Reciprocal(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "recip")


@register("Sin", 7)
def Sin(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "sin")


@register("Cos", 7)
def Cos(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "cos")


def _variadic(ctx: Context, node: onnx.NodeProto, fn: str, mean: bool = False) -> None:
    """Max, Min, Sum, Mean: a left fold of the binary function over every input (numpy
    broadcasting, which opset 8 added and `Context.elementwise` always does, so one lowering
    serves opsets 6 and 8)."""
    names = [n for n in node.input if n]

    def body(*leaves: Body) -> Body:
        acc = leaves[0]
        for leaf in leaves[1:]:
            acc = (fn, acc, leaf)
        return ("mul", acc, _const(1.0 / len(leaves))) if mean else acc

    if len(names) == 1:
        ctx.view(node.output[0], names[0], ctx.shape(names[0]))
        return
    ctx.elementwise(node, names, body)


@register("Max", 6)
def Max(ctx: Context, node: onnx.NodeProto) -> None:
    _variadic(ctx, node, "max")


@register("Min", 6)
def Min(ctx: Context, node: onnx.NodeProto) -> None:
    _variadic(ctx, node, "min")


@register("Sum", 6)
def Sum(ctx: Context, node: onnx.NodeProto) -> None:
    _variadic(ctx, node, "add")


@register("Mean", 6)
def Mean(ctx: Context, node: onnx.NodeProto) -> None:
    _variadic(ctx, node, "add", mean=True)


# -- activations ----------------------------------------------------------------------------

@register("LeakyRelu", 6)
def LeakyRelu(ctx: Context, node: onnx.NodeProto, alpha: float = 0.01) -> None:
    ctx.elementwise(node, [node.input[0]],
                    lambda x: ("where", ("lt", x, _const(0)), ("mul", x, _const(alpha)), x))


@register("PRelu", 6)
def PRelu(ctx: Context, node: onnx.NodeProto) -> None:
    x, slope = node.input
    sx, ss = ctx.shape(x), ctx.shape(slope)
    if ctx.opset < 7 and len(ss) == 1 and len(sx) >= 2 and ss[0] == sx[1] and ss[0] != sx[-1]:
        # opset 6: a 1-D slope holds one value per channel (dimension 1)
        shaped = ctx.fresh(slope)
        ctx.view(shaped, slope, (ss[0],) + (1,) * (len(sx) - 2))
        slope = shaped
    ctx.elementwise(node, [x, slope],
                    lambda a, s: ("where", ("lt", a, _const(0)), ("mul", a, s), a))


@register("Elu", 6)
def Elu(ctx: Context, node: onnx.NodeProto, alpha: float = 1.0) -> None:
    ctx.elementwise(node, [node.input[0]], lambda x: (
        "where", ("lt", x, _const(0)), ("mul", _const(alpha), ("sub", ("exp", x), _const(1))),
        x))


@register("Selu", 6)
def Selu(ctx: Context, node: onnx.NodeProto, alpha: float = 1.67326319217681884765625,
         gamma: float = 1.05070102214813232421875) -> None:
    ctx.elementwise(node, [node.input[0]], lambda x: ("mul", _const(gamma), (
        "where", ("le", x, _const(0)), ("sub", ("mul", _const(alpha), ("exp", x)),
                                        _const(alpha)), x)))


@register("Softplus", 1)
def Softplus(ctx: Context, node: onnx.NodeProto) -> None:
    # log(1 + exp(x)) = relu(x) + log(1 + exp(-|x|)): no overflow for large x
    ctx.elementwise(node, [node.input[0]], lambda x: (
        "add", ("relu", x), ("log", ("add", _const(1), ("exp", ("neg", ("abs", x)))))))


@register("Softsign", 1)
def Softsign(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.elementwise(node, [node.input[0]],
                    lambda x: ("div", x, ("add", _const(1), ("abs", x))))


def _hard_sigmoid(x: Body, alpha: float, beta: float) -> Body:
    return ("max", _const(0), ("min", _const(1), ("add", ("mul", _const(alpha), x),
                                                   _const(beta))))


@register("HardSigmoid", 6)
def HardSigmoid(ctx: Context, node: onnx.NodeProto, alpha: float = 0.2,
                beta: float = 0.5) -> None:
    ctx.elementwise(node, [node.input[0]], lambda x: _hard_sigmoid(x, alpha, beta))


@register("HardSwish", 14)
def HardSwish(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.elementwise(node, [node.input[0]], lambda x: ("mul", x, _hard_sigmoid(x, 1 / 6, 0.5)))


def gelu_body(x: Body, approximate: str = "none") -> Body:
    """GELU as the exporters' decomposition computes it (erf, or the tanh approximation)."""
    if approximate == "tanh":
        inner = ("mul", _const(math.sqrt(2 / math.pi)),
                 ("add", x, ("mul", _const(0.044715), ("mul", x, ("mul", x, x)))))
        return ("mul", ("mul", _const(0.5), x), ("add", _const(1), ("tanh", inner)))
    return ("mul", ("mul", _const(0.5), x),
            ("add", _const(1), ("erf", ("mul", x, _const(1 / math.sqrt(2))))))


@register("Gelu", 20)
def Gelu(ctx: Context, node: onnx.NodeProto, approximate: str = "none") -> None:
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"approximate={approximate!r}")
    ctx.elementwise(node, [node.input[0]], lambda x: gelu_body(x, approximate))


@register("Clip", 6)
def Clip_6(ctx: Context, node: onnx.NodeProto, min: float = -3.4028234663852886e38,
           max: float = 3.4028234663852886e38) -> None:
    ctx.elementwise(node, [node.input[0]],
                    lambda x: ("min", ("max", x, _const(min)), _const(max)))


@register("Clip", 11)
def Clip(ctx: Context, node: onnx.NodeProto) -> None:
    names = list(node.input) + [""] * (3 - len(node.input))
    present = [n for n in names if n]

    def body(*leaves: Body) -> Body:
        it = iter(leaves)
        x = next(it)
        if names[1]:
            x = ("max", x, next(it))
        if names[2]:
            x = ("min", x, next(it))
        return x

    if len(present) == 1:
        ctx.view(node.output[0], names[0], ctx.shape(names[0]))
        return
    ctx.elementwise(node, present, body)


# -- comparisons and logic: 0/1 floats ------------------------------------------------------

@register("Equal", 7)
def Equal(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "eq")


@register("Less", 7)
def Less(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "lt")


@register("Greater", 7)
def Greater(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "gt")


@register("LessOrEqual", 12)
def LessOrEqual(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "le")


@register("GreaterOrEqual", 12)
def GreaterOrEqual(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "ge")


@register("And", 7)
def And(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "and")


@register("Or", 7)
def Or(ctx: Context, node: onnx.NodeProto) -> None:
    _binary(ctx, node, "or")


@register("Not", 1)
def Not(ctx: Context, node: onnx.NodeProto) -> None:
    _unary(ctx, node, "not")


@register("IsNaN", 9)
def IsNaN(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.elementwise(node, [node.input[0]], lambda x: ("not", ("eq", x, x)))  # NaN != NaN


@register("IsInf", 10)
def IsInf(ctx: Context, node: onnx.NodeProto, detect_negative: int = 1,
          detect_positive: int = 1) -> None:
    def body(x: Body) -> Body:
        tests = ([("eq", x, _const(math.inf))] if detect_positive else []) + \
                ([("eq", x, _const(-math.inf))] if detect_negative else [])
        if not tests:
            return ("mul", x, _const(0))
        return tests[0] if len(tests) == 1 else ("or", tests[0], tests[1])

    ctx.elementwise(node, [node.input[0]], body)


@register("Where", 9)
def Where(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.elementwise(node, list(node.input), lambda c, a, b: ("where", c, a, b))


FLOAT_TYPES = {"float32", "float64", "float16", "bfloat16"}
INT_TYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


def _round_bits(x: Body, bits: int) -> Body:
    """``x`` rounded to the nearest float with ``bits`` significant bits, in float32
    arithmetic (Veltkamp's split: ``c = x * (2^(24 - bits) + 1)``, then ``c - (c - x)``)."""
    c = ("mul", x, _const(2.0 ** (24 - bits) + 1))
    return ("sub", c, ("sub", c, x))


def _to_float16(x: Body) -> Body:
    """``x`` rounded to float16: 11 significant bits; below 2^-14 multiples of 2^-24 (the
    subnormals: adding and removing 0.75 leaves that spacing); from 65520 up, infinity."""
    sub = ("sub", ("add", x, _const(0.75)), _const(0.75))
    finite = ("where", ("lt", ("abs", x), _const(2.0 ** -14)), sub, _round_bits(x, 11))
    return ("where", ("ge", ("abs", x), _const(65520.0)), ("mul", x, _const(math.inf)), finite)


def _to_bfloat16(x: Body) -> Body:
    """``x`` rounded to bfloat16: 8 significant bits (float32's exponent range; the split's
    product would overflow above 2^100, so large values are split scaled down by 2^-64)."""
    big = ("mul", _round_bits(("mul", x, _const(2.0 ** -64)), 8), _const(2.0 ** 64))
    return ("where", ("gt", ("abs", x), _const(2.0 ** 100)), big, _round_bits(x, 8))


#: the float types narrower than float32: a cast to one rounds the value to it
NARROW_FLOATS = {"float16": _to_float16, "bfloat16": _to_bfloat16}


@register("Cast", 6)
def Cast(ctx: Context, node: onnx.NodeProto, to: int = 1, saturate: int = 1,
         round_mode: str = "up") -> None:
    """Every computed tensor is float32 on chip; a cast changes values only when it rounds a
    float to float16 or bfloat16 (to nearest) or to an integer (towards zero), or maps a
    number to bool (nonzero is true)."""
    x = node.input[0]
    src = ctx.onnx_dtype(x)
    dst = onnx.helper.tensor_dtype_to_np_dtype(to).name
    if dst in NARROW_FLOATS and src in {"float32", "float64"} | INT_TYPES:
        ctx.elementwise(node, [x], lambda v: NARROW_FLOATS[dst](v))
    elif dst in FLOAT_TYPES and src in FLOAT_TYPES | {"bool"}:
        ctx.view(node.output[0], x, ctx.shape(x))
    elif dst in FLOAT_TYPES and src in INT_TYPES:
        ctx.elementwise(node, [x], lambda v: v)  # an integer input becomes a float activation
    elif dst == "bool":
        ctx.elementwise(node, [x], lambda v: ("not", ("not", v)))
    elif dst in INT_TYPES and src in INT_TYPES | {"bool"}:
        ctx.view(node.output[0], x, ctx.shape(x))  # already integral values
    elif dst in INT_TYPES and src in FLOAT_TYPES:
        ctx.elementwise(node, [x], lambda v: (  # truncation towards zero
            "where", ("lt", v, _const(0)), ("neg", ("floor", ("neg", v))), ("floor", v)))
    else:
        raise Unsupported(f"Cast from {src} to {dst} on chip (tensors there are float32; "
                          "integer tensors only as model inputs indexing a Gather)")


# -- contractions ---------------------------------------------------------------------------

def matmul(ctx: Context, node: onnx.NodeProto, a: str, b: str, out: str, name: str) -> None:
    """``out = a @ b`` with numpy's batch broadcasting (both at least 2-D)."""
    sa, sb = ctx.shape(a), ctx.shape(b)
    if sa[-1] != sb[-2]:
        raise Unsupported(f"MatMul shapes {sa} and {sb} do not agree")
    batch = broadcast_shape(sa[:-2], sb[:-2])
    baxes = _axes(len(batch), "b")
    axes = list(zip(baxes, batch)) + [("m", sa[-2]), ("k", sa[-1]), ("n", sb[-1])]

    def operand(name: str, shape: tuple[int, ...], last: tuple[str, str]) -> Operand:
        lead = len(batch) - (len(shape) - 2)
        keep = [d for d in range(len(shape) - 2)
                if not (shape[d] == 1 and batch[lead + d] > 1)]
        tensor = ctx.matmul_operand(name)
        if len(keep) != len(shape) - 2:
            squeezed = ctx.fresh(name)
            ctx.view(squeezed, tensor, tuple(shape[d] for d in keep) + shape[-2:])
            tensor = squeezed
        return Operand(tensor, tuple(baxes[lead + d] for d in keep) + last)

    ctx.emit(node, name, axes, Operand(out, (*baxes, "m", "n")),
             [operand(a, sa, ("m", "k")), operand(b, sb, ("k", "n"))], "sum",
             ("mul", ("in", 0), ("in", 1)))


@register("MatMul", 1)
def MatMul(ctx: Context, node: onnx.NodeProto) -> None:
    a, b = node.input
    sa, sb = ctx.shape(a), ctx.shape(b)
    out = node.output[0]
    base = node.name or out
    if len(sa) >= 2 and len(sb) >= 2:
        matmul(ctx, node, a, b, out, base)
        return
    # numpy's 1-D rules: a vector a is a row [1, K], a vector b a column [K, 1], and the
    # added dimension is dropped from the result
    if len(sa) == 1:
        a2 = ctx.fresh(a)
        ctx.view(a2, a, (1, sa[0]))
        a = a2
    if len(sb) == 1:
        b2 = ctx.fresh(b)
        ctx.view(b2, b, (sb[0], 1))
        b = b2
    full = ctx.fresh(out)
    matmul(ctx, node, a, b, full, base)
    shape = ctx.shape(full)
    drop = ([len(shape) - 2] if len(sa) == 1 else []) + ([len(shape) - 1] if len(sb) == 1 else [])
    ctx.view(out, full, tuple(d for i, d in enumerate(shape) if i not in drop))


@register("Gemm", 6)
def Gemm(ctx: Context, node: onnx.NodeProto, alpha: float = 1.0, beta: float = 1.0,
         transA: int = 0, transB: int = 0, broadcast: int = 0) -> None:
    a, b = node.input[:2]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    base = node.name or node.output[0]
    if transA:
        at = ctx.fresh(a)
        ctx.view(at, a, tuple(reversed(ctx.shape(a))), (1, 0))
        a = at
    if transB:
        bt = ctx.fresh(b)
        ctx.view(bt, b, tuple(reversed(ctx.shape(b))), (1, 0))
        b = bt
    if alpha != 1.0 and ctx.is_const(b):  # fold alpha into a constant B
        b = ctx.constant(b, ctx.constants[b].astype(np.float32, copy=False) * np.float32(alpha))
        alpha = 1.0
    if c is None and alpha == 1.0:
        matmul(ctx, node, a, b, node.output[0], base)
        return
    product = ctx.fresh(node.output[0])
    matmul(ctx, node, a, b, product, base)
    names = [product] + ([c] if c is not None else [])

    def body(y: Body, *bias: Body) -> Body:
        y = ("mul", y, _const(alpha)) if alpha != 1.0 else y
        if bias:
            y = ("add", y, ("mul", bias[0], _const(beta)) if beta != 1.0 else bias[0])
        return y

    ctx.elementwise(node, names, body, name=f"{base}/bias")


def _parse_einsum(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Unsupported(f"equation {equation!r} has {len(terms)} operands, node has "
                          f"{len(ranks)}")
    if "." in eq:
        # spell the ellipsis out with letters the equation does not use
        free = [c for c in string.ascii_letters if c not in eq]
        width = max(r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t)
        dots = "".join(free[:width])
        terms = [t.replace("...", dots[width - (r - (len(t) - 3)):]) for t, r in
                 zip(terms, ranks)]
        if "->" in eq:
            rhs = rhs.replace("...", dots)
        else:
            rhs = dots + "".join(sorted(c for c in set("".join(terms)) if c not in dots and
                                        "".join(terms).count(c) == 1))
    elif "->" not in eq:
        joined = "".join(terms)
        rhs = "".join(sorted(c for c in set(joined) if joined.count(c) == 1))
    return terms, rhs


@register("Einsum", 12)
def Einsum(ctx: Context, node: onnx.NodeProto, equation: str = "") -> None:
    names = list(node.input)
    shapes = [ctx.shape(n) for n in names]
    terms, rhs = _parse_einsum(equation, [len(s) for s in shapes])
    extents: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        if len(term) != len(shape):
            raise Unsupported(f"equation term {term!r} does not match the rank of {shape}")
        if len(set(term)) != len(term):
            raise Unsupported(f"a repeated index within one operand ({term!r}: a diagonal)")
        for letter, extent in zip(term, shape):
            if extents.get(letter, 1) not in (1, extent) and extent != 1:
                raise Unsupported(f"index {letter!r} has extents {extents[letter]} and {extent}")
            extents[letter] = max(extent, extents.get(letter, 1))
    operands = []
    for name, term, shape in zip(names, terms, shapes):
        keep = [c for c, e in zip(term, shape) if e == extents[c]]  # drop broadcast dims
        tensor = ctx.float_operand(name)
        if len(keep) != len(term):
            squeezed = ctx.fresh(name)
            ctx.view(squeezed, tensor, tuple(extents[c] for c in keep))
            tensor = squeezed
        operands.append(Operand(tensor, tuple(f"e_{c}" for c in keep)))
    if len(set(rhs)) != len(rhs) or any(c not in extents for c in rhs):
        raise Unsupported(f"output {rhs!r} of {equation!r}")
    order = list(rhs) + [c for c in extents if c not in rhs]
    axes = [(f"e_{c}", extents[c]) for c in order]
    out = Operand(node.output[0], tuple(f"e_{c}" for c in rhs))
    reduce = len(order) > len(rhs)
    if len(operands) == 1:
        body: Body = ("in", 0)
    elif len(operands) == 2:
        body = ("mul", ("in", 0), ("in", 1))
    else:
        raise Unsupported("Einsum of more than two operands")
    ctx.emit(node, node.name or node.output[0], axes, out, operands,
             "sum" if reduce else None, body)
