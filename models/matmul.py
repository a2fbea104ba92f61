"""Single-operator models for studying one op's plans: ``matmul-MxKxN``.

``matmul-128x5120x15360`` is ``C[M, N] = A[M, K] @ W[K, N]`` with ``A`` the input and ``W`` a
seeded random weight (an initializer, so the planner treats it as resident like a real layer's).
"""

from __future__ import annotations

import re

import numpy as np
import onnx

from ._builder import GraphBuilder, draw, weight_rng

PATTERN = re.compile(r"^matmul-(\d+)x(\d+)x(\d+)$")


def parse_matmul(name: str) -> tuple[int, int, int] | None:
    """(M, K, N) for a name like ``matmul-128x5120x15360``; None for other names."""
    match = PATTERN.match(name)
    if not match:
        return None
    dims = tuple(int(g) for g in match.groups())
    return dims if min(dims) >= 1 else None  # type: ignore[return-value]


def build_matmul(m: int, k: int, n: int, seed: int = 0, *, weights: bool = True
                 ) -> onnx.ModelProto:
    rng = weight_rng(seed, weights)
    b = GraphBuilder(materialize=weights)
    a = b.graph_input("A", onnx.TensorProto.FLOAT, [m, k])
    w = b.initializer("W", draw(rng, (k, n), 1.0 / np.sqrt(k)))
    b.node("MatMul", [a, w], "matmul", output="C")
    b.graph_output("C", onnx.TensorProto.FLOAT, [m, n])
    return b.finish(f"matmul-{m}x{k}x{n}")
