"""Op tests, elementwise and contraction ops: one- or few-node ONNX models, compiled, emulated
and checked against onnxruntime.

Driven by a record table in the style of JAX's ``lax_test`` (the harness is `ophelpers`). Every
case runs on the 16-core test chip and on a 7-core variant, whose prime core count forces uneven
splits and padding, with fp32 and with fp16 storage. Layout ops are tested in
``test_ops_layout.py``, convolution, pooling, normalisation and reductions in
``test_ops_nn.py``; `test_every_supported_op_is_covered` looks at all three tables.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from ophelpers import CHIPS, Build, Case, G, Ids, case_model, check_case, make_model, with_fp16

from t10c.driver import CompileOptions, compile_model, max_rel_err
from t10c.frontend import UnsupportedModelError

# -- builders of the few-node cases ---------------------------------------------------------

def on_positive(op: str) -> Build:
    return lambda g, x: g.node(op, g.positive(x[0]))


def scalar_right(op: str, value: float) -> Build:
    return lambda g, x: g.node(op, x[0], g.const(value))


def scalar_left(op: str, value: float) -> Build:
    return lambda g, x: g.node(op, g.const(value), x[0])


def weight_right(op: str, *shape: int) -> Build:
    return lambda g, x: g.node(op, x[0], g.weight(*shape))


def weight_left(op: str, *shape: int) -> Build:
    return lambda g, x: g.node(op, g.weight(*shape), x[0])


def div_by_positive(g: G, x: list[str]) -> str:
    return g.node("Div", x[0], g.positive(x[1]))


def pow_squared(g: G, x: list[str]) -> str:
    return g.node("Pow", g.positive(x[0]), g.const(2.0))


def pow_tensor_exponent(g: G, x: list[str]) -> str:
    return g.node("Pow", g.positive(x[0]), x[1])


def folded_cos(g: G, x: list[str]) -> str:
    # Cos of a constant is folded at compile time
    return g.node("Mul", x[0], g.node("Cos", g.weight(6)))


def identity_dropout(g: G, x: list[str]) -> str:
    return g.node("Relu", g.node("Dropout", g.node("Identity", x[0])))


def two_outputs(g: G, x: list[str]) -> tuple[str, str]:
    return g.node("Tanh", x[0]), g.node("Sigmoid", x[0])


def matmul_weight(*shape: int) -> Build:
    return lambda g, x: g.node("MatMul", x[0], g.weight(*shape))


def gather(*table: int) -> Build:
    return lambda g, x: g.node("Gather", g.weight(*table), x[0])


def gather_add(g: G, x: list[str]) -> str:
    return g.node("Add", g.node("Gather", g.weight(10, 4), x[0]), x[1])


def reshape_transpose_matmul(g: G, x: list[str]) -> str:
    # [2,12] -> [2,3,4] -> [2,4,3] @ [3,5] -> [2,4,5]
    r = g.node("Reshape", x[0], g.const([2, 3, 4], np.int64))
    return g.node("MatMul", g.node("Transpose", r, perm=[0, 2, 1]), g.weight(3, 5))


def transpose_matmul(g: G, x: list[str]) -> str:
    # [6,4]^T @ [6,3] -> [4,3]
    return g.node("MatMul", g.node("Transpose", x[0]), x[1])


def matmul_reshape_transpose(g: G, x: list[str]) -> str:
    # split heads the BERT way: [2,4,6] -> [2,4,2,3] -> [2,2,4,3], then Q K^T per head
    def heads(name: str) -> str:
        r = g.node("Reshape", name, g.const([0, 0, 2, -1], np.int64))
        return g.node("Transpose", r, perm=[0, 2, 1, 3])

    k_t = g.node("Transpose", heads(x[1]), perm=[0, 1, 3, 2])
    scores = g.node("MatMul", heads(x[0]), k_t)  # [2,2,4,4]
    merged = g.node("Transpose", scores, perm=[0, 2, 1, 3])
    return g.node("MatMul", g.node("Reshape", merged, g.const([2, 4, 8], np.int64)),
                  g.weight(8, 3))


def softmax(axis: int) -> Build:
    return lambda g, x: g.node("Softmax", x[0], axis=axis)


def layernorm(norm_shape: tuple[int, ...], *, bias: bool, axis: int = -1) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = [x[0], g.weight(*norm_shape)] + ([g.weight(*norm_shape)] if bias else [])
        return g.node("LayerNormalization", *ins, axis=axis, epsilon=1e-5)
    return build


def attention(g: G, x: list[str]) -> str:
    """softmax(Q K^T / sqrt(d)) V for Q, K, V of shape [batch, seq, d=8]."""
    q, k, v = x
    scores = g.node("MatMul", q, g.node("Transpose", k, perm=[0, 2, 1]))
    scaled = g.node("Mul", scores, g.const(1.0 / math.sqrt(8)))
    return g.node("MatMul", g.node("Softmax", scaled, axis=-1), v)


def attention_projected(g: G, x: list[str]) -> str:
    """One head with Q, K, V projected from one input [batch, seq, 8], plus a residual."""
    h = x[0]
    q, k, v = (g.node("MatMul", h, g.weight(8, 8)) for _ in range(3))
    scores = g.node("MatMul", q, g.node("Transpose", k, perm=[0, 2, 1]))
    scaled = g.node("Div", scores, g.const(math.sqrt(8.0)))
    return g.node("Add", g.node("MatMul", g.node("Softmax", scaled, axis=-1), v), h)


# -- activations, comparisons, casts, contractions --------------------------------------------

def unary_attrs(op: str, **attrs: object) -> Build:
    return lambda g, x: g.node(op, x[0], **attrs)


def prelu(*slope: int) -> Build:
    return lambda g, x: g.node("PRelu", x[0], g.weight(*slope))


def clip(lo: float | None, hi: float | None) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = [x[0], g.const(lo) if lo is not None else "", g.const(hi) if hi is not None else ""]
        while ins and not ins[-1]:
            ins.pop()
        return g.node("Clip", *ins)
    return build


def clip_computed_bounds(g: G, x: list[str]) -> str:
    # bounds that are tensors on chip: min(max(x, lo), hi) with lo, hi computed
    lo = g.node("ReduceMin", x[1], keepdims=0)
    return g.node("Clip", x[0], lo, g.node("Neg", lo))


def variadic(op: str) -> Build:
    return lambda g, x: g.node(op, *x)


def as_float(g: G, mask: str) -> str:
    return g.node("Cast", mask, to=TensorProto.FLOAT)


def cast_narrow(to: int) -> Build:
    """Through a narrow float type and back to float32."""
    return lambda g, x: g.node("Cast", g.node("Cast", x[0], to=to), to=TensorProto.FLOAT)


def where_compare(op: str) -> Build:
    return lambda g, x: g.node("Where", g.node(op, x[0], x[1]), x[0], g.node("Mul", x[1],
                                                                           g.const(2.0)))


def where_scalar(g: G, x: list[str]) -> str:
    return g.node("Where", g.node("Less", x[0], g.const(0.5)), x[0], g.const(0.5))


def equal_cast(g: G, x: list[str]) -> str:
    zero = g.node("Equal", g.node("Relu", x[0]), g.const(0.0))
    return g.node("Add", as_float(g, zero), x[0])


def logic(g: G, x: list[str]) -> str:
    pos = g.node("Greater", x[0], g.const(0.0))
    not_neg = g.node("Not", g.node("Less", x[1], g.const(0.0)))
    both = g.node("And", pos, not_neg)
    either = g.node("Or", both, g.node("LessOrEqual", x[0], g.const(-1.0)))
    ge = g.node("GreaterOrEqual", x[1], x[0])
    return g.node("Add", as_float(g, either), g.node("Mul", as_float(g, ge), x[1]))


def isnan_isinf(g: G, x: list[str]) -> str:
    """sqrt of negatives is NaN and log(0) is -inf: both masked back to numbers."""
    root = g.node("Sqrt", x[0])
    clean = g.node("Where", g.node("IsNaN", root), g.const(0.0), root)
    log = g.node("Log", g.node("Relu", x[0]))
    inf = as_float(g, g.node("IsInf", log, detect_positive=0))
    return g.node("Add", clean, inf)


def cast_truncates(g: G, x: list[str]) -> str:
    scaled = g.node("Mul", x[0], g.const(3.0))
    return as_float(g, g.node("Cast", scaled, to=TensorProto.INT64))


def cast_int_input(g: G, x: list[str]) -> str:
    return g.node("Add", as_float(g, x[0]), x[1])


def cast_to_bool(g: G, x: list[str]) -> str:
    return as_float(g, g.node("Cast", g.node("Relu", x[0]), to=TensorProto.BOOL))


def trig(g: G, x: list[str]) -> str:
    return g.node("Add", g.node("Sin", x[0]), g.node("Mul", g.node("Cos", x[0]), x[0]))


def gemm(*, trans_a: int = 0, trans_b: int = 0, alpha: float = 1.0, beta: float = 1.0,
         bias: tuple[int, ...] | None = None, weight: tuple[int, ...] | None = None) -> Build:
    def build(g: G, x: list[str]) -> str:
        b = g.weight(*weight) if weight else x[1]
        ins = [x[0], b] + ([g.weight(*bias)] if bias else [])
        return g.node("Gemm", *ins, transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    return build


def einsum(equation: str, *weight: int) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = list(x) + ([g.weight(*weight)] if weight else [])
        return g.node("Einsum", *ins, equation=equation)
    return build


def gelu_tanh_decomposed(g: G, x: list[str]) -> str:
    """HF's NewGELU written node by node, after a linear layer."""
    h = g.node("Add", g.node("MatMul", x[0], g.weight(8, 8)), g.weight(8))
    cube = g.node("Mul", g.node("Pow", h, g.const(3.0)), g.const(0.044715))
    inner = g.node("Mul", g.node("Add", h, cube), g.const(math.sqrt(2 / math.pi)))
    return g.node("Mul", g.node("Mul", g.const(0.5), h),
                  g.node("Add", g.const(1.0), g.node("Tanh", inner)))


def gelu_erf_decomposed(g: G, x: list[str]) -> str:
    erf = g.node("Erf", g.node("Div", x[0], g.const(math.sqrt(2.0))))
    return g.node("Mul", g.node("Mul", x[0], g.node("Add", erf, g.const(1.0))), g.const(0.5))


def shape_arithmetic(g: G, x: list[str]) -> str:
    """Reshape to [batch, -1] where batch comes from Shape -> Gather -> Unsqueeze -> Concat."""
    batch = g.node("Gather", g.node("Shape", x[0]), g.const(0, np.int64), axis=0)
    target = g.node("Concat", g.node("Unsqueeze", batch, g.ints(0)), g.ints(-1), axis=0)
    flat = g.node("Reshape", x[0], target)
    size = g.node("Cast", g.node("Size", x[0]), to=TensorProto.FLOAT)
    return g.node("Div", g.node("MatMul", flat, g.weight(12, 3)), size)


def range_and_constant_of_shape(g: G, x: list[str]) -> str:
    n = g.node("Gather", g.node("Shape", x[0]), g.const(1, np.int64), axis=0)
    step = g.node("Constant", value=onnx.numpy_helper.from_array(np.array(1, np.int64)))
    positions = g.node("Cast", g.node("Range", g.const(0, np.int64), n, step),
                       to=TensorProto.FLOAT)
    ones = g.node("ConstantOfShape", g.node("Shape", x[0]),
                  value=onnx.numpy_helper.from_array(np.array([2.0], np.float32)))
    return g.node("Mul", g.node("Add", x[0], positions), ones)


def causal_attention(g: G, x: list[str]) -> str:
    """Scores masked with a causal mask built the exporters' way (Trilu, Equal, Where)."""
    q, k, v = x
    seq = g.node("Gather", g.node("Shape", q), g.const(1, np.int64), axis=0)
    square = g.node("Concat", g.node("Unsqueeze", seq, g.ints(0)),
                    g.node("Unsqueeze", seq, g.ints(0)), axis=0)
    ones = g.node("ConstantOfShape", square,
                  value=onnx.numpy_helper.from_array(np.array([1.0], np.float32)))
    lower = g.node("Trilu", ones, upper=0)
    masked = g.node("Equal", lower, g.const(0.0))
    bias = g.node("Where", masked, g.const(-1e9), g.const(0.0))
    scores = g.node("MatMul", q, g.node("Transpose", k, perm=[0, 2, 1]))
    scores = g.node("Add", g.node("Mul", scores, g.const(1 / math.sqrt(8))), bias)
    return g.node("MatMul", g.node("Softmax", scores, axis=-1), v)


def masked_fill(g: G, x: list[str]) -> str:
    """BERT's additive attention mask from an int64 input: (1 - mask) * -10000."""
    mask = as_float(g, x[1])
    bias = g.node("Mul", g.node("Sub", g.const(1.0), mask), g.const(-10000.0))
    scores = g.node("Add", x[0], g.node("Unsqueeze", bias, g.ints(1, 2)))
    return g.node("Softmax", scores, axis=-1)


def dropout_13(g: G, x: list[str]) -> str:
    return g.node("Relu", g.node("Dropout", x[0], g.const(0.1), g.const(False, np.bool_)))


# -- the table ------------------------------------------------------------------------------

UNARY = ["Relu", "Erf", "Tanh", "Sigmoid", "Exp", "Neg", "Abs"]
NEEDS_POSITIVE = ["Log", "Sqrt", "Reciprocal"]
BINARY = ["Add", "Sub", "Mul"]

FP32_CASES: list[Case] = [
    *(Case(op, op, ((3, 5),)) for op in UNARY),
    *(Case(op, on_positive(op), ((3, 5),)) for op in NEEDS_POSITIVE),
    # binary ops, same shapes and with broadcasting
    *(Case(f"{op}-same", op, ((4, 6), (4, 6))) for op in BINARY),
    *(Case(f"{op}-[4,6],[6]", op, ((4, 6), (6,))) for op in BINARY),
    *(Case(f"{op}-[2,3,4],[3,1]", op, ((2, 3, 4), (3, 1))) for op in BINARY),
    Case("Add-[3,1],[1,5]", "Add", ((3, 1), (1, 5))),
    Case("Mul-[6],[2,1,6]", "Mul", ((6,), (2, 1, 6))),
    Case("Div-[4,6],[6]", div_by_positive, ((4, 6), (6,))),
    Case("Div-[2,3,4],[3,1]", div_by_positive, ((2, 3, 4), (3, 1))),
    # scalar constant operands (0-d initializers), on either side
    Case("Add-scalar", scalar_right("Add", 0.5), ((4, 6),)),
    Case("Sub-scalar-left", scalar_left("Sub", 1.0), ((4, 6),)),
    Case("Mul-scalar", scalar_right("Mul", -3.0), ((4, 6),)),
    Case("Div-scalar", scalar_right("Div", 4.0), ((4, 6),)),
    Case("Div-scalar-left", lambda g, x: g.node("Div", g.const(2.0), g.positive(x[0])),
         ((4, 6),)),
    # constant tensor operands (initializers), broadcast either way
    Case("Add-weight-[6]", weight_right("Add", 6), ((4, 6),)),
    Case("Mul-weight-[4,6]", weight_left("Mul", 4, 6), ((4, 6),)),
    Case("Sub-weight-[2,1,6]", weight_left("Sub", 2, 1, 6), ((3, 6),)),
    Case("Div-weight-[3,1]", lambda g, x: g.node("Div", x[0], g.positive(g.weight(3, 1))),
         ((2, 3, 4),)),
    # Pow: constant exponent 2.0, and a tensor exponent on a positive base
    Case("Pow-2.0", pow_squared, ((4, 6),)),
    Case("Pow-tensor", pow_tensor_exponent, ((4, 6), (6,))),
    Case("Cos-folded", folded_cos, ((4, 6),)),
    # folded at the model's opset: Unsqueeze-1's axes attribute (Unsqueeze-13 takes an input)
    Case("Unsqueeze-9-folded", lambda g, x: g.node("Add", x[0], g.node(
        "Unsqueeze", g.weight(6), axes=[0])), ((4, 6),), opset=9),
    Case("Identity-Dropout", identity_dropout, ((3, 5),)),
    Case("two-outputs", two_outputs, ((3, 5),)),
    # MatMul
    Case("MatMul-2d", "MatMul", ((4, 8), (8, 6))),
    Case("MatMul-7x13x5", "MatMul", ((7, 13), (13, 5))),
    Case("MatMul-3d-weight", matmul_weight(8, 6), ((2, 5, 8),)),
    Case("MatMul-3d-weight-prime", matmul_weight(11, 3), ((2, 7, 11),)),
    Case("MatMul-4d", "MatMul", ((2, 3, 4, 5), (2, 3, 5, 6))),
    Case("MatMul-4d-broadcast", "MatMul", ((2, 1, 4, 5), (1, 3, 5, 6))),
    Case("MatMul-3d-2d", "MatMul", ((3, 4, 5), (5, 2))),
    # computed operands whose padding would be non-zero (exp(0) = 1) if it were not masked
    Case("Exp-MatMul-prime-k", lambda g, x: g.node("MatMul", g.node("Exp", x[0]),
                                                   g.node("Exp", x[1])), ((2, 37), (37, 1))),
    # Gather from a constant table
    Case("Gather-[2,3]", gather(10, 4), (Ids((2, 3)),)),
    Case("Gather-[5]", gather(7, 3), (Ids((5,)),)),
    Case("Gather-Add", gather_add, (Ids((2, 3)), (3, 4))),
    # view chains feeding MatMul
    Case("Reshape-Transpose-MatMul", reshape_transpose_matmul, ((2, 12),)),
    Case("Transpose-MatMul", transpose_matmul, ((6, 4), (6, 3))),
    Case("heads-MatMul", matmul_reshape_transpose, ((2, 4, 6), (2, 4, 6))),
    # Softmax and LayerNormalization
    Case("Softmax-axis-1", softmax(-1), ((2, 3, 5),)),
    Case("Softmax-axis1", softmax(1), ((2, 3, 5),)),
    Case("LayerNorm-bias", layernorm((8,), bias=True), ((3, 8),)),
    Case("LayerNorm-no-bias", layernorm((8,), bias=False), ((2, 3, 8),)),
    Case("LayerNorm-axis1", layernorm((3, 8), bias=True, axis=1), ((2, 3, 8),)),
    # attention
    Case("attention", attention, ((2, 4, 8), (2, 4, 8), (2, 4, 8))),
    Case("attention-projected", attention_projected, ((1, 5, 8),)),
    # activations
    Case("LeakyRelu", unary_attrs("LeakyRelu", alpha=0.1), ((3, 5),)),
    Case("Elu", unary_attrs("Elu", alpha=0.7), ((3, 5),)),
    Case("Selu", "Selu", ((3, 5),)),
    Case("Softplus", "Softplus", ((3, 5),)),
    Case("Softsign", "Softsign", ((3, 5),)),
    Case("HardSigmoid", unary_attrs("HardSigmoid", alpha=0.3, beta=0.4), ((3, 5),)),
    Case("HardSwish", "HardSwish", ((3, 5),)),
    Case("PRelu-[5]", prelu(5), ((3, 5),)),
    Case("PRelu-[3,1,1]", prelu(3, 1, 1), ((2, 3, 4, 4),)),
    Case("Gelu-20", "Gelu", ((3, 5),), opset=20),
    Case("Gelu-20-tanh", unary_attrs("Gelu", approximate="tanh"), ((3, 5),), opset=20),
    Case("Clip", clip(-0.5, 0.7), ((3, 5),)),
    Case("Clip-min-only", clip(-0.5, None), ((3, 5),)),
    Case("Clip-computed-bounds", clip_computed_bounds, ((3, 5), (4,))),
    Case("Clip-6", unary_attrs("Clip", min=-0.2, max=0.3), ((3, 5),), opset=6),
    Case("Sin-Cos", trig, ((3, 5),)),
    Case("Max-3", variadic("Max"), ((3, 5), (5,), (3, 1))),
    Case("Min-2", variadic("Min"), ((3, 5), (3, 5))),
    Case("Sum-3", variadic("Sum"), ((3, 5), (5,), (3, 5))),
    Case("Mean-2", variadic("Mean"), ((3, 5), (1, 5))),
    # comparisons and logic (0/1 floats on chip)
    Case("Where-Greater", where_compare("Greater"), ((4, 6), (4, 6))),
    Case("Where-Less-broadcast", where_compare("Less"), ((4, 6), (6,))),
    Case("Where-scalars", where_scalar, ((4, 6),)),
    Case("Equal-Cast", equal_cast, ((4, 6),)),
    Case("logic", logic, ((4, 6), (4, 6))),
    Case("IsNaN-IsInf", isnan_isinf, ((4, 6),)),
    # casts
    Case("Cast-float-int-float", cast_truncates, ((4, 6),)),
    Case("Cast-int64-input", cast_int_input, (Ids((4, 6)), (4, 6))),
    Case("Cast-bool", cast_to_bool, ((4, 6),)),
    # rounded to the narrow type (unrounded, the fp32 case is off by 2^-11 or 2^-8)
    Case("Cast-float16", cast_narrow(TensorProto.FLOAT16), ((4, 6),)),
    Case("Cast-bfloat16", cast_narrow(TensorProto.BFLOAT16), ((4, 6),)),
    # Gemm, Einsum, 1-D MatMul
    Case("Gemm", gemm(weight=(8, 6), bias=(6,)), ((4, 8),)),
    Case("Gemm-transB-alpha-beta", gemm(trans_b=1, alpha=0.5, beta=2.0, weight=(6, 8),
                                        bias=(1, 6)), ((4, 8),)),
    Case("Gemm-transA-activations", gemm(trans_a=1, alpha=1.5), ((8, 4), (8, 6))),
    Case("MatMul-1d-left", "MatMul", ((5,), (5, 3))),
    Case("MatMul-1d-right", "MatMul", ((2, 4, 5), (5,))),
    Case("MatMul-1d-1d", "MatMul", ((5,), (5,))),
    Case("MatMul-2d-1d", "MatMul", ((4, 5), (5,))),
    Case("MatMul-1d-3d", "MatMul", ((5,), (2, 5, 3))),
    Case("Einsum-bmm", einsum("bij,bjk->bik"), ((2, 3, 4), (2, 4, 5))),
    Case("Einsum-heads", einsum("bhqd,bhkd->bhqk"), ((1, 2, 3, 4), (1, 2, 5, 4))),
    Case("Einsum-ellipsis-weight", einsum("...ij,jk->...ik", 4, 3), ((2, 3, 4),)),
    Case("Einsum-transpose", einsum("ij->ji"), ((3, 4),)),
    Case("Einsum-implicit", einsum("ij,jk"), ((3, 4), (4, 2))),
    # decomposed patterns and compile-time shape arithmetic
    Case("GELU-tanh-decomposed", gelu_tanh_decomposed, ((2, 3, 8),)),
    Case("GELU-erf-decomposed", gelu_erf_decomposed, ((2, 3, 8),)),
    Case("Shape-Gather-Concat-Reshape", shape_arithmetic, ((2, 3, 4),)),
    Case("Range-ConstantOfShape", range_and_constant_of_shape, ((3, 5),)),
    Case("causal-attention", causal_attention, ((2, 4, 8), (2, 4, 8), (2, 4, 8))),
    Case("attention-mask", masked_fill, ((2, 3, 5, 5), Ids((2, 5)))),
    Case("Dropout-13", dropout_13, ((3, 5),), opset=13),
]

CASES = with_fp16(FP32_CASES)


@pytest.mark.parametrize("chip", list(CHIPS), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_matches_onnxruntime(case: Case, chip: str) -> None:
    check_case(case, chip)


def test_case_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names)


def test_every_supported_op_is_covered() -> None:
    import test_ops_layout
    import test_ops_nn

    from t10c.frontend import supported_ops

    used = set()
    for case in CASES + test_ops_layout.CASES + test_ops_nn.CASES:
        used |= {n.op_type for n in case_model(case).graph.node}
    assert set(supported_ops()) - used == set()


def test_max_rel_err_sees_nan() -> None:
    want = {"y": np.array([1.0, 2.0], np.float32)}
    assert max_rel_err({"y": np.array([np.nan, 2.0], np.float32)}, want) > 1.0


# -- the frontend's error path --------------------------------------------------------------

def unsupported_rounding(g: G, x: list[str]) -> str:
    rounded = g.node("Round", x[0])
    sign = g.node("Sign", x[0])
    floor = g.node("Floor", x[0])
    return g.node("Add", g.node("Add", rounded, sign), floor)


def test_unsupported_nodes_are_all_reported() -> None:
    model = make_model("rounding", unsupported_rounding, ((3, 4),))
    with pytest.raises(UnsupportedModelError) as info:
        compile_model(model, CHIPS["test16"], CompileOptions(dtype="fp32"))
    err = info.value
    assert len(err.nodes) == 3
    assert [(n.op_type, n.name) for n in err.nodes] == [
        ("Round", "Round_0"), ("Sign", "Sign_1"), ("Floor", "Floor_2")]
    message = str(err)
    for node_name in ("Round_0", "Sign_1", "Floor_2"):
        assert node_name in message
    assert "Supported ops:" in message and "MatMul" in message


def test_unsupported_chain_reports_every_unsupported_node() -> None:
    # an unsupported node fed by another is still reported; the supported Add downstream is not
    def chain(g: G, x: list[str]) -> str:
        return g.node("Add", g.node("Floor", g.node("Sign", g.node("Round", x[0]))), x[0])

    model = make_model("chain", chain, ((3, 4),))
    with pytest.raises(UnsupportedModelError) as info:
        compile_model(model, CHIPS["test16"], CompileOptions(dtype="fp32"))
    assert [n.op_type for n in info.value.nodes] == ["Round", "Sign", "Floor"]


@pytest.mark.parametrize("op,attrs,shapes,want", [
    ("Add", {"broadcast": 1, "axis": 1}, ((2, 3, 4), (3,)), lambda a, b: a + b[:, None]),
    ("Mul", {"broadcast": 1}, ((2, 3, 4), (4,)), lambda a, b: a * b),
    ("Sub", {}, ((2, 3), (2, 3)), lambda a, b: a - b),
])
def test_legacy_broadcast(op: str, attrs: dict, shapes: tuple, want) -> None:
    # onnxruntime has no opset-6 Add, so the reference is numpy
    from t10c.driver import make_inputs
    from t10c.emulator import emulate

    model = make_model(op, lambda g, x: g.node(op, *x, **attrs), shapes, opset=6)
    compiled = compile_model(model, CHIPS["cores7"], CompileOptions(dtype="fp32"))
    inputs = make_inputs(compiled.graph)
    outputs, _, _ = emulate(compiled.program, compiled.chip, inputs, compiled.graph.constants)
    got = outputs[model.graph.output[0].name]
    np.testing.assert_allclose(got, want(inputs["x0"], inputs["x1"]), rtol=1e-6)
