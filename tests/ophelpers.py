"""The harness of the op tests (``test_ops*.py``): a tiny graph builder, the `Case` record and
the check against onnxruntime.

Each `Case` names a model built with `onnx.helper` (an op type applied to the inputs, or a small
graph-building function), the shapes of its graph inputs, the opset, the storage dtype and the
error bound. `check_case` compiles it for a chip, emulates it and compares with onnxruntime on
the same seeded inputs (standard normal floats, in-range int64 indices), so models that need
positive inputs (Log, Sqrt, Pow, divisors) make them inside the graph with ``Abs`` then
``Add 1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from t10c.chips import PRESETS, Chip
from t10c.driver import TOLERANCE, CompileOptions, compile_model, run_compiled

OPSET = 17

CHIPS: dict[str, Chip] = {
    "test16": PRESETS["test16"],
    "cores7": dataclasses.replace(PRESETS["test16"], cores=7),
}


def ir_version(opset: int) -> int:
    """The oldest IR version that carries ``opset`` (onnxruntime reads all of them)."""
    return 8 if opset <= 17 else 9 if opset <= 20 else 10


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
        return self.multi(op_type, 1, *inputs, **attrs)[0]

    def multi(self, op_type: str, outputs: int, *inputs: str, **attrs: object) -> list[str]:
        """A node with ``outputs`` outputs (Split); returns their names."""
        n = len(self.nodes)
        outs = [f"{op_type.lower()}{n}" + (f"_{k}" if k else "") for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs,
                                           name=f"{op_type}_{n}", **attrs))
        return outs

    def const(self, value: object, dtype: type = np.float32) -> str:
        """An initializer; a Python float gives a 0-d (scalar) one."""
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def ints(self, *values: int) -> str:
        """A 1-D int64 initializer (shapes, axes, pads)."""
        return self.const(list(values), np.int64)

    def weight(self, *shape: int) -> str:
        """A seeded standard-normal initializer."""
        rng = np.random.default_rng(100 + len(self.inits))
        return self.const(rng.standard_normal(shape))

    def positive(self, x: str) -> str:
        """``|x| + 1`` (at least one): for Log, Sqrt, Pow bases and divisors."""
        return self.node("Add", self.node("Abs", x), self.const(1.0))


Outputs = str | tuple[str, ...] | list[str]
Build = Callable[[G, list[str]], Outputs]


@dataclass(frozen=True)
class Case:
    """One op test; ``tol`` defaults to the driver's bound for ``dtype``."""

    name: str
    build: str | Build
    shapes: tuple[tuple[int, ...] | Ids, ...]
    dtype: str = "fp32"
    tol: float | None = None
    opset: int = OPSET

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype] if self.tol is None else self.tol


def make_model(name: str, build: str | Build, shapes: tuple[tuple[int, ...] | Ids, ...],
               opset: int = OPSET) -> onnx.ModelProto:
    """A model with inputs ``x0, x1, ...`` of ``shapes`` and outputs from ``build``."""
    g = G()
    names = [f"x{i}" for i in range(len(shapes))]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, s.shape) if isinstance(s, Ids)
              else helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
              for n, s in zip(names, shapes)]
    outs = g.node(build, *names) if isinstance(build, str) else build(g, names)
    outs = (outs,) if isinstance(outs, str) else tuple(outs)
    graph = helper.make_graph(g.nodes, name, inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in outs], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=ir_version(opset))
    # give the outputs their inferred shapes, as exporters do
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    onnx.checker.check_model(model, full_check=True)
    return model


def case_model(case: Case) -> onnx.ModelProto:
    return make_model(case.name, case.build, case.shapes, case.opset)


def check_case(case: Case, chip: str) -> None:
    """Compile ``case`` for ``chip``, emulate it and compare every output with onnxruntime."""
    model = case_model(case)
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


def with_fp16(cases: list[Case]) -> list[Case]:
    """Every case again with fp16 storage, at fp16's bound."""
    return cases + [dataclasses.replace(c, name=f"{c.name}-fp16", dtype="fp16") for c in cases]


def check_every_plan(graph, chip: Chip, want_of: Callable[..., np.ndarray],
                     dtype: str = "fp32", limit: int = 40, timed: bool = False) -> int:
    """Emulate every enumerated plan of ``graph``'s one op (an even sample past ``limit``)
    against ``want_of(graph, feeds)`` computed with numpy; with ``timed``, the emulated cycles
    within 5% of the prediction. Returns how many plans were run."""
    from t10c.codegen import generate
    from t10c.emulator import emulate
    from t10c.partition import Plan, SearchOptions, search_op, verify_plan

    op = graph.ops[0]
    plans = search_op(graph, op, chip, dtype, SearchOptions(chains=True))
    assert plans
    if len(plans) > limit:
        plans = [plans[i] for i in np.linspace(0, len(plans) - 1, limit).astype(int)]
    rng = np.random.default_rng(1)
    feeds = {t: rng.standard_normal(graph.tensors[t].shape).astype(np.float32)
             for t in graph.inputs}
    want = want_of(graph, feeds)
    out_name = graph.outputs[0]
    for p in plans:
        plan = Plan(graph.name, "test", dtype, (p,), (0,), (1,))
        verify_plan(graph, plan, chip)
        out, timeline, _ = emulate(generate(graph, plan, chip), chip, feeds, graph.constants)
        err = np.abs(out[out_name] - want).max() / max(np.abs(want).max(), 1e-6)
        assert err < (1e-5 if dtype == "fp32" else 2e-2), (p, err)
        if timed:
            assert abs(timeline.cycles - p.cycles.total) <= 0.05 * p.cycles.total, \
                (p, timeline.cycles)
    return len(plans)
