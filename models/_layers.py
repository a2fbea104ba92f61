"""Layers shared by the transformer and CNN zoo builders, written node by node the way
``torch.onnx`` exports them (names like ``layer0/attn/q/MatMul``, weights like
``layer0.attn.q.weight``).

Each helper takes the `GraphBuilder`, the generator the weights are drawn from (the draw order
fixes the values), a scope and its input tensor, and returns its output tensor.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from ._builder import GraphBuilder, draw


def scalar(value: float) -> np.ndarray:
    """A 0-d float32 array, for scalar constants that broadcast against anything."""
    return np.array(value, np.float32)


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def dotted(scope: str) -> str:
    return scope.replace("/", ".")


def linear(b: GraphBuilder, rng: np.random.Generator, scope: str, x: str, fan_in: int,
           fan_out: int, std: float, bias: bool = True) -> str:
    """``x @ {scope}.weight (+ {scope}.bias)`` with weight [fan_in, fan_out]."""
    weight = draw(rng, (fan_in, fan_out), std)
    return affine(b, scope, x, weight, draw(rng, (fan_out,), 0.02) if bias else None)


def affine(b: GraphBuilder, scope: str, x: str, weight: np.ndarray,
           bias: np.ndarray | None = None, copy: bool = True) -> str:
    """``x @ {scope}.weight (+ {scope}.bias)`` with the values given, drawn by the caller
    (``copy=False``: a weight that is a view of sibling projections' buffer, `side_by_side`,
    kept as it is)."""
    w = b.initializer(f"{dotted(scope)}.weight", weight, copy=copy)
    y = b.node("MatMul", [x, w], f"{scope}/MatMul")
    if bias is None:
        return y
    bias_name = b.initializer(f"{dotted(scope)}.bias", bias)
    return b.node("Add", [y, bias_name], f"{scope}/Add")


def layer_norm(b: GraphBuilder, rng: np.random.Generator, scope: str, x: str, hidden: int,
               epsilon: float) -> str:
    """LayerNormalization over the last axis (opset 17), scale ~ 1 and bias ~ 0."""
    scale = b.initializer(f"{dotted(scope)}.weight", draw(rng, (hidden,), 0.02, mean=1.0))
    bias = b.initializer(f"{dotted(scope)}.bias", draw(rng, (hidden,), 0.02))
    return b.node("LayerNormalization", [x, scale, bias], f"{scope}/LayerNormalization",
                  axis=-1, epsilon=epsilon)


def rms_norm(b: GraphBuilder, rng: np.random.Generator, scope: str, x: str, hidden: int,
             epsilon: float) -> str:
    """LLaMA's RMSNorm as exported: ``w * (x * 1/sqrt(mean(x^2) + eps))``."""
    w = b.initializer(f"{dotted(scope)}.weight", draw(rng, (hidden,), 0.02, mean=1.0))
    two = b.initializer(f"{dotted(scope)}.two", scalar(2.0))
    eps = b.initializer(f"{dotted(scope)}.eps", scalar(epsilon))
    sq = b.node("Pow", [x, two], f"{scope}/Pow")
    var = b.node("ReduceMean", [sq], f"{scope}/ReduceMean", axes=[-1], keepdims=1)
    rstd = b.node("Reciprocal", [b.node("Sqrt", [b.node("Add", [var, eps], f"{scope}/Add")],
                                        f"{scope}/Sqrt")], f"{scope}/Reciprocal")
    return b.node("Mul", [w, b.node("Mul", [x, rstd], f"{scope}/Mul")], f"{scope}/Mul_1")


def split_heads(b: GraphBuilder, scope: str, x: str, shape: str, transpose_k: bool = False
                ) -> str:
    """[B, S, H*D] -> [B, H, S, D] (or [B, H, D, S] for keys)."""
    y = b.node("Reshape", [x, shape], f"{scope}/Reshape")
    perm = [0, 2, 3, 1] if transpose_k else [0, 2, 1, 3]
    return b.node("Transpose", [y], f"{scope}/Transpose", perm=perm)


def merge_heads(b: GraphBuilder, scope: str, x: str, shape: str) -> str:
    """[B, H, S, D] -> [B, S, H*D]."""
    y = b.node("Transpose", [x], f"{scope}/Transpose", perm=[0, 2, 1, 3])
    return b.node("Reshape", [y, shape], f"{scope}/Reshape")


def causal_mask(b: GraphBuilder, seq: int) -> str:
    """A bool [S, S] mask, true where a query may see a key, built the way exports build it
    (ConstantOfShape, Trilu, Cast); it depends on nothing but the shape and folds."""
    shape = b.initializer("causal.shape", ints(seq, seq))
    one = onnx.helper.make_tensor("one", onnx.TensorProto.FLOAT, [1], [1.0])
    ones = b.node("ConstantOfShape", [shape], "causal/ConstantOfShape", value=one)
    lower = b.node("Trilu", [ones], "causal/Trilu", upper=0)
    return b.node("Cast", [lower], "causal/Cast", to=onnx.TensorProto.BOOL)


def attention_core(b: GraphBuilder, scope: str, q: str, k_t: str, v: str, head_dim: int,
                   mask: str | None = None, fill: str | None = None) -> str:
    """``softmax(q @ k_t / sqrt(d) [masked]) @ v`` on [B, H, S, D] heads."""
    scale = b.initializer(f"{dotted(scope)}.scale", scalar(1.0 / math.sqrt(head_dim)))
    scores = b.node("MatMul", [q, k_t], f"{scope}/scores/MatMul")
    scores = b.node("Mul", [scores, scale], f"{scope}/scores/Mul")
    if mask is not None:
        assert fill is not None
        scores = b.node("Where", [mask, scores, fill], f"{scope}/scores/Where")
    probs = b.node("Softmax", [scores], f"{scope}/Softmax", axis=-1)
    return b.node("MatMul", [probs, v], f"{scope}/context/MatMul")


def gelu_erf(b: GraphBuilder, scope: str, x: str, c: dict[str, str]) -> str:
    """Exact GELU as TorchScript exports it: ``x * (erf(x / sqrt 2) + 1) * 0.5``."""
    g = b.node("Div", [x, c["sqrt2"]], f"{scope}/Div")
    g = b.node("Erf", [g], f"{scope}/Erf")
    g = b.node("Add", [g, c["one"]], f"{scope}/Add")
    g = b.node("Mul", [x, g], f"{scope}/Mul")
    return b.node("Mul", [g, c["half"]], f"{scope}/Mul_half")


def gelu_constants(b: GraphBuilder) -> dict[str, str]:
    return {"sqrt2": b.initializer("gelu.sqrt2", scalar(math.sqrt(2.0))),
            "one": b.initializer("gelu.one", scalar(1.0)),
            "half": b.initializer("gelu.half", scalar(0.5))}
