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
from t10c.digest import hasher
from t10c.dtypes import IntTensors, ceil_div
from t10c.ir import Graph, TensorExpr, last_product, unravel

from .place import exchange_estimate
from .plan import KERNEL_CORES, OpPlan, geometry

Box = tuple[np.ndarray, np.ndarray] | None  # (origins (ncores, ndim), shape (ndim,))


def _output_box(graph: Graph, j: int, plan: OpPlan) -> Box:
    """The box of op j's result each core holds after its last step (None: reduce-scattered,
    not a box)."""
    op = graph.ops[j]
    geo = geometry(graph, op, plan)
    if geo.reduce_group > 1:
        return None
    out = len(op.inputs)
    return geo.tile_origin(out, geo.steps - 1), np.asarray(geo.tile_shape(out))


def _clip(lo: np.ndarray, hi: np.ndarray, extent: np.ndarray) -> np.ndarray:
    return np.maximum(np.minimum(hi, extent) - np.maximum(lo, 0), 0)


def _remote_elements(have: Box, want: tuple[np.ndarray, np.ndarray], extent: np.ndarray
                     ) -> int:
    """The most elements any core must receive to go from ``have`` to ``want`` (all of them
    when ``have`` is not a box): from `plan.KERNEL_CORES` cores one pass over them
    (`kernels.most_remote_boxes`); below, as whole-array passes."""
    w_origin, w_shape = want
    if len(w_origin) >= KERNEL_CORES:
        from .kernels import as_int64, most_remote_boxes, wanted_elements  # (numba)

        w_origin, w_shape, extent = as_int64(w_origin), as_int64(w_shape), as_int64(extent)
        if have is None:
            return int(wanted_elements(w_origin, w_shape, extent).max(initial=0))
        return int(most_remote_boxes(as_int64(have[0]), as_int64(have[1]), w_origin, w_shape,
                                     extent))
    wanted = last_product(_clip(w_origin, w_origin + w_shape, extent))
    if have is None:
        return int(wanted.max(initial=0))
    h_origin, h_shape = have
    n = min(len(h_origin), len(w_origin))
    lo = np.maximum(h_origin[:n], w_origin[:n])
    hi = np.minimum(h_origin[:n] + h_shape, w_origin[:n] + w_shape)
    local = np.zeros(len(w_origin), dtype=np.int64)
    local[:n] = last_product(_clip(lo, np.maximum(hi, lo), extent))
    return int((wanted - local).max(initial=0))


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
                    int_tensors: IntTensors) -> tuple[tuple[int, ...], ...]:
    """Cycles to bring ``extra[k]`` of op i from producer j's layout, for every (producer
    plan, consumer plan) pair."""
    operand = graph.ops[i].extra[k]
    direct = operand.tensor == graph.ops[j].output.tensor
    extent = np.asarray(graph.tensors[operand.tensor].shape)
    nbytes = int_tensors.bytes_of(operand.tensor, dtype)
    haves = [_output_box(graph, j, p) if direct else None for p in producer]
    wants = [extra_box(graph, i, k, q) for q in consumer]
    moving = (lambda b: exchange_estimate(chip, b)) if chip.is_mesh else chip.transfer_cycles
    # plans differing only in their steps leave and want the same boxes: each distinct
    # (have, want) pair once (per pair, work over every core: 750,000 on a wafer)
    have_ids = _distinct([None if h is None else (h[0], h[1]) for h in haves])
    want_ids = _distinct([(w[0], w[1], np.asarray(g)) for w, g in wants])
    memo: dict[tuple[int, int], int] = {}
    rows = []
    for have, hk in zip(haves, have_ids):
        row = []
        for (want, group), wk in zip(wants, want_ids):
            if (hk, wk) not in memo:
                remote = ceil_div(_remote_elements(have, want, extent), group)
                memo[hk, wk] = chip.sync_cycles + moving(remote * nbytes) if remote else 0
            row.append(memo[hk, wk])
        rows.append(tuple(row))
    return tuple(rows)


def _distinct(items: list[tuple[np.ndarray, ...] | None]) -> list[int]:
    """A number per item, equal for items whose arrays are equal (shape, dtype, values)."""
    seen: dict[bytes, int] = {}
    out = []
    for item in items:
        h = hasher()
        for a in item or ():
            a = np.ascontiguousarray(a)
            h.update(repr((a.shape, a.dtype.str)).encode())
            h.update(a)
        out.append(seen.setdefault(h.digest() if item is not None else b"", len(seen)))
    return out


def extra_elements(graph: Graph, op: TensorExpr, k: int, flat: np.ndarray, valid: np.ndarray
                   ) -> np.ndarray:
    """For each element of the result buffer (``flat`` output element, ``valid``), the flat
    element of ``extra[k]`` its epilogue reads, or -1 for padding."""
    operand = op.extra[k]
    out_axes = [str(a) for a in op.output.axes]
    coords = unravel(np.where(valid, flat, 0), graph.tensors[op.output.tensor].shape)
    shape = graph.tensors[operand.tensor].shape
    if not operand.axes:
        index = np.zeros_like(flat)
    else:
        picked = tuple(coords[out_axes.index(str(a))] for a in operand.axes)
        index = np.ravel_multi_index(picked, shape)
    return np.where(valid, index, -1)
