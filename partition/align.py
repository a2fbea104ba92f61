"""Plans that need no re-layout: a consumer plan whose input tiles are where its producer left
them.

Each op's own Pareto front in (hot bytes, cycles) rarely holds a plan that matches the layout
its producer leaves: a bias Add after a MatMul is cheapest on its own as a near-square grid,
while the MatMul leaves row strips, and every such pair pays a barrier and an exchange. So
for every activation input of an op, and every plan on its producer's front that leaves one
box per core forming a regular grid over the tensor (`transitions.result_boxes`), this
module builds the consumer plan that wants exactly those boxes:

- ``F`` over the consumer's axes is the grid's shape on the axes the input indexes (1 on the
  others), with one compute step and nothing rotating; its blocks ``ceil(E / F)`` must equal
  the producer's boxes, or the grid cannot be matched. An input dimension read through a
  window of one term, ``coef * axis + offset`` (a strided or shifted slice folded into its
  reader: a gated MLP's woven gate and up halves, `frontend.rewrite._weave`), takes blocks
  of ``box / coef`` points (one point where the boxes are single elements), each reading
  within one box;
- on an all-to-all chip any physical core can run any logical core, so logical core ``c``
  runs on the core that holds box ``c`` (`OpPlan.cores`).

The aligned plan is costed by the same cost model (`cost.plan_cost`) and offered in a second,
small solve after the first (`partition.plan_graph`): every op chooses between its chosen plan
and the plans aligned to what its producers' choices, or their aligned alternatives, leave;
the solver pairs an aligned plan only with the producer plans that leave its layout
(`solve.py`, (C3)). Aligned plans leave a box grid themselves, so chains of elementwise ops
align transitively. At most ``SearchOptions.align`` of them are added per op.

On an all-to-all chip only ops with a single moving input (the others weights) get aligned
plans: an op with two moving inputs pays its barrier unless both arrive aligned, and offering
them plans aligned to one input made the relaxation of the whole-graph model weak (diamonds
such as a LayerNorm's mean, variance and normalisation all reading one tensor). Offering
aligned plans beside whole fronts in the first solve stalled CP-SAT on bert-large
(docs/planner.md).

On a mesh a re-layout costs the distance its data travels, so an input that stays where its
producer left it saves its whole route even when another input moves: ops with several
moving inputs get plans aligned to each. There an aligned plan must not reduce (its cores
are wherever the producer's boxes lie, so no reduction group would sit in its rectangle,
`place.group_tile`): it runs on the producer's cores, computes, and rotates nothing, so its
own cycles are placement-free and its re-layouts are priced by routing
(`meshmove.py`), as every mesh plan's.
"""

from __future__ import annotations

import math

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import IntTensors, ceil_div
from t10c.ir import Dim, Graph

from .cost import plan_cost
from .plan import Cycles, Geometry, OpPlan, geometry, operand_shapes
from .transitions import result_boxes


def _grid(origin: np.ndarray, shape: np.ndarray, extent: tuple[int, ...]
          ) -> tuple[tuple[int, ...], np.ndarray] | None:
    """When the boxes that lie inside the tensor form a regular grid of ``shape``-sized
    blocks from 0 (one box per block, blocks of ``ceil(E / F)``): (F per dimension, the grid
    index of every box, -1 for boxes wholly in the padding). None otherwise."""
    ext = np.asarray(extent)
    if (shape <= 0).any():
        return None
    inside = (origin < ext).all(axis=1) & (origin + shape > 0).all(axis=1)
    if ((origin[inside] % shape) != 0).any() or (origin[inside] < 0).any():
        return None
    F = tuple(int(f) for f in ceil_div(ext, shape))
    if any(ceil_div(e, f) != s for e, f, s in zip(extent, F, shape)):
        return None
    index = np.full(len(origin), -1, dtype=np.int64)
    if inside.any():
        index[inside] = np.ravel_multi_index(tuple((origin[inside] // shape).T), F)
    boxes = int(inside.sum())
    # one box per block: as many boxes as blocks, none two in a block (a count, not a sort)
    if boxes != math.prod(F) or (boxes and np.bincount(index[inside]).max() > 1):
        return None
    return F, index


def aligned_plan(graph: Graph, i: int, slot: int, j: int, produced: OpPlan, chip: Chip,
                 dtype: str, ints: IntTensors, consts: frozenset[str],
                 weights_home: bool = False) -> OpPlan | None:
    """The plan of op ``i`` whose input ``slot`` tiles are the boxes plan ``produced`` of op
    ``j`` leaves, on the cores holding them; None when there is none."""
    if graph.ops[i].inputs[slot].tensor != graph.ops[j].output.tensor:
        return None
    pgeo = geometry(graph, graph.ops[j], produced)
    boxes = result_boxes(pgeo, any_chunk=True)
    if boxes is None:
        return None
    return plan_on_boxes(graph, i, slot, *boxes, pgeo.phys, chip, dtype, ints, consts,
                         weights_home)


def plan_on_boxes(graph: Graph, i: int, slot: int, origin: np.ndarray, shape: np.ndarray,
                  phys: np.ndarray, chip: Chip, dtype: str, ints: IntTensors,
                  consts: frozenset[str], weights_home: bool = False) -> OpPlan | None:
    """The plan of op ``i`` whose input ``slot`` tiles are the boxes ``origin`` (one row per
    core) of ``shape``, core ``c``'s on physical core ``phys[c]`` (what a producer leaves,
    `aligned_plan`, or what a neighbour reading the same activation wants of it,
    `partition._match_reads`); None when the boxes are no regular grid, or the plan would
    reduce on a mesh or not fit."""
    op = graph.ops[i]
    operand = op.inputs[slot]
    names = op.axis_names
    reads = [_read(d) for d in operand.axes]
    if any(r is None or r[0] not in names for r in reads) or \
            len({r[0] for r in reads if r}) != len(reads):
        return None  # windows of several terms, data-indexed dimensions: no simple tiles
    grid = _grid(origin, shape, graph.tensors[operand.tensor].shape)
    if grid is None:
        return None
    per_dim, index = grid
    F = [1] * len(names)
    blocks = []  # per operand dimension: the box index each block of its axis reads
    for d, r in enumerate(reads):
        assert r is not None
        a, coef, offset = r
        at, extent = names.index(a), op.axes[names.index(a)][1]
        box = int(shape[d])
        if box % coef and box != 1:
            return None
        block = max(box // coef, 1)  # a block of the axis reads within one box
        F[at] = ceil_div(extent, block)
        if ceil_div(extent, F[at]) != block:
            return None
        first = coef * np.arange(F[at]) * block + offset
        last = first + coef * (block - 1)
        k = first // box
        if (last // box != k).any() or (first < 0).any() or (k >= per_dim[d]).any():
            return None
        blocks.append(k)
    if math.prod(F) > chip.cores:
        return None
    # logical core c (row-major over F) wants the box whose grid index its coordinates give
    holder = np.full(math.prod(per_dim), -1, dtype=np.int64)
    holder[index[index >= 0]] = phys[index >= 0]
    coords = np.stack(np.unravel_index(np.arange(math.prod(F)), F), axis=1)
    dims = [names.index(r[0]) for r in reads if r]
    cores = holder[np.ravel_multi_index(
        tuple(k[coords[:, a]] for k, a in zip(blocks, dims)), per_dim)]
    if (cores < 0).any():
        return None
    nops = len(op.operands)
    T = (1,) * len(names)
    rot: tuple[tuple[str, ...], ...] = ((),) * nops
    drivers: tuple[tuple[str, ...], ...] = ((),) * len(names)
    chain = (1,) * nops
    shapes = operand_shapes(graph, op)
    if np.array_equal(cores, np.arange(len(cores))):
        placed_or_none = None  # the row-major numbering already matches
    else:
        placed_or_none = tuple(cores.tolist())
    geo = Geometry(op, tuple(F), T, rot, drivers, shapes, chain, None, placed_or_none)
    if chip.is_mesh and geo.reduce_group > 1:
        return None  # see the module doc
    cycles, hot, cold, out = plan_cost(geo, chip, dtype, ints, consts, weights_home)
    if hot > chip.sram_bytes_per_core:
        return None
    return OpPlan(op.name, tuple(F), T, rot, drivers, chain,
                  Cycles(cycles.compute, cycles.shift, cycles.sync, cycles.reduce), hot, cold,
                  out, home=weights_home, cores=placed_or_none, aligned=slot)


def _read(dim: Dim) -> tuple[str, int, int] | None:
    """An operand dimension as (axis, coef, offset): the dimension's index is ``coef *
    axis + offset`` (a plain axis: coef 1, offset 0; a strided or shifted slice read
    point by point: a window of one term). None for a window of several terms."""
    if isinstance(dim, str):
        return dim, 1, 0
    if len(dim.terms) != 1 or dim.terms[0][1] < 1:
        return None
    (axis, coef), = dim.terms
    return axis, coef, dim.offset


def _same(a: OpPlan, b: OpPlan) -> bool:
    """The same plan, wherever it came from (an aligned copy of a front plan adds nothing)."""
    return (a.F, a.T, a.rot, a.chain, a.cores, a.home) == (b.F, b.T, b.rot, b.chain, b.cores,
                                                            b.home)


def aligned_variants(graph: Graph, i: int, fronts: list[list[OpPlan]], chip: Chip,
                     dtype: str, ints: IntTensors, consts: frozenset[str], limit: int,
                     weights_home: bool = False) -> list[OpPlan]:
    """Up to ``limit`` plans of op ``i`` aligned to plans on its producers' fronts (earlier
    ops' fronts, aligned variants included), not already on its own front."""
    if limit <= 0:
        return []
    op = graph.ops[i]
    producer = {o.output.tensor: j for j, o in enumerate(graph.ops[:i])}
    found: list[OpPlan] = []
    # round-robin over the inputs, each producer's plans in front order (fastest first)
    candidates = []
    made = {o.output.tensor for o in graph.ops}
    if not chip.is_mesh and sum(graph.root(o.tensor) in made for o in op.inputs) != 1:
        return []  # see the module doc: one moving input only, off meshes
    for slot, operand in enumerate(op.inputs):
        j = producer.get(operand.tensor)
        if j is not None:
            candidates.append([(slot, j, p) for p in fronts[j]])
    for tier in range(max((len(c) for c in candidates), default=0)):
        for c in candidates:
            if tier >= len(c) or len(found) >= limit:
                continue
            slot, j, p = c[tier]
            # (on a mesh a warm-up's fetch onto scattered cores is not priced by routing:
            # an aligned plan keeps its weights, an elementwise op's few, resident there)
            q = aligned_plan(graph, i, slot, j, p, chip, dtype, ints, consts,
                             weights_home and not chip.is_mesh)
            if q is not None and not any(_same(q, f) for f in (*fronts[i], *found)):
                found.append(q)
    return found
