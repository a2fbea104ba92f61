"""The cost model: predicted cycles and bytes per core of one plan on one chip.

Formulas (all per core; the slowest core sets the pace of a bulk-synchronous step):

- compute = steps x cost of one sub-task. A contraction (sum of products of two inputs) runs on
  the matrix unit as ``batch`` products of ``m x k`` by ``k x n``, padded to the unit's (k, n)
  granularity (`Chip.matmul_cycles`); other ops run on the vector unit at `body_ops` operations
  per point of the sub-task (`Chip.vector_cycles`).
- prologue (a contraction that reads an elementwise function of an operand,
  `t10c.ir.TensorExpr.prologue`; `costs.prologue_cycles`): each sub-task first transforms its
  block of the operand on the vector unit, at the prologue's operations per element, before
  the matrix unit reads it; the prologue's inputs are inputs of the op, with tiles, shifts and
  re-layouts of their own.
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
  share. A weight (a bias) waits in a compact idle layout and is fetched into that buffer
  before the op, with any weights the op warms up (one barrier); an activation's re-layout is
  an edge of the whole-graph choice, as an input's is (`partition/epilogue.py`).

The emulator times the program with the same `Chip` primitives from the instructions' actual
shapes and tables, so a one-op program's measured cycles equal these predictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from t10c.chips import DTYPES, Chip
from t10c.costs import compute_cycles
from t10c.dtypes import IntTensors, ceil_div
from t10c.elementwise import body_cost
from t10c.ir import TensorExpr

from .collectives import reduce_estimate, scatter_unit
from .place import exchange_estimate, shift_cycles
from .plan import Cycles, Geometry
from .pod import reduce_pairs, ring_cross, spread_cross


def element_bytes(op: TensorExpr, index: int, dtype: str, int_tensors: IntTensors) -> int:
    """Bytes per element of operand ``index`` on chip: accumulators of reductions are fp32."""
    operand = op.operands[index]
    if operand.tensor in int_tensors:
        return int_tensors.bytes_of(operand.tensor, dtype)
    if index == len(op.inputs) and op.combine is not None:
        return 4
    return DTYPES[dtype]


def home_bytes(op: TensorExpr, shapes: dict[str, tuple[int, ...]], chip: Chip, dtype: str,
               int_tensors: IntTensors, const_tensors: frozenset[str]) -> int:
    """Bytes per core of the op's weights spread evenly over all cores (the vgm home)."""
    return sum(ceil_div(math.prod(shapes[o.tensor]), chip.cores)
               * int_tensors.bytes_of(o.tensor, dtype)
               for o in op.inputs if o.tensor in const_tensors)


@dataclass(frozen=True)
class EpilogueCost:
    """Per core, what a fused op's epilogue adds (all zero without one); fields are ints, or
    numpy arrays over plans in `vcost`."""

    compute: Any = 0  # cycles of vector work on the finished result
    moved: Any = 0  # bytes of activations brought beside the result (an edge of the solve)
    hot: Any = 0  # bytes of the extra operands' buffers and idle copies, live through the op
    cold: Any = 0  # bytes resident between runs: the weights' idle copies
    fetched: Any = 0  # bytes of weights fetched from their idle layout before the op


def epilogue_cost(op: TensorExpr, share: Any, chip: Chip, dtype: str,
                  int_tensors: IntTensors, const_tensors: frozenset[str],
                  shapes: dict[str, tuple[int, ...]]) -> EpilogueCost:
    """What op's epilogue costs per core on ``share`` elements of its finished result
    (``share`` may be a numpy array, `vcost`: the arithmetic is elementwise).

    An epilogue weight (a bias) is broadcast over the result and laid element for element
    beside a core's share: kept there between runs it would take as many bytes as the share,
    which at large batches adds up to much of SRAM over a model's ops. It waits in a compact
    idle layout instead (``shapes`` gives its size; `idle_cores`) and is fetched into the share
    buffer before the op, with the op's other weights. The idle copy avoids core 0, on which
    every op runs: that core receives its whole share, so the busiest core's bytes are the
    share's, as priced here. Where `fetches_epilogue_weights` says no (one core; a mesh
    without DRAM), the weight stays resident beside the result instead."""
    if op.epilogue is None:
        return EpilogueCost()
    rate = chip.vector_ops_per_cycle[dtype]
    compute = chip.compute_overhead_cycles + ceil_div(share * max(1, body_cost(op.epilogue)),
                                                      rate)
    each = [share * int_tensors.bytes_of(o.tensor, dtype) for o in op.extra]
    moved = sum(b for b, o in zip(each, op.extra) if o.tensor not in const_tensors)
    weights = sum(b for b, o in zip(each, op.extra) if o.tensor in const_tensors)
    if not fetches_epilogue_weights(chip):
        return EpilogueCost(compute, moved, sum(each), weights)
    idle = sum(ceil_div(math.prod(shapes[o.tensor]), chip.cores - 1)
               * int_tensors.bytes_of(o.tensor, dtype)
               for o in op.extra if o.tensor in const_tensors)
    return EpilogueCost(compute, moved, sum(each) + idle, idle, weights)


def fetches_epilogue_weights(chip: Chip) -> bool:
    """Whether epilogue weights wait in a compact idle layout and are fetched before each run
    (`epilogue_cost`), or stay resident beside the result: one core has no other to hold
    them, and on a mesh without DRAM (a wafer) the fetch crosses the mesh before every op
    while a core's share of a result, and so of the weight beside it, is small (LLaMA-3-8B
    decode on wse2 with int8 weights, whose per-column scales are epilogue weights: 39% of
    the step fetching them)."""
    return chip.cores > 1 and not (chip.is_mesh and not chip.has_dram)


def idle_cores(chip: Chip) -> range:
    """The cores an epilogue weight's idle copy is spread over (`epilogue_cost`)."""
    return range(1, chip.cores) if chip.cores > 1 else range(1)


def plan_cost(geo: Geometry, chip: Chip, dtype: str, int_tensors: IntTensors,
              const_tensors: frozenset[str], weights_home: bool = False,
              kept: frozenset[int] = frozenset()) -> tuple[Cycles, int, int, int]:
    """(cycles, hot bytes, cold bytes, output bytes) per core of one plan.

    With ``weights_home`` the weights stay in a compact idle layout, spread evenly over all
    cores (the cold bytes), and each run warms up the tiles it needs first: one barrier and the
    tiles' bytes, counted as shift; the fetched tiles are hot on top of the idle copy. (The vgm
    baseline does this for every op; t10 chooses it per op where SRAM is short.)

    ``kept``: input slots whose buffer the plan keeps for the next op
    (`transitions.shared_inputs`); one that rotates returns to its step-0 placement after the
    last step, with the rotated weights (one more ring shift), and the kept buffers live
    through the reduce-scatter (`kept_bytes`).
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
        elif chip.is_pod:  # the busiest chip's bytes over its links (`pod.ring_cross`);
            # an operand rotating slower than its axis moves on chain / T of its cores a step
            per_chip = sum(ceil_div(tile_bytes[i] * geo.chain[i]
                                    * ring_cross(chip, geo.phys, geo.ring_source(i)),
                                    geo.T[rot_axis[i]])  # type: ignore[index]
                           for i in movers)
            cycles = chip.exchange_cycles(moved, int(np.asarray(per_chip).max()))
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
    # rotated resident weights return home after the last step, and so do rotated inputs
    # kept for the next op: one more shift of each
    homing = [i for i, o in enumerate(op.inputs) if rot_axis[i] is not None and (
        i in kept if o.tensor not in const_tensors else not weights_home)]
    if sum(tile_bytes[i] for i in homing):
        shift += step_cycles(homing)
        sync += chip.sync_cycles

    epi = epilogue_cost(op, final_share(geo), chip, dtype, int_tensors, const_tensors,
                        geo.shapes)
    fetch_shift, fetch_sync = fetch_estimate(geo, chip, dtype, int_tensors, const_tensors,
                                             weights_home, epi)
    shift += fetch_shift
    sync += fetch_sync

    reduce = 0
    group = geo.reduce_group
    out_bytes = tile_bytes[out]
    chunk_bytes = 0
    if group > 1:
        elems = math.prod(geo.tile_shape(out))
        chunk = scatter_unit(elems, group)
        chunk_bytes = chunk * element_bytes(op, out, dtype, int_tensors)
        first = chunk_bytes  # the largest chunk a level keeps
        if geo.embed is not None:  # levels along the mesh, their adds included
            moving, first_elems = reduce_estimate(
                chip, geo.ncores, group, geo.embed.col_ring, geo.embed.row_ring, elems,
                element_bytes(op, out, dtype, int_tensors), dtype)
            first = first_elems * element_bytes(op, out, dtype, int_tensors)
            reduce = chip.sync_cycles + moving
        else:
            red = tuple(j for j, a in enumerate(geo.axes) if a not in op.output.axes)
            j = geo.rotation_axis(out)
            ring = None if j is None else (geo.axes.index(geo.driver_of(out)), geo.T[j])
            pairs = reduce_pairs(chip, geo.F, red, group, ring,
                                 geo.phys if geo.cores is not None else None)
            moving = chip.exchange_cycles((group - 1) * chunk_bytes, pairs * chunk_bytes)
            reduce = chip.sync_cycles + moving + chip.vector_cycles((group - 1) * chunk, dtype)
        if sum(tile_bytes[i] for i in homing):
            reduce -= chip.sync_cycles  # codegen: the reduce shares the restore's superstep
        out_bytes = chunk_bytes
    compute += epi.compute  # (the activations' re-layout is an edge: partition/epilogue.py)

    # while computing: every operand's tile and a receive buffer per rotating one; during the
    # reduce-scatter the activation inputs and receive buffers are gone, and the weights, the
    # partial sums and the chunk remain
    # (a reduce that shares the restore shift's superstep keeps the buffers the restore
    # sends from, one tile per rotated weight or kept input, until it is done: codegen's
    # ``shared``; and the kept inputs' buffers)
    cold = sum(tile_bytes[i] for i, o in enumerate(op.inputs) if o.tensor in const_tensors)
    hot = sum(tile_bytes) + sum(tile_bytes[i] for i in range(nops) if rot_axis[i] is not None)
    if group > 1:
        sending = sum(tile_bytes[i] for i in homing)
        keeping = sum(tile_bytes[i] for i in kept)
        hot = max(hot, cold + tile_bytes[out] + first + sending + keeping)
    hot += epi.hot  # the epilogue's operands live through the whole op
    if weights_home:
        cold = home_bytes(op, geo.shapes, chip, dtype, int_tensors, const_tensors)
        hot += cold
    cold += epi.cold
    return Cycles(compute, shift, sync, reduce), hot, cold, out_bytes


def fetch_estimate(geo: Geometry, chip: Chip, dtype: str, int_tensors: IntTensors,
                   const_tensors: frozenset[str], weights_home: bool,
                   epi: EpilogueCost | None = None) -> tuple[int, int]:
    """(shift, sync) cycles `plan_cost` counts for fetching the plan's weights from their idle
    layouts (warmed-up weights with ``weights_home``, and epilogue weights): one barrier and
    the fetched bytes, estimated (`place.exchange_estimate` on a mesh). After the solve, a
    mesh plan's fetch is routed as codegen emits it instead (`transitions.route_fetches`)."""
    op = geo.op
    if epi is None:
        epi = epilogue_cost(op, final_share(geo), chip, dtype, int_tensors, const_tensors,
                            geo.shapes)
    fetched = fetch_bytes(geo, chip, dtype, int_tensors, const_tensors, weights_home, epi)
    if not fetched:
        return 0, 0
    whole = weights_whole(op, geo.shapes, dtype, int_tensors, const_tensors) \
        if weights_home else 0
    shift = (exchange_estimate(chip, fetched) if geo.embed is not None
             else chip.exchange_cycles(fetched, spread_cross(
                 chip, geo.ncores, fetched, fetch_wanted(chip, geo.ncores, whole,
                                                         epi.fetched))))
    return shift, chip.sync_cycles


def fetch_bytes(geo: Geometry, chip: Chip, dtype: str, int_tensors: IntTensors,
                const_tensors: frozenset[str], weights_home: bool,
                epi: EpilogueCost | None = None) -> int:
    """The bytes a core of the plan fetches from the weights' idle layouts (`fetch_estimate`):
    its epilogue's weights and, with ``weights_home``, its tiles of the warmed-up weights."""
    if epi is None:
        epi = epilogue_cost(geo.op, final_share(geo), chip, dtype, int_tensors, const_tensors,
                            geo.shapes)
    fetched = epi.fetched
    if weights_home:
        fetched += sum(element_bytes(geo.op, i, dtype, int_tensors)
                       * math.prod(geo.tile_shape(i))
                       for i, o in enumerate(geo.op.inputs) if o.tensor in const_tensors)
    return fetched


def weights_whole(op: TensorExpr, shapes: dict[str, tuple[int, ...]], dtype: str,
                  int_tensors: IntTensors, const_tensors: frozenset[str]) -> int:
    """The bytes of all of ``op``'s weights, whole."""
    return sum(element_bytes(op, i, dtype, int_tensors) * math.prod(shapes[o.tensor])
               for i, o in enumerate(op.inputs) if o.tensor in const_tensors)


def fetch_wanted(chip: Chip, ncores: int, warmed: int, epilogue_fetched: int) -> int | None:
    """The most distinct bytes of a plan's fetch from the idle layouts that the busiest chip
    of a pod wants (`pod.spread_cross`'s cap; None off a pod): its cores' epilogue weights
    (``epilogue_fetched`` a core), and the ``warmed`` bytes of the weights warmed up, whole at
    most, since an element crosses to a chip once and is fanned out there. A replicated
    plan's cores want many copies of one tile (gpt2-xl on ipu-pod4: fetches estimated at
    1.4x the emulated time without the cap)."""
    if not chip.is_pod:
        return None
    return warmed + epilogue_fetched * chip.busiest_chip_cores(ncores)


def spread_owner(numel: int, over: range, elems: np.ndarray | None = None) -> np.ndarray:
    """(numel,): the core holding each element of a tensor spread evenly over the cores
    ``over``, ``ceil(numel / len(over))`` a core in order (a weight's idle layout,
    `home_bytes` and `epilogue_cost`; codegen's ``load_home``); or of elements ``elems``."""
    chunk = ceil_div(numel, len(over))
    return over.start + (np.arange(numel, dtype=np.int64) if elems is None else elems) // chunk


def kept_bytes(geo: Geometry, slots: frozenset[int], chip: Chip, dtype: str,
               int_tensors: IntTensors, const_tensors: frozenset[str],
               weights_home: bool = False) -> int:
    """Bytes per core beyond the plan's own hot bytes when the buffers of input ``slots``
    stay allocated after the steps, through the reduce-scatter and the epilogue, so that
    the next op reads those copies instead of receiving its own
    (`transitions.shared_inputs`): `plan_cost` with ``kept`` against without (during the
    steps every input's tile is counted; during the reduce-scatter only the weights, the
    partial sums, the chunk, the restore's sources and the kept buffers)."""
    if geo.reduce_group <= 1 or not slots:
        return 0  # no reduce phase: the tiles are counted through the whole op
    with_ = plan_cost(geo, chip, dtype, int_tensors, const_tensors, weights_home, slots)[1]
    return with_ - plan_cost(geo, chip, dtype, int_tensors, const_tensors, weights_home)[1]


def final_share(geo: Geometry) -> int:
    """Elements of the finished result per core: its chunk after a reduce-scatter."""
    elems = math.prod(geo.tile_shape(len(geo.op.inputs)))
    return scatter_unit(elems, geo.reduce_group)
