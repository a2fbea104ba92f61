"""``t10c check``: every unsupported node at once, the device graph's summary, whether the
weights can fit the chip, and the exit code. Driven through `add_check_parser` and
`cmd_check`, the two functions the CLI wires in."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from t10c.check import EXIT_FAIL, EXIT_OK, EXIT_USAGE, add_check_parser, cmd_check

FIXTURES = Path(__file__).parent / "fixtures"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="t10c")
    add_check_parser(parser.add_subparsers(dest="command"))
    code = cmd_check(parser.parse_args(["check", *argv]))
    out, err = capsys.readouterr()
    return code, out, err


def three_unsupported(path: Path) -> Path:
    """Round, Sign and Hardmax of the input, then a supported MatMul."""
    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    nodes = [helper.make_node("Round", ["x"], ["a"], name="my_round"),
             helper.make_node("Sign", ["x"], ["b"], name="my_sign"),
             helper.make_node("Hardmax", ["x"], ["c"], name="my_hardmax"),
             helper.make_node("Sum", ["a", "b", "c"], ["s"], name="sum"),
             helper.make_node("MatMul", ["s", "w"], ["y"], name="proj"),
             helper.make_node("Relu", ["x"], ["z"], name="act")]
    graph = helper.make_graph(nodes, "three", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 8])], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return path


def test_lists_every_unsupported_node(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path) -> None:
    code, out, _ = run(capsys, str(three_unsupported(tmp_path / "three.onnx")))
    assert code == EXIT_FAIL
    assert "3 unsupported node(s)" in out
    for op, name in (("Round", "my_round"), ("Sign", "my_sign"), ("Hardmax", "my_hardmax")):
        assert f"{op} node '{name}' (opset 17)" in out
    assert "device graph (the supported part" in out  # the Relu is still summarised
    assert "cannot be compiled" in out


def test_says_weights_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    # llama-tiny's embedding and its transposed copy (the tied LM head) need 17 MB in fp16;
    # the test chip has 16 x 640 KiB
    code, out, _ = run(capsys, "llama-tiny", "--chip", "test16", "--seq-len", "16")
    assert code == EXIT_FAIL
    assert "every node is supported" in out
    assert "do NOT fit" in out
    assert "the weights need 17.1 MB, the chip has 10.5 MB" in out


def test_summarises_a_compilable_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "bert-tiny", "--seq-len", "16")
    assert code == EXIT_OK
    assert "device graph: 53 ops (contraction 16, elementwise 22, gather 1, reduce 14)" in out
    assert "parameters: 4,369,156" in out
    assert "they fit" in out and "can be compiled" in out


def test_dynamic_input_needs_shape(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(FIXTURES / "gpt2-hf-dynamic.onnx")
    code, _, err = run(capsys, path)
    assert code == EXIT_FAIL and "--shape input_ids=1xN" in err
    code, out, _ = run(capsys, path, "--shape", "input_ids=1x16")
    assert code == EXIT_OK, out


@pytest.mark.parametrize("argv", [["no-such-model"], ["mlp", "--chip", "tpu-v9"]])
def test_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == EXIT_USAGE and err.startswith("t10c: error:")
