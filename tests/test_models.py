"""Zoo tests: every small model passes the checker, runs on onnxruntime, reproduces.

Only the tiny sizes are built here (bert-large is ~1.3 GB of weights, llama-360m ~1.4 GB);
``tests/test_zoo.py`` compiles and emulates them.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from t10c.models import (
    BERT_SIZES,
    GPT2_SIZES,
    LLAMA_DECODE_SIZES,
    LLAMA_SIZES,
    RESNET_SIZES,
    VIT_SIZES,
    ZOO_NAMES,
    UnknownModelError,
    build,
    build_bert,
    build_llama,
    is_zoo_name,
)
from t10c.models._builder import GraphBuilder

VOCAB = 30522


@dataclass(frozen=True)
class Case:
    """One small zoo build and what its graph must look like."""

    name: str
    seq_len: int
    batch: int | None
    input_name: str
    input_shape: tuple[int, ...]
    output_name: str
    output_shape: tuple[int, ...]
    op_types: frozenset[str]


CASES = [
    Case(
        "mlp", 128, None, "x", (16, 784), "logits", (16, 10),
        frozenset({"MatMul", "Add", "Relu"}),
    ),
    Case(
        "mlp", 128, 3, "x", (3, 784), "logits", (3, 10),
        frozenset({"MatMul", "Add", "Relu"}),
    ),
    Case(
        "bert-tiny", 16, None, "input_ids", (1, 16), "last_hidden_state", (1, 16, 128),
        frozenset({
            "Gather", "Slice", "Add", "LayerNormalization", "MatMul", "Reshape",
            "Transpose", "Mul", "Softmax", "Div", "Erf",
        }),
    ),
    Case(
        "bert-tiny", 8, 2, "input_ids", (2, 8), "last_hidden_state", (2, 8, 128),
        frozenset({
            "Gather", "Slice", "Add", "LayerNormalization", "MatMul", "Reshape",
            "Transpose", "Mul", "Softmax", "Div", "Erf",
        }),
    ),
]  # fmt: skip


CASES += [
    Case(
        "gpt2-tiny", 16, None, "input_ids", (1, 16), "logits", (1, 16, 50257),
        frozenset({
            "Range", "Gather", "Add", "LayerNormalization", "MatMul", "Split", "Reshape",
            "Transpose", "Mul", "ConstantOfShape", "Trilu", "Cast", "Where", "Softmax", "Pow",
            "Tanh",
        }),
    ),
    Case(
        "gpt2-tiny", 8, 2, "input_ids", (2, 8), "logits", (2, 8, 50257),
        frozenset({
            "Range", "Gather", "Add", "LayerNormalization", "MatMul", "Split", "Reshape",
            "Transpose", "Mul", "ConstantOfShape", "Trilu", "Cast", "Where", "Softmax", "Pow",
            "Tanh",
        }),
    ),
    Case(
        "vit-tiny", 0, None, "pixel_values", (1, 3, 32, 32), "logits", (1, 10),
        frozenset({
            "Conv", "Reshape", "Transpose", "Expand", "Concat", "Add", "LayerNormalization",
            "MatMul", "Mul", "Softmax", "Div", "Erf", "Gather",
        }),
    ),
    Case(
        "llama-tiny", 16, None, "input_ids", (1, 16), "logits", (1, 16, 32000),
        frozenset({
            "Gather", "Range", "Cast", "Unsqueeze", "Mul", "Concat", "Cos", "Sin",
            "ConstantOfShape", "Trilu", "Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal",
            "MatMul", "Reshape", "Transpose", "Slice", "Neg", "Expand", "Where", "Softmax",
            "Sigmoid",
        }),
    ),
    Case(
        "resnet-tiny", 0, 2, "pixel_values", (2, 3, 64, 64), "logits", (2, 10),
        frozenset({
            "Conv", "BatchNormalization", "Relu", "MaxPool", "Add", "GlobalAveragePool",
            "Flatten", "Gemm",
        }),
    ),
]  # fmt: skip


def _random_input(case: Case, rng: np.random.Generator) -> np.ndarray:
    if case.input_name == "input_ids":
        vocab = 32000 if case.name.startswith("llama") else VOCAB
        return rng.integers(0, vocab, size=case.input_shape, dtype=np.int64)
    return rng.standard_normal(case.input_shape, dtype=np.float32)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c.name}-b{c.batch}-s{c.seq_len}"
)
def test_builds_checks_and_runs(case: Case) -> None:
    model = build(case.name, seq_len=case.seq_len, batch=case.batch)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert {n.op_type for n in model.graph.node} == case.op_types
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert [i.name for i in model.graph.input] == [case.input_name]
    assert [o.name for o in model.graph.output] == [case.output_name]

    feed = _random_input(case, np.random.default_rng(1))
    (out,) = _run(model, {case.input_name: feed})
    assert out.shape == case.output_shape
    assert out.dtype == np.float32
    assert np.isfinite(out).all()


@pytest.mark.parametrize(("name", "seq_len"), [
    ("mlp", 128), ("bert-tiny", 16), ("gpt2-tiny", 8), ("vit-tiny", 8), ("llama-tiny", 8),
    ("llama-tiny-decode", 8), ("resnet-tiny", 8),
])
def test_build_is_deterministic(name: str, seq_len: int) -> None:
    first = build(name, seq_len=seq_len).SerializeToString()
    assert build(name, seq_len=seq_len).SerializeToString() == first
    assert build(name, seq_len=seq_len, seed=1).SerializeToString() != first


def test_unknown_name_lists_known_models() -> None:
    with pytest.raises(UnknownModelError) as info:
        build("resnet-51")
    assert isinstance(info.value, ValueError)
    for known in ZOO_NAMES:
        assert known in str(info.value)


def test_zoo_names() -> None:
    assert ZOO_NAMES == ("mlp", "bert-tiny", "bert-mini", "bert-base", "bert-large",
                         "gpt2-tiny", "gpt2", "gpt2-medium", "gpt2-xl", "vit-tiny", "vit-base",
                         "llama-tiny", "llama-135m", "llama-360m", "llama3-8b", "llama2-13b",
                         "llama2-70b", "llama-tiny-decode", "llama-135m-decode",
                         "llama-360m-decode", "llama3-8b-decode", "llama2-13b-decode",
                         "llama2-70b-decode", "resnet-tiny", "resnet50")
    assert set(ZOO_NAMES) == {"mlp", *BERT_SIZES, *GPT2_SIZES, *VIT_SIZES, *LLAMA_SIZES,
                              *LLAMA_DECODE_SIZES, *RESNET_SIZES}
    assert all(is_zoo_name(n) for n in ZOO_NAMES)
    assert not is_zoo_name("model.onnx")
    assert all(is_zoo_name(n) for n in ("resnet", "vit", "llama", "llama-decode"))


def test_shape_only_builds_are_light_and_plannable() -> None:
    """Without weights a model keeps its shapes (and folds, plans and compiles) but has no
    data: gpt2-xl, 1.5B parameters, builds in a couple of megabytes."""
    from t10c.frontend import has_weights, to_graph

    model = build("gpt2-xl", weights=False, seq_len=8)
    assert model.ByteSize() < 8_000_000
    tiny = to_graph(build("bert-tiny", weights=False, seq_len=8))
    assert not has_weights(tiny)
    assert has_weights(to_graph(build("bert-tiny", seq_len=8)))
    assert tiny.constants["word_embeddings"].shape == (30522, 128)


def test_bert_layer_structure() -> None:
    """Each extra layer adds the same fixed set of nodes and readable names."""
    one = Counter(
        n.op_type for n in build_bert(32, 1, 2, 64, vocab=50, seq_len=4).graph.node
    )
    two = Counter(
        n.op_type for n in build_bert(32, 2, 2, 64, vocab=50, seq_len=4).graph.node
    )
    per_layer = two - one
    assert per_layer == Counter(
        MatMul=8, Add=9, Reshape=4, Transpose=4, Mul=3, Softmax=1, Div=1, Erf=1,
        LayerNormalization=2,
    )  # fmt: skip
    model = build_bert(32, 2, 2, 64, vocab=50, seq_len=4)
    inits = {t.name for t in model.graph.initializer}
    assert {
        "layer1.attn.q.weight",
        "layer1.ffn.down.bias",
        "position_embeddings",
    } <= inits
    assert "layer1/attn/k/Transpose" in {n.name for n in model.graph.node}


def _reference_bert(
    model: onnx.ModelProto, ids: np.ndarray, layers: int, heads: int
) -> np.ndarray:
    """BERT in plain numpy (float64) from the model's own initializers."""
    w = {
        t.name: numpy_helper.to_array(t).astype(np.float64)
        for t in model.graph.initializer
    }

    def ln(x: np.ndarray, p: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * w[f"{p}.scale"] + w[f"{p}.bias"]

    def lin(x: np.ndarray, p: str) -> np.ndarray:
        return x @ w[f"{p}.weight"] + w[f"{p}.bias"]

    batch, seq = ids.shape
    x = w["word_embeddings"][ids] + w["position_embeddings"][:seq]
    x = ln(x, "embeddings.ln")
    hidden = x.shape[-1]
    d = hidden // heads
    for i in range(layers):
        p = f"layer{i}.attn"
        q, k, v = (
            lin(x, f"{p}.{n}").reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)
            for n in "qkv"
        )
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = (s / s.sum(-1, keepdims=True)) @ v
        ctx = ctx.transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
        x = ln(lin(ctx, f"{p}.out") + x, f"{p}.ln")
        p = f"layer{i}.ffn"
        u = lin(x, f"{p}.up")
        g = u * 0.5 * (1.0 + np.vectorize(math.erf)(u / math.sqrt(2.0)))
        x = ln(lin(g, f"{p}.down") + x, f"{p}.ln")
    return x


def test_bert_tiny_matches_numpy_reference() -> None:
    size = BERT_SIZES["bert-tiny"]
    model = build("bert-tiny", seq_len=8, batch=2)
    ids = np.random.default_rng(2).integers(0, VOCAB, size=(2, 8), dtype=np.int64)
    (out,) = _run(model, {"input_ids": ids})
    ref = _reference_bert(model, ids, size.layers, size.heads)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": 513}, "seq_len"),
        ({"seq_len": 0}, "seq_len"),
        ({"batch": 0}, "batch"),
    ],
)
def test_bert_rejects_bad_shapes(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build("bert-tiny", **kwargs)


def test_bert_rejects_indivisible_heads() -> None:
    with pytest.raises(ValueError, match="divisible"):
        build_bert(30, 1, 4, 64)


def test_builder_rejects_duplicate_names() -> None:
    b = GraphBuilder()
    x = b.graph_input("x", onnx.TensorProto.FLOAT, [2])
    b.node("Relu", [x], "act/Relu")
    with pytest.raises(ValueError, match="node name"):
        b.node("Relu", [x], "act/Relu")
    with pytest.raises(ValueError, match="tensor name"):
        b.initializer("x", np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="not produced"):
        b.graph_output("y", onnx.TensorProto.FLOAT, [2])


@pytest.mark.parametrize(("name", "size", "params"), [  # name: the family's formula
    ("gpt2", GPT2_SIZES["gpt2"], 124_439_808),
    ("vit-base", VIT_SIZES["vit-base"], 86_567_656),
    ("llama-360m", LLAMA_SIZES["llama-135m"], 134_515_008),
    ("llama-360m", LLAMA_SIZES["llama-360m"], 361_821_120),
    # the model cards' counts: Llama-3-8B 8.03 B, Llama-2-13B 13.0 B, Llama-2-70B 69.0 B
    ("llama-360m", LLAMA_SIZES["llama3-8b"], 8_030_261_248),
    ("llama-360m", LLAMA_SIZES["llama2-13b"], 13_015_864_320),
    ("llama-360m", LLAMA_SIZES["llama2-70b"], 68_976_648_192),
    ("gpt2", GPT2_SIZES["gpt2-medium"], 354_823_168),  # GPT-2 medium, "355M"
    ("resnet50", RESNET_SIZES["resnet50"], 25_557_032),
])
def test_standard_sizes_have_their_parameter_counts(name: str, size: object,
                                                    params: int) -> None:
    """The standard sizes, counted from their shapes without building them (tests never build
    the big models): the published parameter counts."""
    assert _count(name, size) == params


@pytest.mark.parametrize(("family", "tiny", "size"), [
    ("gpt2", "gpt2-tiny", GPT2_SIZES["gpt2-tiny"]),
    ("vit-base", "vit-tiny", VIT_SIZES["vit-tiny"]),
    ("llama-360m", "llama-tiny", LLAMA_SIZES["llama-tiny"]),
    ("llama-360m", "llama-tiny-decode", LLAMA_SIZES["llama-tiny"]),  # the same weights
    ("resnet50", "resnet-tiny", RESNET_SIZES["resnet-tiny"]),
])
def test_parameter_formula_matches_the_builders(family: str, tiny: str, size: object) -> None:
    """The formula above counts what the builders make (checked on the tiny sizes): learned
    weights, not BatchNorm statistics, RoPE frequencies or scalar constants."""
    model = build(tiny, seq_len=8)
    weights = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                  if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) > 1
                  and "running" not in t.name and "inv_freq" not in t.name)
    assert weights == _count(family, size)


def _count(name: str, s) -> int:  # noqa: ANN001
    if name == "gpt2":
        h = s.hidden
        per_layer = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) \
            + (4 * h * h + h)
        return s.vocab * h + s.positions * h + s.layers * per_layer + 2 * h
    if name == "vit-base":
        h, tokens = s.hidden, (s.image // s.patch) ** 2 + 1
        per_layer = 4 * h + 4 * (h * h + h) + (h * s.mlp + s.mlp) + (s.mlp * h + h)
        return (3 * s.patch * s.patch * h + h) + h + tokens * h + s.layers * per_layer + 2 * h \
            + h * s.classes + s.classes
    if name == "llama-360m":
        h, d = s.hidden, s.hidden // s.heads
        per_layer = 2 * h + h * h + 2 * h * s.kv_heads * d + h * h + 3 * h * s.intermediate
        head = 0 if s.tied else s.vocab * h  # an untied output head is a weight of its own
        return s.vocab * h + s.layers * per_layer + h + head
    width_in, total = s.stem, 3 * 49 * s.stem + 2 * s.stem  # stem conv and its BN (scale, bias)
    for stage, (depth, width) in enumerate(zip(s.depths, s.widths)):
        for block in range(depth):
            out = 4 * width
            total += width_in * width + 9 * width * width + width * out + 2 * (2 * width + out)
            if block == 0:
                total += width_in * out + 2 * out
            width_in = out
        del stage
    return total + width_in * s.classes + s.classes


def test_build_llama_and_gpt2_reject_bad_shapes() -> None:
    with pytest.raises(ValueError, match="divisible"):
        build_llama(32, 1, 4, 3, 64)
    with pytest.raises(ValueError, match="seq_len"):
        build("gpt2-tiny", seq_len=2048)



def test_weights_past_the_protobuf_limit_are_refused_in_one_message() -> None:
    from t10c.models import ModelTooLargeError

    with pytest.raises(ModelTooLargeError, match="32.1 GB .* shape-only"):
        build("llama3-8b-decode", seq_len=16)
