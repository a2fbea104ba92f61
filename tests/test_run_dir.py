"""`t10c compile -o DIR` then `t10c run DIR`: the saved program runs again, from disk."""

from __future__ import annotations

import json

import numpy as np
import onnx

from t10c.cli import main
from t10c.models import build


def test_run_a_compiled_zoo_model(tmp_path, capsys) -> None:
    out = tmp_path / "bt"
    assert main(["compile", "bert-tiny", "--chip", "test16", "--seq-len", "16", "-o", str(out),
                 "--no-table"]) == 0
    assert main(["run", str(out), "--trace", str(out / "trace.json")]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["ok"] and run["cycles"] > 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["chip"] == "test16"
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert sum(e["args"]["cycles"] for e in events if e["ph"] == "X") == run["cycles"]
    assert "OK" in capsys.readouterr().out


def test_run_a_compiled_file_model(tmp_path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(build("mlp", batch=2), path)
    out = tmp_path / "mlp"
    assert main(["compile", str(path), "--chip", "test16", "-o", str(out), "--no-table"]) == 0
    assert (out / "model.onnx").is_file()
    assert main(["run", str(out)]) == 0


def _two_input_model() -> onnx.ModelProto:
    """``y = x @ w + bias``, fed in that order: the graph's order is not the names' sorted one
    (which ``program.json`` keeps its inputs in)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 16),
                                                                         dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "bias"], ["y"])], "two_inputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inputs_are_matched_by_name_not_order(tmp_path, capsys) -> None:
    """A decode step's past_key_values.10 sorts before .2: its directory runs all the same,
    and an inputs.json that lacks an input, or has one of another shape, is refused."""
    path = tmp_path / "two.onnx"
    onnx.save(_two_input_model(), path)
    out = tmp_path / "two"
    assert main(["compile", str(path), "--chip", "test16", "-o", str(out), "--no-table"]) == 0
    specs = json.loads((out / "inputs.json").read_text())
    assert [x["name"] for x in specs["inputs"]] == ["x", "bias"]
    assert list(json.loads((out / "program.json").read_text())["inputs"]) == ["bias", "x"]
    assert main(["run", str(out)]) == 0
    assert "OK" in capsys.readouterr().out

    specs["inputs"][0]["shape"] = [4, 9]
    specs["inputs"].pop()
    (out / "inputs.json").write_text(json.dumps(specs))
    assert main(["run", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no bias" in err
    assert "x has shape [4, 9], the program's is [4, 8]" in err


def test_run_needs_a_compiled_directory(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path)]) == 2
    assert "compile.json" in capsys.readouterr().err


def test_run_needs_no_frontend(tmp_path, monkeypatch, capsys) -> None:
    """The directory holds the program, its weights, its input specs and the model: `t10c run`
    emulates and checks without lowering anything, and keeps the predicted latency."""
    from t10c import frontend

    out = tmp_path / "bt"
    assert main(["compile", "bert-tiny", "--chip", "test16", "--seq-len", "16", "-o", str(out),
                 "--no-table", "--run"]) == 0
    first = json.loads((out / "run.json").read_text())
    assert {"weights.npz", "inputs.json", "model.onnx"} <= {p.name for p in out.iterdir()}

    def refuse(*args, **kwargs):
        raise AssertionError("t10c run must not run the frontend")

    monkeypatch.setattr(frontend, "load_model", refuse)
    monkeypatch.setattr(frontend, "to_graph", refuse)
    assert main(["run", str(out)]) == 0
    again = json.loads((out / "run.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert again["predicted_cycles"] == plan["total_cycles"] == first["predicted_cycles"]
    # the same seeded inputs as compile --run: the same outputs, so the same error
    assert again["max_rel_err"] == first["max_rel_err"] and again["cycles"] == first["cycles"]
    assert "OK" in capsys.readouterr().out


def test_a_timing_only_compile_draws_no_weights(tmp_path) -> None:
    out = tmp_path / "t"
    assert main(["compile", "bert-tiny", "--chip", "test16", "--seq-len", "16", "-o", str(out),
                 "--no-table", "--timing-only"]) == 0
    assert not (out / "weights.npz").exists() and not (out / "program.json").exists()


def test_model_file_is_written_one_initializer_at_a_time_as_onnx_saves_it(tmp_path) -> None:
    from t10c.rundir import write_model

    model = build("bert-tiny", seq_len=16)
    model.metadata_props.add(key="k", value="v")  # a field after the graph's
    assert write_model(model, tmp_path / "streamed.onnx")
    onnx.save_model(model, tmp_path / "saved.onnx")
    assert (tmp_path / "streamed.onnx").read_bytes() == (tmp_path / "saved.onnx").read_bytes()
    # past the limit nothing is written and the caller falls back to external data
    assert not write_model(model, tmp_path / "big.onnx", limit=1000)
    assert not (tmp_path / "big.onnx").exists()


def test_weights_built_apart_are_the_models_and_written_as_onnx_saves_them(tmp_path) -> None:
    """A zoo model built apart holds its large weights once, beside it: the same values,
    put back as the model `build` gives, and written to model.onnx byte for byte as it is."""
    from t10c.frontend import to_graph
    from t10c.models import build_apart, with_weights
    from t10c.rundir import write_model

    full = build("gpt2-tiny", seq_len=16)
    model, apart = build_apart("gpt2-tiny", seq_len=16)
    assert apart and model.ByteSize() < full.ByteSize() // 10
    assert with_weights(model, apart).SerializeToString() == full.SerializeToString()
    assert write_model(model, tmp_path / "apart.onnx", apart=apart)
    onnx.save_model(full, tmp_path / "saved.onnx")
    assert (tmp_path / "apart.onnx").read_bytes() == (tmp_path / "saved.onnx").read_bytes()
    # the frontend takes the arrays themselves as constants (no copy), equal to decoding them
    graph, want = to_graph(model, weights=apart), to_graph(full)
    held = [k for k in graph.constants if k in apart]
    assert held and all(graph.constants[k] is apart[k] for k in held)
    assert all(np.array_equal(graph.constants[k], want.constants[k]) for k in want.constants)
    import pytest

    from t10c.frontend import FrontendError

    name = held[0]
    with pytest.raises(FrontendError, match=f"weights given for initializer '{name}'"):
        to_graph(model, weights={**apart, name: apart[name][:1]})


def test_zoo_models_are_checked_without_their_weights() -> None:
    import pytest

    from t10c.models._builder import GraphBuilder

    b = GraphBuilder()
    x = b.graph_input("x", onnx.TensorProto.FLOAT, [2, 4096])
    w = b.initializer("w", np.ones((4096, 3), np.float32))
    b.node("MatMul", [x, w], "mm", output="y")
    b.graph_output("y", onnx.TensorProto.FLOAT, [2, 3])
    b.node("Relu", ["nowhere"], "bad", output="z")  # reads a tensor nothing makes
    with pytest.raises(onnx.checker.ValidationError):
        b.finish("broken")


def test_the_zoos_attention_projections_are_held_side_by_side_once(tmp_path) -> None:
    """BERT's q, k and v weights, built apart, are column blocks of one buffer
    (`models._builder.side_by_side`): model.onnx is still written byte for byte as
    ``onnx.save_model`` writes the model `build` gives, and the frontend's fused weight is
    a view of that buffer, not a copy of it (bert-large's compile holds 288 MiB less)."""
    from t10c.frontend import to_graph
    from t10c.models import build_apart
    from t10c.rundir import write_model

    full = build("bert-tiny", seq_len=16)
    model, apart = build_apart("bert-tiny", seq_len=16)
    parts = [apart[f"layer0.attn.{p}.weight"] for p in "qkv"]
    assert all(p.base is parts[0].base and not p.flags.c_contiguous for p in parts)
    assert write_model(model, tmp_path / "apart.onnx", apart=apart)
    onnx.save_model(full, tmp_path / "saved.onnx")
    assert (tmp_path / "apart.onnx").read_bytes() == (tmp_path / "saved.onnx").read_bytes()
    graph = to_graph(model, weights=apart, siblings=True)
    fused = graph.constants["layer0.attn.q.weight~fused"]
    assert fused.base is parts[0].base  # a view of it
    assert np.array_equal(fused, np.concatenate(parts, axis=1))

