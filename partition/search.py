"""Per-op plan search: enumerate legal rTensor plans, cost them, keep the Pareto front.

Enumeration (see `plan.py` for what a plan means):

1. ``F``: per axis, the candidate factors are the divisors of the extent and the powers of two
   below it (capped at the core count); to their grid product come, for each row and axis, the
   largest factor that still fits beside the others (so that odd core counts get used). It
   keeps the rows with ``prod(F) <= cores``,
   at least ``min_util`` of the usable cores busy, and at most ``max_pad`` padding waste.
2. Rotation: for each axis ``a`` and each non-empty set ``S`` of operands indexed by ``a``, and
   each step count ``T > 1`` that divides ``F`` of an axis every member of ``S`` lacks (the ring
   driver), the operands in ``S`` rotate along ``a`` in ``T`` steps. Up to ``max_rot_axes`` axes
   rotate in one plan; an operand rotates along one axis at most.
3. Every plan is costed with numpy over all factor rows of a rotation template at once
   (`vcost.costs_for`, the vectorised `cost.plan_cost`); the front keeps the plans that no other
   plan beats in both hot bytes and cycles, each with its idle (cold) bytes, and only those are
   built as `OpPlan` objects.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import IntTensors, ceil_div
from t10c.elementwise import body_inputs
from t10c.ir import INDIRECT, TensorExpr

from .place import choose, ring_drivers
from .plan import Cycles, OpPlan
from .vcost import CostArrays, Template, costs_for


@dataclass(frozen=True)
class SearchOptions:
    """Pruning thresholds of the per-op search."""

    min_util: float = 0.5  # keep plans using at least this share of the usable cores
    max_pad: float = 0.25  # keep plans whose padded iteration space is at most 1.25x the real one
    max_rot_axes: int = 2  # rotate along at most this many axes in one plan
    max_steps: int = 64  # at most this many compute steps
    #: also enumerate inputs rotating at a slower pace than their axis' steps (divisibility
    #: chains); under bulk-synchronous timing they are dominated, see `plan.py`
    chains: bool = False
    #: virtual global memory (the vgm baseline): weights live spread evenly over all cores and
    #: every op fetches the tiles it needs before it computes, as shared-memory compilers do
    weights_home: bool = False
    #: on a mesh or torus, embed every plan's rings (`place.py`) and price shifts by hops and
    #: link load; False plans as if the chip were all-to-all and numbers cores row-major, as
    #: T10 does (the baseline that shows what mesh awareness is worth)
    mesh_aware: bool = True
    #: plans aligned to the layouts their producers' chosen plans leave (`align.py`), at most
    #: this many per op in the second solve; 0 for none
    align: int = 2
    #: on a chip with DRAM, how each op's loads are scheduled (`partition/dram.py`): "elk"
    #: (as early as SRAM allows), "static" (one fixed preload depth) or "basic" (load, then
    #: execute)
    dram_schedule: str = "elk"


def _axis_candidates(extent: int, cores: int) -> list[int]:
    """Divisors of the extent and powers of two below it: factors that split evenly or make
    rings (a step count must divide its driver's factor)."""
    cands = {d for d in range(1, min(extent, cores) + 1) if extent % d == 0}
    p = 1
    while p <= min(extent, cores):
        cands.add(p)
        p *= 2
    return sorted(cands)


def _factor_grids(extents: tuple[int, ...], splittable: list[bool], cores: int,
                  opts: SearchOptions, parallel: list[bool] | None = None) -> np.ndarray:
    """All admissible F vectors, as an (n, naxes) array."""
    per_axis = [np.array(_axis_candidates(e, cores) if s else [1], dtype=np.int64)
                for e, s in zip(extents, splittable)]
    grid = np.stack([g.ravel() for g in np.meshgrid(*per_axis, indexing="ij")], axis=1)
    grid = np.unique(np.concatenate([grid, _fill(grid, np.asarray(extents), splittable, cores)]),
                     axis=0)
    parallel = parallel if parallel is not None else [True] * len(extents)
    used = grid.prod(axis=1)
    # "busy" is measured against the output's parallelism: splitting a reduction axis only to
    # occupy more cores buys partial sums to combine, which the cost model weighs, and must
    # not be forced (a LayerNorm row on a wafer would otherwise be cut into hundreds of parts)
    best = min(cores, math.prod(e for e, s, p in zip(extents, splittable, parallel)
                                if s and p))
    padded = np.prod(ceil_div(np.asarray(extents), grid) * grid, axis=1)
    keep = (used <= cores) & (used >= opts.min_util * best) & (
        padded <= (1 + opts.max_pad) * math.prod(extents))
    if not keep.any():  # the thresholds must prune, never leave an op without a plan
        keep = used <= cores
    return grid[keep]


def _fill(grid: np.ndarray, extents: np.ndarray, splittable: list[bool], cores: int
          ) -> np.ndarray:
    """Rows that stretch one axis of a grid row to use as many of the cores as fit.

    The even factors rarely multiply up to the core count (1472 = 2^6 x 23 on an MK2); for each
    row and axis this adds the largest factor that fits beside the others, lowered to the fewest
    cores giving the same block (a larger factor with the same block only adds idle cores).
    """
    rows = []
    for j in range(grid.shape[1]):
        if not splittable[j]:
            continue
        others = np.prod(np.delete(grid, j, axis=1), axis=1)
        f = np.minimum(extents[j], cores // others)
        f = np.maximum(f, 1)
        f = ceil_div(extents[j], ceil_div(extents[j], f))  # fewest cores with the same block size
        stretched = grid.copy()
        stretched[:, j] = f
        rows.append(stretched)
    return np.concatenate(rows) if rows else grid[:0]


@dataclass(frozen=True)
class _AxisRotation:
    """Operands ``members`` rotate along axis ``j`` in ``t`` steps."""

    j: int
    t: int
    members: tuple[int, ...]


@functools.lru_cache(maxsize=1024)
def _lacks(op: TensorExpr) -> list[list[int]]:
    """Per operand, the op axes it does not depend on (its possible ring drivers); read-only
    (remembered per op: every template and plan of the op asks)."""
    axes = op.axis_names
    return [[k for k, a in enumerate(axes) if a not in o.axis_set] for o in op.operands]


def _axis_rotations(op: TensorExpr, grid: np.ndarray, opts: SearchOptions
                    ) -> list[_AxisRotation]:
    axes = op.axis_names
    lacks = _lacks(op)
    plain = [set(o.plain_axes) for o in op.operands]
    found: list[_AxisRotation] = []
    for j, a in enumerate(axes):
        users = [i for i, ax in enumerate(plain) if a in ax]
        longest = int((ceil_div(op.axes[j][1], grid[:, j])).max()) if len(grid) else 0
        for size in range(1, len(users) + 1):
            for subset in itertools.combinations(users, size):
                if not all(lacks[i] for i in subset) or not _in_step(op, subset, users):
                    continue
                drivers = sorted({k for i in subset for k in lacks[i]})
                values = np.unique(grid[:, drivers])
                ts = sorted({t for t in range(2, min(opts.max_steps, longest) + 1)
                             if (values % t == 0).any()})
                found.extend(_AxisRotation(j, t, subset) for t in ts)
    return found


def _in_step(op: TensorExpr, subset: tuple[int, ...], users: list[int]) -> bool:
    """A prologue's own inputs (`t10c.ir.TensorExpr.prologue`) rotate exactly when the operand
    it transforms does: the rest of the choices would only enlarge the search."""
    chosen = set(subset)
    for slot, base in _prologue_inputs(op).items():
        for i in base:
            if i in users and (i in chosen) != (slot in chosen):
                return False
    return True


def _prologue_inputs(op: TensorExpr) -> dict[int, list[int]]:
    """For each prologue slot, the inputs past the first two that its body reads."""
    found: dict[int, list[int]] = {}
    for slot, body in op.prologue:
        found[slot] = sorted(i for i in body_inputs(body) if i >= 2)
    return found



def _templates(op: TensorExpr, grid: np.ndarray, opts: SearchOptions):
    """No rotation first, then every combination of axis rotations (and paces, with chains)."""
    naxes, nops = len(op.axes), len(op.operands)
    yield Template((1,) * naxes, ((),) * nops, (1,) * nops), ()
    rotations = _axis_rotations(op, grid, opts)
    for count in range(1, opts.max_rot_axes + 1):
        for combo in _across_axes(rotations, count):
            members = [i for r in combo for i in r.members]
            if len(members) != len(set(members)):
                continue
            if math.prod(r.t for r in combo) > opts.max_steps:
                continue
            T = [1] * naxes
            rot: list[tuple[str, ...]] = [()] * nops
            for r in combo:
                T[r.j] = r.t
                for i in r.members:
                    rot[i] = (op.axis_names[r.j],)
            for chain in _chains(op, tuple(T), tuple(rot), opts):
                yield Template(tuple(T), tuple(rot), chain), combo


def _across_axes(rotations: list[_AxisRotation], count: int, start: int = 0, after: int = -1
                 ) -> Iterator[tuple[_AxisRotation, ...]]:
    """`itertools.combinations(rotations, count)` (rotations ordered by axis), in its order,
    keeping only the combinations whose rotations run along different axes."""
    for n in range(start, len(rotations)):
        r = rotations[n]
        if r.j <= after:
            continue
        if count == 1:
            yield (r,)
        else:
            for rest in _across_axes(rotations, count - 1, n + 1, r.j):
                yield (r, *rest)


def _feasible(op: TensorExpr, combo: tuple[_AxisRotation, ...], grid: np.ndarray
              ) -> np.ndarray:
    """Rows of ``grid`` on which every rotation has a ring: a driver whose factor ``t``
    divides, and at least ``t`` elements per block along the axis."""
    return _Feasibility(op, grid)(combo)


class _Feasibility:
    """`_feasible` for one op and grid, each rotation's rows computed once (an op's
    templates combine the same few rotations hundreds of times)."""

    def __init__(self, op: TensorExpr, grid: np.ndarray) -> None:
        self.op, self.grid, self.lacks = op, grid, _lacks(op)
        self._rows: dict[_AxisRotation, np.ndarray] = {}

    def __call__(self, combo: tuple[_AxisRotation, ...]) -> np.ndarray:
        mask = np.ones(len(self.grid), dtype=bool)
        for r in combo:
            if r not in self._rows:
                ok = ceil_div(self.op.axes[r.j][1], self.grid[:, r.j]) >= r.t
                for i in r.members:
                    ok &= (self.grid[:, self.lacks[i]] % r.t == 0).any(axis=1)
                self._rows[r] = ok
            mask &= self._rows[r]
        return mask


def _ring_driver(lacks: list[int], F: tuple[int, ...], t: int) -> int:
    """The axis an operand's ring of ``t`` cores runs along: the first it lacks whose factor
    ``t`` divides (`vcost.mesh_rings` applies the same rule to whole arrays of F, and both
    embed through `place.embed_rows`)."""
    return next(k for k in lacks if F[k] % t == 0)


def _drivers(op: TensorExpr, combo: tuple[_AxisRotation, ...], F: tuple[int, ...]
             ) -> tuple[tuple[str, ...], ...]:
    """Each rotating operand's ring runs along the first axis it lacks whose factor ``t``
    divides; the skew of axis j sums those drivers."""
    axes = op.axis_names
    lacks = _lacks(op)
    drivers: list[tuple[str, ...]] = [()] * len(axes)
    for r in combo:
        chosen = {_ring_driver(lacks[i], F, r.t) for i in r.members}
        drivers[r.j] = tuple(axes[k] for k in sorted(chosen))
    return tuple(drivers)


def _search(op: TensorExpr, chip: Chip, dtype: str, shapes: dict[str, tuple[int, ...]],
            int_tensors: IntTensors, const_tensors: frozenset[str], opts: SearchOptions):
    """Yield (template, rotations, F rows, costs) for every template with legal rows."""
    extents = tuple(e for _, e in op.axes)
    grid = _factor_grids(extents, [True] * len(extents), chip.cores, opts,
                         [a in op.output.axes for a in op.axis_names])
    mesh = chip.is_mesh and opts.mesh_aware
    feasible = _Feasibility(op, grid)
    for tpl, combo in _templates(op, grid, opts):
        rows = grid[feasible(combo)]
        if not len(rows):
            continue
        c = costs_for(op, tpl, rows, chip, dtype, shapes, int_tensors, const_tensors,
                      opts.weights_home, mesh)
        if mesh and not c.placeable.all():
            keep = c.placeable
            rows = rows[keep]
            c = CostArrays(*(getattr(c, f.name)[keep] for f in dataclasses.fields(c)))
        if len(rows):
            yield tpl, combo, rows, c, mesh


def _plan(op: TensorExpr, tpl: Template, combo, F: np.ndarray, c: CostArrays, r: int,
          chip: Chip, mesh: bool) -> OpPlan:
    f = tuple(int(x) for x in F)
    embed = None
    if mesh:
        lacks = _lacks(op)
        axes = op.axis_names
        drivers_of: list[str | None] = []
        for i, rot in enumerate(tpl.rot):
            t = tpl.T[axes.index(rot[0])] if rot else 1
            drivers_of.append(axes[_ring_driver(lacks[i], f, t)] if rot else None)
        embed = choose(chip, math.prod(f), ring_drivers(tpl.T, tpl.rot, drivers_of, axes), axes)
        assert embed is not None, "the search keeps only placeable rows"
    return OpPlan(op.name, f, tpl.T, tpl.rot, _drivers(op, combo, f), tpl.chain,
                  Cycles(int(c.compute[r]), int(c.shift[r]), int(c.sync[r]), int(c.reduce[r])),
                  int(c.hot[r]), int(c.cold[r]), int(c.out[r]), embed=embed)


def enumerate_plans(op: TensorExpr, chip: Chip, dtype: str, shapes: dict[str, tuple[int, ...]],
                    int_tensors: IntTensors, const_tensors: frozenset[str],
                    opts: SearchOptions = SearchOptions()) -> list[OpPlan]:
    """Every legal plan of ``op`` that survives pruning, costed (all of them materialised)."""
    plans: list[OpPlan] = []
    for tpl, combo, rows, c, mesh in _search(op, chip, dtype, shapes, int_tensors,
                                             const_tensors, opts):
        plans.extend(_plan(op, tpl, combo, rows[r], c, r, chip, mesh) for r in range(len(rows)))
    return plans


def _chains(op: TensorExpr, T: tuple[int, ...], rot: tuple[tuple[str, ...], ...],
            opts: SearchOptions):
    """The full rotation, then (with ``opts.chains``) every slower pace of rotating inputs."""
    axes = op.axis_names
    full = tuple(T[axes.index(r[0])] if r else 1 for r in rot)
    yield full
    if not opts.chains:
        return
    choices = []
    for i, r in enumerate(rot):
        t = full[i]
        if r and i < len(op.inputs):
            choices.append([f for f in range(2, t + 1) if t % f == 0])
        else:
            choices.append([t])
    for combo in itertools.product(*choices):
        if combo != full:
            yield combo


@dataclass(frozen=True)
class SearchResult:
    front: list[OpPlan]  # fastest first, at most `limit`
    smallest: OpPlan | None  # the plan with the fewest hot bytes, fitting or not
    least_cold: int  # the fewest resident (weight) bytes per core of any plan
    enumerated: int
    wall_s: float
    #: on a mesh, every plan Pareto-optimal in hot bytes, cycles and cores spanned, fastest
    #: first (`region_front` with no cap): what `refine` tries, worked out with the front
    region: tuple[OpPlan, ...] = ()


def search_front(op: TensorExpr, chip: Chip, dtype: str, shapes: dict[str, tuple[int, ...]],
                 int_tensors: IntTensors, const_tensors: frozenset[str],
                 opts: SearchOptions = SearchOptions(), limit: int | None = None
                 ) -> SearchResult:
    """The Pareto front in (hot bytes, cycles) of ``op``'s plans, computed on arrays: only the
    plans on it are materialised."""
    start = time.perf_counter()
    parts = _parts(op, chip, dtype, shapes, int_tensors, const_tensors, opts)
    if not parts:
        return SearchResult([], None, 0, 0, time.perf_counter() - start)
    total = np.concatenate([c.total for *_, c, _ in parts])
    hot = np.concatenate([c.hot for *_, c, _ in parts])
    part = np.concatenate([np.full(len(rows), k) for k, (_, _, rows, _, _) in enumerate(parts)])
    row = np.concatenate([np.arange(len(rows)) for _, _, rows, _, _ in parts])

    def make(n: int) -> OpPlan:
        tpl, combo, rows, c, mesh = parts[part[n]]
        return _plan(op, tpl, combo, rows[row[n]], c, row[n], chip, mesh)

    smallest = make(int(np.lexsort((part, total, hot))[0]))
    fits = np.flatnonzero(hot <= chip.sram_bytes_per_core)
    order = fits[np.lexsort((row[fits], part[fits], hot[fits], total[fits]))]
    if any(mesh for *_, mesh in parts):
        # on a mesh, the front in (hot bytes, bytes fed to the plan, cycles): re-layouts, not
        # an op's own cycles, dominate a decode step there, and a plan that splits the weights
        # finely (cheap per op once reductions run in levels) replicates its activation input
        # over every core, a fan-out the whole-graph planner must be able to avoid
        fed = np.concatenate([c.fed for *_, c, _ in parts])
        on_front = _front_of(order, hot, limit, fed)
    else:
        on_front = _front_of(order, hot, limit)
    least_cold = int(min(int(c.cold.min()) for *_, c, _ in parts))
    region = tuple(_region(op, chip, parts, np.iinfo(np.int64).max)) if chip.is_mesh else ()
    return SearchResult([make(int(n)) for n in on_front], smallest, least_cold, len(total),
                        time.perf_counter() - start, region)


def region_front(op: TensorExpr, chip: Chip, dtype: str, shapes: dict[str, tuple[int, ...]],
                 int_tensors: IntTensors, const_tensors: frozenset[str], opts: SearchOptions,
                 cap: int) -> list[OpPlan]:
    """The plans of ``op`` within ``cap`` hot bytes per core that are Pareto-optimal in hot
    bytes, cycles and cores spanned, fastest first (then fewer hot bytes, fewer cores, the
    enumeration's order): among `enumerate_plans`' list so sorted, each plan that no plan
    before it matches or beats in both hot bytes and cores. Computed on arrays, as
    `search_front` is: only these plans are materialised (on wse2, bert-large's costliest op
    has tens of thousands of plans, 1.4 s to make them all). A mesh's search has the
    uncapped list already (`SearchResult.region`): this is its plans within ``cap``, the
    same ones (a plan within the cap is beaten only by plans within it)."""
    return _region(op, chip, _parts(op, chip, dtype, shapes, int_tensors, const_tensors, opts),
                   cap)


def _region(op: TensorExpr, chip: Chip, parts: list, cap: int) -> list[OpPlan]:
    if not parts:
        return []
    hot = np.concatenate([c.hot for *_, c, _ in parts])
    n = np.flatnonzero(hot <= cap)
    total = np.concatenate([c.total for *_, c, _ in parts])[n]
    cores = np.concatenate([np.prod(rows, axis=1) for _, _, rows, _, _ in parts])[n]
    part = np.concatenate([np.full(len(rows), k) for k, (_, _, rows, _, _) in
                           enumerate(parts)])[n]
    row = np.concatenate([np.arange(len(rows)) for _, _, rows, _, _ in parts])[n]
    hot = hot[n]
    order = np.lexsort((row, part, cores, hot, total))
    h, c = hot[order], cores[order]
    # a plan is kept where every plan before it with at most its cores has more hot bytes:
    # the least hot bytes before each position over the core counts up to its own, one core
    # count at a time (a plan's F takes few distinct products)
    most = np.iinfo(np.int64).max
    least = np.full(len(order), most, dtype=np.int64)
    keep = np.zeros(len(order), dtype=bool)
    for count in np.unique(c):
        at = c == count
        before = np.minimum.accumulate(np.concatenate([[most], np.where(at, h, most)]))[:-1]
        least = np.minimum(least, before)
        keep[at] = h[at] < least[at]
    plans = []
    for k in order[keep].tolist():
        tpl, combo, rows, costs, mesh = parts[part[k]]
        plans.append(_plan(op, tpl, combo, rows[row[k]], costs, int(row[k]), chip, mesh))
    return plans


#: every template's legal rows and costs, by everything `_search` reads: not the chip's SRAM
#: size, which only decides which plans fit (`search_front`), so the compiles of a sweep over
#: SRAM sizes (`t10c sweep`) enumerate and cost each op once; least recently used first out
_PARTS: collections.OrderedDict[tuple, list] = collections.OrderedDict()
_PARTS_LIMIT = 256


def _parts(op: TensorExpr, chip: Chip, dtype: str, shapes: dict[str, tuple[int, ...]],
           int_tensors: IntTensors, const_tensors: frozenset[str], opts: SearchOptions
           ) -> list:
    """`_search`'s templates, remembered in this process (read-only: the front is cut from
    them without changing them)."""
    key = (repr(dataclasses.replace(chip, sram_bytes_per_core=1)), dtype, op.signature(),
           tuple((int_tensors.get(o.tensor), o.tensor in const_tensors, shapes[o.tensor])
                 for o in (*op.operands, *op.extra)), opts)
    if key in _PARTS:
        _PARTS.move_to_end(key)
        return _PARTS[key]
    parts = list(_search(op, chip, dtype, shapes, int_tensors, const_tensors, opts))
    _PARTS[key] = parts
    if len(_PARTS) > _PARTS_LIMIT:
        _PARTS.popitem(last=False)
    return parts


def _front_of(order: np.ndarray, key: np.ndarray, limit: int | None,
              other: np.ndarray | None = None) -> np.ndarray:
    """The rows of ``order`` (fastest first) that no faster row matches or beats in ``key``
    (and in ``other``, if given), at most ``limit`` of them spread evenly along the front."""
    if other is None:
        best_before = np.minimum.accumulate(np.concatenate([[np.iinfo(np.int64).max],
                                                            key[order]]))
        on_front = order[key[order] < best_before[:-1]]
    else:
        kept: list[int] = []
        for n in order.tolist():
            k = np.asarray(kept, dtype=np.int64)
            if not len(k) or not ((key[k] <= key[n]) & (other[k] <= other[n])).any():
                kept.append(n)
        on_front = np.asarray(kept, dtype=np.int64)
    if limit is not None and len(on_front) > limit:
        picks = sorted({round(i * (len(on_front) - 1) / (limit - 1)) for i in range(limit)})
        on_front = on_front[picks]
    return on_front


def pareto_front(plans: list[OpPlan], sram_bytes: int, limit: int) -> list[OpPlan]:
    """Plans not beaten in both hot bytes and cycles, fitting ``sram_bytes``, fastest first.

    At most ``limit`` plans are kept, spread evenly along the front so that both the fastest and
    the smallest survive.
    """
    fits = [p for p in plans if p.hot_bytes_per_core <= sram_bytes]
    fits.sort(key=lambda p: (p.cycles.total, p.hot_bytes_per_core, p.F, p.T, p.rot, p.chain))
    front: list[OpPlan] = []
    for p in fits:
        if not front or p.hot_bytes_per_core < front[-1].hot_bytes_per_core:
            front.append(p)
    if len(front) > limit:
        picks = sorted({round(i * (len(front) - 1) / (limit - 1)) for i in range(limit)})
        front = [front[i] for i in picks]
    return front


__all__ = ["SearchOptions", "SearchResult", "enumerate_plans", "search_front", "pareto_front",
           "region_front", "INDIRECT"]
