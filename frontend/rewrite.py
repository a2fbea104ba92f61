"""Rewrites of the ONNX node list before lowering.

`fold_batchnorm`: a BatchNormalization (inference) that is the only reader of a Conv with
constant weights is folded into that Conv: ``W' = W * s`` per output channel and
``B' = (B - mean) * s + bias`` with ``s = scale / sqrt(var + eps)``. The Conv then writes the
BatchNormalization's output and the BatchNormalization node disappears.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper


def fold_batchnorm(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                   outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with every foldable Conv + BatchNormalization pair merged; new weights are
    added to ``constants``."""
    readers = Counter(name for n in nodes for name in n.input if name)
    producer = {out: i for i, n in enumerate(nodes) for out in n.output}
    merged: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    for j, bn in enumerate(nodes):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in bn.attribute}
        if attrs.get("training_mode", 0) or any(bn.output[1:]) or not attrs.get("spatial", 1):
            continue
        i = producer.get(bn.input[0])
        if i is None or i in merged or nodes[i].op_type != "Conv":
            continue
        conv = nodes[i]
        if readers[conv.output[0]] != 1 or conv.output[0] in outputs:
            continue
        params = list(bn.input[1:5])
        weights = [conv.input[1]] + ([conv.input[2]] if len(conv.input) > 2 and conv.input[2]
                                     else [])
        if not all(n in constants for n in params + weights):
            continue
        scale, bias, mean, var = (constants[n].astype(np.float64) for n in params)
        s = scale / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
        w = constants[weights[0]].astype(np.float64)
        b = constants[weights[1]].astype(np.float64) if len(weights) > 1 else np.zeros(len(s))
        w_name, b_name = f"{weights[0]}~bn{j}", f"{conv.output[0]}~bn{j}.bias"
        constants[w_name] = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)
        constants[b_name] = ((b - mean) * s + bias).astype(np.float32)
        folded = onnx.NodeProto()
        folded.CopyFrom(conv)
        del folded.input[:]
        folded.input.extend([conv.input[0], w_name, b_name])
        del folded.output[:]
        folded.output.append(bn.output[0])
        merged[i] = folded
        dropped.add(j)
    return [merged.get(i, n) for i, n in enumerate(nodes) if i not in dropped]
