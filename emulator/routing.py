"""Dimension-order routing on a 2D mesh or torus, with the load on every link.

A transfer of ``b`` bytes from core ``s`` to core ``d`` (row-major numbering on a ``rows x cols``
grid) first travels along the source's row to the destination's column, then along that column
to the destination's row (X then Y). On a torus each leg takes the shorter way round (a tie
goes the way that does not wrap). Every directed link carries the sum of the bytes routed over it.

One exchange phase (all transfers between two barriers) lasts

    hop_latency x (most hops of any transfer) + ceil(busiest link's bytes / link bandwidth)

which is exact for the pipelined, contention-bound traffic of compute-shift programs and a
lower bound for irregular traffic. Loads are accumulated with difference arrays and cumulative
sums, so a phase costs O(transfers + links) numpy work, never a loop over transfers.
Multicast exchanges travel route trees instead (`t10c.multicast`, shared with the planner):
`route_phase` routes a phase's unicasts and trees together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import ceil_div
from t10c.multicast import leg as _leg
from t10c.multicast import line_loads as _line_loads
from t10c.multicast import phase_cycles, route_trees


@dataclass(frozen=True)
class Routed:
    """One phase's routes: its cycles, busiest link, longest route, and the per-link loads."""

    cycles: int
    max_link_bytes: int
    max_hops: int
    #: (4, rows, cols) bytes per directed link: east, west (link x joins column x and x + 1),
    #: south, north (link y joins row y and y + 1); None when nothing moved
    loads: np.ndarray | None


#: transfers routed at once: a phase's arrays are routed in slices of this many, so that a
#: wafer-wide reduce (750,000 cores times a level's members) needs no array of every transfer
_SLICE = 1 << 21


def route(chip: Chip, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> Routed:
    """Route every transfer of one phase on ``chip``'s mesh. ``src``, ``dst`` and ``nbytes``
    broadcast to one shape; a transfer per element (2-D ones: per row, a few at a time, so
    that broadcast views are never expanded whole). Link loads are sums, so the slices add
    up to exactly the loads of the whole phase."""
    src, dst, nbytes = np.broadcast_arrays(np.asarray(src), np.asarray(dst), np.asarray(nbytes))
    if src.ndim != 2:
        src, dst, nbytes = (a.reshape(-1, 1) for a in (src, dst, nbytes))
    rows, cols = chip.grid
    torus = chip.topology == "torus2d"
    loads = np.zeros((4, rows, cols), dtype=np.int64)
    hops = 0
    moved = False
    step = max(1, _SLICE // max(src.shape[1], 1))
    for lo in range(0, len(src), step):
        s, d, b = (np.asarray(a[lo:lo + step], dtype=np.int64).ravel()
                   for a in (src, dst, nbytes))
        keep = (s != d) & (b > 0)
        if not keep.any():
            continue
        moved = True
        s, d, b = s[keep], d[keep], b[keep]
        sr, sc = np.divmod(s, cols)
        dr, dc = np.divmod(d, cols)
        dx, hx = _leg(sc, dc, cols, torus)
        dy, hy = _leg(sr, dr, rows, torus)
        weights = b.astype(np.float64)
        # added straight into the phase's loads (the Y legs' lines are columns: transposed
        # views), only the lines some transfer uses: no wafer-sized temporaries
        _line_loads(sr, sc, dx, weights, rows, cols, into=(loads[0], loads[1]))
        _line_loads(dc, sr, dy, weights, cols, rows, into=(loads[2].T, loads[3].T))
        hops = max(hops, int((hx + hy).max()))
    if not moved:
        return Routed(0, 0, 0, None)
    busiest = int(loads.max())
    cycles = chip.hop_latency_cycles * hops + ceil_div(busiest, chip.link_bytes_per_cycle)
    return Routed(cycles, busiest, hops, loads)


def route_phase(chip: Chip, unicast: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                trees: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None) -> Routed:
    """Route one phase of unicast transfers (`route`'s arguments) and multicast trees
    (`t10c.multicast.route_trees`' arguments) together: link loads add up, the longest
    route of either counts, and the trees' colours set the waves (`t10c.multicast`)."""
    uni = route(chip, *unicast) if unicast is not None else Routed(0, 0, 0, None)
    tr = route_trees(chip, *trees) if trees is not None else None
    if tr is None:
        return uni
    loads = tr.loads if uni.loads is None else uni.loads + tr.loads
    busiest = int(loads.max())
    hops = max(uni.max_hops, tr.hops)
    return Routed(phase_cycles(chip, busiest, hops, int(tr.counts.max())), busiest, hops, loads)


def hops(chip: Chip, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Hop count of each transfer under dimension-order routing (`Chip.hops`)."""
    return chip.hops(src, dst)
