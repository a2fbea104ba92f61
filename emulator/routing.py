"""Dimension-order routing on a 2D mesh or torus, with the load on every link.

A transfer of ``b`` bytes from core ``s`` to core ``d`` (row-major numbering on a ``rows x cols``
grid) first travels along the source's row to the destination's column, then along that column
to the destination's row (X then Y). On a torus each leg takes the shorter way round (a tie
goes the way that does not wrap). Every directed link carries the sum of the bytes routed over it.

One exchange phase (all transfers between two barriers) lasts

    hop_latency x (most hops of any transfer) + ceil(busiest link's bytes / link bandwidth)

which is exact for the pipelined, contention-bound traffic of compute-shift programs and a
lower bound for irregular traffic. Loads are accumulated with difference arrays and running
sums, so a phase costs O(transfers + links), in compiled kernels shared with the planner
(`t10c.meshkernels`).
Multicast exchanges travel route trees instead (`t10c.multicast`, shared with the planner):
`route_phase` routes a phase's unicasts and trees together.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.multicast import phase_cycles, tree_parts


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
    return route_phase(chip, (src, dst, nbytes), None)


def _slices(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
            ) -> Iterator[tuple[np.ndarray, ...]]:
    """`route`'s transfers as the kernels take them (`t10c.meshkernels`): rows of the
    broadcast arrays, about `_SLICE` transfers at a time, as contiguous int64."""
    src, dst, nbytes = np.broadcast_arrays(np.asarray(src), np.asarray(dst), np.asarray(nbytes))
    if src.ndim != 2:
        src, dst, nbytes = (a.reshape(-1, 1) for a in (src, dst, nbytes))
    step = max(1, _SLICE // max(src.shape[1], 1))
    for lo in range(0, len(src), step):
        yield tuple(np.ascontiguousarray(a[lo:lo + step], dtype=np.int64).ravel()
                    for a in (src, dst, nbytes))


def route_phase(chip: Chip, unicast: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                trees: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None) -> Routed:
    """Route one phase of unicast transfers (`route`'s arguments) and multicast trees
    (`t10c.multicast.route_trees`' arguments) together, by the compiled kernels
    (`t10c.meshkernels.phase_loads`): link loads add up, the longest route of either
    counts, and the trees' colours set the waves (`t10c.multicast`)."""
    from t10c import meshkernels  # (numba, only where a mesh is routed)

    loads = np.zeros((4, *chip.grid), dtype=np.int64)
    counts = np.zeros((4, *chip.grid), dtype=np.int64) if trees is not None else None
    hops = meshkernels.phase_loads(chip.grid, chip.topology == "torus2d",
                                   _slices(*unicast) if unicast is not None else (),
                                   tree_parts(*trees) if trees is not None else (),
                                   loads, counts)
    if hops < 0:
        return Routed(0, 0, 0, None)
    busiest = int(loads.max())
    most = int(counts.max()) if counts is not None else 0
    return Routed(phase_cycles(chip, busiest, hops, most), busiest, hops, loads)


def hops(chip: Chip, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Hop count of each transfer under dimension-order routing (`Chip.hops`)."""
    return chip.hops(src, dst)
