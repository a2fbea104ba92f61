"""Elementwise fusion: an elementwise op whose only reader is the next op is inlined into it.

Only where the consumer's iteration space is the producer's: no point is computed twice.
The producer's body replaces the consumer's ``("in", k)`` leaf, with the producer's axes renamed
to the consumer's through the operand that read it, and its inputs appended to the consumer's
(identical operands merged). The intermediate tensor then never exists on chip: GELU written as
five ONNX nodes becomes one expression, and the normalising step of a LayerNorm absorbs the
scale and shift.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from t10c.ir import Body, Graph, Operand, TensorExpr


def _reindex(body: Body, mapping: dict[int, Body]) -> Body:
    if body[0] == "in":
        return mapping[body[1]]
    if body[0] == "const":
        return body
    return (body[0], *(_reindex(arg, mapping) for arg in body[1:]))


def _inline(producer: TensorExpr, consumer: TensorExpr, slot: int) -> TensorExpr:
    read = consumer.inputs[slot]
    rename = dict(zip(producer.output.axes, read.axes))
    inputs = [o for k, o in enumerate(consumer.inputs) if k != slot]
    leaves: dict[int, Body] = {}
    for k, o in enumerate(producer.inputs):
        moved = Operand(o.tensor, tuple(rename[a] for a in o.axes))
        if moved not in inputs:
            inputs.append(moved)
        leaves[k] = ("in", inputs.index(moved))
    inlined = _reindex(producer.body, leaves)
    mapping: dict[int, Body] = {}
    for k, o in enumerate(consumer.inputs):
        mapping[k] = inlined if k == slot else ("in", inputs.index(o))
    return replace(consumer, inputs=tuple(inputs), body=_reindex(consumer.body, mapping))


def fuse_elementwise(graph: Graph, max_inputs: int = 6) -> Graph:
    """Inline single-reader elementwise producers into their reader, repeatedly."""
    ops = list(graph.ops)
    keep = set(graph.outputs) | {v.source for v in graph.views.values()}
    changed = True
    while changed:
        changed = False
        readers = Counter(o.tensor for op in ops for o in op.inputs)
        position = {op.output.tensor: i for i, op in enumerate(ops)}
        for ci, consumer in enumerate(ops):
            if consumer.body[0] == "take":
                continue
            for slot, operand in enumerate(consumer.inputs):
                pi = position.get(operand.tensor)
                if pi is None or readers[operand.tensor] != 1 or operand.tensor in keep:
                    continue
                if not all(isinstance(d, str) for d in operand.axes):
                    continue  # read through a window: inlining would recompute the halo
                producer = ops[pi]
                if producer.combine is not None or producer.body[0] == "take":
                    continue
                # only where every point of the consumer reads one point of the producer:
                # inlining into a wider iteration space (a matmul) would recompute the producer
                # for every point of the extra axes and take the matmul off the matrix unit
                if set(operand.axes) != set(consumer.axis_names):
                    continue
                if len(consumer.inputs) - 1 + len(producer.inputs) > max_inputs:
                    continue
                ops[ci] = _inline(producer, consumer, slot)
                del ops[pi]
                changed = True
                break
            if changed:
                break
    used = {o.tensor for op in ops for o in op.operands} | set(graph.views) | set(graph.inputs)
    used |= {v.source for v in graph.views.values()}
    tensors = {k: v for k, v in graph.tensors.items() if k in used}
    return replace(graph, ops=tuple(ops), tensors=tensors)
