"""What one sub-task costs on one core: shared by the planner's cost model and the emulator.

Both price the same work with these functions, the planner from a plan's geometry and the
emulator from a program's instructions, so that predictions and measurements agree by design
and differ only where the program does something the plan did not foresee.
"""

from __future__ import annotations

import math

from t10c.chips import Chip
from t10c.elementwise import body_cost
from t10c.ir import TensorExpr, is_contraction


def body_ops(op: TensorExpr) -> int:
    """Vector operations per point of the op's iteration space (at least one: the store); the
    functions' costs are `t10c.elementwise.FNS`'s."""
    return max(1, body_cost(op.body) + (1 if op.combine else 0))


def contraction_dims(op: TensorExpr, sub: dict[str, int]) -> tuple[int, int, int, int]:
    """(m, k, n, batch) of a contraction's sub-task with axis sizes ``sub``."""
    a, b = (set(x.axis_set) for x in op.inputs[:2])
    out = set(op.output.axes)
    m = k = n = batch = 1
    for axis, size in sub.items():
        if axis not in out:
            k *= size
        elif axis in a and axis in b:
            batch *= size
        elif axis in a:
            m *= size
        else:
            n *= size
    return m, k, n, batch


def compute_cycles(op: TensorExpr, sub: dict[str, int], chip: Chip, dtype: str) -> int:
    """Cycles of one sub-task of ``op`` with axis sizes ``sub`` on one core."""
    if is_contraction(op):
        m, k, n, batch = contraction_dims(op, sub)
        return chip.matmul_cycles(m, k, n, batch, dtype) + prologue_cycles(op, sub, chip, dtype)
    if op.body[0] == "take":  # one lookup per output point, whatever share of rows is here
        return chip.vector_cycles(math.prod(sub[str(a)] for a in op.output.axes), dtype)
    return chip.vector_cycles(math.prod(sub.values()) * body_ops(op), dtype)




def prologue_ops(op: TensorExpr) -> list[tuple[int, tuple[tuple[str, ...], int]]]:
    """The vector work of each prologue of ``op``: (input slot, (axes, operations)) pairs, one
    per set of axes its nodes vary along. A node is evaluated once per point of the axes its
    leaves index (numpy broadcasts it so, `emulator.kernels`): LayerNorm's ``rsqrt(var +
    eps)`` once per row of the tile, its ``x - mean`` once per element."""
    found = []
    for slot, body in op.prologue:
        per: dict[tuple[str, ...], int] = {}
        order = op.inputs[slot].axis_set
        _node_axes(op, body, order, per)
        if not per:  # a bare copy still stores every element
            per[tuple(order)] = 1
        found.extend((slot, item) for item in sorted(per.items()))
    return found


def _node_axes(op: TensorExpr, body: tuple, order: tuple[str, ...],
               per: dict[tuple[str, ...], int]) -> tuple[str, ...]:
    """The axes ``body`` varies along (in ``order``), adding each node's operations to
    ``per``."""
    if body[0] == "in":
        have = set(op.inputs[body[1]].axis_set)
        return tuple(a for a in order if a in have)
    if body[0] == "const":
        return ()
    have = set()
    for arg in body[1:]:
        have |= set(_node_axes(op, arg, order, per))
    axes = tuple(a for a in order if a in have)
    per[axes] = per.get(axes, 0) + body_cost((body[0], *(("const", 0.0),) * (len(body) - 1)))
    return axes


def prologue_cycles(op: TensorExpr, sub: dict[str, int], chip: Chip, dtype: str) -> int:
    """Cycles of a sub-task's prologues (`t10c.ir.TensorExpr.prologue`): each transforms the
    sub-task's block of its operand on the vector unit, in one pass, before the matmul reads
    it."""
    total = 0
    for slot, _ in op.prologue:
        ops = sum(math.prod(sub[a] for a in axes) * n
                  for s, (axes, n) in prologue_ops(op) if s == slot)
        total += chip.vector_cycles(ops, dtype)
    return total
