"""Graphs whose outputs are constants (Shape, Size, Constant, anything folded), zero-size
tensors, and their refusal where t10c writes nothing: through the driver against onnxruntime,
and through the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from t10c.chips import PRESETS
from t10c.cli import EXIT_FAIL, main
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.frontend import FrontendError

CHIP = PRESETS["test16"]


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list[int]]],
           outputs: list[str], **consts: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_empty_tensor_value_info(o) for o in outputs],
                              [onnx.numpy_helper.from_array(np.array(v, np.int64), k)
                               for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def test_shape_size_and_computed_outputs_together() -> None:
    model = _model([helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("Size", ["x"], ["n"]),
                    helper.make_node("Relu", ["x"], ["y"])],
                   [("x", TensorProto.FLOAT, [2, 3, 5])], ["s", "n", "y"])
    compiled = compile_model(model, CHIP, CompileOptions(dtype="fp32"))
    result = run_compiled(compiled)
    assert result.ok
    np.testing.assert_array_equal(result.outputs["s"], [2, 3, 5])
    assert result.outputs["n"].shape == () and float(result.outputs["n"]) == 30


def test_a_zero_size_input_folds_and_its_reduction_runs() -> None:
    model = _model([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=1)],
                   [("x", TensorProto.FLOAT, [2, 0, 4])], ["y"])
    compiled = compile_model(model, CHIP, CompileOptions(dtype="fp32"))
    assert compiled.graph.inputs == ()
    result = run_compiled(compiled)  # onnxruntime is fed the empty input
    assert result.ok and result.outputs["y"].shape == (1, 1, 1)
    assert float(result.outputs["y"].reshape(-1)[0]) == 0.0


def test_an_empty_slice_needs_no_op() -> None:
    model = _model([helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
                    helper.make_node("Concat", ["a", "b"], ["y"], axis=1)],
                   [("x", TensorProto.FLOAT, [3, 4])], ["y"], sizes=[0, 4])
    compiled = compile_model(model, CHIP, CompileOptions(dtype="fp32"))
    assert run_compiled(compiled).ok


def test_a_zero_size_output_is_refused_by_name() -> None:
    model = _model([helper.make_node("Slice", ["x", "s", "e"], ["y"])],
                   [("x", TensorProto.FLOAT, [4])], ["y"], s=[3], e=[1])
    with pytest.raises(FrontendError, match=r"output 'y' is zero-size \(shape \(0,\)\)"):
        compile_model(model, CHIP, CompileOptions(dtype="fp32"))


def test_the_cli_says_zero_size_in_one_line(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    model = _model([helper.make_node("Shape", ["x"], ["y"], start=2, end=1)],
                   [("x", TensorProto.FLOAT, [2, 3])], ["y"])
    path = tmp_path / "empty.onnx"
    onnx.save(model, path)
    code = main(["compile", str(path), "--chip", "test16"])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("t10c: error:")]
    assert code == EXIT_FAIL and len(lines) == 1 and "zero-size" in lines[0], err
    assert "Traceback" not in err
