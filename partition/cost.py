"""The cost model: predicted cycles and bytes per core of one plan on one chip.

Formulas (all per core; the slowest core sets the pace of a bulk-synchronous step):

- compute = steps x cost of one sub-task. A contraction (sum of products of two inputs) runs on
  the matrix unit as ``batch`` products of ``m x k`` by ``k x n``, padded to the unit's (k, n)
  granularity (`Chip.matmul_cycles`); other ops run on the vector unit at `body_ops` operations
  per point of the sub-task (`Chip.vector_cycles`).
- shift: at each step boundary where a rotating operand's axis advances, every core receives the
  next partition of it from its ring neighbour: one barrier plus the bytes of all operands that
  move (`Chip.transfer_cycles`). On a mesh, a plan embedded by `place.py` pays hops (at most 2)
  and the busiest link instead (`place.shift_cycles`). On a chip whose compute and transfers
  overlap, a shift step costs only what it takes beyond the compute step before it.
- reduce: when ``g > 1`` cores hold partial sums of the same output block, a reduce-scatter
  leaves each with ``1/g`` of it: one barrier, ``(g - 1) x chunk`` elements received and added
  (on a mesh, the levels of a K-tree reduce-scatter along the mesh,
  `collectives.reduce_estimate`).
- re-layout (priced by the whole-graph planner, measured by the emulator): one barrier plus the
  bytes of each input buffer that a producer left elsewhere.
- epilogue (a fused op, `t10c.ir.TensorExpr.epilogue`; `epilogue_cost`): once the result is
  complete, its vector work on each core's share of it (the chunk after a reduce-scatter, the
  output tile otherwise), counted as compute; each extra operand is one more buffer of that
  share, resident for a weight; an activation's re-layout is an edge of the whole-graph
  choice, as an input's is (`partition/epilogue.py`).

The emulator times the program with the same `Chip` primitives from the instructions' actual
shapes and tables, so a one-op program's measured cycles equal these predictions.
"""

from __future__ import annotations

import math
from typing import Any

from t10c.chips import DTYPES, Chip
from t10c.costs import INDEX_BYTES, compute_cycles
from t10c.elementwise import body_cost
from t10c.ir import TensorExpr

from .collectives import reduce_estimate
from .place import exchange_estimate, shift_cycles
from .plan import Cycles, Geometry


def element_bytes(op: TensorExpr, index: int, dtype: str, int_tensors: frozenset[str]) -> int:
    """Bytes per element of operand ``index`` on chip: accumulators of reductions are fp32."""
    operand = op.operands[index]
    if operand.tensor in int_tensors:
        return INDEX_BYTES
    if index == len(op.inputs) and op.combine is not None:
        return 4
    return DTYPES[dtype]


def home_bytes(op: TensorExpr, shapes: dict[str, tuple[int, ...]], chip: Chip, dtype: str,
               const_tensors: frozenset[str]) -> int:
    """Bytes per core of the op's weights spread evenly over all cores (the vgm home)."""
    return sum(-(-math.prod(shapes[o.tensor]) // chip.cores) * DTYPES[dtype]
               for o in op.inputs if o.tensor in const_tensors)


def epilogue_cost(op: TensorExpr, share: Any, chip: Chip, dtype: str,
                  int_tensors: frozenset[str], const_tensors: frozenset[str]
                  ) -> tuple[Any, Any, Any, Any]:
    """(compute cycles, activation bytes, hot bytes, cold bytes) per core of op's epilogue on
    ``share`` elements of its finished result (all zero without an epilogue). ``share`` may
    be a numpy array (`vcost`): the arithmetic is elementwise."""
    if op.epilogue is None:
        return 0, 0, 0, 0
    rate = chip.vector_ops_per_cycle[dtype]
    compute = chip.compute_overhead_cycles + -(-share * max(1, body_cost(op.epilogue)) // rate)
    each = [share * (INDEX_BYTES if o.tensor in int_tensors else DTYPES[dtype]) for o in op.extra]
    moved = sum(b for b, o in zip(each, op.extra) if o.tensor not in const_tensors)
    cold = sum(b for b, o in zip(each, op.extra) if o.tensor in const_tensors)
    return compute, moved, sum(each), cold


def plan_cost(geo: Geometry, chip: Chip, dtype: str, int_tensors: frozenset[str],
              const_tensors: frozenset[str], weights_home: bool = False
              ) -> tuple[Cycles, int, int, int]:
    """(cycles, hot bytes, cold bytes, output bytes) per core of one plan.

    With ``weights_home`` the weights stay in a compact idle layout, spread evenly over all
    cores (the cold bytes), and each run warms up the tiles it needs first: one barrier and the
    tiles' bytes, counted as shift; the fetched tiles are hot on top of the idle copy. (The vgm
    baseline does this for every op; t10 chooses it per op where SRAM is short.)
    """
    op = geo.op
    nops = len(op.operands)
    out = nops - 1
    tile_bytes = [element_bytes(op, i, dtype, int_tensors) * math.prod(geo.tile_shape(i))
                  for i in range(nops)]

    sub = dict(zip(geo.axes, geo.u))
    per_step = compute_cycles(op, sub, chip, dtype)
    compute = geo.steps * per_step
    rot_axis = [geo.rotation_axis(i) for i in range(nops)]

    def step_cycles(movers: list[int]) -> int:
        """One shift step moving ``movers``; on a chip that overlaps compute and transfers,
        only what exceeds the compute step before it."""
        moved = sum(tile_bytes[i] for i in movers)
        if not moved:
            return 0
        if geo.embed is not None:
            cycles = shift_cycles(chip, [(tile_bytes[i], geo.driver_of(i),
                                          geo.T[rot_axis[i]]) for i in movers])  # type: ignore
        else:
            cycles = chip.transfer_cycles(moved)
        return max(cycles - per_step, 0) if chip.overlap else cycles

    # Digits advance like an odometer (last axis fastest): a boundary whose outermost changing
    # axis is J occurs prod(T[:J]) * (T[J] - 1) times, and moves every operand rotating along
    # J or an axis after it.
    shift = sync = 0
    for J in range(len(geo.T)):
        if geo.T[J] == 1:
            continue
        count = math.prod(geo.T[:J]) * (geo.T[J] - 1)
        movers = [i for i in range(nops) if (r := rot_axis[i]) is not None and r >= J]
        if sum(tile_bytes[i] for i in movers):
            shift += count * step_cycles(movers)
            sync += count * chip.sync_cycles
    # rotated resident weights return home after the last step: one more shift of each
    homing = [i for i, o in enumerate(op.inputs)
              if rot_axis[i] is not None and o.tensor in const_tensors]
    if sum(tile_bytes[i] for i in homing) and not weights_home:
        shift += step_cycles(homing)
        sync += chip.sync_cycles

    fetched = sum(tile_bytes[i] for i, o in enumerate(op.inputs) if o.tensor in const_tensors)
    if weights_home and fetched:
        shift += (exchange_estimate(chip, fetched) if geo.embed is not None
                  else chip.transfer_cycles(fetched))
        sync += chip.sync_cycles

    reduce = 0
    group = geo.reduce_group
    out_bytes = tile_bytes[out]
    chunk_bytes = 0
    if group > 1:
        elems = math.prod(geo.tile_shape(out))
        chunk = -(-elems // group)
        chunk_bytes = chunk * element_bytes(op, out, dtype, int_tensors)
        first = chunk_bytes  # the largest chunk a level keeps
        if geo.embed is not None:  # levels along the mesh, their adds included
            moving, first_elems = reduce_estimate(
                chip, geo.ncores, group, geo.embed.col_ring, geo.embed.row_ring, elems,
                element_bytes(op, out, dtype, int_tensors), dtype)
            first = first_elems * element_bytes(op, out, dtype, int_tensors)
            reduce = chip.sync_cycles + moving
        else:
            moving = chip.transfer_cycles((group - 1) * chunk_bytes)
            reduce = chip.sync_cycles + moving + chip.vector_cycles((group - 1) * chunk, dtype)
        out_bytes = chunk_bytes
    share = chunk if group > 1 else math.prod(geo.tile_shape(out))
    epi_compute, _, epi_hot, epi_cold = epilogue_cost(op, share, chip, dtype, int_tensors,
                                                      const_tensors)
    compute += epi_compute  # (the activations' re-layout is an edge: partition/epilogue.py)

    # while computing: every operand's tile and a receive buffer per rotating one; during the
    # reduce-scatter the activation inputs and receive buffers are gone, and the weights, the
    # partial sums and the chunk remain
    cold = sum(tile_bytes[i] for i, o in enumerate(op.inputs) if o.tensor in const_tensors)
    hot = sum(tile_bytes) + sum(tile_bytes[i] for i in range(nops) if rot_axis[i] is not None)
    if group > 1:
        hot = max(hot, cold + tile_bytes[out] + first)
    hot += epi_hot  # the epilogue's operands live through the whole op
    if weights_home:
        cold = home_bytes(op, geo.shapes, chip, dtype, const_tensors)
        hot += cold
    cold += epi_cold  # epilogue weights stay resident beside the result, homed or not
    return Cycles(compute, shift, sync, reduce), hot, cold, out_bytes
