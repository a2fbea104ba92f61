"""Per-op plan search: enumerate legal rTensor plans, cost them, keep the Pareto front.

Enumeration (see `plan.py` for what a plan means):

1. ``F``: per axis, the candidate factors are the divisors of the extent and the powers of two
   below it (capped at the core count); the grid product keeps those with ``prod(F) <= cores``,
   at least ``min_util`` of the usable cores busy, and at most ``max_pad`` padding waste.
2. Rotation: for each axis ``a`` and each non-empty set ``S`` of operands indexed by ``a``, and
   each step count ``T > 1`` that divides ``F`` of an axis every member of ``S`` lacks (the ring
   driver), the operands in ``S`` rotate along ``a`` in ``T`` steps. Up to ``max_rot_axes`` axes
   rotate in one plan; an operand rotates along one axis at most.
3. Every plan is costed (`cost.plan_cost`); the front keeps the plans that no other plan beats in
   both hot bytes and cycles, each with its idle (cold) bytes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.ir import INDIRECT, TensorExpr

from .cost import plan_cost
from .plan import Geometry, OpPlan


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


def _axis_candidates(extent: int, cores: int) -> list[int]:
    cands = {d for d in range(1, min(extent, cores) + 1) if extent % d == 0}
    p = 1
    while p <= min(extent, cores):
        cands.add(p)
        p *= 2
    return sorted(cands)


def _factor_grids(extents: tuple[int, ...], splittable: list[bool], cores: int,
                  opts: SearchOptions) -> np.ndarray:
    """All admissible F vectors, as an (n, naxes) array."""
    per_axis = [np.array(_axis_candidates(e, cores) if s else [1], dtype=np.int64)
                for e, s in zip(extents, splittable)]
    grid = np.stack([g.ravel() for g in np.meshgrid(*per_axis, indexing="ij")], axis=1)
    used = grid.prod(axis=1)
    best = min(cores, math.prod(e for e, s in zip(extents, splittable) if s))
    padded = np.prod(-(-np.asarray(extents) // grid) * grid, axis=1)
    keep = (used <= cores) & (used >= opts.min_util * best) & (
        padded <= (1 + opts.max_pad) * math.prod(extents))
    return grid[keep]


def _rotation_options(op: TensorExpr, F: tuple[int, ...], opts: SearchOptions):
    """Yield (T, rot, drivers) for one F: no rotation first, then every legal rotation."""
    axes = op.axis_names
    extents = [e for _, e in op.axes]
    operand_axes = [set(o.axis_set) for o in op.operands]
    plain = [set(o.plain_axes) for o in op.operands]
    per_axis: list[list[tuple[int, int, tuple[int, ...], tuple[str, ...]]]] = []
    for j, a in enumerate(axes):
        opts_a = []
        users = [i for i, ax in enumerate(plain) if a in ax]
        block = -(-extents[j] // F[j])
        for size in range(1, len(users) + 1):
            for subset in itertools.combinations(users, size):
                # candidate driver axes: each member must lack at least one
                lacks = [[k for k, b in enumerate(axes) if b not in operand_axes[i] and F[k] > 1]
                         for i in subset]
                if not all(lacks):
                    continue
                common = set.union(*(set(x) for x in lacks))
                ts = sorted({t for k in common for t in range(2, F[k] + 1) if F[k] % t == 0
                             and t <= block})
                for t in ts:
                    drivers = []
                    for cand in lacks:
                        k = next((k for k in cand if F[k] % t == 0), None)
                        if k is None:
                            break
                        drivers.append(axes[k])
                    else:
                        opts_a.append((j, t, subset, tuple(sorted(set(drivers),
                                                                  key=axes.index))))
        per_axis.append(opts_a)

    nops = len(op.operands)
    yield (1,) * len(axes), ((),) * nops, ((),) * len(axes)
    flat = [o for opts_a in per_axis for o in opts_a]
    for count in range(1, opts.max_rot_axes + 1):
        for combo in itertools.combinations(flat, count):
            if len({c[0] for c in combo}) != count:
                continue
            members = [i for c in combo for i in c[2]]
            if len(members) != len(set(members)):
                continue
            T = [1] * len(axes)
            rot: list[tuple[str, ...]] = [()] * nops
            drivers: list[tuple[str, ...]] = [()] * len(axes)
            for j, t, subset, drv in combo:
                T[j] = t
                drivers[j] = drv
                for i in subset:
                    rot[i] = (axes[j],)
            if math.prod(T) > opts.max_steps:
                continue
            yield tuple(T), tuple(rot), tuple(drivers)


def enumerate_plans(op: TensorExpr, chip: Chip, dtype: str, shapes: dict[str, tuple[int, ...]],
                    int_tensors: frozenset[str], const_tensors: frozenset[str],
                    opts: SearchOptions = SearchOptions()) -> list[OpPlan]:
    """Every legal plan of ``op`` that survives pruning, costed."""
    extents = tuple(e for _, e in op.axes)
    # an axis that indexes the table dimension of a lookup together with data is never split;
    # every other axis may be
    splittable = [True] * len(extents)
    grids = _factor_grids(extents, splittable, chip.cores, opts)
    plans = []
    for row in grids:
        F = tuple(int(x) for x in row)
        for T, rot, drivers in _rotation_options(op, F, opts):
            for chain in _chains(op, T, rot, opts):
                geo = Geometry(op, F, T, rot, drivers, shapes, chain)
                cycles, hot, cold, out = plan_cost(geo, chip, dtype, int_tensors, const_tensors)
                plans.append(OpPlan(op.name, F, T, rot, drivers, chain, cycles, hot, cold, out))
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


def smallest_plan(plans: list[OpPlan]) -> OpPlan | None:
    return min(plans, key=lambda p: (p.hot_bytes_per_core, p.cycles.total), default=None)


__all__ = ["SearchOptions", "enumerate_plans", "pareto_front", "smallest_plan", "INDIRECT"]
