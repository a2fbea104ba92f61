"""A multi-layer perceptron: the smallest zoo model, handy for end-to-end smoke tests.

Graph (for the default dims 784 -> 1024 -> 1024 -> 10)::

    x[batch, 784] -> MatMul fc0.weight -> Add fc0.bias -> Relu
                  -> MatMul fc1.weight -> Add fc1.bias -> Relu
                  -> MatMul fc2.weight -> Add fc2.bias -> logits[batch, 10]

Op types used: MatMul, Add, Relu.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import onnx

from ._builder import GraphBuilder, draw, weight_rng

MLP_DIMS: tuple[int, ...] = (784, 1024, 1024, 10)
"""Default layer widths: an MNIST-shaped classifier."""

BIAS_STD = 0.02


def build_mlp(
    batch: int = 16, dims: Sequence[int] = MLP_DIMS, seed: int = 0, *, weights: bool = True
) -> onnx.ModelProto:
    """Build an MLP mapping ``x`` [batch, dims[0]] to ``logits`` [batch, dims[-1]].

    Layer ``i`` computes ``x @ fc{i}.weight + fc{i}.bias`` (weight [in, out],
    bias [out]), followed by ``Relu`` on every layer but the last. Weights are
    drawn from ``N(0, 1/in)`` so activations stay O(1) through the stack; biases
    from ``N(0, 0.02^2)``. The same arguments always give a byte-identical model.

    >>> build_mlp(batch=2, dims=(4, 3)).graph.output[0].name
    'logits'
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if len(dims) < 2 or min(dims) < 1:
        raise ValueError(f"dims needs at least two positive widths, got {tuple(dims)}")
    rng = weight_rng(seed, weights)
    b = GraphBuilder(materialize=weights)
    x = b.graph_input("x", onnx.TensorProto.FLOAT, [batch, dims[0]])
    last = len(dims) - 2
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(dims)):
        w = b.initializer(
            f"fc{i}.weight", draw(rng, (fan_in, fan_out), 1.0 / math.sqrt(fan_in))
        )
        bias = b.initializer(f"fc{i}.bias", draw(rng, (fan_out,), BIAS_STD))
        x = b.node("MatMul", [x, w], f"fc{i}/MatMul")
        x = b.node(
            "Add", [x, bias], f"fc{i}/Add", output="logits" if i == last else None
        )
        if i != last:
            x = b.node("Relu", [x], f"fc{i}/Relu")
    b.graph_output(x, onnx.TensorProto.FLOAT, [batch, dims[-1]])
    return b.finish("mlp", doc=f"t10c zoo MLP, dims={tuple(dims)}, seed={seed}")
