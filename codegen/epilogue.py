"""Epilogues in programs: the per-element step a fused op runs once its result is complete.

A fused op (`t10c.ir.TensorExpr.epilogue`) is generated as its reduction or contraction, then
one more ``Compute`` per core over the elements of the finished result buffer, in place. That
``Compute`` names a flat elementwise expression derived here (`epilogue_expr`): one axis over
the buffer's elements, input 0 the result buffer itself, input ``i + 1`` the buffer holding
``extra[i]`` laid out element for element like the result (`extra_elements` gives the table
codegen loads or exchanges it with). A program's expressions are therefore the graph's ops,
stripped of their epilogues, followed by one derived expression per fused op
(`program_exprs`), so the emulator, the reference executor and the verifier run epilogues as
ordinary elementwise work.
"""

from __future__ import annotations

import dataclasses

from t10c.ir import Body, Graph, Operand, TensorExpr
from t10c.partition.epilogue import extra_elements as extra_elements  # (the planner's too)

#: the axis of a derived epilogue expression: the elements of the result buffer
AXIS = "e"


def _renumber(body: Body) -> Body:
    """The epilogue over derived inputs: ``("acc",)`` is input 0, ``extra[i]`` input i + 1."""
    if body == ("acc",):
        return ("in", 0)
    if body[0] == "in":
        return ("in", body[1] + 1)
    if body[0] == "const":
        return body
    return (body[0], *(_renumber(arg) for arg in body[1:]))


def epilogue_expr(graph: Graph, op: TensorExpr) -> TensorExpr:
    """The flat elementwise expression of ``op``'s epilogue (``op.epilogue`` must be set).

    Its one axis has the output's element count, an upper bound of any core's share of it.
    It carries the op's name, so that its cycles are the op's.
    """
    assert op.epilogue is not None
    numel = graph.tensors[op.output.tensor].numel
    flat = (AXIS,)
    inputs = (Operand(op.output.tensor, flat), *(Operand(o.tensor, flat) for o in op.extra))
    return TensorExpr(op.name, ((AXIS, numel),), Operand(op.output.tensor, flat), inputs, None,
                      _renumber(op.epilogue), op.source)


def program_exprs(graph: Graph) -> tuple[TensorExpr, ...]:
    """A program's expressions: the ops without epilogues (index n is op n), then the derived
    expression of each fused op, in op order (`epilogue_index`)."""
    plain = tuple(dataclasses.replace(op, epilogue=None, extra=()) for op in graph.ops)
    return plain + tuple(epilogue_expr(graph, op) for op in graph.ops if op.epilogue is not None)


def epilogue_index(graph: Graph, n: int) -> int:
    """The index in `program_exprs` of op n's derived epilogue expression."""
    return len(graph.ops) + sum(op.epilogue is not None for op in graph.ops[:n])
