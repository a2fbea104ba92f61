"""The onnx package's generated node tests (``onnx.backend.test.case.node``), run through t10c.

`collect_testcases` builds every case in memory: a model (usually one node) with its input and
expected output arrays. `scope` decides whether a case is one t10c claims (every op in it is a
supported op, and its data types are t10c's: float32 data, int64 indices and shapes) and
`run_case` compiles it for a small chip in fp32, emulates it and compares with the expected
outputs at t10c's fp32 tolerance. ``python tests/nodecases.py`` runs them all and prints a
summary (the test, `test_onnx_node.py`, runs them one by one).
"""

from __future__ import annotations

import functools
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper

from t10c.chips import PRESETS
from t10c.driver import TOLERANCE, CompileOptions, compile_model
from t10c.emulator import emulate
from t10c.frontend import FrontendError, supported_ops

CHIP = PRESETS["test16"]
RTOL = TOLERANCE["fp32"]

#: element types t10c reads and writes: float32 data; int64 for indices and shapes; booleans
#: (comparisons) come out as 0/1 floats on chip and are compared as such
INPUT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64}
OUTPUT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.BOOL, onnx.TensorProto.INT64}

#: ops whose int64 output is a shape or an index (other int64 outputs are integer data)
SHAPE_OPS = {"Shape", "Size", "Constant", "ConstantOfShape", "Range"}
#: (op, input slot) read at run time on chip as int64 indices: every other int64 graph input
#: (a shape, axes, pads, repeats, split sizes, constant indices) is bound at compile time
RUNTIME_INT64 = {("Gather", 1), ("GatherElements", 1)}


@functools.cache
def all_cases() -> dict[str, onnx.backend.test.case.test_case.TestCase]:
    """Every generated node test case, by name."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        cases = collect_testcases(None)
    return {c.name: c for c in cases if c.kind == "node" and c.model is not None}


def _elem(vi: onnx.ValueInfoProto) -> int:
    return vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0


def ops_of(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


def scope(case) -> str | None:
    """None when t10c claims the case, else why it is outside t10c's ops or data types."""
    model = case.model
    ops = ops_of(model)
    supported = set(supported_ops())
    if any(n.domain not in ("", "ai.onnx") for n in model.graph.node):
        return "an operator domain other than ONNX's"
    if not ops <= supported:
        return f"ops t10c does not claim: {', '.join(sorted(ops - supported))}"
    names = onnx.TensorProto.DataType.Name
    for vi in model.graph.input:
        if _elem(vi) not in INPUT_TYPES:
            return f"input {vi.name!r} is {names(_elem(vi)) if _elem(vi) else 'not a tensor'}"
    for vi in model.graph.output:
        if _elem(vi) not in OUTPUT_TYPES:
            return f"output {vi.name!r} is {names(_elem(vi)) if _elem(vi) else 'not a tensor'}"
        index_output = any(n.op_type == "MaxPool" and n.output[1:2] == [vi.name]
                           for n in model.graph.node)
        if _elem(vi) == onnx.TensorProto.INT64 and not (ops <= SHAPE_OPS or index_output):
            return f"output {vi.name!r} is int64 data (t10c computes float32)"
    return None


def bound(case, data: list) -> tuple[onnx.ModelProto, list[str]]:
    """The case's model with its compile-time int64 inputs (shapes, axes, pads: t10c compiles
    static shapes) made initializers holding ``data``'s values, and the names of the inputs
    left to feed at run time."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    runtime = {name for n in model.graph.node for i, name in enumerate(n.input)
               if (n.op_type, i) in RUNTIME_INT64}
    inits = {t.name for t in model.graph.initializer}
    feeds: list[str] = []
    keep = []
    for vi, value in zip([i for i in model.graph.input if i.name not in inits], data):
        if _elem(vi) == onnx.TensorProto.INT64 and vi.name not in runtime:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), vi.name))
        else:
            feeds.append(vi.name)
            keep.append(vi)
    del model.graph.input[:]
    model.graph.input.extend(keep)
    return model, feeds


def run_case(case, rtol: float | None = None) -> tuple[str, str]:
    """("pass" | "fail" | "refused", detail) for one case: compile (once per data set when
    they bind different compile-time inputs), emulate, compare (relative to the largest
    expected magnitude, at ``rtol``, by default t10c's fp32 tolerance)."""
    worst = 0.0
    compiled: dict[bytes, object] = {}
    for inputs, wants in case.data_sets:
        model, names = bound(case, inputs)
        key = model.SerializeToString()
        if key not in compiled:
            try:
                compiled[key] = compile_model(model, CHIP, CompileOptions(dtype="fp32"))
            except FrontendError as exc:
                return "refused", str(exc)
        program = compiled[key]
        inits = {t.name for t in case.model.graph.initializer}
        every = [i.name for i in case.model.graph.input if i.name not in inits]
        feeds = {k: np.asarray(v) for k, v in zip(every, inputs) if k in names}
        with np.errstate(all="ignore"):
            outputs, _, _ = emulate(program.program, CHIP, feeds,  # type: ignore[attr-defined]
                                    program.graph.constants)  # type: ignore[attr-defined]
        for out, want in zip(model.graph.output, wants):
            want = np.asarray(want).astype(np.float64)
            got = np.asarray(outputs[out.name]).astype(np.float64)
            if got.shape != want.shape:
                return "fail", f"{out.name}: shape {got.shape}, expected {want.shape}"
            nan = np.isnan(want)
            if (np.isnan(got) != nan).any():
                return "fail", f"{out.name}: NaN where the expected output has none, or not"
            inf = np.isinf(want)
            if (got[inf] != want[inf]).any() or np.isinf(got[~inf & ~nan]).any():
                return "fail", f"{out.name}: infinities differ"
            ok = ~nan & ~inf
            scale = max(float(np.abs(want[ok]).max(initial=0.0)), 1e-30)
            worst = max(worst, float(np.abs(got[ok] - want[ok]).max(initial=0.0)) / scale)
    return ("pass" if worst <= (rtol or RTOL) else "fail"), f"max relative error {worst:.2e}"


def main(argv: list[str]) -> None:
    """Run every case in scope (or those named in ``argv``) and print one line per case."""
    cases = all_cases()
    names = argv or sorted(n for n, c in cases.items() if scope(c) is None)
    counts: dict[str, int] = {}
    for name in names:
        try:
            status, detail = run_case(cases[name])
        except Exception as exc:  # a crash is a result here, to be listed
            status, detail = "crash", f"{type(exc).__name__}: {exc}"
        counts[status] = counts.get(status, 0) + 1
        lines = [x for x in detail.splitlines() if not x.startswith("Supported ops")]
        print(f"{status:8} {name}: {lines[-1].strip() if lines else ''}"[:300], flush=True)
    print(counts)


if __name__ == "__main__":
    main(sys.argv[1:])
