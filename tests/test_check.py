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

from t10c.check import EXIT_FAIL, EXIT_OK, EXIT_USAGE, add_check_parser, check_model, cmd_check
from t10c.chips import PRESETS
from t10c.frontend import to_graph
from t10c.ir import Graph
from t10c.models import build

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
    # gpt2-tiny: 6.96M parameters (the tied LM head counted once) need 13.7 MB in fp16; the
    # test chip has 16 x 640 KiB
    code, out, _ = run(capsys, "gpt2-tiny", "--chip", "test16", "--seq-len", "16")
    assert code == EXIT_FAIL
    assert "every node is supported" in out
    assert "do NOT fit" in out
    assert "the weights need 13.7 MB, the chip has 10.5 MB" in out


def test_weights_live_in_dram_on_a_chip_that_has_some(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """On a chip with DRAM the weights are held there (what does not stay in SRAM is loaded
    before the ops that read it): LLaMA-2-13B's 26 GB fit elk-pod4's 343.6 GB, not the
    wormhole-n150's 12.9 GB (it had been refused against the pod's 3.8 GB of SRAM)."""
    code, out, _ = run(capsys, "llama2-13b-decode", "--chip", "elk-pod4")
    assert code == EXIT_OK
    assert "26,030.9 MB at fp16 against 343,597.4 MB of DRAM on elk-pod4" in out
    assert "nothing found that stops llama2-13b-decode" in out
    code, out, _ = run(capsys, "llama2-13b-decode", "--chip", "wormhole-n150")
    assert code == EXIT_FAIL
    assert "the weights need 26,030.9 MB, the chip has 12,884.9 MB of DRAM" in out


def test_summarises_a_compilable_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "bert-tiny", "--seq-len", "16")
    assert code == EXIT_OK
    # the bias, scale, GELU and residual ops are epilogues of the matmuls (frontend/fuse.py)
    assert "device graph: 39 ops (contraction 16, elementwise 8, gather 1, reduce 14)" in out
    assert "parameters: 4,369,156" in out
    # only necessary conditions are checked: the verdict must not promise a plan
    assert "they fit in it" in out and "nothing found that stops bert-tiny" in out
    assert "can be compiled" not in out


def test_flops_are_compiles_count() -> None:
    # the embedding lookup counts its output points, not the table (1.876 GFLOP before)
    report = check_model("bert-mini", PRESETS["ipu-mk2"])
    graph = compile_graph("bert-mini")
    assert report.flops == graph.flops() == 875_593_728


def test_tied_embedding_counted_once() -> None:
    report = check_model("gpt2-tiny", PRESETS["ipu-mk2"], seq_len=16)
    graph = compile_graph("gpt2-tiny", seq_len=16)
    copy = graph.constants["lm_head/Transpose_output_0"]  # wte, folded through Transpose
    assert copy.shape == graph.constants["wte"].shape[::-1]
    every = sum(v.size * (2 if v.dtype.kind == "f" else 4) for v in graph.constants.values())
    assert report.weight_bytes == every - copy.size * 2
    assert report.weight_bytes < 2 * report.parameters * 1.01


def test_check_draws_no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import t10c.models

    asked: list[bool] = []
    real = t10c.models.build

    def spy(name: str, **kwargs: object) -> onnx.ModelProto:
        asked.append(bool(kwargs.get("weights", True)))
        return real(name, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(t10c.models, "build", spy)
    check_model("bert-tiny", PRESETS["ipu-mk2"], seq_len=8)
    assert asked == [False]


def compile_graph(name: str, **kwargs: object) -> Graph:
    """The device graph compile lowers (shape-only, as compile without --run builds it)."""
    return to_graph(build(name, weights=False, **kwargs))  # type: ignore[arg-type]


def test_dynamic_input_needs_shape(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(FIXTURES / "gpt2-hf-dynamic.onnx")
    code, _, err = run(capsys, path)
    assert code == EXIT_FAIL and "--shape input_ids=1xN" in err
    code, out, _ = run(capsys, path, "--shape", "input_ids=1x16")
    assert code == EXIT_OK, out


@pytest.mark.parametrize("argv", [["no-such-model"], ["mlp", "--chip", "tpu-v9"],
                                  ["no/such/model.onnx"]])
def test_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == EXIT_USAGE and err.startswith("t10c: error:")
    assert err.count("\n") == 1


def test_misspelt_zoo_name_gets_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "bert-tinny")
    assert code == EXIT_USAGE
    assert "did you mean 'bert-tiny'" in err
