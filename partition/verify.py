"""Plan verifier: run before codegen (always) and in tests.

It re-derives from each plan's geometry, independently of how the search built it, that:

1. the op fits the chip (``prod(F) <= cores``) and every rotation has a ring: the operand lacks
   its driver axis and ``T`` divides the driver's factor;
2. the sub-tasks tile the iteration space exactly once: along every axis the blocks and
   sub-blocks cover ``[0, extent)`` once, and every core visits each sub-block combination once
   over the steps (so every output element is computed and every reduction term is seen once);
3. every rotation delivers what the next step reads: after each shift, a core's partition is the
   one its ring source held;
4. memory: each op's hot bytes, and the resident weights plus the running op and the live
   activations, fit every core's SRAM;
5. placement: the op's cores sit on distinct physical cores of the chip, and on a mesh an
   embedded plan (`place.py`) shifts every ring by at most 2 hops.

Repeated layers (ops with the same expression and plan) are checked once.
"""

from __future__ import annotations

import numpy as np

from t10c.chips import Chip
from t10c.ir import Graph, distinct_rows

from .chosen import Plan, PlanError
from .plan import Geometry, geometry
from .solve import liveness

__all__ = ["PlanError", "verify_plan"]


def _check_op(geo: Geometry, chip: Chip) -> list[str]:
    problems = []
    if geo.ncores > chip.cores:
        problems.append(f"uses {geo.ncores} cores, the chip has {chip.cores}")
    for i in range(len(geo.op.operands)):
        j = geo.rotation_axis(i)
        if j is None:
            continue
        try:
            driver = geo.driver_of(i)
        except AssertionError:
            problems.append(f"operand {i} rotates along {geo.axes[j]} without a driver it lacks")
            continue
        if geo.F[geo.axes.index(driver)] % geo.T[j]:
            problems.append(f"T[{geo.axes[j]}]={geo.T[j]} does not divide F[{driver}]")
    if problems:
        return problems
    for j, (e, f, t) in enumerate(zip(geo.E, geo.F, geo.T)):
        starts = (np.arange(f)[:, None] * geo.b[j] + np.arange(t)[None, :] * geo.u[j]).ravel()
        cover = np.zeros(f * geo.b[j], dtype=np.int64)
        for first in starts:
            cover[first:first + geo.u[j]] += 1
        if not (cover[:e] == 1).all():
            problems.append(f"axis {geo.axes[j]} is not covered exactly once")
    # a core's visits depend on it only through its skew: check each distinct skew once
    skews = distinct_rows(geo.skew)[0]
    T = np.asarray(geo.T)
    seen = np.stack([np.ravel_multi_index(tuple(((np.asarray(geo.digits(s)) + skews) % T).T),
                                          geo.T) for s in range(geo.steps)], axis=1)
    if not (np.sort(seen, axis=1) == np.arange(geo.steps)).all():
        problems.append("some core does not visit every sub-block exactly once")
    for i in range(len(geo.op.operands)):
        j = geo.rotation_axis(i)
        if j is None:
            continue
        if not 1 < geo.chain[i] <= geo.T[j] or geo.T[j] % geo.chain[i]:
            problems.append(f"operand {i}: f_t {geo.chain[i]} does not divide T={geo.T[j]}")
            continue
        if i == len(geo.op.inputs) and geo.chain[i] != geo.T[j]:
            problems.append("the output must rotate at its axis' pace (partial sums move)")
        # the ring source holds the same block of the operand (it differs from the core only
        # along an axis the operand lacks) ...
        ring = geo.ring_source(i)
        if not (geo.tile_origin(i, 0)[ring] - geo.tile_origin(i, 0) ==
                _part_offset(geo, i, 0)[ring] - _part_offset(geo, i, 0)).all():
            problems.append(f"operand {i}: its ring leaves the block it shares")
        # ... and after every step it holds the partition the core reads next. Partitions
        # depend on a core only through its skew, so each distinct (core skew, source skew)
        # pair is checked once per step
        per = geo.T[j] // geo.chain[i]
        pairs = distinct_rows(np.stack([geo.skew[:, j], geo.skew[ring, j]], axis=1))[0]
        for s in range(geo.steps - 1):
            if j not in geo.changes(s):
                continue
            now, nxt = geo.digits(s)[j], geo.digits(s + 1)[j]
            own, wanted = (now + pairs[:, 0]) % geo.T[j] // per, \
                (nxt + pairs[:, 0]) % geo.T[j] // per
            held = (now + pairs[:, 1]) % geo.T[j] // per
            if not np.where(own != wanted, held == wanted, True).all():
                problems.append(f"operand {i}: shift after step {s} delivers the wrong partition")
                break
        if geo.embed is not None and geo.steps > 1:
            far = int(chip.hops(geo.phys[geo.ring_source(i)], geo.phys).max())
            if far > 2:
                problems.append(f"operand {i}: its ring has a {far}-hop edge on {chip.name}")
    phys = geo.phys
    if phys.min(initial=0) < 0 or phys.max(initial=0) >= chip.cores or \
            np.bincount(phys, minlength=1).max(initial=0) > 1:
        problems.append("its cores are not distinct physical cores of the chip")
    return problems


def _part_offset(geo: Geometry, index: int, step: int) -> np.ndarray:
    """(ncores, ndim): the part of operand ``index``'s tile origin that its partition adds."""
    zero = np.zeros_like(geo.tile_origin(index, step))
    j = geo.rotation_axis(index)
    assert j is not None
    per = geo.T[j] // geo.chain[index]
    dims = [d for d, a in enumerate(geo.dim_axes(index)) if a == j]
    zero[:, dims] = (geo.partition(index, step) * per * geo.u[j])[:, None]
    return zero


def verify_plan(graph: Graph, plan: Plan, chip: Chip) -> None:
    """Raise `PlanError` listing every problem of ``plan``; return quietly when it is sound."""
    problems = []
    if len(plan.ops) != len(graph.ops):
        raise PlanError(f"plan has {len(plan.ops)} ops, graph has {len(graph.ops)}")
    checked: dict[tuple, list[str]] = {}
    for op, p in zip(graph.ops, plan.ops):
        if p.op != op.name:
            problems.append(f"{op.name}: plan is for {p.op}")
            continue
        key = (op.signature(), p.unnamed)
        if key not in checked:
            checked[key] = _check_op(geometry(graph, op, p), chip)
        for msg in checked[key]:
            problems.append(f"{op.name}: {msg}")
        if p.hot_bytes_per_core > chip.sram_bytes_per_core:
            problems.append(f"{op.name}: needs {p.hot_bytes_per_core} bytes per core, "
                            f"SRAM is {chip.sram_bytes_per_core}")
    resident = sum(p.cold_bytes_per_core for p in plan.ops)
    terms = liveness(graph, chip.has_dram)
    for i, p in enumerate(plan.ops):
        live = sum(plan.ops[j].out_bytes_per_core
                   for j in (*terms.live_after[i], *terms.dying_inputs[i]))
        need = resident + p.hot_bytes_per_core - p.cold_bytes_per_core + live
        if need > chip.sram_bytes_per_core:
            problems.append(f"{graph.ops[i].name}: {need} bytes per core in use while it runs "
                            f"and re-lays out its inputs, SRAM is {chip.sram_bytes_per_core}")
    if problems:
        raise PlanError("plan verification failed:\n  " + "\n  ".join(problems))
