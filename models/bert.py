"""A BERT encoder written op by op, shaped like a ``torch.onnx`` export of HF BERT.

No attention mask, no token-type embeddings, no pooler: the graph maps ``input_ids``
int64 [batch, seq] to ``last_hidden_state`` float32 [batch, seq, hidden]. All shapes are
static. Dataflow::

    embeddings  Gather(word_embeddings, input_ids) + Slice(position_embeddings)[:seq]
                -> LayerNormalization
    layer i     attn: q,k,v = x @ W + b -> Reshape [b,s,h,d] -> Transpose
                      (q, v: [b,h,s,d]; k: [b,h,d,s])
                      probs = Softmax((q @ k) * 1/sqrt(d)); ctx = probs @ v
                      -> Transpose [b,s,h,d] -> Reshape [b,s,hidden] -> @ Wo + bo
                      -> Add x -> LayerNormalization
                ffn:  u = x @ W1 + b1; g = u * 0.5 * (1 + Erf(u / sqrt 2))
                      (as Div, Erf, Add, Mul, Mul); g @ W2 + b2 -> Add x
                      -> LayerNormalization

Op types used: Gather, Slice, Add, LayerNormalization, MatMul, Reshape, Transpose, Mul,
Softmax, Div, Erf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx

from ._builder import GraphBuilder, draw, side_by_side, weight_rng
from ._layers import affine

WEIGHT_STD = 0.02
"""Std of every weight, embedding and bias (BERT's ``initializer_range``)."""

LN_EPSILON = 1e-12


@dataclass(frozen=True)
class BertSize:
    """The shape hyper-parameters of one BERT variant."""

    hidden: int
    layers: int
    heads: int
    intermediate: int


BERT_SIZES: MappingProxyType[str, BertSize] = MappingProxyType(
    {
        "bert-tiny": BertSize(hidden=128, layers=2, heads=2, intermediate=512),
        "bert-mini": BertSize(hidden=256, layers=4, heads=4, intermediate=1024),
        "bert-base": BertSize(hidden=768, layers=12, heads=12, intermediate=3072),
        "bert-large": BertSize(hidden=1024, layers=24, heads=16, intermediate=4096),
    }
)
"""Zoo name -> size; the sizes of Google's released BERT checkpoints."""


@dataclass(frozen=True)
class _Constants:
    """Names of the non-weight initializers shared by every layer."""

    split_heads_shape: str
    merge_heads_shape: str
    attn_scale: str
    sqrt2: str
    one: str
    half: str


def _scalar(value: float) -> np.ndarray:
    """A 0-d float32 array, for scalar constants that broadcast against anything."""
    return np.array(value, np.float32)


def _linear(
    b: GraphBuilder,
    rng: np.random.Generator,
    scope: str,
    x: str,
    fan_in: int,
    fan_out: int,
) -> str:
    """``x @ {scope}.weight + {scope}.bias`` with weight [fan_in, fan_out]."""
    weight = draw(rng, (fan_in, fan_out), WEIGHT_STD)
    return affine(b, scope, x, weight, draw(rng, (fan_out,), WEIGHT_STD))


def _layer_norm(
    b: GraphBuilder,
    rng: np.random.Generator,
    scope: str,
    x: str,
    hidden: int,
    output: str | None = None,
) -> str:
    """LayerNormalization over the last axis; scale ~ 1 and bias ~ 0, plus noise."""
    dotted = scope.replace("/", ".")
    scale = b.initializer(
        f"{dotted}.scale", draw(rng, (hidden,), WEIGHT_STD, mean=1.0)
    )
    bias = b.initializer(f"{dotted}.bias", draw(rng, (hidden,), WEIGHT_STD))
    return b.node(
        "LayerNormalization",
        [x, scale, bias],
        f"{scope}/LayerNormalization",
        output=output,
        axis=-1,
        epsilon=LN_EPSILON,
    )


def _embeddings(
    b: GraphBuilder,
    rng: np.random.Generator,
    input_ids: str,
    *,
    vocab: int,
    max_pos: int,
    seq_len: int,
    hidden: int,
) -> str:
    """Token embedding plus the first ``seq_len`` position embeddings, then LN."""
    words = b.initializer("word_embeddings", draw(rng, (vocab, hidden), WEIGHT_STD))
    positions = b.initializer(
        "position_embeddings", draw(rng, (max_pos, hidden), WEIGHT_STD)
    )
    starts = b.initializer("embeddings.position.starts", np.array([0], np.int64))
    ends = b.initializer("embeddings.position.ends", np.array([seq_len], np.int64))
    axes = b.initializer("embeddings.position.axes", np.array([0], np.int64))
    tokens = b.node("Gather", [words, input_ids], "embeddings/word/Gather", axis=0)
    pos = b.node("Slice", [positions, starts, ends, axes], "embeddings/position/Slice")
    x = b.node("Add", [tokens, pos], "embeddings/Add")
    return _layer_norm(b, rng, "embeddings/ln", x, hidden)


def _attention(
    b: GraphBuilder,
    rng: np.random.Generator,
    layer: int,
    x: str,
    c: _Constants,
    hidden: int,
) -> str:
    """Multi-head self-attention with output projection, residual and LayerNorm."""
    scope = f"layer{layer}/attn"
    heads: dict[str, str] = {}
    parts = (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3]))
    # drawn as `_linear` draws them, one part after another; the weights held side by side
    drawn = [(draw(rng, (hidden, hidden), WEIGHT_STD), draw(rng, (hidden,), WEIGHT_STD))
             for _ in parts]
    weights = side_by_side([w for w, _ in drawn])
    for (part, perm), weight, (_, bias) in zip(parts, weights, drawn):
        y = affine(b, f"{scope}/{part}", x, weight, bias, copy=False)
        y = b.node("Reshape", [y, c.split_heads_shape], f"{scope}/{part}/Reshape")
        heads[part] = b.node("Transpose", [y], f"{scope}/{part}/Transpose", perm=perm)
    scores = b.node("MatMul", [heads["q"], heads["k"]], f"{scope}/scores/MatMul")
    scores = b.node("Mul", [scores, c.attn_scale], f"{scope}/scores/Mul")
    probs = b.node("Softmax", [scores], f"{scope}/Softmax", axis=-1)
    ctx = b.node("MatMul", [probs, heads["v"]], f"{scope}/context/MatMul")
    ctx = b.node("Transpose", [ctx], f"{scope}/context/Transpose", perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, c.merge_heads_shape], f"{scope}/context/Reshape")
    out = _linear(b, rng, f"{scope}/out", ctx, hidden, hidden)
    res = b.node("Add", [out, x], f"{scope}/residual/Add")
    return _layer_norm(b, rng, f"{scope}/ln", res, hidden)


def _ffn(
    b: GraphBuilder,
    rng: np.random.Generator,
    layer: int,
    x: str,
    c: _Constants,
    hidden: int,
    intermediate: int,
    output: str | None,
) -> str:
    """Feed-forward block with exact (Erf) GELU, residual and LayerNorm."""
    scope = f"layer{layer}/ffn"
    u = _linear(b, rng, f"{scope}/up", x, hidden, intermediate)
    g = b.node("Div", [u, c.sqrt2], f"{scope}/gelu/Div")
    g = b.node("Erf", [g], f"{scope}/gelu/Erf")
    g = b.node("Add", [g, c.one], f"{scope}/gelu/Add")
    g = b.node("Mul", [u, g], f"{scope}/gelu/Mul")
    g = b.node("Mul", [g, c.half], f"{scope}/gelu/Mul_half")
    d = _linear(b, rng, f"{scope}/down", g, intermediate, hidden)
    res = b.node("Add", [d, x], f"{scope}/residual/Add")
    return _layer_norm(b, rng, f"{scope}/ln", res, hidden, output=output)


def build_bert(
    hidden: int,
    layers: int,
    heads: int,
    intermediate: int,
    *,
    vocab: int = 30522,
    max_pos: int = 512,
    seq_len: int = 128,
    batch: int = 1,
    seed: int = 0,
    name: str = "bert",
    weights: bool = True,
) -> onnx.ModelProto:
    """Build a BERT encoder (see the module docstring for the exact graph).

    Weights are float32 draws from ``numpy.random.default_rng(seed)``: N(0, 0.02^2) for
    matrices, embeddings and biases, N(1, 0.02^2) for LayerNorm scales. The same
    arguments always give a byte-identical model. bert-large is about 1.3 GB of weights,
    which fits the 2 GB protobuf limit, so every zoo size is one self-contained proto;
    building it takes ~25 s and ~7 GB peak RSS, nearly all of it the protobuf
    serialization inside ``check_model`` (a later ``SerializeToString`` costs as much).

    >>> m = build_bert(32, 1, 2, 64, vocab=100, max_pos=16, seq_len=8)
    >>> [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    [1, 8, 32]
    """
    if min(hidden, layers, heads, intermediate, vocab, max_pos, batch) < 1:
        raise ValueError(
            "hidden, layers, heads, intermediate, vocab, max_pos and batch must be >= 1"
        )
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    if not 1 <= seq_len <= max_pos:
        raise ValueError(f"seq_len must be in [1, max_pos={max_pos}], got {seq_len}")
    head_dim = hidden // heads
    rng = weight_rng(seed, weights)
    b = GraphBuilder(materialize=weights)
    input_ids = b.graph_input("input_ids", onnx.TensorProto.INT64, [batch, seq_len])
    split = np.array([batch, seq_len, heads, head_dim], np.int64)
    merge = np.array([batch, seq_len, hidden], np.int64)
    c = _Constants(
        split_heads_shape=b.initializer("attn.split_heads.shape", split),
        merge_heads_shape=b.initializer("attn.merge_heads.shape", merge),
        attn_scale=b.initializer("attn.scale", _scalar(1.0 / math.sqrt(head_dim))),
        sqrt2=b.initializer("gelu.sqrt2", _scalar(math.sqrt(2.0))),
        one=b.initializer("gelu.one", _scalar(1.0)),
        half=b.initializer("gelu.half", _scalar(0.5)),
    )
    x = _embeddings(
        b,
        rng,
        input_ids,
        vocab=vocab,
        max_pos=max_pos,
        seq_len=seq_len,
        hidden=hidden,
    )
    for i in range(layers):
        x = _attention(b, rng, i, x, c, hidden)
        x = _ffn(
            b,
            rng,
            i,
            x,
            c,
            hidden,
            intermediate,
            output="last_hidden_state" if i == layers - 1 else None,
        )
    b.graph_output(x, onnx.TensorProto.FLOAT, [batch, seq_len, hidden])
    doc = (
        f"t10c zoo {name}: hidden={hidden} layers={layers} heads={heads}"
        f" intermediate={intermediate} seed={seed}"
    )
    return b.finish(name, doc=doc)
