"""The cost model of `cost.py`, vectorised over many factor vectors ``F`` at once.

For one op and one rotation template (step counts ``T``, rotating operands, their paces),
`costs_for` prices every row of an ``(N, naxes)`` array of ``F`` with numpy. It implements the
same formulas as the scalar `cost.plan_cost`, which stays the readable definition; a test checks
that both agree on every plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.costs import body_ops, prologue_ops
from t10c.dtypes import IntTensors, ceil_div
from t10c.ir import INDIRECT, TensorExpr, Window, is_contraction

from .collectives import reduce_estimate
from .cost import element_bytes, epilogue_cost, fetch_wanted, home_bytes, weights_whole
from .place import embed_rows, exchange_estimate, hops_of_ring
from .pod import reduce_pairs, ring_cross_row, spread_cross


@dataclass(frozen=True)
class Template:
    """A rotation choice that does not depend on ``F``: where and how operands rotate."""

    T: tuple[int, ...]
    rot: tuple[tuple[str, ...], ...]
    chain: tuple[int, ...]


@dataclass(frozen=True)
class CostArrays:
    compute: np.ndarray
    shift: np.ndarray
    sync: np.ndarray
    reduce: np.ndarray
    hot: np.ndarray
    cold: np.ndarray
    out: np.ndarray
    #: rows a mesh-aware search can embed (`place.choose`); all True otherwise
    placeable: np.ndarray
    #: bytes of the non-resident inputs' first tiles over all cores: what the producers'
    #: re-layouts must deliver (a plan that replicates an activation on every core it splits
    #: the weights over feeds it many times; a rotating input is fed once per ring)
    fed: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.compute + self.shift + self.sync + self.reduce


def _transfer(chip: Chip, nbytes: np.ndarray) -> np.ndarray:
    cycles = chip.hop_latency_cycles + ceil_div(nbytes, chip.link_bytes_per_cycle)
    return np.where(nbytes > 0, cycles, 0)


def _pod(chip: Chip, cross: np.ndarray) -> np.ndarray:
    """`Chip.pod_cycles` of every row's busiest chip's inter-chip bytes."""
    cycles = chip.chip_link_latency_cycles + ceil_div(cross, max(chip.pod_bytes_per_cycle, 1))
    return np.where(cross > 0, cycles, 0)


def mesh_rings(op: TensorExpr, tpl: Template, F: np.ndarray, chip: Chip
               ) -> tuple[np.ndarray, dict[int, np.ndarray], np.ndarray, np.ndarray]:
    """For every row of ``F``: whether `place.choose` embeds it, each rotating operand's
    driver (axis position), and the ring lengths laid along the columns and the rows."""
    axes = op.axis_names
    n = len(F)
    lacks = [[k for k, a in enumerate(axes) if a not in o.axis_set] for o in op.operands]
    driver: dict[int, np.ndarray] = {}
    ring: dict[int, int] = {}
    for i, r in enumerate(tpl.rot):
        if not r:
            continue
        t = tpl.T[axes.index(r[0])]
        d = np.full(n, -1, dtype=np.int64)
        for k in reversed(lacks[i]):  # the first lacking axis whose factor t divides wins
            d = np.where(F[:, k] % t == 0, k, d)
        driver[i], ring[i] = d, t
    ok, _, col_ring, _, row_ring = embed_rows(chip, np.prod(F, axis=1), driver, ring)
    return ok, driver, col_ring, row_ring


def costs_for(op: TensorExpr, tpl: Template, F: np.ndarray, chip: Chip, dtype: str,
              shapes: dict[str, tuple[int, ...]], int_tensors: IntTensors,
              const_tensors: frozenset[str], weights_home: bool = False,
              mesh: bool = False) -> CostArrays:
    axes = op.axis_names
    E = np.asarray([e for _, e in op.axes], dtype=np.int64)
    T = np.asarray(tpl.T, dtype=np.int64)
    b = ceil_div(E[None, :], F * T[None, :]) * T[None, :]
    u = b // T[None, :]
    n = len(F)
    nops = len(op.operands)
    out_index = nops - 1
    ones = np.ones(n, dtype=np.int64)

    def tile_elems(i: int) -> np.ndarray:
        operand = op.operands[i]
        elems = ones
        for d, dim in enumerate(operand.axes):
            if isinstance(dim, Window):
                size = ones + sum(c * (b[:, axes.index(a)] - 1) for a, c in dim.terms)
            elif dim == INDIRECT:
                size = ones * shapes[operand.tensor][d]
            else:
                j = axes.index(dim)
                size = u[:, j] * (tpl.T[j] // tpl.chain[i]) if dim in tpl.rot[i] else b[:, j]
            elems = elems * size
        return elems

    elems = [tile_elems(i) for i in range(nops)]
    tile_bytes = [element_bytes(op, i, dtype, int_tensors) * elems[i] for i in range(nops)]
    steps = math.prod(tpl.T)

    if is_contraction(op):
        a_set, b_set = (set(x.axis_set) for x in op.inputs[:2])
        out_set = set(op.output.axes)
        m = k = nn = batch = ones
        for j, a in enumerate(axes):
            if a not in out_set:
                k = k * u[:, j]
            elif a in a_set and a in b_set:
                batch = batch * u[:, j]
            elif a in a_set:
                m = m * u[:, j]
            else:
                nn = nn * u[:, j]
        uk, un = chip.matmul_unit
        macs = batch * m * (ceil_div(k, uk) * uk) * (ceil_div(nn, un) * un)
        per_step = chip.compute_overhead_cycles + ceil_div(
            macs, chip.matmul_macs_per_cycle[dtype])
        for slot, _ in op.prologue:  # `costs.prologue_cycles`
            work = sum((np.prod(u[:, [axes.index(a) for a in on]], axis=1) * ops
                        for s, (on, ops) in prologue_ops(op) if s == slot),
                       np.zeros(n, dtype=np.int64))
            per_step = per_step + chip.compute_overhead_cycles + ceil_div(
                work, chip.vector_ops_per_cycle[dtype])
    elif op.body[0] == "take":  # `costs.compute_cycles`: one lookup per output point
        points = np.prod(u[:, [axes.index(a) for a in op.output.axes]], axis=1)
        per_step = chip.compute_overhead_cycles + ceil_div(
            points, chip.vector_ops_per_cycle[dtype])
    else:
        points = np.prod(u, axis=1)
        per_step = chip.compute_overhead_cycles + ceil_div(
            points * body_ops(op), chip.vector_ops_per_cycle[dtype])
    compute = steps * per_step

    rot_axis = [axes.index(r[0]) if r else None for r in tpl.rot]
    if mesh:
        placeable, driver, col_ring, row_ring = mesh_rings(op, tpl, F, chip)
    else:
        placeable, driver, col_ring, row_ring = np.ones(n, dtype=bool), {}, ones, ones

    pod = chip.is_pod and not mesh
    if pod:  # per row, each rotating operand's ring crossings (`search._ring_driver`)
        lacks = [[k for k, a in enumerate(axes) if a not in o.axis_set] for o in op.operands]
        grids = [tuple(int(x) for x in f) for f in F]
        ring_of = {i: np.asarray([ring_cross_row(chip, f, next(
            (k for k in lacks[i] if f[k] % tpl.T[j] == 0), -1), tpl.T[j]) for f in grids],
            dtype=np.int64).reshape(n, chip.chips)
                   for i, j in enumerate(rot_axis) if j is not None}

    def crossing(movers: list[int]) -> np.ndarray:
        """Per row, the busiest chip's inter-chip bytes of one shift of ``movers``."""
        per_chip = sum(ceil_div(tile_bytes[i][:, None] * tpl.chain[i] * ring_of[i],
                                tpl.T[rot_axis[i]]) for i in movers)  # type: ignore[index]
        return np.asarray(per_chip).max(axis=1)

    def step(movers: list[int]) -> np.ndarray:
        moved = sum((tile_bytes[i] for i in movers), np.zeros(n, dtype=np.int64))
        if mesh:  # operands on the same driver share its links (`place.shift_cycles`)
            busiest = np.zeros(n, dtype=np.int64)
            for i in movers:
                same = sum(np.where(driver[j] == driver[i], tile_bytes[j], 0) for j in movers)
                busiest = np.maximum(busiest, same)
            hops = max(hops_of_ring(tpl.T[rot_axis[i]]) for i in movers)  # type: ignore
            cycles = np.where(busiest > 0, chip.hop_latency_cycles * hops
                              + ceil_div(busiest, chip.link_bytes_per_cycle), 0)
        else:
            cycles = _transfer(chip, moved)
            if pod:
                cycles = np.maximum(cycles, _pod(chip, crossing(movers)))
        if chip.overlap:
            cycles = np.maximum(cycles - per_step, 0)
        return cycles

    shift = np.zeros(n, dtype=np.int64)
    sync = np.zeros(n, dtype=np.int64)
    for J in range(len(axes)):
        if tpl.T[J] == 1:
            continue
        movers = [i for i in range(nops) if (r := rot_axis[i]) is not None and r >= J]
        if not movers:
            continue
        count = math.prod(tpl.T[:J]) * (tpl.T[J] - 1)
        moved = sum(tile_bytes[i] for i in movers)
        shift = shift + count * step(movers)
        sync = sync + count * np.where(moved > 0, chip.sync_cycles, 0)
    homing = [i for i, o in enumerate(op.inputs)
              if rot_axis[i] is not None and o.tensor in const_tensors and not weights_home]
    if homing:
        home = sum(tile_bytes[i] for i in homing)
        shift = shift + step(homing)
        sync = sync + np.where(home > 0, chip.sync_cycles, 0)

    red = [j for j, a in enumerate(axes) if a not in op.output.axes]
    group = np.prod(F[:, red], axis=1) if red else ones
    out_axis = rot_axis[out_index]
    if out_axis is not None:
        group = group // tpl.T[out_axis]
    share = np.where(group > 1, ceil_div(elems[out_index], group), elems[out_index])
    epi = epilogue_cost(op, share, chip, dtype, int_tensors, const_tensors, shapes)
    fetched = ones * epi.fetched
    if weights_home:
        fetched = fetched + sum((tile_bytes[i] for i, o in enumerate(op.inputs)
                                 if o.tensor in const_tensors), np.zeros(n, dtype=np.int64))
    if fetched.any():
        if mesh:
            shift = shift + np.asarray([exchange_estimate(chip, int(x)) for x in fetched])
        else:
            fetch = _transfer(chip, fetched)
            if pod:
                ncores = np.prod(F, axis=1)
                whole = weights_whole(op, shapes, dtype, int_tensors, const_tensors) \
                    if weights_home else 0
                fetch = np.maximum(fetch, _pod(chip, np.asarray(
                    [spread_cross(chip, int(c), int(x),
                                  fetch_wanted(chip, int(c), whole, int(e)))
                     for c, x, e in zip(ncores, fetched, ones * epi.fetched)])))
            shift = shift + fetch
        sync = sync + np.where(fetched > 0, chip.sync_cycles, 0)

    out_elem = element_bytes(op, out_index, dtype, int_tensors)
    chunk = ceil_div(elems[out_index], group)
    chunk_bytes = np.where(group > 1, chunk * out_elem, 0)
    vec = chip.compute_overhead_cycles + ceil_div((group - 1) * chunk,
                                                    chip.vector_ops_per_cycle[dtype])
    first = chunk  # the largest chunk a level of the reduce-scatter keeps
    if mesh:  # the levels of `collectives.reduce_estimate` (their adds included)
        ncores = np.prod(F, axis=1)
        moving = np.zeros(n, dtype=np.int64)
        first = chunk.copy()
        rows = np.stack([group, ncores, col_ring, row_ring, elems[out_index]], axis=1)
        uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
        for row, (g, nc, tc, tr, block) in enumerate(uniq.tolist()):
            if g > 1:
                sel = inverse.ravel() == row
                cycles, most = reduce_estimate(chip, nc, g, tc, tr, block, out_elem, dtype)
                moving[sel] = cycles
                first[sel] = most
        vec = np.zeros(n, dtype=np.int64)
    else:
        moving = _transfer(chip, (group - 1) * chunk * out_elem)
        if pod and red:
            drv = (None if out_axis is None else
                   [next((k for k in lacks[out_index] if f[k] % tpl.T[out_axis] == 0), -1)
                    for f in grids])
            pairs = np.asarray([reduce_pairs(chip, f, tuple(red), int(g),
                                             None if drv is None or out_axis is None
                                             else (drv[r], tpl.T[out_axis]))
                                for r, (f, g) in enumerate(zip(grids, group))], dtype=np.int64)
            moving = np.maximum(moving, _pod(chip, np.where(group > 1, pairs * chunk * out_elem,
                                                            0)))
    reduce = np.where(group > 1, chip.sync_cycles + moving + vec, 0)
    if homing:  # codegen: a reduce-scatter shares the restore shift's superstep (one barrier)
        reduce = reduce - np.where((group > 1) & (home > 0), chip.sync_cycles, 0)
    out_bytes = np.where(group > 1, chunk_bytes, tile_bytes[out_index])
    compute = compute + epi.compute

    cold = sum((tile_bytes[i] for i, o in enumerate(op.inputs) if o.tensor in const_tensors),
               np.zeros(n, dtype=np.int64))
    hot = sum(tile_bytes) + sum((tile_bytes[i] for i in range(nops) if rot_axis[i] is not None),
                                np.zeros(n, dtype=np.int64))
    sending = home if homing else 0  # the restore's sources, kept through a shared reduce
    hot = np.where(group > 1, np.maximum(hot, cold + tile_bytes[out_index] + first * out_elem
                                         + sending), hot)
    hot = hot + epi.hot
    if weights_home:
        cold = ones * home_bytes(op, shapes, chip, dtype, int_tensors, const_tensors)
        hot = hot + cold
    cold = cold + epi.cold
    fed = np.prod(F, axis=1) * sum((tile_bytes[i] for i, o in enumerate(op.inputs)
                                    if o.tensor not in const_tensors),
                                   np.zeros(n, dtype=np.int64))
    return CostArrays(compute, shift, sync, reduce, hot, cold, out_bytes, placeable, fed)
