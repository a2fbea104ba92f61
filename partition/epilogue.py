"""Re-layout of a fused op's epilogue operands (`t10c.ir.TensorExpr.extra`): solver edges.

An activation that a fused op's epilogue reads (a residual) is brought element for element
beside the op's finished result (`codegen/epilogue.py`), with the op's other inputs. What moves
depends on both plans, the producer's and the fused op's, so, like an input's re-layout, it is
an edge of the whole-graph choice (`transitions.edge_cost` for inputs): a core receives every
element of its share of the result's box that the producer did not leave on it. After a
reduce-scatter a core's share is a chunk of its box, not a box: the box's remote elements are
then divided by the group (an estimate; the emulator measures the real exchange).
"""

from __future__ import annotations

import numpy as np

from t10c.chips import Chip
from t10c.costs import INDEX_BYTES
from t10c.dtypes import dtype_bytes
from t10c.ir import Graph

from .place import exchange_estimate
from .plan import OpPlan, geometry
from .transitions import output_box, remote_elements


def extra_box(graph: Graph, i: int, k: int, plan: OpPlan
              ) -> tuple[tuple[np.ndarray, np.ndarray], int]:
    """The box of ``extra[k]`` beside each core's finished result of op i, and the reduce
    group (the share of the box each core holds is 1/group of it)."""
    op = graph.ops[i]
    geo = geometry(graph, op, plan)
    out = len(op.inputs)
    origin = geo.tile_origin(out, geo.steps - 1)
    shape = np.asarray(geo.tile_shape(out))
    axes = [str(a) for a in op.output.axes]
    picked = [axes.index(str(a)) for a in op.extra[k].axes]
    return (origin[:, picked], shape[picked]), geo.reduce_group


def extra_edge_cost(graph: Graph, j: int, i: int, k: int, producer: list[OpPlan],
                    consumer: list[OpPlan], chip: Chip, dtype: str,
                    int_tensors: frozenset[str]) -> tuple[tuple[int, ...], ...]:
    """Cycles to bring ``extra[k]`` of op i from producer j's layout, for every (producer
    plan, consumer plan) pair."""
    operand = graph.ops[i].extra[k]
    direct = operand.tensor == graph.ops[j].output.tensor
    extent = np.asarray(graph.tensors[operand.tensor].shape)
    nbytes = INDEX_BYTES if operand.tensor in int_tensors else dtype_bytes(dtype)
    haves = [output_box(graph, j, p) if direct else None for p in producer]
    wants = [extra_box(graph, i, k, q) for q in consumer]
    moving = (lambda b: exchange_estimate(chip, b)) if chip.is_mesh else chip.transfer_cycles
    rows = []
    for have in haves:
        row = []
        for want, group in wants:
            remote = -(-remote_elements(have, want, extent) // group)
            row.append(chip.sync_cycles + moving(remote * nbytes) if remote else 0)
        rows.append(tuple(row))
    return tuple(rows)
