"""Op tests: one- or few-node ONNX models, compiled, emulated and checked against onnxruntime.

Driven by a record table in the style of JAX's ``lax_test``: each `Case` names a model built
with `onnx.helper` (an op type applied to the inputs, or a small graph-building function), the
shapes of its graph inputs, the storage dtype and the error bound. Every case runs on the
16-core test chip and on a 7-core variant, whose prime core count forces uneven splits and
padding. ``run_compiled`` feeds the emulator and onnxruntime the same seeded inputs (standard
normal floats, in-range int64 indices), so models that need positive inputs (Log, Sqrt, Pow,
divisors) make them inside the graph with ``Abs`` then ``Add 1``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from t10c.chips import PRESETS, Chip
from t10c.driver import TOLERANCE, CompileOptions, compile_model, max_rel_err, run_compiled
from t10c.frontend import UnsupportedModelError

OPSET = 17
IR_VERSION = 8

CHIPS: dict[str, Chip] = {
    "test16": PRESETS["test16"],
    "cores7": dataclasses.replace(PRESETS["test16"], cores=7),
}


@dataclass(frozen=True)
class Ids:
    """The shape of an int64 index input."""

    shape: tuple[int, ...]


class G:
    """A tiny graph builder: `node`, `const` and `weight` return the tensor name they make."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def node(self, op_type: str, *inputs: str, **attrs: object) -> str:
        n = len(self.nodes)
        out = f"{op_type.lower()}{n}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out],
                                           name=f"{op_type}_{n}", **attrs))
        return out

    def const(self, value: object, dtype: type = np.float32) -> str:
        """An initializer; a Python float gives a 0-d (scalar) one."""
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, *shape: int) -> str:
        """A seeded standard-normal initializer."""
        rng = np.random.default_rng(100 + len(self.inits))
        return self.const(rng.standard_normal(shape))

    def positive(self, x: str) -> str:
        """``|x| + 1`` (at least one): for Log, Sqrt, Pow bases and divisors."""
        return self.node("Add", self.node("Abs", x), self.const(1.0))


Outputs = str | tuple[str, ...]
Build = Callable[[G, list[str]], Outputs]


@dataclass(frozen=True)
class Case:
    """One op test; ``tol`` defaults to the driver's bound for ``dtype``."""

    name: str
    build: str | Build
    shapes: tuple[tuple[int, ...] | Ids, ...]
    dtype: str = "fp32"
    tol: float | None = None

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype] if self.tol is None else self.tol


def make_model(name: str, build: str | Build, shapes: tuple[tuple[int, ...] | Ids, ...]
               ) -> onnx.ModelProto:
    """An opset-17 model with inputs ``x0, x1, ...`` of ``shapes`` and outputs from ``build``."""
    g = G()
    names = [f"x{i}" for i in range(len(shapes))]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, s.shape) if isinstance(s, Ids)
              else helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
              for n, s in zip(names, shapes)]
    outs = g.node(build, *names) if isinstance(build, str) else build(g, names)
    outs = (outs,) if isinstance(outs, str) else outs
    graph = helper.make_graph(g.nodes, name, inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in outs], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION)
    # give the outputs their inferred shapes, as exporters do
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    onnx.checker.check_model(model, full_check=True)
    return model


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
    # Cos cannot run on chip, but on a constant it is folded at compile time
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
]

#: every case again with fp16 storage, at fp16's bound
CASES = FP32_CASES + [dataclasses.replace(c, name=f"{c.name}-fp16", dtype="fp16")
                      for c in FP32_CASES]


@pytest.mark.parametrize("chip", list(CHIPS), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_matches_onnxruntime(case: Case, chip: str) -> None:
    model = make_model(case.name, case.build, case.shapes)
    compiled = compile_model(model, CHIPS[chip], CompileOptions(dtype=case.dtype))
    result = run_compiled(compiled, seed=0)
    assert set(result.outputs) == {o.name for o in model.graph.output}
    for name, want in result.reference.items():
        assert result.outputs[name].shape == want.shape, name
        # max_rel_err ignores NaN (see test_max_rel_err_sees_nan), so check separately
        assert np.isfinite(result.outputs[name]).all(), name
    assert result.max_rel_err <= case.tolerance, (
        f"{case.name} on {chip} ({case.dtype}): max_rel_err {result.max_rel_err:.3g} "
        f"> {case.tolerance:g}")


def test_case_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names)


def test_every_supported_op_is_covered() -> None:
    from t10c.frontend import supported_ops

    used = set()
    for case in CASES:
        used |= {n.op_type for n in make_model(case.name, case.build, case.shapes).graph.node}
    assert set(supported_ops()) <= used


def test_max_rel_err_sees_nan() -> None:
    want = {"y": np.array([1.0, 2.0], np.float32)}
    assert max_rel_err({"y": np.array([np.nan, 2.0], np.float32)}, want) > 1.0


# -- the frontend's error path --------------------------------------------------------------

def unsupported_trig(g: G, x: list[str]) -> str:
    cos = g.node("Cos", x[0])
    sin = g.node("Sin", x[0])
    floor = g.node("Floor", x[0])
    return g.node("Add", g.node("Add", cos, sin), floor)


def test_unsupported_nodes_are_all_reported() -> None:
    model = make_model("trig", unsupported_trig, ((3, 4),))
    with pytest.raises(UnsupportedModelError) as info:
        compile_model(model, CHIPS["test16"], CompileOptions(dtype="fp32"))
    err = info.value
    assert len(err.nodes) == 3
    assert [(n.op_type, n.name) for n in err.nodes] == [
        ("Cos", "Cos_0"), ("Sin", "Sin_1"), ("Floor", "Floor_2")]
    message = str(err)
    for node_name in ("Cos_0", "Sin_1", "Floor_2"):
        assert node_name in message
    assert "Supported ops:" in message and "MatMul" in message


def test_unsupported_chain_reports_every_unsupported_node() -> None:
    # an unsupported node fed by another is still reported; the supported Add downstream is not
    def chain(g: G, x: list[str]) -> str:
        return g.node("Add", g.node("Floor", g.node("Sin", g.node("Cos", x[0]))), x[0])

    model = make_model("chain", chain, ((3, 4),))
    with pytest.raises(UnsupportedModelError) as info:
        compile_model(model, CHIPS["test16"], CompileOptions(dtype="fp32"))
    assert [n.op_type for n in info.value.nodes] == ["Cos", "Sin", "Floor"]
