"""Sibling matmuls fused (`frontend.rewrite.fuse_sibling_matmuls`): matmuls that read one
activation with constant weights of their own become one matmul over the weights side by
side, its biases added as one, its result split; the model computes what onnxruntime
computes; weights something else reads, and on a chip with DRAM a concatenation too large
for it, are left alone; the zoo's attention projections become one op per layer; and a
Split's pieces read as heads are sliced after the heads' views (GPT-2). Asked
by ``--fuse all`` (the default) and ``prologues``, not by ``epilogues`` (`CompileOptions.fuse`;
``to_graph(siblings=True)``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from t10c.chips import chip_from_dict, load_chip
from t10c.cli import main
from t10c.driver import CompileOptions, chip_graph, compile_model, load_source, run_compiled
from t10c.frontend import to_graph
from t10c.frontend.rewrite import _joined_name, slice_heads_after_split


def _siblings(biases: tuple[bool, ...] = (True, True, True), shared: bool = False,
              opset: int = 17, k: int = 24, widths: tuple[int, ...] = (16, 8, 8)
              ) -> onnx.ModelProto:
    """``x`` times three weights (``q``, ``k``, ``v``), each with a bias where ``biases``
    says; ``shared``: ``v``'s weight is also read by a fourth matmul."""
    rng = np.random.default_rng(7)
    nodes, inits, outs = [], [], []
    for name, width, bias in zip("qkv", widths, biases):
        inits.append(numpy_helper.from_array(
            rng.standard_normal((k, width)).astype(np.float32), f"{name}.w"))
        nodes.append(helper.make_node("MatMul", ["x", f"{name}.w"], [f"{name}.xw"],
                                      name=f"l0/{name}/MatMul"))
        out = f"{name}.xw"
        if bias:
            inits.append(numpy_helper.from_array(
                rng.standard_normal(width).astype(np.float32), f"{name}.b"))
            nodes.append(helper.make_node("Add", [out, f"{name}.b"], [f"{name}.y"],
                                          name=f"l0/{name}/Add"))
            out = f"{name}.y"
        nodes.append(helper.make_node("Relu", [out], [name], name=f"l0/{name}/Relu"))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, width]))
    if shared:
        nodes.append(helper.make_node("MatMul", ["x2", "v.w"], ["again"], name="again"))
        outs.append(helper.make_tensor_value_info("again", TensorProto.FLOAT, [4, widths[2]]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])]
    if shared:
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, [4, k]))
    graph = helper.make_graph(nodes, "siblings", inputs, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _contractions(model: onnx.ModelProto) -> list[str]:
    return [op.name for op in to_graph(model, siblings=True).ops if op.reduction_axes]


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("biases", [(True, True, True), (True, False, True)])
def test_siblings_become_one_matmul_that_computes_the_same(opset: int,
                                                           biases: tuple[bool, ...]) -> None:
    model = _siblings(biases, opset=opset)
    assert _contractions(model) == ["l0/q+k+v/MatMul"]
    graph = to_graph(model, siblings=True)
    fused = graph.ops[0]
    if all(biases):  # the biases added once, as the fused matmul's epilogue
        assert fused.epilogue is not None and len(fused.extra) == 1
    compiled = compile_model(model, load_chip("test16"),
                             CompileOptions(dtype="fp32"))
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err


def test_weights_read_elsewhere_are_not_fused() -> None:
    assert sorted(_contractions(_siblings(shared=True))) == [
        "again", "l0/q+k/MatMul", "l0/v/MatMul"]


def test_all_and_prologues_make_them_one() -> None:
    model = _siblings()
    assert len(_contractions(model)) == 1
    for fuse in ("all", "prologues"):
        graph = chip_graph(model, load_chip("test16"), {}, fuse=fuse)
        assert [op.name for op in graph.ops if op.reduction_axes] == ["l0/q+k+v/MatMul"]
    for fuse in ("epilogues", "inline", "none"):
        graph = chip_graph(model, load_chip("test16"), {}, fuse=fuse)
        assert sorted(op.name for op in graph.ops if op.reduction_axes) == \
            ["l0/k/MatMul", "l0/q/MatMul", "l0/v/MatMul"], fuse


def test_a_chip_with_dram_fuses_only_what_it_would_not_split_again() -> None:
    """On a chip with DRAM the weights side by side must stay within the split's bound
    (half the SRAM): 16 KiB cores hold 24 x 32 fp16 weights once, not 24 x 1,024."""
    chip = chip_from_dict({"base": "test64-dram", "name": "dram16k", "cores": 16,
                           "grid": [4, 4], "sram_bytes_per_core": 2048})
    small = chip_graph(_siblings(), chip, {})
    assert [op.name for op in small.ops if op.reduction_axes] == ["l0/q+k+v/MatMul"]
    wide = chip_graph(_siblings(widths=(512, 256, 256)), chip, {})
    names = [op.name for op in wide.ops if op.reduction_axes]
    assert not any("+" in n for n in names), names


def test_joined_names() -> None:
    assert _joined_name(["a/attn/q/MatMul", "a/attn/k/MatMul", "a/attn/v/MatMul"]) == \
        "a/attn/q+k+v/MatMul"
    assert _joined_name(["a/q_proj/MatMul", "a/k_proj/MatMul"]) == "a/q_proj+k_proj/MatMul"
    assert _joined_name(["x/MatMul", "MatMul_3"]) == "x/MatMul+MatMul_3"


@pytest.mark.parametrize("model, fused, copies", [
    ("bert-tiny", "layer0/attn/q+k+v/MatMul", False),
    # the rotary embedding reads the query and the keys through windows (rotate_half), and
    # the values are the step's new cache entries: their slices stay copies
    ("llama-tiny-decode", "layers0/attn/q_proj+k_proj+v_proj/MatMul", True)])
def test_the_zoos_projections_are_one_op(model: str, fused: str, copies: bool) -> None:
    """One matmul for q, k and v; on bert no copy of their heads: each slice is taken after
    the heads' Reshape and Transpose, and folds into the op that reads it."""
    plain, graph = (to_graph(load_source(model), siblings=s) for s in (False, True))
    names = {op.name for op in graph.ops}
    assert fused in names, sorted(names)
    assert any(_is_copy(op) for op in graph.ops) == copies, [op.name for op in graph.ops]
    assert sum(bool(op.reduction_axes) for op in graph.ops) < \
        sum(bool(op.reduction_axes) for op in plain.ops)


def _is_copy(op) -> bool:  # type: ignore[no-untyped-def]
    return op.body == ("in", 0) and len(op.inputs) == 1 and not op.reduction_axes


def test_a_split_read_as_heads_is_sliced_after_the_heads_views() -> None:
    """GPT-2's ``c_attn`` is one matmul already, split into q, k and v: each piece sliced
    after its heads' Reshape and Transpose folds into its reader (three copy ops a layer
    fewer), computing what onnxruntime computes."""
    model = load_source("gpt2-tiny")
    plain, sliced = (to_graph(model, siblings=s) for s in (False, True))
    assert sum(op.name.endswith(("/Split/0", "/Split/1", "/Split/2")) for op in plain.ops) > 0
    assert not any(_is_copy(op) for op in sliced.ops), [op.name for op in sliced.ops]
    assert len(sliced.ops) < len(plain.ops)
    compiled = compile_model(model, load_chip("ipu-mk2"),
                             CompileOptions(dtype="fp32"))
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err
    # a Split of another axis, or before opset 10, is left to the Split's own lowering
    split = helper.make_node("Split", ["x"], ["a", "b"], axis=0)
    assert slice_heads_after_split([split], {}, {"x": (4, 6), "a": (2, 6), "b": (2, 6)},
                                   17) == [split]
    split = helper.make_node("Split", ["x"], ["a", "b"], axis=1)
    assert slice_heads_after_split([split], {}, {"x": (4, 6), "a": (4, 3), "b": (4, 3)},
                                   9) == [split]


def test_the_commands_that_compile_take_it(capsys) -> None:
    """``--fuse`` on explain (the fused op's front; `epilogues` has no such op) and bench."""
    assert main(["explain", "bert-tiny", "--op", "layer0/attn/q+k+v/MatMul", "--chip",
                 "test16"]) == 0
    assert "layer0/attn/q+k+v/MatMul" in capsys.readouterr().out
    assert main(["explain", "bert-tiny", "--op", "layer0/attn/q+k+v/MatMul", "--chip",
                 "test16", "--fuse", "epilogues"]) == 2
    capsys.readouterr()
    assert main(["bench", "--models", "bert-tiny", "--chips", "test16", "--timing-only",
                 "--fuse", "epilogues"]) == 0
    assert "| bert-tiny |" in capsys.readouterr().out


@pytest.mark.parametrize("chip", ["test64-dram", "mesh64x64"])
def test_a_decode_step_with_fused_projections_runs_on_a_mesh_and_with_dram(chip: str) -> None:
    """The decode step's cache read where it lives and grown in place (meshes, DRAM) with its
    keys and values slices of the fused projection: the outputs are onnxruntime's."""
    target = load_chip(chip) if chip != "mesh64x64" else chip_from_dict(
        {"base": "wse2", "name": "mesh64x64", "grid": [64, 64], "cores": 4096})
    compiled = compile_model("llama-tiny-decode", target, CompileOptions())
    assert any("q_proj+k_proj+v_proj" in op.name for op in compiled.graph.ops)
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err
    assert result.timeline.cycles == compiled.plan.total_cycles


def _gated_mlp(k: int = 24, width: int = 32) -> onnx.ModelProto:
    """LLaMA's MLP: ``down(silu(x @ gate) * (x @ up))``, SiLU as ``g * sigmoid(g)``."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("gate.w", (k, width)), ("up.w", (k, width)),
                                 ("down.w", (width, k)))]
    nodes = [helper.make_node("MatMul", ["x", "gate.w"], ["g"], name="mlp/gate_proj/MatMul"),
             helper.make_node("MatMul", ["x", "up.w"], ["u"], name="mlp/up_proj/MatMul"),
             helper.make_node("Sigmoid", ["g"], ["s"], name="mlp/Sigmoid"),
             helper.make_node("Mul", ["g", "s"], ["a"], name="mlp/act"),
             helper.make_node("Mul", ["a", "u"], ["h"], name="mlp/Mul"),
             helper.make_node("MatMul", ["h", "down.w"], ["y"], name="mlp/down_proj/MatMul")]
    graph = helper.make_graph(
        nodes, "gated", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, k])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8)


def test_a_gated_mlps_projections_are_woven() -> None:
    """Gate and up, combined point by point, interleave their columns in the fused weight:
    the gating op reads column ``i`` of each at ``2 i`` and ``2 i + 1`` of the product
    (strided windows), so any run of columns a core computes holds both halves of its
    points; the model still computes what onnxruntime computes. q, k and v, as wide but
    each read apart, stay side by side."""
    model = _gated_mlp()
    graph = to_graph(model, siblings=True)
    gating = next(op for op in graph.ops if op.name == "mlp/Mul")
    windows = sorted((a.terms, a.offset) for o in gating.inputs for a in o.axes
                     if not isinstance(a, str))
    assert windows == [(((windows[0][0][0][0], 2),), 0), (((windows[0][0][0][0], 2),), 1)]
    weight = next(v for name, v in graph.constants.items() if name.endswith("~fused"))
    source = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert np.array_equal(weight[:, 0::2], source["gate.w"])
    assert np.array_equal(weight[:, 1::2], source["up.w"])
    result = run_compiled(compile_model(model, load_chip("test16"),
                                        CompileOptions(dtype="fp32")))
    assert result.ok, result.max_rel_err
    apart = _siblings(widths=(8, 8, 8))
    qkv = to_graph(apart, siblings=True)
    weight = next(v for name, v in qkv.constants.items() if name.endswith(".w~fused"))
    source = {t.name: numpy_helper.to_array(t) for t in apart.graph.initializer}
    assert np.array_equal(weight, np.concatenate([source[f"{n}.w"] for n in "qkv"], axis=1))


@pytest.mark.parametrize("woven", [False, True])
def test_weights_already_side_by_side_are_fused_without_a_copy(woven: bool) -> None:
    """Parts that are views of one matrix laid out as the fused weight is (the zoo's q, k
    and v: `models._builder.side_by_side`) give a view of that matrix; any other parts
    (their own arrays, or views in another order) are copied into a new one, the same
    values."""
    from t10c.frontend.rewrite import _side_by_side

    whole = np.arange(6 * 12, dtype=np.float32).reshape(6, 12)
    parts = ([whole[:, j::3] for j in range(3)] if woven
             else [whole[:, 0:4], whole[:, 4:8], whole[:, 8:12]])
    got = _side_by_side(parts, woven)
    assert np.shares_memory(got, whole) and got.shape == whole.shape
    want = (np.stack(parts, axis=2).reshape(6, -1) if woven
            else np.concatenate(parts, axis=1))
    for other in ([p.copy() for p in parts], parts[::-1], parts[:2]):
        got = _side_by_side(other, woven)
        assert not np.shares_memory(got, whole)
        assert np.array_equal(got, np.stack(other, axis=2).reshape(6, -1) if woven
                              else np.concatenate(other, axis=1))
    assert np.array_equal(_side_by_side(parts, woven), want)
