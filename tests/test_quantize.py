"""Int8 weights (``--quantize int8``) and matmuls split over column blocks on chips with DRAM:
the weights stay a byte an element from the model to the emulator, the model is checked
against onnxruntime as written, and a matmul too large for the chip's SRAM still plans."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from t10c.chips import load_chip
from t10c.cli import EXIT_FAIL, main
from t10c.driver import CompileOptions, chip_graph, compile_model, load_source, run_compiled
from t10c.dtypes import IntTensors
from t10c.frontend import to_graph
from t10c.models.quantize import quantize_matrix, quantize_weights
from t10c.partition.bounds import tensor_bytes
from t10c.partition.space import tensor_sets


def _matmul_model(k: int, n: int, m: int = 4, seed: int = 0, opset: int = 17,
                  nodes: list[onnx.NodeProto] | None = None,
                  inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """``y = relu(x @ W)``: W a float initializer, or what ``nodes`` and ``inits`` make."""
    if nodes is None:
        w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
        inits = [numpy_helper.from_array(w, "W")]
        nodes = []
    graph = helper.make_graph(
        [*nodes, helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("Relu", ["xw"], ["y"])], "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def test_quantize_matrix_rounds_each_column_to_its_scale() -> None:
    w = np.random.default_rng(1).standard_normal((40, 6)).astype(np.float32)
    w[:, 3] = 0
    q, s = quantize_matrix(w)
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (6,)
    assert np.abs(q.astype(int)).max() == 127 and q.min() >= -127
    assert s[3] == 1 and not q[:, 3].any()  # a zero column: scale 1, values 0
    live = [0, 1, 2, 4, 5]
    assert (np.abs(q[:, live]).max(axis=0) == 127).all()  # each column's peak is +-127
    err = np.abs(w - q * s)
    assert (err <= s / 2 * (1 + 1e-6)).all()


def test_quantize_weights_rewrites_only_matmul_weights() -> None:
    model = quantize_weights(load_source("llama-tiny-decode"))
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    inits = {t.name: t for t in model.graph.initializer}
    assert dq and all(inits[n.input[0]].data_type == TensorProto.INT8 for n in dq)
    # every quantized weight is read by matmuls only, as their second input
    for n in dq:
        readers = [r for r in model.graph.node if n.output[0] in r.input]
        assert readers and all(r.op_type == "MatMul" and list(r.input).index(n.output[0]) == 1
                               for r in readers)
    # the embedding table (a Gather's) stays float
    gather = next(n for n in model.graph.node if n.op_type == "Gather")
    assert inits[gather.input[0]].data_type == TensorProto.FLOAT
    onnx.checker.check_model(model, full_check=True)


def test_int8_weights_stay_a_byte_on_chip() -> None:
    model = quantize_weights(_matmul_model(256, 128))
    graph = to_graph(model)
    (op,) = graph.ops
    weight = op.inputs[1].tensor
    assert graph.tensors[weight].dtype == "int8" and graph.constants[weight].dtype == np.int8
    ints, _ = tensor_sets(graph)
    assert ints == IntTensors({weight: "int8"}) and ints.bytes_of(weight, "fp16") == 1
    assert tensor_bytes(graph, weight, "fp16") == 256 * 128
    assert op.epilogue is not None  # the scale (and the Relu) run on the matmul's result
    chip = load_chip("test16")
    plain = compile_model(_matmul_model(256, 128), chip).plan.ops[0]
    small = compile_model(model, chip).plan.ops[0]
    assert small.cold_bytes_per_core < plain.cold_bytes_per_core


@pytest.mark.parametrize("chip", ["ipu-mk2", "test64-dram"])
def test_a_quantized_llama_matches_onnxruntime(chip: str) -> None:
    compiled = compile_model("llama-tiny-decode", load_chip(chip),
                             CompileOptions(quantize="int8"))
    assert any(v.dtype == np.int8 for v in compiled.graph.constants.values())
    assert any(n.op_type == "DequantizeLinear" for n in compiled.model.graph.node)
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err


def test_the_reference_computes_a_dequantized_matmul_as_written() -> None:
    """onnxruntime's default optimisations would run DequantizeLinear + MatMul as an integer
    matmul that quantizes the activations too, 0.6% off on this product: the reference turns
    that fusion off, so fp32 storage agrees to rounding."""
    model = quantize_weights(_matmul_model(64, 48))
    result = run_compiled(compile_model(model, load_chip("test16"), CompileOptions(dtype="fp32")))
    assert result.max_rel_err < 1e-5


def test_dequantize_forms_left_as_float_still_match() -> None:
    """An asymmetric (zero point) or per-row DequantizeLinear is folded into a float
    constant, stored in --dtype."""
    rng = np.random.default_rng(3)
    q = rng.integers(-100, 100, (32, 24)).astype(np.int8)
    for scale, zero, axis in [(np.full(24, 0.02, np.float32), np.full(24, 3, np.int8), 1),
                              (np.full(32, 0.05, np.float32), None, 0)]:
        inits = [numpy_helper.from_array(q, "Wq"), numpy_helper.from_array(scale, "S")]
        ins = ["Wq", "S"]
        if zero is not None:
            inits.append(numpy_helper.from_array(zero, "Z"))
            ins.append("Z")
        model = _matmul_model(32, 24, nodes=[helper.make_node(
            "DequantizeLinear", ins, ["W"], axis=axis)], inits=inits)
        compiled = compile_model(model, load_chip("test16"), CompileOptions(dtype="fp32"))
        assert all(v.dtype != np.int8 for v in compiled.graph.constants.values())
        assert run_compiled(compiled).max_rel_err < 1e-5


def test_a_matmul_past_half_the_sram_is_split_by_columns() -> None:
    """test64-dram has 16 MiB of SRAM in all: a 12 MiB fp16 weight is planned as two ops over
    its column blocks, joined, and runs as the model does."""
    chip = load_chip("test64-dram")
    model = _matmul_model(1024, 6144)
    graph = chip_graph(model, chip, {}, dtype="fp16")
    split = [op for op in graph.ops if "~cols" in op.name]
    assert len(split) == 2
    assert [graph.tensors[op.inputs[1].tensor].shape for op in split] == [(1024, 3072)] * 2
    assert len(chip_graph(model, load_chip("test16"), {}).ops) == 1  # no DRAM: no split
    assert run_compiled(compile_model(model, chip)).ok


def test_quantize_cli_errors_and_run_dir(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    old = tmp_path / "old.onnx"
    onnx.save(_matmul_model(16, 8, opset=11), old)
    assert main(["compile", str(old), "--chip", "test16", "--quantize", "int8"]) == EXIT_FAIL
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["t10c: error: the model imports ONNX opset 11; weights quantized per "
                   "column need opset 13 or later (DequantizeLinear's axis): convert the "
                   "model with onnx.version_converter first"]
    new = tmp_path / "new.onnx"
    onnx.save(_matmul_model(64, 32), new)
    out = tmp_path / "out"
    assert main(["compile", str(new), "--chip", "test16", "--quantize", "int8",
                 "-o", str(out)]) == 0
    saved = onnx.load(str(out / "model.onnx"))  # the quantized model, not the file given
    assert [n.op_type for n in saved.graph.node][0] == "DequantizeLinear"
    capsys.readouterr()
    assert main(["run", str(out)]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["check", str(new), "--chip", "test16", "--quantize", "int8"]) == 0
    assert "(0.0 MB of them int8)" in capsys.readouterr().out
    # the plan says it was made for int8 weights: replayed with them, the same plan
    plan = out / "plan.json"
    assert json.loads(plan.read_text())["quantize"] == "int8"
    again = tmp_path / "again"
    assert main(["compile", str(new), "--chip", "test16", "--quantize", "int8",
                 "--plan", str(plan), "-o", str(again)]) == 0
    assert (again / "plan.json").read_bytes() == plan.read_bytes()
    capsys.readouterr()
    assert main(["compile", str(new), "--chip", "test16", "--plan", str(plan)]) == EXIT_FAIL
    assert capsys.readouterr().err.strip() == (
        "t10c: error: the plan was made with --quantize int8: compile with --quantize int8 "
        "or without --plan")
    floats = tmp_path / "floats"
    assert main(["compile", str(new), "--chip", "test16", "-o", str(floats)]) == 0
    capsys.readouterr()
    assert main(["compile", str(new), "--chip", "test16", "--quantize", "int8", "--plan",
                 str(floats / "plan.json")]) == EXIT_FAIL
    assert capsys.readouterr().err.strip() == (
        "t10c: error: the plan was made with float weights: compile without --quantize or "
        "without --plan")
