"""SRAM layout: one address per buffer, valid on every core (the program is SPMD).

Buffers are rectangles in (time, address): alive from their ``Alloc`` to their ``Free`` (or
the end), ``size`` bytes tall. Two buffers alive at the same time must not overlap in address.

1. ``best_fit``: the largest buffers first, each at the lowest address where it overlaps no
   placed buffer that shares its lifetime (a classic offline heuristic; usually within a few
   percent of the lower bound, the most bytes alive at once).
2. When that peak exceeds the SRAM, CP-SAT repairs it: ``AddNoOverlap2D`` over the rectangles
   with every address in ``[0, SRAM - size]``, the heuristic's layout as the hint, and a limit
   in CP-SAT's deterministic time only, so the same program gets the same layout on an idle or
   a loaded machine (`partition/cpsat.py`; Ctrl-C interrupts it).

The lower bound, the peak and the fragmentation (peak over lower bound, minus one) are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from t10c.dtypes import DTYPES, ceil_div
from t10c.partition import cpsat

#: bytes: every buffer starts at a multiple of 8 and its size is rounded up to one. 8 is the
#: widest access of the cores we target (the IPU's 64-bit ``ld64``/``st64`` and the paired
#: fp32 vector loads need 8-byte-aligned addresses), and a multiple of every element size, so
#: no element of any buffer straddles an access boundary. Changing it moves every address.
ALIGN = 8
assert all(ALIGN % d.bytes == 0 for d in DTYPES.values())

#: the repair's budget in CP-SAT deterministic seconds (work units, about a second each on an
#: idle machine)
REPAIR_LIMIT = 10.0


def aligned(nbytes: int) -> int:
    """The bytes a buffer of ``nbytes`` occupies: at least one, rounded up to ``ALIGN``."""
    return ceil_div(max(nbytes, 1), ALIGN) * ALIGN


@dataclass(frozen=True)
class Rect:
    start: int  # index of the Alloc instruction
    end: int  # index of the Free instruction (exclusive bound of the lifetime)
    size: int  # bytes, aligned


@dataclass(frozen=True)
class Layout:
    offsets: tuple[int, ...]
    peak: int
    live: int  # the most bytes alive at once: no layout can do better
    method: str

    @property
    def fragmentation(self) -> float:
        return self.peak / self.live - 1 if self.live else 0.0


def max_live(rects: list[Rect]) -> int:
    events = sorted([(r.start, r.size) for r in rects] + [(r.end, -r.size) for r in rects],
                    key=lambda e: (e[0], e[1]))
    live = best = 0
    for _, delta in events:
        live += delta
        best = max(best, live)
    return best


def best_fit(rects: list[Rect]) -> tuple[int, ...]:
    n = len(rects)
    start = np.array([r.start for r in rects])
    end = np.array([r.end for r in rects])
    size = np.array([r.size for r in rects])
    offset = np.full(n, -1, dtype=np.int64)
    for i in sorted(range(n), key=lambda k: (-rects[k].size, rects[k].start, k)):
        placed = (offset >= 0) & (start < end[i]) & (start[i] < end)
        lo = offset[placed]
        hi = lo + size[placed]
        order = np.argsort(lo, kind="stable")
        at = 0
        for a, b in zip(lo[order], hi[order]):
            if a - at >= size[i]:
                break
            at = max(at, int(b))
        offset[i] = at
    return tuple(int(x) for x in offset)


def repair(rects: list[Rect], hint: tuple[int, ...], capacity: int,
           deterministic_limit: float = REPAIR_LIMIT, seed: int = 0) -> tuple[int, ...] | None:
    """A layout within ``capacity`` bytes by CP-SAT, or None if none was found within
    ``deterministic_limit`` (CP-SAT deterministic seconds)."""
    model = cp_model.CpModel()
    xs, ys, offs = [], [], []
    for n, r in enumerate(rects):
        if r.size > capacity:
            return None
        off = model.new_int_var(0, capacity - r.size, f"off{n}")
        xs.append(model.new_fixed_size_interval_var(r.start, max(r.end - r.start, 1), f"t{n}"))
        ys.append(model.new_fixed_size_interval_var(off, r.size, f"a{n}"))
        model.add_hint(off, min(hint[n], capacity - r.size))
        offs.append(off)
    model.add_no_overlap_2d(xs, ys)
    solver = cp_model.CpSolver()
    cpsat.configure(solver, deterministic_limit, workers=1, seed=seed)
    status = cpsat.run(solver, model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return tuple(int(solver.value(o)) for o in offs)


def layout(rects: list[Rect], capacity: int, deterministic_limit: float = REPAIR_LIMIT,
           repair_ok: bool = True) -> Layout:
    """Addresses for ``rects`` within ``capacity`` bytes if best-fit or the repair (unless
    not ``repair_ok``) finds them (otherwise best-fit's, whose peak then says by how much
    they overflow)."""
    live = max_live(rects)
    offsets = best_fit(rects)
    peak = max((o + r.size for o, r in zip(offsets, rects)), default=0)
    if peak <= capacity or live > capacity or not repair_ok:
        return Layout(offsets, peak, live, "best-fit")
    repaired = repair(rects, offsets, capacity, deterministic_limit)
    if repaired is None:
        return Layout(offsets, peak, live, "best-fit (CP-SAT found no repair within its limit)")
    peak = max(o + r.size for o, r in zip(repaired, rects))
    return Layout(repaired, peak, live, "best-fit + CP-SAT repair")
