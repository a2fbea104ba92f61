"""The lowering registry: one module-level function per (op type, since version), named after
its op, attributes checked against its signature, and bugs inside a lowering not mistaken for
unsupported attributes."""

from __future__ import annotations

import importlib

import onnx
import pytest
from onnx import TensorProto, helper

from t10c.frontend import REGISTRY, UnsupportedModelError, to_graph
from t10c.frontend.context import Context, register


def _model(node: onnx.NodeProto, shape: tuple[int, ...] = (3, 4)) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_every_lowering_is_a_module_level_function_named_after_its_op() -> None:
    for op_type, lowerings in REGISTRY.items():
        assert [low.since for low in lowerings] == sorted({low.since for low in lowerings})
        for low in lowerings:
            fn = low.fn
            assert "<locals>" not in fn.__qualname__, f"{op_type}: {fn.__qualname__} is a closure"
            assert fn.__name__ == op_type or fn.__name__.startswith(f"{op_type}_"), fn.__name__
            module = importlib.import_module(fn.__module__)
            assert getattr(module, fn.__name__) is fn, f"{fn.__name__} is not {fn.__module__}'s"


def test_register_refuses_a_misnamed_or_repeated_lowering() -> None:
    def lower(ctx: Context, node: onnx.NodeProto) -> None: ...

    with pytest.raises(ValueError, match="named lower"):
        register("Relu", 99)(lower)
    with pytest.raises(ValueError, match="registered twice"):
        register("Relu", REGISTRY["Relu"][0].since)(REGISTRY["Relu"][0].fn)


def test_attributes_are_keyword_arguments_with_onnx_defaults() -> None:
    low = REGISTRY["LeakyRelu"][-1]
    assert low.attributes == frozenset({"alpha"})
    assert REGISTRY["Constant"][-1].attributes is None  # any one value attribute


def test_an_attribute_the_lowering_does_not_take_is_reported_by_name(monkeypatch) -> None:
    # valid ONNX (the checker rejects attributes outside the op's schema), but a lowering
    # that takes no ``alpha``: its signature decides, before it is called
    called = []

    def LeakyRelu(ctx: Context, node: onnx.NodeProto) -> None:
        called.append(node)

    low = REGISTRY["LeakyRelu"][-1]
    monkeypatch.setitem(REGISTRY, "LeakyRelu", [])
    register("LeakyRelu", low.since)(LeakyRelu)
    node = helper.make_node("LeakyRelu", ["x"], ["y"], name="r", alpha=0.2)
    with pytest.raises(UnsupportedModelError, match="unsupported attribute alpha"):
        to_graph(_model(node))
    assert not called


def test_a_bug_inside_a_lowering_is_not_an_unsupported_attribute(monkeypatch) -> None:
    low = REGISTRY["Relu"][-1]

    def broken(ctx: Context, node: onnx.NodeProto) -> None:
        raise TypeError("a bug")

    monkeypatch.setitem(REGISTRY, "Relu", [type(low)(low.op_type, low.since, broken,
                                                     frozenset())])
    with pytest.raises(TypeError, match="a bug"):
        to_graph(_model(helper.make_node("Relu", ["x"], ["y"])))


def test_each_version_keeps_its_semantics() -> None:
    # Softmax before opset 13 normalises over every dimension from `axis` on
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    model = _model(node, (2, 3, 4))
    model.opset_import[0].version = 11
    graph = to_graph(model, fuse=False)
    reduced = {a for op in graph.ops if op.combine == "max" for a in op.reduction_axes}
    assert len(reduced) == 2
    model.opset_import[0].version = 13
    graph = to_graph(model, fuse=False)
    assert len({a for op in graph.ops if op.combine == "max" for a in op.reduction_axes}) == 1
