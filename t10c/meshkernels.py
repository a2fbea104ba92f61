"""Compiled kernels that load a 2D mesh's or torus's links with routed transfers and trees,
and the planner's loads of a reduce-scatter's levels on a rectangle of members
(`level_loads`).

`t10c.multicast` defines the routes (dimension order, each leg the shorter way round a torus;
a tree X first or Y first, whichever takes fewer links) and `emulator.routing` the phase
they make. This module only adds their bytes onto the links, entry by entry, compiled with
numba: a wafer's exchange is millions of entries, and the same work as whole-array numpy
passes took a sixth of a wafer compile (bert-large on wse2 in one process under cProfile:
10.9 s of 63 s, about ten passes over every entry and a temporary per pass).

Every leg is two marks on a difference array of its line (one where it starts, one past its
end); a line's running sum then gives each link's load. A leg along a torus line may run past
the line's end and wrap: the line's array is two lines long, and the second half is folded
back onto the first. The arrays are laid out as the loads are, (way, row, column), for the
legs along the columns too: an exchange's destinations come core by core, so the column legs
of a row's destinations are marked side by side (laid out column by column, each mark landed
a line's length from the last: two to three times slower on a wafer's exchanges). Only the
rows from the first to the last marked are summed, and the marks are left zeroed, so that
the arrays (kept per thread: `_Scratch`) are reused without being cleared or paged in
again. Loads are integer sums: the same in any order of the entries.

numba compiles each kernel at its first call and keeps the machine code in ``__pycache__``
beside this file (``cache=True``), so that a process compiles nothing a process before it
compiled (about 3 s, once after an install). numba is imported only when a mesh is routed
or its reduces are priced: compiles for all-to-all chips never load it. A compile that forks
workers loads every kernel first (`load`), so that they inherit them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _leg(start: int, end: int, size: int, torus: bool) -> int:
    """The signed length of the leg from ``start`` to ``end`` on a line (or, with ``torus``,
    a ring) of ``size`` positions: `t10c.multicast.leg`, one leg."""
    delta = end - start
    if torus:
        fwd = delta % size
        if fwd < size - fwd:
            delta = fwd
        elif fwd > size - fwd:
            delta = fwd - size
    return delta


@njit(cache=True, nogil=True)
def _first(way: int, start: int, length: int, size: int) -> int:
    """The first link of a leg of ``length`` links from position ``start``, the positive way
    (way 0: links start .. start + length - 1) or the negative way (way 1: start - length
    .. start - 1); link x joins positions x and x + 1. A leg that wraps round a torus starts
    one line's length on (its links past the line's end are folded back)."""
    first = start if way == 0 else start - length
    return first + size if first < 0 else first


@njit(cache=True, nogil=True)
def _mark_x(diff: np.ndarray, way: int, row: int, start: int, length: int, size: int,
            weight: int) -> None:
    """A leg along ``row`` carrying ``weight`` (``diff``: (way, row, column))."""
    first = _first(way, start, length, size)
    diff[way, row, first] += weight
    diff[way, row, first + length] -= weight


@njit(cache=True, nogil=True)
def _mark_y(diff: np.ndarray, way: int, col: int, start: int, length: int, size: int,
            weight: int) -> int:
    """A leg along column ``col`` carrying ``weight`` (``diff``: (way, row, column)); the
    row of its first mark."""
    first = _first(way, start, length, size)
    diff[way, first, col] += weight
    diff[way, first + length, col] -= weight
    return first


@njit(cache=True, nogil=True)
def _fold(along_x: np.ndarray, along_y: np.ndarray, span: np.ndarray, rows: int, cols: int,
          loads: np.ndarray, keep: bool) -> int:
    """Sum the legs marked (rows ``span[0] .. span[1]`` of ``along_x``, ``span[2] ..
    span[3]`` of ``along_y``), along each row, and down each column row after row, adding
    them to ``loads`` (east, west, south, north) if ``keep``; zero the marks and the span.
    The largest running sum: the busiest link's load where no leg wraps (a mesh)."""
    busiest = 0
    for way in range(2):
        for row in range(span[0], span[1] + 1):
            run = 0
            for x in range(along_x.shape[2]):
                run += along_x[way, row, x]
                along_x[way, row, x] = 0
                if run != 0:
                    busiest = max(busiest, run)
                    if keep:
                        loads[way, row, x if x < cols else x - cols] += run
    run_y = np.zeros(cols, dtype=np.int64)
    for way in range(2):
        for y in range(span[2], span[3] + 1):
            at = y if y < rows else y - rows
            for c in range(cols):
                run_y[c] += along_y[way, y, c]
                along_y[way, y, c] = 0
                if run_y[c] != 0:
                    busiest = max(busiest, run_y[c])
                    if keep:
                        loads[2 + way, at, c] += run_y[c]
    span[0], span[1], span[2], span[3] = along_x.shape[1], -1, along_y.shape[1], -1
    return busiest


# The kernels keep the rows they mark in local variables and store them once: a store per
# entry to a small array beside the marks (which the compiler cannot tell apart from them)
# made every mark wait for it, two and a half times slower on a wafer's exchanges.


@njit(cache=True, nogil=True)
def _unicasts(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, rows: int, cols: int,
              torus: bool, along_x: np.ndarray, along_y: np.ndarray,
              span: np.ndarray) -> int:
    """Mark every transfer's route, X then Y; the longest route (-1: nothing moves)."""
    hops = -1
    lo_x, hi_x, lo_y, hi_y = span[0], span[1], span[2], span[3]
    for k in range(src.shape[0]):
        s, d, b = src[k], dst[k], nbytes[k]
        if s == d or b <= 0:
            continue
        sr, sc = s // cols, s % cols
        dr, dc = d // cols, d % cols
        dx = _leg(sc, dc, cols, torus)
        dy = _leg(sr, dr, rows, torus)
        hops = max(hops, abs(dx) + abs(dy))
        if dx != 0:
            _mark_x(along_x, 0 if dx > 0 else 1, sr, sc, abs(dx), cols, b)
            lo_x, hi_x = min(lo_x, sr), max(hi_x, sr)
        if dy != 0:
            first = _mark_y(along_y, 0 if dy > 0 else 1, dc, sr, abs(dy), rows, b)
            lo_y, hi_y = min(lo_y, first), max(hi_y, first + abs(dy))
    span[0], span[1], span[2], span[3] = lo_x, hi_x, lo_y, hi_y
    return hops


@njit(cache=True, nogil=True)
def _trees(tree: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
           rows: int, cols: int, torus: bool, along_x: np.ndarray, along_y: np.ndarray,
           span: np.ndarray, count_x: np.ndarray, count_y: np.ndarray,
           count_span: np.ndarray) -> int:
    """Mark every tree's links, with its bytes and with 1 (the trees per link, at the same
    places: one span for both): entries of a tree are consecutive and share its source and
    bytes; entries that do not move (their source is their destination, or no bytes) are
    left out. The longest route (-1: none).

    A tree goes Y first (up the source's column, then along each destination row as far as
    its farthest destination either way) where that takes fewer links than X first (along
    the source's row, then along each destination column)."""
    # per tree, the farthest either way along each destination column (X first) and each
    # destination row (Y first); a line's slot is the tree's while its stamp is
    col_pos = np.zeros(cols, dtype=np.int64)
    col_neg = np.zeros(cols, dtype=np.int64)
    col_stamp = np.full(cols, -1, dtype=np.int64)
    row_pos = np.zeros(rows, dtype=np.int64)
    row_neg = np.zeros(rows, dtype=np.int64)
    row_stamp = np.full(rows, -1, dtype=np.int64)
    used_cols = np.empty(cols, dtype=np.int64)
    used_rows = np.empty(rows, dtype=np.int64)
    lo_x, hi_x, lo_y, hi_y = span[0], span[1], span[2], span[3]
    hops = -1
    n = tree.shape[0]
    start = 0
    t = 0
    while start < n:
        end = start + 1
        while end < n and tree[end] == tree[start]:
            end += 1
        x_pos = x_neg = y_pos = y_neg = 0
        ncols = nrows = 0
        s, b = -1, 0
        for k in range(start, end):
            if src[k] == dst[k] or nbytes[k] <= 0:
                continue
            if s < 0:  # the tree's first entry that moves: its source and bytes
                s, b = src[k], nbytes[k]
            sr, sc = src[k] // cols, src[k] % cols
            dr, dc = dst[k] // cols, dst[k] % cols
            dx = _leg(sc, dc, cols, torus)
            dy = _leg(sr, dr, rows, torus)
            hops = max(hops, abs(dx) + abs(dy))
            x_pos, x_neg = max(x_pos, dx), max(x_neg, -dx)
            y_pos, y_neg = max(y_pos, dy), max(y_neg, -dy)
            # (written out for the columns and the rows: as one helper called twice, numba's
            # code for this loop ran two to three times slower)
            if col_stamp[dc] != t:
                col_stamp[dc] = t
                col_pos[dc] = col_neg[dc] = 0
                used_cols[ncols] = dc
                ncols += 1
            col_pos[dc], col_neg[dc] = max(col_pos[dc], dy), max(col_neg[dc], -dy)
            if row_stamp[dr] != t:
                row_stamp[dr] = t
                row_pos[dr] = row_neg[dr] = 0
                used_rows[nrows] = dr
                nrows += 1
            row_pos[dr], row_neg[dr] = max(row_pos[dr], dx), max(row_neg[dr], -dx)
        t += 1
        start = end
        if s < 0:
            continue
        sr, sc = s // cols, s % cols
        xy = x_pos + x_neg
        for j in range(ncols):
            xy += col_pos[used_cols[j]] + col_neg[used_cols[j]]
        yx = y_pos + y_neg
        for j in range(nrows):
            yx += row_pos[used_rows[j]] + row_neg[used_rows[j]]
        if yx < xy:  # Y first (X first on a tie)
            for way, length in ((0, y_pos), (1, y_neg)):
                if length:
                    first = _mark_y(along_y, way, sc, sr, length, rows, b)
                    _mark_y(count_y, way, sc, sr, length, rows, 1)
                    lo_y, hi_y = min(lo_y, first), max(hi_y, first + length)
            for j in range(nrows):
                r = used_rows[j]
                for way, length in ((0, row_pos[r]), (1, row_neg[r])):
                    if length:
                        _mark_x(along_x, way, r, sc, length, cols, b)
                        _mark_x(count_x, way, r, sc, length, cols, 1)
                        lo_x, hi_x = min(lo_x, r), max(hi_x, r)
        else:
            for way, length in ((0, x_pos), (1, x_neg)):
                if length:
                    _mark_x(along_x, way, sr, sc, length, cols, b)
                    _mark_x(count_x, way, sr, sc, length, cols, 1)
                    lo_x, hi_x = min(lo_x, sr), max(hi_x, sr)
            for j in range(ncols):
                c = used_cols[j]
                for way, length in ((0, col_pos[c]), (1, col_neg[c])):
                    if length:
                        first = _mark_y(along_y, way, c, sr, length, rows, b)
                        _mark_y(count_y, way, c, sr, length, rows, 1)
                        lo_y, hi_y = min(lo_y, first), max(hi_y, first + length)
    span[0], span[1], span[2], span[3] = lo_x, hi_x, lo_y, hi_y
    count_span[0], count_span[1], count_span[2], count_span[3] = lo_x, hi_x, lo_y, hi_y
    return hops


class _Scratch(threading.local):
    """A thread's difference arrays for one mesh shape, for bytes and for tree counts: the
    legs along the rows and those along the columns, both (way, row, column), and the rows
    of each marked so far (`_fold` reads and resets them). Zero between calls (the folds
    leave them so). The emulator's timing thread and codegen route at once: each thread has
    its own."""

    def __init__(self) -> None:
        self.key: tuple[int, int, bool] | None = None
        self.arrays: tuple[np.ndarray, ...] = ()

    def get(self, rows: int, cols: int, torus: bool) -> tuple[np.ndarray, ...]:
        if self.key != (rows, cols, torus):
            self.arrays = ()  # (the old shape's first)
            # a mesh's legs never wrap: a line and one past its end; a torus's, two lines
            width, height = (2 * cols + 1, 2 * rows + 1) if torus else (cols + 1, rows + 1)
            arrays = []
            for _ in range(2):  # bytes, then trees
                arrays += [np.zeros((2, rows, width), dtype=np.int64),
                           np.zeros((2, height, cols), dtype=np.int64),
                           np.array([rows, -1, height, -1], dtype=np.int64)]
            self.arrays, self.key = tuple(arrays), (rows, cols, torus)
        return self.arrays


_SCRATCH = _Scratch()


def _busiest(arrays: tuple[np.ndarray, ...], rows: int, cols: int, torus: bool) -> int:
    """The busiest link's load of the marks of ``arrays`` (a `_Scratch` triple), which are
    zeroed: without the loads on a mesh; on a torus (small: its legs wrap) from them."""
    if not torus:
        return int(_fold(*arrays, rows, cols, _NO_LOADS, False))
    loads = np.zeros((4, rows, cols), dtype=np.int64)
    _fold(*arrays, rows, cols, loads, True)
    return int(loads.max())


#: `_fold`'s loads where they are not kept
_NO_LOADS = np.zeros((4, 1, 1), dtype=np.int64)


def _marked(grid: tuple[int, int], torus: bool, unicasts: Iterable[tuple[np.ndarray, ...]],
            trees: Iterable[tuple[np.ndarray, ...]]) -> tuple[tuple[np.ndarray, ...], int]:
    """The thread's scratch (the bytes' triple, then the trees') with every transfer of
    ``unicasts`` and every tree of ``trees`` marked, and the longest route (-1: nothing
    moves)."""
    rows, cols = grid
    arrays = _SCRATCH.get(rows, cols, torus)
    hops = -1
    for src, dst, nbytes in unicasts:
        hops = max(hops, _unicasts(src, dst, nbytes, rows, cols, torus, *arrays[:3]))
    for tree, src, dst, nbytes in trees:
        hops = max(hops, _trees(tree, src, dst, nbytes, rows, cols, torus, *arrays))
    return arrays, int(hops)


def phase_loads(grid: tuple[int, int], torus: bool, unicasts: Iterable[tuple[np.ndarray, ...]],
                trees: Iterable[tuple[np.ndarray, ...]], loads: np.ndarray,
                counts: np.ndarray | None = None) -> int:
    """Add to ``loads`` ((4, rows, cols) int64: east, west, south, north) the bytes of one
    phase's transfers and trees, routed together, and to ``counts`` (if given; the same
    shape) one per tree on every link it takes; the longest route in hops, -1 where nothing
    moves (a transfer to its own source, or of no bytes).

    ``unicasts`` are parts (source core, destination core, bytes), each transfer routed X
    then Y; ``trees`` are parts (tree, source core, destination core, the tree's bytes), one
    entry per (tree, destination), a tree's entries consecutive and within one part, each
    tree X first or Y first, whichever takes fewer links (X first on a tie). Every array is
    1-d contiguous int64."""
    arrays, hops = _marked(grid, torus, unicasts, trees)
    _fold(*arrays[:3], *grid, loads, True)
    if counts is not None:
        _fold(*arrays[3:], *grid, counts, True)
    else:
        _busiest(arrays[3:], *grid, torus)  # (zeroes the marks)
    return hops


def phase_busiest(grid: tuple[int, int], torus: bool,
                  unicasts: Iterable[tuple[np.ndarray, ...]],
                  trees: Iterable[tuple[np.ndarray, ...]]) -> tuple[int, int, int]:
    """`phase_loads`' (longest route, busiest link's bytes, most trees on a link), without
    the loads."""
    arrays, hops = _marked(grid, torus, unicasts, trees)
    return hops, _busiest(arrays[:3], *grid, torus), _busiest(arrays[3:], *grid, torus)


@njit(cache=True, nogil=True)
def level_loads(height: int, width: int, row_stride: int, col_stride: int, elems: int,
                elem_bytes: int, unit: int, axis: np.ndarray, size: np.ndarray,
                weight: np.ndarray, value: np.ndarray) -> np.ndarray:
    """(levels, 3): (longest route in hops, busiest link's bytes before the lines' sharing,
    elements added) of every level of a reduce-scatter over a ``height x width`` rectangle
    of members, `partition.collectives.routed_levels`' levels: level k's digit lies along
    mesh axis ``axis[k]`` (0: a row, 1: a column) with ``size[k]`` values, ``value[k, m]``
    member m's (row-major in the rectangle; `collectives._digit_values`), ``weight[k]`` its
    place value in the member's final position; a position keeps ``unit`` elements per unit
    of its digits' weight, of ``elems`` (`scatter_unit`), ``elem_bytes`` each.

    Member m has row m // width and column m % width; at level k each level group's
    members, in digit order along their line, send each receiver its chunk: between the
    t-th and the (t+1)-th member the line carries the chunks of the receivers on one side
    from every sender on the other, one way and the other, the same on every link of that
    stretch. A member's position along its line is its column times ``col_stride`` (along a
    row) or its row times ``row_stride``."""
    group = height * width
    levels = len(axis)
    final = np.zeros(group, dtype=np.int64)
    for m in range(group):
        for k in range(levels):
            final[m] += value[k, m] * weight[k]
    member = np.empty(group, dtype=np.int64)  # the member at each final position
    for m in range(group):
        member[final[m]] = m
    start = np.zeros(group, dtype=np.int64)
    real = np.empty(group, dtype=np.int64)
    out = np.zeros((levels, 3), dtype=np.int64)
    for k in range(levels):
        n, w = size[k], weight[k]
        chunk = unit * w
        for m in range(group):
            start[m] += value[k, m] * chunk
            real[m] = min(max(elems - start[m], 0), chunk) * elem_bytes  # what m gathers
        along_row = axis[k] == 0
        length = width * col_stride + 1 if along_row else height * row_stride + 1
        lines = max(height, width) + 1
        west = np.zeros(lines * length, dtype=np.int64)
        east = np.zeros(lines * length, dtype=np.int64)
        hops = 0
        for first in range(group):
            if value[k, first] != 0:
                continue
            base = final[first]  # the level group's members: base + t w, t < n
            total = 0
            for t in range(n):
                total += real[member[base + t * w]]
            got = 0
            for t in range(n - 1):
                a, b = member[base + t * w], member[base + (t + 1) * w]
                got += real[a]
                if along_row:
                    line, lo, hi = a // width, (a % width) * col_stride, (b % width) * col_stride
                else:
                    line, lo, hi = a % width, (a // width) * row_stride, (b // width) * row_stride
                at = line * length
                west[at + lo] += got * (n - 1 - t)
                west[at + hi] -= got * (n - 1 - t)
                east[at + lo] += (total - got) * (t + 1)
                east[at + hi] -= (total - got) * (t + 1)
            if total > 0:
                a, b = member[base], member[base + (n - 1) * w]
                if along_row:
                    span = (b % width - a % width) * col_stride
                else:
                    span = (b // width - a // width) * row_stride
                hops = max(hops, span)
        busiest = 0
        for loads in (west, east):
            running = 0
            for x in range(len(loads)):
                running += loads[x]
                busiest = max(busiest, running)
        out[k, 0], out[k, 1], out[k, 2] = hops, busiest, (n - 1) * chunk
    return out


def load() -> None:
    """Load every kernel here now (numba's cached machine code, or compiled at the first
    run), each through a call on a 2 x 2 mesh and torus. A process about to fork workers
    that route calls it first: the workers then inherit the kernels loaded, where each
    would otherwise import numba and load them itself (about half a second a worker)."""
    one = np.zeros(1, dtype=np.int64)
    for torus in (False, True):
        phase_loads((2, 2), torus, [(one, one + 1, one + 1)], [(one, one, one + 3, one + 1)],
                    np.zeros((4, 2, 2), dtype=np.int64), np.zeros((4, 2, 2), dtype=np.int64))
        phase_busiest((2, 2), torus, [(one, one + 1, one + 1)], [(one, one, one + 3, one + 1)])
    level_loads(1, 2, 1, 1, 2, 2, 1, one - 1, one + 1, one, np.array([[0, 1]], dtype=np.int64))
