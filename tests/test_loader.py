"""The model loader refuses bad models with one clear line (exit 1 from the CLI), reads external
data from the model's own folder only, and never raises anything but `FrontendError` on
mutated models (hypothesis)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from t10c import cli
from t10c.driver import load_source
from t10c.frontend import FrontendError, ModelNotFoundError, load_model, to_graph


def small_model(w: np.ndarray | None = None) -> onnx.ModelProto:
    """y = relu(x @ w + b): two initializers, three nodes, opset 17."""
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 100 if w is None else w
    b = np.linspace(-1, 1, 32, dtype=np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def with_external(model: onnx.ModelProto, location: str, folder: Path) -> Path:
    """Save ``model`` into ``folder`` with weight ``w`` in the file ``location``; the data file
    is written at ``folder / location`` only when that stays inside ``folder``."""
    w = next(t for t in model.graph.initializer if t.name == "w")
    data = w.raw_data
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(data)))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    folder.mkdir(parents=True, exist_ok=True)
    if not os.path.isabs(location) and ".." not in location:
        (folder / location).write_bytes(data)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def compile_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(["compile", *argv, "--chip", "test16", "--no-table"])
    return code, capsys.readouterr().err


def test_external_data_is_read_beside_the_model(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = with_external(small_model(), "weights.bin", tmp_path / "m")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # before: only found when run from the model's folder
    model = load_model(path)
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w"))
    np.testing.assert_array_equal(w, numpy_helper.to_array(small_model().graph.initializer[0]))
    assert to_graph(model).constants["w"].shape == (64, 32)


@pytest.mark.parametrize("location, expect", [
    ("/etc/passwd", "outside the model's folder"),
    ("../secret.bin", "outside the model's folder"),
    ("sub/../../secret.bin", "outside the model's folder"),
    ("missing.bin", "'missing.bin' is missing"),
])
def test_external_data_outside_or_missing_is_refused(tmp_path: Path, location: str,
                                                     expect: str) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64 * 32 * 4)
    path = with_external(small_model(), location, tmp_path / "m")
    if location == "missing.bin":
        (tmp_path / "m" / "missing.bin").unlink()
    with pytest.raises(FrontendError, match="initializer 'w'") as info:
        load_model(path)
    assert expect in str(info.value)


def test_external_data_symlink_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64 * 32 * 4)
    path = with_external(small_model(), "weights.bin", tmp_path / "m")
    (tmp_path / "m" / "weights.bin").unlink()
    (tmp_path / "m" / "weights.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(FrontendError, match="leads outside the model's folder"):
        load_model(path)


def test_short_external_data_is_refused(tmp_path: Path) -> None:
    path = with_external(small_model(), "weights.bin", tmp_path / "m")
    (tmp_path / "m" / "weights.bin").write_bytes(b"\0" * 100)
    with pytest.raises(FrontendError, match="the tensor needs 8192 bytes"):
        load_model(path)


def test_external_data_without_a_folder_is_refused(tmp_path: Path) -> None:
    model = onnx.load(with_external(small_model(), "weights.bin", tmp_path),
                      load_external_data=False)
    with pytest.raises(FrontendError, match="given without a file"):
        load_model(model)


def test_non_regular_and_huge_files_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.onnx"
    with open(huge, "wb") as f:  # sparse: no disk space used
        f.truncate(3 * 2**30)
    start = time.perf_counter()
    for path, expect in ((Path("/dev/zero"), "not a regular file"),
                         (fifo, "not a regular file"), (tmp_path, "is a directory"),
                         (huge, "at most 2 GB")):
        with pytest.raises(FrontendError, match=expect):
            load_model(path)
    assert time.perf_counter() - start < 5  # /dev/zero took 23 s to fail with a MemoryError


@pytest.mark.parametrize("content", [b"", b"hello, not a model\n", bytes(range(256)) * 4,
                                     b"\x08\x07"])
def test_not_onnx_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(content)
    with pytest.raises(FrontendError, match="not an ONNX model"):
        load_model(path)


def test_names_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.onnx"
    path.write_bytes(small_model().SerializeToString().replace(b"small", b"\x80mall"))
    with pytest.raises(FrontendError, match="not UTF-8"):
        load_model(path)


def test_opset_newer_than_onnx_knows_is_refused(tmp_path: Path) -> None:
    model = small_model()
    model.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    path = tmp_path / "new.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(FrontendError, match=r"knows opsets up to \d+: re-export"):
        load_model(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_blamed_on_the_model(tmp_path: Path, bad: float) -> None:
    w = np.ones((64, 32), np.float32)
    w[3, 4] = bad
    path = tmp_path / "nan.onnx"
    path.write_bytes(small_model(w).SerializeToString())
    with pytest.raises(FrontendError, match=r"NaN or infinity: initializer 'w' \(1 of 2048"):
        load_model(path)


def test_missing_path_and_misspelt_zoo_name(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such file"):
        load_source(tmp_path / "nope.onnx")
    from t10c.models import UnknownModelError

    with pytest.raises(UnknownModelError, match="did you mean 'gpt2-tiny'"):
        load_source("gpt2-tiyn")


def test_cli_gives_one_line_and_the_exit_code(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    outside = with_external(small_model(), "/etc/passwd", tmp_path / "m")
    nan = tmp_path / "nan.onnx"
    nan.write_bytes(small_model(np.full((64, 32), np.nan, np.float32)).SerializeToString())
    for argv, want in (([str(junk)], 1), (["/dev/zero"], 1), ([str(outside)], 1),
                       ([str(nan)], 1), ([str(nan), "--run"], 1),
                       ([str(tmp_path / "nope.onnx")], 2), (["bert-tinny"], 2)):
        code, err = compile_cli(capsys, *argv)
        assert code == want, (argv, err)
        assert err.startswith("t10c: error: ") and err.count("\n") == 1, err


def test_shape_only_convention_is_public(tmp_path: Path) -> None:
    """Any producer can write shape-only weights; the frontend never imports the zoo."""
    import subprocess
    import sys

    from t10c.frontend import SHAPE_ONLY_LOCATION, has_weights, is_shape_only

    model = small_model()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", SHAPE_ONLY_LOCATION
    path = tmp_path / "shapes.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = load_model(path)
    assert is_shape_only(loaded.graph.initializer[0])
    graph = to_graph(loaded)
    assert graph.constants["w"].shape == (64, 32) and not has_weights(graph)
    code = ("import sys, t10c.frontend; "
            "sys.exit('t10c.models' in sys.modules)")
    # in a temporary folder: from the repository root its t10c/ would shadow the install
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0


def test_compile_and_run_with_external_data_from_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = with_external(small_model(), "weights.bin", tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    code = cli.main(["compile", str(path), "--chip", "test16", "--no-table", "--run"])
    out = capsys.readouterr().out
    assert code == 0 and "OK" in out, out


# -- fuzzing: mutated bytes and mutated fields of a small valid model ----------------------

VALID = small_model().SerializeToString()
#: examples per fuzz test; T10C_FUZZ_EXAMPLES=5000 for a long hunt
EXAMPLES = int(os.environ.get("T10C_FUZZ_EXAMPLES", "200"))


def _outcome(data: bytes, folder: Path) -> None:
    """Load and lower ``data``: it must work or raise `FrontendError`, nothing else."""
    path = folder / "fuzz.onnx"
    path.write_bytes(data)
    try:
        to_graph(load_model(path))
    except FrontendError:
        pass


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1,
                max_size=8), st.integers(0, len(VALID)))
def test_fuzz_mutated_bytes(tmp_path: Path, flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(VALID)
    for at, value in flips:
        data[at] = value
    _outcome(bytes(data[:max(cut, 1)] if cut < len(VALID) // 2 else data), tmp_path)


FIELDS = st.sampled_from(["dims", "data_type", "raw_data", "op_type", "input", "opset",
                          "ir_version", "output_shape", "attribute", "external", "drop_init"])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(FIELDS, st.integers(-3, 70000), st.text(max_size=6)), min_size=1,
                max_size=3))
def test_fuzz_mutated_fields(tmp_path: Path, edits: list[tuple[str, int, str]]) -> None:
    model = small_model()
    g = model.graph
    for what, n, text in edits:
        if not g.initializer and what in ("dims", "data_type", "raw_data", "external",
                                          "drop_init"):
            continue
        init = g.initializer[n % len(g.initializer)] if g.initializer else None
        node = g.node[n % 3]
        if what == "dims" and init is not None:
            init.dims[n % len(init.dims)] = n
        elif what == "data_type":
            init.data_type = n % 25
        elif what == "raw_data":
            init.raw_data = init.raw_data[: n % (len(init.raw_data) + 1)]
        elif what == "op_type":
            node.op_type = text or ["Gemm", "Softmax", "Conv", "Reshape", "Split"][n % 5]
        elif what == "input":
            node.input[n % len(node.input)] = text or "y"
        elif what == "opset":
            model.opset_import[0].version = n % 40
        elif what == "ir_version":
            model.ir_version = n % 14
        elif what == "output_shape":
            g.output[0].type.tensor_type.shape.dim[n % 2].dim_value = n
        elif what == "attribute":
            node.attribute.append(helper.make_attribute(text or "axis", n))
        elif what == "external":
            init.data_location = TensorProto.EXTERNAL
            entry = init.external_data.add()
            entry.key, entry.value = "location", text or "w.bin"
        elif what == "drop_init":
            del g.initializer[n % len(g.initializer)]
    _outcome(model.SerializeToString(), tmp_path)
