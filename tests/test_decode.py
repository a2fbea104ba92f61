"""The LLaMA decode step (``llama-*-decode``): one new token with the KV cache as graph inputs
and outputs. Its graph, its agreement with the prefill model it continues, and the whole
pipeline (several graph outputs) on the emulator against onnxruntime."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from ophelpers import CHIPS

from t10c.chips import PRESETS, chip_from_dict
from t10c.cli import main
from t10c.codegen.program import ProgramError, Store
from t10c.codegen.verify import verify_program
from t10c.driver import CompileOptions, compile_model, make_inputs, run_compiled
from t10c.emulator.reference import run_reference
from t10c.frontend import to_graph
from t10c.models import ALIASES, LLAMA_SIZES, ZOO_NAMES, build, build_llama_decode
from t10c.models._builder import OPSET

TINY = LLAMA_SIZES["llama-tiny"]


def _dims(value: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value for d in value.type.tensor_type.shape.dim]


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_decode_names_follow_their_prefill_twins() -> None:
    for size in ("tiny", "135m", "360m"):
        assert ZOO_NAMES.index(f"llama-{size}-decode") > ZOO_NAMES.index("llama-360m")
    assert ALIASES["llama-decode"] == "llama-135m-decode"


def test_decode_graph_has_the_cache_as_inputs_and_outputs() -> None:
    past, batch, kv, d = 8, 2, TINY.kv_heads, TINY.hidden // TINY.heads
    model = build("llama-tiny-decode", seq_len=past, batch=batch)
    onnx.checker.check_model(model, full_check=True)
    cache = [f"{i}.{kv_}" for i in range(TINY.layers) for kv_ in ("key", "value")]
    assert [(i.name, _dims(i)) for i in model.graph.input] == [
        ("input_ids", [batch, 1])] + [(f"past_key_values.{c}", [batch, kv, past, d])
                                      for c in cache]
    assert [(o.name, _dims(o)) for o in model.graph.output] == [
        ("logits", [batch, 1, TINY.vocab])] + [(f"present.{c}", [batch, kv, past + 1, d])
                                               for c in cache]
    assert "Where" not in {n.op_type for n in model.graph.node}  # no causal mask
    assert build("llama-tiny-decode", seq_len=past, batch=batch).SerializeToString() == \
        model.SerializeToString()

    rng = np.random.default_rng(1)
    feeds = {"input_ids": rng.integers(0, TINY.vocab, (batch, 1))}
    feeds |= {i.name: rng.standard_normal(_dims(i)).astype(np.float32)
              for i in model.graph.input[1:]}
    outs = dict(zip([o.name for o in model.graph.output], _session(model).run(None, feeds)))
    assert all(np.isfinite(v).all() for v in outs.values())
    for c in cache:  # the cache comes back unchanged, one row longer
        assert np.array_equal(outs[f"present.{c}"][:, :, :past], feeds[f"past_key_values.{c}"])


def test_decode_continues_the_prefill() -> None:
    """Prefill over past + 1 tokens, and a decode step on the cache of its first ``past``
    tokens, agree: same weights (same seed), same RoPE position, same keys and values."""
    past = 6
    prefill = build("llama-tiny", seq_len=past + 1)
    kv_names = {}
    for i in range(TINY.layers):  # expose the prefill's k (after RoPE) and v per layer
        kv_names[f"{i}.key"] = f"layers{i}/attn/k_rope/Add_output_0"
        kv_names[f"{i}.value"] = f"layers{i}/attn/v/Transpose_output_0"
    prefill.graph.output.extend(onnx.helper.make_tensor_value_info(
        name, onnx.TensorProto.FLOAT, None) for name in kv_names.values())
    ids = np.random.default_rng(2).integers(0, TINY.vocab, (1, past + 1))
    full = dict(zip([o.name for o in prefill.graph.output],
                    _session(prefill).run(None, {"input_ids": ids})))

    decode = build("llama-tiny-decode", seq_len=past)
    feeds = {"input_ids": ids[:, past:]}
    feeds |= {f"past_key_values.{c}": full[t][:, :, :past] for c, t in kv_names.items()}
    step = dict(zip([o.name for o in decode.graph.output], _session(decode).run(None, feeds)))
    np.testing.assert_allclose(step["logits"], full["logits"][:, past:], rtol=1e-4, atol=1e-4)
    for c, t in kv_names.items():
        np.testing.assert_allclose(step[f"present.{c}"], full[t], rtol=1e-5, atol=1e-5)


def test_driver_inputs_cover_ids_and_cache() -> None:
    inputs = make_inputs(to_graph(build("llama-tiny-decode", seq_len=4)), seed=0)
    assert inputs["input_ids"].dtype == np.int64
    assert 0 <= inputs["input_ids"].min() and inputs["input_ids"].max() < TINY.vocab
    cache = inputs["past_key_values.1.value"]
    assert cache.dtype == np.float32 and cache.shape == (1, TINY.kv_heads, 4, 32)
    assert 0.5 < cache.std() < 2.0  # N(0, 1), not zeros or ones


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_tiny_decode_matches_onnxruntime(dtype: str) -> None:
    # llama-tiny's 32k-token embedding and tied head (17 MB in fp16) need a bigger chip than
    # test16 (see test_check), so the zoo model runs on the MK2 as the other tiny models do
    compiled = compile_model("llama-tiny-decode", PRESETS["ipu-mk2"],
                             CompileOptions(dtype=dtype, seq_len=16))
    result = run_compiled(compiled)
    assert set(result.outputs) >= {"logits", "present.0.key", "present.1.value"}
    assert result.ok, f"{dtype}: max_rel_err {result.max_rel_err:.3g}"


@pytest.mark.parametrize("chip", ["test16", "cores7"])
def test_small_vocab_decode_matches_onnxruntime_on_the_test_chip(chip: str) -> None:
    """The llama-tiny layers with a 512-token vocabulary fit test16 (and 7 cores): every
    output, the logits and each present key and value, matches onnxruntime in fp32."""
    model = build_llama_decode(TINY.hidden, TINY.layers, TINY.heads, TINY.kv_heads,
                               TINY.intermediate, vocab=512, past_len=16, batch=2)
    result = run_compiled(compile_model(model, CHIPS[chip], CompileOptions(dtype="fp32")))
    assert len(result.reference) == 1 + 2 * TINY.layers
    for name, want in result.reference.items():
        got = result.outputs[name]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max(),
                                   err_msg=name)
    assert result.ok


def test_cli_compiles_and_runs_the_decode_step(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["compile", "llama-tiny-decode", "--seq-len", "8", "--run", "--no-table"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "model llama-tiny-decode" in out and ": OK" in out


def _folded(model: onnx.ModelProto, split: bool = False) -> onnx.ModelProto:
    """``model`` with `fold_repeat_kv` applied to its nodes, and `split_cache_concat` and
    `split_softmax_over_parts` after it with ``split``, as the frontend applies them."""
    from t10c.frontend.rewrite import fold_repeat_kv, split_cache_concat, split_softmax_over_parts

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: tuple(_dims(v)) for v in [*inferred.graph.value_info,
                                                 *inferred.graph.input, *inferred.graph.output]}
    given = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    constants = dict(given)
    outputs = {o.name for o in model.graph.output}
    nodes = fold_repeat_kv(list(model.graph.node), constants, shapes, outputs)
    if split:
        inputs = {i.name for i in model.graph.input}
        nodes = split_cache_concat(nodes, constants, shapes, inputs, outputs)
        nodes = split_softmax_over_parts(nodes, constants, shapes, outputs, OPSET)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in constants.items()
                                 if k not in given)
    return out


def _feeds(model: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    feeds = {"input_ids": rng.integers(0, TINY.vocab, (batch, _dims(model.graph.input[0])[1]))}
    return feeds | {i.name: rng.standard_normal(_dims(i)).astype(np.float32)
                    for i in model.graph.input[1:]}


@pytest.mark.parametrize("name, batch", [("llama-tiny-decode", 2), ("llama-tiny", 1)])
def test_grouped_query_attention_reads_each_kv_head_once(name: str, batch: int) -> None:
    """The repeated keys and values fold into the attention matmuls (`fold_repeat_kv`): the
    folded ONNX model computes what the model does (onnxruntime on both), no Expand is left,
    the device graph's attention matmuls read the cache with its kv heads, not a copy per
    query head, and the scores' scale still fuses into its matmul."""
    model = build(name, seq_len=8, batch=batch)
    folded = _folded(model)
    onnx.checker.check_model(folded, full_check=True)
    assert "Expand" not in {n.op_type for n in folded.graph.node}
    assert sum(n.op_type == "MatMul" for n in folded.graph.node) == \
        sum(n.op_type == "MatMul" for n in model.graph.node)
    feeds = _feeds(model, batch)
    for want, got in zip(_session(model).run(None, feeds), _session(folded).run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    graph = to_graph(model)
    keys = 8 + name.endswith("-decode")  # the cache and the new token
    attention = [op for op in graph.ops if op.name.endswith(("scores/MatMul", "context/MatMul"))]
    assert len(attention) == 2 * TINY.layers
    assert not any(op.name.endswith("scores/Mul") for op in graph.ops)  # fused: an epilogue
    for op in attention:
        cache = graph.tensors[graph.root(op.inputs[1].tensor)].shape
        assert math.prod(cache) == batch * TINY.kv_heads * keys * (TINY.hidden // TINY.heads)


def test_attention_reads_the_cache_input_itself_when_split() -> None:
    """With the cache split (`split_cache_concat`, on mesh chips): the rewritten ONNX model
    computes what the model does (onnxruntime on both), every attention matmul over the past
    reads a ``past_key_values`` graph input itself (loaded in its own layout, not re-laid
    from the Concat), the scores' scale still fuses into both parts' matmuls, and the
    Concats stay for the ``present`` outputs. The prefill model, with no cache input, and the
    graph built without the split are untouched."""
    model = build("llama-tiny-decode", seq_len=8, batch=2)
    split = _folded(model, split=True)
    onnx.checker.check_model(split, full_check=True)
    feeds = _feeds(model, 2)
    for want, got in zip(_session(model).run(None, feeds), _session(split).run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    prefill = build("llama-tiny", seq_len=8)
    assert [n.name for n in _folded(prefill, split=True).graph.node] == \
        [n.name for n in _folded(prefill).graph.node]

    graph = to_graph(model, split_cache=True)
    past = [op for op in graph.ops if op.name.endswith(("scores/MatMul/cache0",
                                                        "context/MatMul/cache0"))]
    assert len(past) == 2 * TINY.layers
    for op in past:
        roots = [graph.root(i.tensor) for i in op.inputs]
        assert any(r.startswith("past_key_values.") and r in graph.inputs for r in roots), \
            (op.name, roots)
    assert not any(op.name.endswith("scale") for op in graph.ops)  # fused: epilogues
    assert sum(op.name.endswith("_cache/Concat") for op in graph.ops) == 2 * TINY.layers
    whole = to_graph(model)
    assert not any("/cache0" in op.name for op in whole.ops)


def test_the_softmax_over_the_cache_parts_is_computed_part_by_part() -> None:
    """After the split (`split_softmax_over_parts`): the scores are never concatenated nor
    normalised as one row: each part's maximum and sum are reductions of their own (the new
    token's one-wide part is its own), the parts' probabilities are what the context matmuls
    read, and the rewritten model still computes what the model does (onnxruntime on both,
    the ONNX checker on the rewrite)."""
    model = build("llama-tiny-decode", seq_len=8, batch=2)
    split = _folded(model, split=True)
    onnx.checker.check_model(split, full_check=True)
    kinds = Counter(n.op_type for n in split.graph.node)
    assert kinds["Softmax"] == 0
    assert not any(n.op_type == "Concat" and "scores" in n.name for n in split.graph.node)
    assert kinds["ReduceMax"] == kinds["ReduceSum"] == TINY.layers  # the past part's
    feeds = _feeds(model, 2)
    for want, got in zip(_session(model).run(None, feeds), _session(split).run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    graph = to_graph(model, split_cache=True)
    names = {op.name.split("/", 1)[1] for op in graph.ops if op.name.startswith("layers0/")}
    assert {"attn/Softmax/max0", "attn/Softmax/sum0", "attn/context/MatMul/cache1"} <= names
    # (the new token's exp(s - m) is recomputed where it is read: `fuse.py`, rule 5)
    assert not {"attn/Softmax", "attn/scores/MatMul/cache", "attn/Softmax/exp1"} & names


def _masked_attention() -> onnx.ModelProto:
    """Scores over two parts (a past of 5 positions and one new), scaled, their rows
    regrouped by a Reshape, a mask added per column, a Softmax, and the context as the
    parts' products summed: the shape a decode step exported with an attention mask has
    after `split_cache_concat`."""
    f = onnx.TensorProto.FLOAT
    nodes = [
        helper.make_node("Concat", ["s0", "s1"], ["s"], axis=-1),
        helper.make_node("Mul", ["s", "half"], ["scaled"]),
        helper.make_node("Reshape", ["scaled", "rows"], ["grouped"]),
        helper.make_node("Add", ["grouped", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("Reshape", ["p", "back"], ["q"]),
        helper.make_node("Slice", ["q", "lo0", "hi0", "ax"], ["q0"]),
        helper.make_node("Slice", ["q", "lo1", "hi1", "ax"], ["q1"]),
        helper.make_node("MatMul", ["q0", "v0"], ["c0"]),
        helper.make_node("MatMul", ["q1", "v1"], ["c1"]),
        helper.make_node("Add", ["c0", "c1"], ["context"])]
    consts = {"half": np.array(0.5, np.float32), "rows": np.array([1, 6, 6]),
              "back": np.array([2, 3, 6]), "lo0": np.array([0]), "hi0": np.array([5]),
              "lo1": np.array([5]), "hi1": np.array([6]), "ax": np.array([-1])}
    graph = helper.make_graph(
        nodes, "masked",
        [helper.make_tensor_value_info(n, f, shape) for n, shape in
         (("s0", [2, 3, 5]), ("s1", [2, 3, 1]), ("mask", [1, 1, 6]), ("v0", [2, 5, 4]),
          ("v1", [2, 1, 4]))],
        [helper.make_tensor_value_info("context", f, [2, 3, 4])],
        [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=8)


def test_a_masked_softmax_is_left_whole() -> None:
    """Elementwise steps between the Concat and the Softmax (a scale, a mask added per
    column) keep the Softmax whole: split, each part's steps would be ops of their own
    where they cannot fold into the parts' matmuls (after the heads' Reshape), and that was
    not measured to pay. The compiled model still matches onnxruntime on a mesh."""
    from t10c.frontend.rewrite import split_softmax_over_parts

    model = _masked_attention()
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: tuple(_dims(v)) for v in [*inferred.graph.value_info,
                                                 *inferred.graph.input, *inferred.graph.output]}
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    given = list(model.graph.node)
    assert split_softmax_over_parts(given, constants, shapes, {"context"}, OPSET) == given
    mesh = chip_from_dict({"base": "wse2", "name": "mesh8", "grid": [8, 8], "cores": 64})
    result = run_compiled(compile_model(model, mesh, CompileOptions(dtype="fp32")))
    assert result.ok, result.max_rel_err


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_the_parts_reductions_are_written_for_the_models_opset(opset: int) -> None:
    """The reductions the split writes take their axes as the model's opset wants them (an
    attribute before opset 13 for ReduceSum and 18 for ReduceMax, an input after): the ONNX
    checker accepts the rewritten model, onnxruntime computes what the model does, and so
    does the compiled model on a mesh. Before opset 13 a Softmax over its last axis, named
    explicitly, is split too."""
    from t10c.frontend.rewrite import split_softmax_over_parts

    f = onnx.TensorProto.FLOAT
    nodes = [helper.make_node("Concat", ["s0", "s1"], ["s"], axis=-1),
             helper.make_node("Softmax", ["s"], ["p"], axis=2),
             helper.make_node("Slice", ["p", "lo0", "hi0", "ax"], ["p0"]),
             helper.make_node("Slice", ["p", "lo1", "hi1", "ax"], ["p1"]),
             helper.make_node("MatMul", ["p0", "v0"], ["c0"]),
             helper.make_node("MatMul", ["p1", "v1"], ["c1"]),
             helper.make_node("Add", ["c0", "c1"], ["context"])]
    consts = {"lo0": np.array([0]), "hi0": np.array([5]), "lo1": np.array([5]),
              "hi1": np.array([6]), "ax": np.array([2])}
    dims = {"s0": [2, 3, 5], "s1": [2, 3, 1], "v0": [2, 5, 4], "v1": [2, 1, 4]}
    model = helper.make_model(helper.make_graph(
        nodes, "parts", [helper.make_tensor_value_info(n, f, d) for n, d in dims.items()],
        [helper.make_tensor_value_info("context", f, [2, 3, 4])],
        [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()]),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: tuple(_dims(v)) for v in [*inferred.graph.value_info,
                                                 *inferred.graph.input, *inferred.graph.output]}
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    given = set(constants)
    split_nodes = split_softmax_over_parts(list(model.graph.node), constants, shapes,
                                           {"context"}, opset)
    assert "Softmax" not in {n.op_type for n in split_nodes}
    split = onnx.ModelProto()
    split.CopyFrom(model)
    del split.graph.node[:]
    split.graph.node.extend(split_nodes)
    split.graph.initializer.extend(onnx.numpy_helper.from_array(v, k)
                                   for k, v in constants.items() if k not in given)
    onnx.checker.check_model(split, full_check=True)
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(d).astype(np.float32) for n, d in dims.items()}
    want, = _session(model).run(None, feeds)
    got, = _session(split).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    mesh = chip_from_dict({"base": "wse2", "name": "mesh8", "grid": [8, 8], "cores": 64})
    result = run_compiled(compile_model(model, mesh, CompileOptions(dtype="fp32")))
    assert result.ok, result.max_rel_err


def test_a_softmax_not_over_the_parts_alone_is_left_whole() -> None:
    """A Softmax over a Concat stays one when its result is sliced across the parts, or the
    Concat is read by anything else."""
    from t10c.frontend.rewrite import split_softmax_over_parts

    def nodes(cut: tuple[int, int], also_read: bool) -> list[onnx.NodeProto]:
        made = [helper.make_node("Concat", ["a", "b"], ["ab"], axis=-1),
                helper.make_node("Softmax", ["ab"], ["p"], axis=-1),
                helper.make_node("Slice", ["p", "lo", "hi", "ax"], ["p0"])]
        return made + ([helper.make_node("Neg", ["ab"], ["n"])] if also_read else [])

    shapes = {"a": (2, 6), "b": (2, 1), "ab": (2, 7), "p": (2, 7), "p0": (2, 6), "n": (2, 7)}
    for cut, also_read, split in (((0, 6), False, True), ((0, 5), False, False),
                                  ((1, 7), False, False), ((0, 6), True, False)):
        constants = {"lo": np.array([cut[0]]), "hi": np.array([cut[1]]), "ax": np.array([1])}
        given = nodes(cut, also_read)
        got = split_softmax_over_parts(given, constants, dict(shapes), {"p0"}, OPSET)
        assert ("Softmax" not in {n.op_type for n in got}) == split, (cut, also_read)
        if not split:
            assert got == given


def test_a_broadcast_that_is_no_head_repeat_is_left_alone() -> None:
    """Graphs without a head repeat before a matmul's matrix are not touched: BERT's, and a
    MatMul whose operand's Reshape merges the repeated axis with a size-1 one too."""
    from onnx import helper

    bert = build("bert-tiny")
    assert [n.name for n in _folded(bert).graph.node] == [n.name for n in bert.graph.node]
    f = onnx.TensorProto.FLOAT
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"], name="e"),
             helper.make_node("Reshape", ["e", "merged"], ["r"], name="r"),
             helper.make_node("MatMul", ["a", "r"], ["y"], name="mm")]
    graph = helper.make_graph(
        nodes, "not-a-repeat", [helper.make_tensor_value_info("x", f, [2, 1, 1, 4, 8]),
                            helper.make_tensor_value_info("a", f, [6, 3, 4])],
        [helper.make_tensor_value_info("y", f, None)],
        [onnx.numpy_helper.from_array(np.array([2, 3, 1, 4, 8]), "shape"),
         onnx.numpy_helper.from_array(np.array([6, 4, 8]), "merged")])
    two = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert [n.name for n in _folded(two).graph.node] == ["e", "r", "mm"]


def test_the_repeat_folds_through_a_dynamo_exports_views_and_scale() -> None:
    """torch.dynamo's export of HF LLaMA flattens the repeated keys' heads into the batch,
    transposes, reshapes back and scales them by a scalar before the scores' MatMul: that
    chain amounts to ``k^T`` times a scalar, so the repeat still folds (the scale moves to
    the product) and no Expand is left on chip; test_fixtures checks its outputs."""
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "llama-hf-mask-dynamic.onnx"
    model = onnx.load(path)
    assert sum(n.op_type == "Expand" and "expand" in n.name for n in model.graph.node) == 4
    graph = to_graph(model, pinned={"input_ids": (2, 16), "attention_mask": (2, 16)})
    assert not any("expand" in op.source for op in graph.ops)


def test_view_chains_are_told_apart_by_where_the_elements_go() -> None:
    """`_views_as`: the zoo's chain by its shapes alone (any size), a dynamo-style chain by
    the elements' positions; a chain that moves elements otherwise, or one too large to
    check position by position, is not folded."""
    from t10c.frontend.rewrite import VIEW_CHECK_ELEMENTS, _views_as

    big, merged = (2, 2, 3, 5, 4), (2, 6, 5, 4)
    assert _views_as(big, merged, (("Reshape", merged, ()),)) is False
    assert _views_as(big, merged, (("Reshape", merged, ()),
                                   ("Transpose", (2, 6, 4, 5), (0, 1, 3, 2)))) is True
    dynamo = (("Reshape", (12, 5, 4), ()), ("Transpose", (12, 4, 5), (0, 2, 1)),
              ("Reshape", (2, 6, 4, 5), ()))
    assert _views_as(big, merged, dynamo) is True
    assert _views_as(big, merged, (("Reshape", (2, 6, 4, 5), ()),)) is None  # not a swap
    huge = (1, 8, 4, VIEW_CHECK_ELEMENTS // 32 + 1, 1)
    flat = (1, 32, huge[3], 1)
    assert _views_as(huge, flat, (("Reshape", flat, ()),)) is False
    assert _views_as(huge, flat, (("Reshape", (32, huge[3], 1), ()),
                                  ("Reshape", flat, ()))) is None


def test_a_mesh_decode_step_grows_its_cache_in_place() -> None:
    """On a mesh (no DRAM) the ``present`` caches are grown in place too (`grow_in_place`):
    the Concats are no ops, the host is given the new entries alone (`Store.index`, the rest
    being the ``past`` input it holds), and the step's outputs still match onnxruntime, the
    per-core reference executor's exactly."""
    chip = chip_from_dict({"base": "wse2", "name": "mesh8", "grid": [8, 8], "cores": 64})
    model = build_llama_decode(TINY.hidden, TINY.layers, TINY.heads, TINY.kv_heads,
                               TINY.intermediate, vocab=512, past_len=16, batch=2)
    compiled = compile_model(model, chip, CompileOptions(dtype="fp32"))
    graph, program = compiled.graph, compiled.program
    presents = [t for t in graph.outputs if t.startswith("present")]
    assert sorted(graph.appends) == sorted(presents)
    assert not any(op.name.endswith("cache/Concat") for op in graph.ops)
    stores = {i.tensor: i for i in program.instrs if isinstance(i, Store)}
    for t in presents:
        grown = graph.appends[t]
        assert stores[t].base == grown.base and grown.length == 16
        assert len(stores[t].index) == graph.tensors[grown.rows].numel == 2 * TINY.kv_heads * (
            TINY.hidden // TINY.heads)
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err
    inputs = make_inputs(graph, seed=0)
    for t in presents:
        np.testing.assert_array_equal(result.outputs[t][:, :, :16], inputs[graph.appends[t].base])
    want = run_reference(program, chip, inputs, graph.constants)
    for name, got in result.outputs.items():
        np.testing.assert_array_equal(got, want[name], err_msg=name)
    # the verifier refuses a stored element outside the tensor and a base that is no input
    k, store = next((k, i) for k, i in enumerate(program.instrs)
                    if isinstance(i, Store) and i.index is not None)
    size = math.prod(store.shape)
    for bad, words in ((dataclasses.replace(store, index=store.index + size), "index holds"),
                       (dataclasses.replace(store, base="nothing"), "'nothing' is not an input")):
        instrs = program.instrs[:k] + (bad,) + program.instrs[k + 1:]
        with pytest.raises(ProgramError, match=words):
            verify_program(dataclasses.replace(program, instrs=instrs), chip)
