"""Re-layout costs between a producer's plan and a consumer's plan (the solver's (C3) edges).

The producer leaves every core a box of the tensor (its output tile after the last step); the
consumer wants every core to hold a box of it (its input tile at step 0). A core receives every
element of its wanted box that it does not already hold; the exchange lasts as long as the
busiest core needs, after one barrier:

    remote(c) = |want(c) within the tensor| - |want(c) and have(c) within the tensor|
    cycles = sync + transfer(max_c remote(c) * bytes per element), or 0 when nothing moves.

On a mesh the transfer is `place.exchange_estimate` (routes across the mesh, not one hop).

When the producer's result ends reduce-scattered (not a box) or a Reshape/Transpose view lies
between the two, every wanted element is counted as remote. The emulator measures the real
exchange from codegen's tables, so this is an estimate only in those cases.
"""

from __future__ import annotations

import numpy as np

from t10c.chips import Chip
from t10c.ir import Graph

from .cost import element_bytes
from .place import exchange_estimate
from .plan import OpPlan, geometry

Box = tuple[np.ndarray, np.ndarray] | None  # (origins (ncores, ndim), shape (ndim,))


def output_box(graph: Graph, j: int, plan: OpPlan) -> Box:
    op = graph.ops[j]
    geo = geometry(graph, op, plan)
    if geo.reduce_group > 1:
        return None
    out = len(op.inputs)
    return geo.tile_origin(out, geo.steps - 1), np.asarray(geo.tile_shape(out))


def input_box(graph: Graph, i: int, slot: int, plan: OpPlan) -> tuple[np.ndarray, np.ndarray]:
    op = graph.ops[i]
    geo = geometry(graph, op, plan)
    return geo.tile_origin(slot, 0), np.asarray(geo.tile_shape(slot))


def _clip(lo: np.ndarray, hi: np.ndarray, extent: np.ndarray) -> np.ndarray:
    return np.maximum(np.minimum(hi, extent) - np.maximum(lo, 0), 0)


def remote_elements(have: Box, want: tuple[np.ndarray, np.ndarray], extent: np.ndarray
                    ) -> int:
    """The most elements any core must receive to go from ``have`` to ``want``."""
    w_origin, w_shape = want
    wanted = np.prod(_clip(w_origin, w_origin + w_shape, extent), axis=1)
    if have is None:
        return int(wanted.max(initial=0))
    h_origin, h_shape = have
    n = min(len(h_origin), len(w_origin))
    lo = np.maximum(h_origin[:n], w_origin[:n])
    hi = np.minimum(h_origin[:n] + h_shape, w_origin[:n] + w_shape)
    local = np.zeros(len(w_origin), dtype=np.int64)
    local[:n] = np.prod(_clip(lo, np.maximum(hi, lo), extent), axis=1)
    return int((wanted - local).max(initial=0))


def edge_cost(graph: Graph, j: int, i: int, slot: int, producer: list[OpPlan],
              consumer: list[OpPlan], chip: Chip, dtype: str, int_tensors: frozenset[str]
              ) -> tuple[tuple[int, ...], ...]:
    """Re-layout cycles for every (producer plan, consumer plan) pair of one edge."""
    op = graph.ops[i]
    operand = op.inputs[slot]
    direct = operand.tensor == graph.ops[j].output.tensor
    extent = np.asarray(graph.tensors[operand.tensor].shape)
    nbytes = element_bytes(op, slot, dtype, int_tensors)
    haves = [output_box(graph, j, p) if direct else None for p in producer]
    wants = [input_box(graph, i, slot, q) for q in consumer]
    # on a mesh, mesh-aware plans price the exchange by its routes (an estimate); plans made
    # under the all-to-all assumption price it as that assumption says
    aware = chip.is_mesh and any(q.embed is not None for q in consumer)
    moving = (lambda b: exchange_estimate(chip, b)) if aware else chip.transfer_cycles
    # on a mesh a producer core that feeds many consumer cores is a hot spot too: it sends its
    # tile once per consumer core that reads each element (the operand's replication)
    fanout = [replication(op, slot, q) for q in consumer]
    rows = []
    for have, p in zip(haves, producer):
        row = []
        for want, copies in zip(wants, fanout):
            remote = remote_elements(have, want, extent)
            if aware and remote:
                sent = p.out_bytes_per_core * copies
                row.append(chip.sync_cycles + exchange_estimate(chip, remote * nbytes, sent))
            else:
                row.append(chip.sync_cycles + moving(remote * nbytes) if remote else 0)
        rows.append(tuple(row))
    return tuple(rows)


def replication(op, slot: int, plan: OpPlan) -> int:
    """How many cores hold each element of input ``slot`` (one copy per ring when it
    rotates): the product of F over the op axes the operand does not index."""
    own = set(op.inputs[slot].axis_set)
    copies = 1
    for (axis, _), f in zip(op.axes, plan.F):
        if axis not in own:
            copies *= f
    return max(copies // plan.chain[slot], 1)
