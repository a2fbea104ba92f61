"""Op tests, convolution, pooling, normalisation, softmax and reductions, checked against
onnxruntime like `test_ops`; and the shapes the frontend gives decomposed patterns (LayerNorm
and RMSNorm written with ReduceMean, BatchNormalization after Conv).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import ModelProto, TensorProto, helper
from ophelpers import CHIPS, Build, Case, G, case_model, check_case, with_fp16

from t10c.driver import CompileOptions, compile_model, make_inputs, run_compiled
from t10c.frontend import to_graph


def conv(cout: int, cin_per_group: int, *kernel: int, bias: bool = True,
         **attrs: object) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = [x[0], g.weight(cout, cin_per_group, *kernel)] + ([g.weight(cout)] if bias else [])
        return g.node("Conv", *ins, **attrs)
    return build


def conv_transpose(cin: int, cout_per_group: int, *kernel: int, bias: bool = True,
                   **attrs: object) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = [x[0], g.weight(cin, cout_per_group, *kernel)] + ([g.weight(cout_per_group *
                                                                         attrs.get("group", 1))]
                                                               if bias else [])
        return g.node("ConvTranspose", *ins, **attrs)
    return build


def pool(op: str, **attrs: object) -> Build:
    return lambda g, x: g.node(op, x[0], **attrs)


def batchnorm(channels: int) -> Build:
    def build(g: G, x: list[str]) -> str:
        rng = np.random.default_rng(7)
        scale, bias, mean = (g.const(rng.standard_normal(channels)) for _ in range(3))
        var = g.const(rng.uniform(0.5, 2.0, channels))
        return g.node("BatchNormalization", x[0], scale, bias, mean, var, epsilon=1e-3)
    return build


def conv_bn_relu(g: G, x: list[str]) -> str:
    """ResNet's stem: Conv (no bias), BatchNormalization, Relu, MaxPool."""
    y = conv(6, 3, 3, 3, bias=False, pads=[1, 1, 1, 1], strides=[2, 2])(g, x)
    y = g.node("Relu", batchnorm(6)(g, [y]))
    return g.node("MaxPool", y, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])


def instance_norm(g: G, x: list[str]) -> str:
    return g.node("InstanceNormalization", x[0], g.weight(3), g.weight(3), epsilon=1e-4)


def reduce(op: str, axes: list[int] | None, keepdims: int = 1, opset: int = 18) -> Build:
    def build(g: G, x: list[str]) -> str:
        if axes is None:
            return g.node(op, x[0], keepdims=keepdims)
        takes_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
        if takes_input:
            return g.node(op, x[0], g.ints(*axes), keepdims=keepdims)
        return g.node(op, x[0], axes=axes, keepdims=keepdims)
    return build


def softmax(op: str, axis: int) -> Build:
    return lambda g, x: g.node(op, x[0], axis=axis)


def layernorm_decomposed(g: G, x: list[str]) -> str:
    """LayerNorm as a TorchScript export writes it: ReduceMean, Sub, Pow, ReduceMean, Add,
    Sqrt, Div, Mul, Add."""
    mean = g.node("ReduceMean", x[0], axes=[-1])
    centred = g.node("Sub", x[0], mean)
    var = g.node("ReduceMean", g.node("Pow", centred, g.const(2.0)), axes=[-1])
    std = g.node("Sqrt", g.node("Add", var, g.const(1e-5)))
    normed = g.node("Div", centred, std)
    return g.node("Add", g.node("Mul", normed, g.weight(8)), g.weight(8))


def rmsnorm_decomposed(g: G, x: list[str]) -> str:
    """LLaMA's RMSNorm: x * 1/sqrt(mean(x^2) + eps) * weight."""
    var = g.node("ReduceMean", g.node("Pow", x[0], g.const(2.0)), axes=[-1])
    inv = g.node("Reciprocal", g.node("Sqrt", g.node("Add", var, g.const(1e-6))))
    return g.node("Mul", g.weight(8), g.node("Mul", x[0], inv))


def softmax_fully_masked(g: G, x: list[str]) -> str:
    """Rows masked with float32's lowest value, one of them entirely: uniform in float32, and
    must stay so when fp16 storage turns the mask value into -inf."""
    mask = g.const([[1, 1, 0, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], np.bool_)
    scores = g.node("Where", mask, x[0], g.const(float(np.finfo(np.float32).min)))
    return g.node("Softmax", scores, axis=-1)


def softmax_decomposed(g: G, x: list[str]) -> str:
    mx = g.node("ReduceMax", x[0], axes=[-1])
    e = g.node("Exp", g.node("Sub", x[0], mx))
    return g.node("Div", e, g.node("ReduceSum", e, g.ints(-1)))


def maxpool_indices(**attrs: object) -> Build:
    """MaxPool's both outputs, the Indices (int64) as floats for the comparison."""
    def build(g: G, x: list[str]) -> list[str]:
        y, indices = g.multi("MaxPool", 2, x[0], **attrs)
        return [y, g.node("Cast", indices, to=1)]
    return build


FP32_CASES: list[Case] = [
    # convolution
    Case("Conv2d", conv(4, 3, 3, 3), ((2, 3, 7, 6),)),
    Case("Conv2d-stride-pad", conv(4, 3, 3, 3, strides=[2, 2], pads=[1, 1, 1, 1]),
         ((1, 3, 7, 7),)),
    Case("Conv2d-asym-pad-dilation", conv(2, 3, 3, 2, pads=[2, 0, 1, 1], dilations=[2, 1]),
         ((1, 3, 8, 6),)),
    Case("Conv2d-groups", conv(6, 2, 3, 3, group=2, pads=[1, 1, 1, 1]), ((1, 4, 5, 5),)),
    Case("Conv2d-depthwise", conv(4, 1, 3, 3, group=4, strides=[2, 2], pads=[1, 1, 1, 1]),
         ((2, 4, 6, 6),)),
    Case("Conv2d-depthwise-multiplier", conv(8, 1, 3, 3, group=4, bias=False),
         ((1, 4, 5, 5),)),
    Case("Conv2d-1x1", conv(5, 3, 1, 1), ((2, 3, 4, 4),)),
    Case("Conv2d-1x1-stride2", conv(5, 3, 1, 1, strides=[2, 2], bias=False), ((1, 3, 5, 5),)),
    Case("Conv2d-same-upper", conv(2, 3, 3, 3, auto_pad="SAME_UPPER", strides=[2, 2]),
         ((1, 3, 6, 5),)),
    Case("Conv2d-same-lower", conv(2, 3, 2, 2, auto_pad="SAME_LOWER"), ((1, 3, 5, 5),)),
    Case("Conv2d-valid", conv(2, 3, 3, 3, auto_pad="VALID", strides=[1, 2]), ((1, 3, 6, 7),)),
    Case("Conv2d-patchify", conv(8, 3, 4, 4, strides=[4, 4]), ((1, 3, 8, 12),)),
    Case("Conv1d", conv(4, 2, 3, pads=[1, 1]), ((2, 2, 9),)),
    Case("Conv3d", conv(2, 2, 2, 3, 2, pads=[1, 0, 1, 1, 1, 0]), ((1, 2, 3, 4, 4),)),
    Case("ConvTranspose2d-stride2", conv_transpose(3, 2, 3, 3, strides=[2, 2],
                                                   pads=[1, 1, 1, 1],
                                                   output_padding=[1, 1]), ((1, 3, 4, 5),)),
    Case("ConvTranspose2d-stride1", conv_transpose(3, 4, 3, 2, pads=[1, 0, 1, 0]),
         ((2, 3, 4, 4),)),
    Case("ConvTranspose2d-dilation", conv_transpose(2, 2, 3, 3, strides=[3, 2],
                                                    dilations=[2, 1], bias=False),
         ((1, 2, 3, 3),)),
    Case("ConvTranspose2d-groups", conv_transpose(4, 3, 2, 2, strides=[2, 2], group=2),
         ((1, 4, 3, 3),)),
    Case("ConvTranspose1d-output-shape", conv_transpose(2, 3, 4, strides=[2],
                                                        output_shape=[9]), ((1, 2, 5),)),
    Case("ConvTranspose2d-same-upper", conv_transpose(2, 2, 3, 3, strides=[2, 2],
                                                      auto_pad="SAME_UPPER"), ((1, 2, 3, 4),)),
    Case("ConvTranspose-computed-weight",
         lambda g, x: g.node("ConvTranspose", x[0], g.node("Relu", x[1]), strides=[2]),
         ((1, 2, 4), (2, 3, 2))),
    # pooling
    Case("MaxPool-indices", maxpool_indices(kernel_shape=[2, 2], strides=[2, 2]),
         ((1, 2, 4, 6),)),
    Case("MaxPool-indices-pad", maxpool_indices(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         ((2, 2, 5, 5),)),
    Case("MaxPool-3x3-s2-p1", pool("MaxPool", kernel_shape=[3, 3], strides=[2, 2],
                                   pads=[1, 1, 1, 1]), ((2, 3, 7, 7),)),
    Case("MaxPool-2x2", pool("MaxPool", kernel_shape=[2, 2], strides=[2, 2]), ((1, 2, 6, 4),)),
    Case("MaxPool-ceil", pool("MaxPool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
         ((1, 2, 6, 6),)),
    Case("MaxPool-dilation-pad", pool("MaxPool", kernel_shape=[2, 2], dilations=[2, 2],
                                      pads=[1, 0, 1, 1]), ((1, 2, 5, 5),)),
    Case("MaxPool-1d-same", pool("MaxPool", kernel_shape=[3], strides=[2],
                                 auto_pad="SAME_UPPER"), ((2, 3, 8),)),
    Case("AveragePool-pad-exclude", pool("AveragePool", kernel_shape=[3, 3], strides=[2, 2],
                                         pads=[1, 1, 1, 1]), ((1, 2, 7, 7),)),
    Case("AveragePool-pad-include", pool("AveragePool", kernel_shape=[3, 3], strides=[1, 1],
                                         pads=[1, 1, 1, 1], count_include_pad=1),
         ((1, 2, 5, 5),)),
    Case("AveragePool-ceil", pool("AveragePool", kernel_shape=[2, 2], strides=[2, 2],
                                  ceil_mode=1), ((1, 2, 5, 5),)),
    Case("AveragePool-2x2", pool("AveragePool", kernel_shape=[2, 2], strides=[2, 2]),
         ((2, 3, 4, 6),)),
    Case("GlobalAveragePool", "GlobalAveragePool", ((2, 3, 4, 5),)),
    Case("GlobalMaxPool", "GlobalMaxPool", ((2, 3, 4, 5),)),
    # normalisation
    Case("LRN", lambda g, x: g.node("LRN", x[0], size=3, alpha=0.01, beta=0.6, bias=1.5),
         ((2, 5, 3, 4),)),
    Case("LRN-size5", lambda g, x: g.node("LRN", x[0], size=5), ((1, 6, 5, 3),)),
    Case("BatchNormalization", batchnorm(3), ((2, 3, 4, 4),)),
    Case("BatchNormalization-2d", batchnorm(3), ((4, 3),)),
    Case("Conv-BN-Relu-MaxPool", conv_bn_relu, ((1, 3, 9, 9),)),
    Case("InstanceNormalization", instance_norm, ((2, 3, 4, 5),)),
    Case("LayerNorm-decomposed", layernorm_decomposed, ((2, 3, 8),), opset=13),
    Case("RMSNorm-decomposed", rmsnorm_decomposed, ((2, 3, 8),), opset=13),
    # reductions
    Case("ReduceMean-keepdims", reduce("ReduceMean", [-1]), ((2, 3, 5),), opset=18),
    Case("ReduceMean-13-attr", reduce("ReduceMean", [0, 2], 0, opset=13), ((2, 3, 5),),
         opset=13),
    Case("ReduceSum-13-input", reduce("ReduceSum", [1], 0, opset=13), ((2, 3, 5),), opset=13),
    Case("ReduceSum-all", reduce("ReduceSum", None), ((2, 3, 5),), opset=18),
    Case("ReduceMax", reduce("ReduceMax", [1], 0), ((2, 3, 5),), opset=18),
    Case("ReduceMin", reduce("ReduceMin", [-1]), ((2, 3, 5),), opset=18),
    Case("ReduceSumSquare", reduce("ReduceSumSquare", [0], 0), ((4, 3),), opset=18),
    Case("ReduceL2", reduce("ReduceL2", [1]), ((4, 3),), opset=18),
    # softmax
    Case("Softmax-11-coerced", softmax("Softmax", 1), ((2, 3, 4),), opset=11),
    Case("LogSoftmax", softmax("LogSoftmax", -1), ((3, 7),)),
    Case("LogSoftmax-11-coerced", softmax("LogSoftmax", 1), ((2, 3, 4),), opset=11),
    Case("Softmax-decomposed", softmax_decomposed, ((3, 7),)),
    Case("Softmax-fully-masked-row", softmax_fully_masked, ((2, 3, 5),)),
]

CASES = with_fp16(FP32_CASES)


@pytest.mark.parametrize("chip", list(CHIPS), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_nn_op_matches_onnxruntime(case: Case, chip: str) -> None:
    check_case(case, chip)


def test_case_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names)


def _kinds(name: str) -> list[str]:
    case = next(c for c in FP32_CASES if c.name == name)
    return [op.kind for op in to_graph(case_model(case)).ops]


def test_decomposed_layernorm_is_reduce_reduce_elementwise() -> None:
    assert _kinds("LayerNorm-decomposed") == ["reduce", "reduce", "elementwise"]


def test_decomposed_rmsnorm_is_reduce_elementwise() -> None:
    assert _kinds("RMSNorm-decomposed") == ["reduce", "elementwise"]


def test_decomposed_softmax_is_like_softmax() -> None:
    assert _kinds("Softmax-decomposed") == ["reduce", "reduce", "elementwise"]


def test_batchnorm_folds_into_conv() -> None:
    # Conv with the bias and Relu as its epilogue, then the pool: no BatchNormalization op
    model = case_model(next(c for c in FP32_CASES if c.name == "Conv-BN-Relu-MaxPool"))
    graph = to_graph(model)
    assert [op.kind for op in graph.ops] == ["contraction", "reduce"]
    assert graph.ops[0].epilogue is not None
    plain = to_graph(model, epilogues=False)
    assert [op.kind for op in plain.ops] == ["contraction", "elementwise", "reduce"]
    assert not any("BatchNormalization" in op.source for op in graph.ops)


def _scaled_matmuls(also_added: bool) -> ModelProto:
    """x * g read by two MatMuls with constant weights (RMSNorm's weight before q and k), and
    with ``also_added`` by an Add as well."""
    rng = np.random.default_rng(0)
    init = [helper.make_tensor(n, TensorProto.FLOAT, v.shape, v.ravel()) for n, v in (
        ("g", rng.normal(1, 0.1, 16).astype(np.float32)),
        ("w1", rng.normal(0, 0.3, (16, 8)).astype(np.float32)),
        ("w2", rng.normal(0, 0.3, (16, 12)).astype(np.float32)))]
    nodes = [helper.make_node("Mul", ["x", "g"], ["s"]),
             helper.make_node("MatMul", ["s", "w1"], ["y1"]),
             helper.make_node("MatMul", ["s", "w2"], ["y2"])]
    outs = [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [4, 8]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, [4, 12])]
    if also_added:
        nodes.append(helper.make_node("Add", ["s", "x"], ["z"]))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 16]))
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 16])], outs, init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_scale_read_only_by_matmuls_folds_into_their_weights(dtype: str) -> None:
    """``(x * g) @ W = x @ (g[:, None] * W)`` (`rewrite.fold_scale_into_matmuls`): the Mul
    disappears when only matmuls with constant weights read it, and stays when anything else
    does; both compile to the outputs onnxruntime gives."""
    folded, kept = _scaled_matmuls(False), _scaled_matmuls(True)
    assert [op.kind for op in to_graph(folded).ops] == ["contraction", "contraction"]
    assert "elementwise" in [op.kind for op in to_graph(kept).ops]
    for model in (folded, kept):
        result = run_compiled(compile_model(model, CHIPS["test16"], CompileOptions(dtype=dtype)))
        assert result.ok, result.max_rel_err


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_maxpool_indices_are_exact_beyond_fp16_integers(dtype: str) -> None:
    # positions up to 3199: fp16 holds integers exactly only up to 2048, so the relative error
    # of `check_case` would hide an off-by-one; the int64 indices must equal onnxruntime's
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "mp", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 2, 40, 40])], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 20, 20]),
        helper.make_tensor_value_info("i", TensorProto.INT64, [1, 2, 20, 20])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    compiled = compile_model(model, CHIPS["test16"], CompileOptions(dtype=dtype))
    result = run_compiled(compiled)
    got, want = result.outputs["i"], result.reference["i"]
    assert want.max() > 2048
    if dtype == "fp32":
        np.testing.assert_array_equal(got, want)
        return
    # fp16 storage rounds x, so two window elements may tie where float32 tells them apart:
    # then the first is the answer; every other index must be onnxruntime's
    x = make_inputs(compiled.graph)["x"].reshape(-1).astype(np.float16)
    differ = got != want
    assert differ.mean() < 0.01
    np.testing.assert_array_equal(x[got[differ].astype(np.int64)], x[want[differ]])
    assert (got[differ] < want[differ]).all()
