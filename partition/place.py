"""Placement of an op's core grid on a 2D mesh or torus, and the mesh costs that follow from it.

On an all-to-all chip any core can stand for any position of the op's grid: logical core ``c``
(row-major over ``F``) runs on physical core ``c``. On a mesh a shift costs hops and shares
links, so where the cores sit decides what a rotation costs.

The mesh-aware embedding (`Embedding`) gives each ring driver its own physical dimension:

- each rotating operand rotates along a ring of ``t`` cores that differ only in its driver's
  coordinate (``plan.py``); at most two drivers exist in a placeable plan, one laid along the
  columns (ring length ``tc``) and one along the rows (``tr``);
- the chip is cut into blocks of ``tr x tc`` cores; inside a block a core's position along each
  dimension is its ring position, *interleaved*: ring positions ``0, 1, .., t-1`` sit at
  offsets ``0, 2, 4, .., 5, 3, 1`` (even positions outward, odd ones back), so every ring edge,
  the wrap-around included, is at most 2 hops (WaferLLM's MeshGEMM does the same);
- the rest of a core's coordinates (non-driver axes, and driver coordinates divided by the ring
  length) form one mixed-radix index, reduction axes innermost so that cores holding partial
  sums of the same block sit close; blocks are filled row-major with it over the op's region,
  the squarest rectangle of blocks that holds them (`region_width`), centred on the mesh, so
  that all ops' regions are concentric: data moving between two ops crosses about half of
  each one's extent (from a common corner it crossed up to the whole larger one).

With this embedding a ring edge is at most 2 hops and each link of a line of rings carries one
message per ring and direction, so a shift step costs ``hop latency x hops + busiest link bytes
/ link bandwidth``, where the busiest link carries the bytes of every operand that moves along
the same driver (operands moving along different drivers use different links). A plan whose
rings do not embed this way (three drivers, two ring lengths on one driver, or blocks that do
not fit the grid) is not placeable and the mesh-aware search leaves it out.

The all-to-all-assumption plans (T10 as published, ``embed=None``) keep the identity placement;
on a mesh their rings are wherever row-major numbering puts them, and the emulator charges the
real routes.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import ceil_div
from t10c.multicast import phase_cycles

#: routing resources one rotating operand takes on every core of its rings: one route (a
#: Cerebras "colour") per direction of the interleaved ring
ROUTES_PER_RING = 2


@dataclass(frozen=True)
class Embedding:
    """Where an op's grid sits on a ``rows x cols`` mesh (see the module doc)."""

    rows: int
    cols: int
    col_driver: str = ""  # the driver axis laid along the columns ("" for none)
    col_ring: int = 1
    row_driver: str = ""
    row_ring: int = 1

    def as_list(self) -> list[object]:
        return [self.rows, self.cols, self.col_driver, self.col_ring, self.row_driver,
                self.row_ring]

    @staticmethod
    def from_list(v: list[object] | tuple[object, ...] | None) -> Embedding | None:
        if not v:
            return None
        r, c, cd, ct, rd, rt = v
        return Embedding(int(r), int(c), str(cd), int(ct), str(rd), int(rt))  # type: ignore


def interleave(pos: np.ndarray, t: int) -> np.ndarray:
    """Physical offset of ring position ``pos`` in a ring of ``t`` cores laid on a line."""
    half = (t + 1) // 2
    return np.where(pos < half, 2 * pos, 2 * (t - 1 - pos) + 1)


def ring_drivers(T: tuple[int, ...], rot: tuple[tuple[str, ...], ...],
                 drivers_of: list[str | None], axes: tuple[str, ...]) -> dict[str, int] | None:
    """Ring length per driver axis; None when one driver would carry two ring lengths."""
    rings: dict[str, int] = {}
    for r, d in zip(rot, drivers_of):
        if not r or d is None:
            continue
        t = T[axes.index(r[0])]
        if rings.setdefault(d, t) != t:
            return None
    return rings


def fits(chip: Chip, ncores: int, tc: int, tr: int) -> bool:
    """Whether ``ncores`` cores cut into ``tr x tc`` blocks fit the chip's grid."""
    return bool(_fits(chip, np.array([ncores]), np.array([tc]), np.array([tr]))[0])


def _fits(chip: Chip, ncores: np.ndarray, tc: np.ndarray, tr: np.ndarray) -> np.ndarray:
    rows, cols = chip.grid
    tc, tr = np.maximum(tc, 1), np.maximum(tr, 1)
    return (tc <= cols) & (tr <= rows) & (ceil_div(ncores, tc * tr) <= (rows // tr) * (cols // tc))


def embed_rows(chip: Chip, ncores: np.ndarray, driver: dict[int, np.ndarray],
               ring: dict[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                               np.ndarray]:
    """The embedding rule, over many grids at once (the search prices whole arrays of F).

    Row ``n`` is a grid of ``ncores[n]`` cores whose rotating operand ``i`` runs a ring of
    ``ring[i]`` cores along axis position ``driver[i][n]``. Returns per row: whether it embeds
    (one ring length per driver, at most two drivers, their routes within the chip's, blocks
    that fit the grid), the column driver's axis position (-1: none) and ring length, and the
    row driver's. The driver with the lower axis position goes along the columns unless only
    the other way round fits."""
    n = len(ncores)
    ok = np.ones(n, dtype=bool)
    big = np.iinfo(np.int64).max
    ops = list(driver)
    for a, b in itertools.combinations(ops, 2):  # one ring length per driver
        if ring[a] != ring[b]:
            ok &= driver[a] != driver[b]
    first = np.full(n, big)
    for i in ops:
        first = np.minimum(first, driver[i])
    second = np.full(n, big)
    for i in ops:
        second = np.minimum(second, np.where(driver[i] != first, driver[i], big))
    for i in ops:  # at most two drivers
        ok &= (driver[i] == first) | (driver[i] == second)
    t_first = np.ones(n, dtype=np.int64)
    t_second = np.ones(n, dtype=np.int64)
    for i in ops:
        t_first = np.where(driver[i] == first, ring[i], t_first)
        t_second = np.where(driver[i] == second, ring[i], t_second)
    first = np.where(first == big, -1, first)
    second = np.where(second == big, -1, second)
    ndrivers = (first >= 0).astype(np.int64) + (second >= 0)
    if chip.routes_per_core:
        ok &= ROUTES_PER_RING * ndrivers <= chip.routes_per_core
    straight, swapped = _fits(chip, ncores, t_first, t_second), \
        _fits(chip, ncores, t_second, t_first)
    ok &= straight | swapped
    return (ok, np.where(straight, first, second), np.where(straight, t_first, t_second),
            np.where(straight, second, first), np.where(straight, t_second, t_first))


def choose(chip: Chip, ncores: int, rings: dict[str, int] | None, axes: tuple[str, ...]
           ) -> Embedding | None:
    """The embedding of a grid of ``ncores`` cores with ``rings`` (driver -> ring length), or
    None when it cannot be placed with every ring edge within 2 hops (`embed_rows`' rule)."""
    if rings is None:  # one driver would carry two ring lengths
        return None
    names = list(rings)
    ok, cd, ct, rd, rt = embed_rows(
        chip, np.array([ncores]), {k: np.array([axes.index(d)]) for k, d in enumerate(names)},
        {k: rings[d] for k, d in enumerate(names)})
    if not ok[0]:
        return None
    return Embedding(chip.rows, chip.cols, axes[cd[0]] if cd[0] >= 0 else "", int(ct[0]),
                     axes[rd[0]] if rd[0] >= 0 else "", int(rt[0]))


def physical_cores(coords: np.ndarray, F: tuple[int, ...], axes: tuple[str, ...],
                   reduction: set[str], embed: Embedding) -> np.ndarray:
    """(ncores,): the physical core (row-major over the mesh) of each logical core."""
    coords = np.asarray(coords, dtype=np.int64)
    n = len(coords)
    ring_pos = {}
    rest_cols = []
    rest_dims = []
    order = [j for j, a in enumerate(axes) if a not in reduction] + [
        j for j, a in enumerate(axes) if a in reduction]
    ring = ring_lengths(embed, axes)
    for j in order:
        a, t = axes[j], ring[j]
        if t > 1:
            ring_pos[a] = coords[:, j] % t
        rest_cols.append(coords[:, j] // t)
        rest_dims.append(F[j] // t)
    rest = np.zeros(n, dtype=np.int64)
    for col, dim in zip(rest_cols, rest_dims):
        rest = rest * dim + col
    # reduction axes are innermost: a reduction group is ``group`` consecutive blocks, laid as
    # a rectangle of blocks that tiles the chip (`group_tile`) so that it never straddles the
    # end of a row; row-major over the blocks when no rectangle tiles it
    group = math.prod(d for (j, d) in zip(order, rest_dims) if axes[j] in reduction)
    nblocks = math.prod(rest_dims)
    per_row = region_width(embed, nblocks, group)
    tile = group_tile(per_row, embed.rows // embed.row_ring, nblocks, group)
    if tile is None:
        brow, bcol = np.divmod(rest, per_row)
    else:
        height, width = tile
        gi, member = np.divmod(rest, group)
        band, slot = np.divmod(gi, per_row // width)
        mr, mc = np.divmod(member, width)
        brow, bcol = band * height + mr, slot * width + mc
    used_rows, used_cols = region_extent(per_row, nblocks, group, tile)
    row0, col0 = (embed.rows - used_rows * embed.row_ring) // 2, \
        (embed.cols - used_cols * embed.col_ring) // 2
    col = col0 + bcol * embed.col_ring
    row = row0 + brow * embed.row_ring
    if embed.col_driver:
        col = col + interleave(ring_pos[embed.col_driver], embed.col_ring)
    if embed.row_driver:
        row = row + interleave(ring_pos[embed.row_driver], embed.row_ring)
    return row * embed.cols + col


def grid_coords(F: tuple[int, ...], scale: tuple[int, ...] | None = None) -> np.ndarray:
    """(prod(F), len(F)): every point's coordinates on a grid of sizes ``F``, row-major (each
    axis' range broadcast over the grid: 4x faster on a wafer's cores than unravel_index),
    each axis' times ``scale``'s if given (scaled as they are made: multiplying the grid by
    a row of a few scales afterwards takes seven times as long)."""
    return grid_columns(F, [grid_axis(F, k) * (1 if scale is None else scale[k])
                            for k in range(len(F))])


def grid_axis(F: tuple[int, ...], k: int) -> np.ndarray:
    """Axis ``k``'s coordinate on a grid of sizes ``F``, shaped to broadcast over it."""
    return np.arange(F[k], dtype=np.int64).reshape([f if i == k else 1 for i, f in enumerate(F)])


def grid_columns(F: tuple[int, ...], columns: list[np.ndarray | int]) -> np.ndarray:
    """(prod(F), len(columns)), column ``j`` each grid point's value of ``columns[j]``
    (broadcast over the grid of sizes ``F``, row-major). The columns are made over the grid's
    axes and broadcast as they are written: a wafer's 750,000 cores are not gathered column
    by column."""
    out = np.empty((math.prod(F), len(columns)), dtype=np.int64)
    grid = out.reshape(*F, len(columns))
    for j, col in enumerate(columns):
        grid[..., j] = col
    return out


def grid_physical_cores(F: tuple[int, ...], axes: tuple[str, ...], reduction: set[str],
                        embed: Embedding) -> np.ndarray:
    """`physical_cores` of every logical core of the grid ``F`` (row-major), equal to it
    element for element, computed from two sub-grids where the embedding is a sum of a
    function of some axes and one of the others (`grid_parts`; a wafer's grid is 850,000
    cores, its sub-grids a few thousand each). Read-only, and kept for the next plan of the
    same grid and placement (`_PLACED`)."""
    key = (F, axes, frozenset(reduction), embed)
    with _PLACED_LOCK:
        got = _PLACED.get(key)
        if got is not None:
            _PLACED.move_to_end(key)
            return got
    parts = grid_parts(F, axes, reduction, embed)
    if parts is None:
        phys = physical_cores(grid_coords(F), F, axes, reduction, embed)
    else:
        phys = (parts[1] + parts[2]).reshape(math.prod(F))
    phys.flags.writeable = False
    global _PLACED_BYTES
    with _PLACED_LOCK:
        if key not in _PLACED:
            _PLACED[key] = phys
            _PLACED_BYTES += phys.nbytes
            while _PLACED_BYTES > PLACED_KEPT_BYTES and len(_PLACED) > 1:
                _PLACED_BYTES -= _PLACED.popitem(last=False)[1].nbytes
    return phys


#: `grid_physical_cores` by its arguments, the least recently asked for dropped first: the
#: planner asks for the same op's placement under every plan of its grid (the temporal
#: factors and rotations do not move a core), on a wafer 6 MB and a few milliseconds each
#: (bert-large on wse2: 1,117 asks for 288 placements)
_PLACED: OrderedDict[tuple, np.ndarray] = OrderedDict()
_PLACED_BYTES = 0
_PLACED_LOCK = threading.Lock()
#: what `_PLACED` holds at most
PLACED_KEPT_BYTES = 256 << 20


def grid_parts(F: tuple[int, ...], axes: tuple[str, ...], reduction: set[str],
               embed: Embedding) -> tuple[frozenset[int], np.ndarray, np.ndarray] | None:
    """`physical_cores` of the grid ``F`` as the sum of two parts where it is one: (the axis
    positions of the second part, the first part, the second part), each shaped over ``F``
    with the other part's axes of size 1, so that the grid's cores are ``first + second``
    broadcast; None where the embedding is not such a sum.

    The blocks' mixed-radix index is ``rest = r_P * D_S + r_S`` over a prefix P and a suffix S
    of the axes' order (`physical_cores`), ``0 <= r_S < D_S`` when every ring length divides
    its axis. With reduction groups laid as rectangles, P = the other axes, S = the reduction
    axes: a group's rectangle (band, slot) depends on r_P alone, the member's place in it on
    r_S alone. Laid row-major, when D_S divides the blocks per row (q D_S): the block's row
    is r_P // q and its column (r_P % q) D_S + r_S. A ring position depends on its own axis
    alone. So phys(c) = (phys(c_P, 0) - phys(0, 0)) + phys(0, c_S)."""
    ring = ring_lengths(embed, axes)
    order = [j for j, a in enumerate(axes) if a not in reduction] + [
        j for j, a in enumerate(axes) if a in reduction]
    dims = [F[j] // ring[j] for j in order]
    group = math.prod(d for j, d in zip(order, dims) if axes[j] in reduction)
    per_row = region_width(embed, math.prod(dims), group)
    split = None
    if all(F[j] % ring[j] == 0 for j in order) and math.prod(F) > 1:
        if group_tile(per_row, embed.rows // embed.row_ring, math.prod(dims), group):
            split = len(order) - sum(a in reduction for a in axes)
        else:  # the longest suffix whose blocks divide a row's
            split = next((k for k in range(1, len(order))
                          if per_row % math.prod(dims[k:]) == 0), None)
    if split is None or split in (0, len(order)):
        return None
    parts = []
    for side in (set(order[:split]), set(order[split:])):
        sub = tuple(f if j in side else 1 for j, f in enumerate(F))
        parts.append(physical_cores(grid_coords(sub), F, axes, reduction, embed).reshape(sub))
    zero = physical_cores(np.zeros((1, len(F)), dtype=np.int64), F, axes, reduction, embed)
    parts[0] -= zero[0]
    return frozenset(order[split:]), parts[0], parts[1]


def region_width(embed: Embedding, nblocks: int, group: int) -> int:
    """Blocks per row of the region an op's ``nblocks`` blocks fill: the squarest in cores
    that holds them (and in which its reduction groups of ``group`` blocks tile,
    `group_tile`), not the mesh's whole width. Every op's region is centred on the mesh
    (`physical_cores`), so a re-layout between two ops crosses about half of each one's
    extent: on a wafer a few thousand cores span 45 x 45, where row-major over the chip's
    width they span 2 x 996 and data between two such ops crosses the wafer."""
    per_row, block_rows = embed.cols // embed.col_ring, embed.rows // embed.row_ring
    if per_row < 1 or block_rows < 1:  # (a grid that does not embed: priced, never placed)
        return max(per_row, 1)
    # the least W with W x W x col_ring >= nblocks x row_ring: W blocks of col_ring cores per
    # row, nblocks / W block rows of row_ring cores
    side = math.isqrt(ceil_div(nblocks * embed.row_ring, embed.col_ring) - 1) + 1 \
        if nblocks > 1 else 1
    width = min(per_row, max(side, ceil_div(nblocks, block_rows)))
    if group > 1 and width < per_row and group_tile(width, block_rows, nblocks, group) is None \
            and group_tile(per_row, block_rows, nblocks, group) is not None:
        return per_row
    return width


def ring_lengths(embed: Embedding, axes: tuple[str, ...]) -> list[int]:
    """Per axis, the ring it runs along on the mesh (1 for an axis that drives none)."""
    return [embed.col_ring if a == embed.col_driver else (
        embed.row_ring if a == embed.row_driver else 1) for a in axes]


def region_span(F: tuple[int, ...], axes: tuple[str, ...], reduction: set[str],
                embed: Embedding) -> tuple[int, int]:
    """(rows, cols) of cores of the region an op's grid ``F`` takes on the mesh
    (`physical_cores` centres it there)."""
    dims = [f // t for f, t in zip(F, ring_lengths(embed, axes))]
    nblocks = math.prod(dims)
    group = math.prod(d for d, a in zip(dims, axes) if a in reduction)
    per_row = region_width(embed, nblocks, group)
    tile = group_tile(per_row, embed.rows // embed.row_ring, nblocks, group)
    rows, cols = region_extent(per_row, nblocks, group, tile)
    return rows * embed.row_ring, cols * embed.col_ring


def region_extent(per_row: int, nblocks: int, group: int, tile: tuple[int, int] | None
                  ) -> tuple[int, int]:
    """(block rows, blocks per row) an op's ``nblocks`` blocks take when laid ``per_row``
    blocks a row (`region_width`), reduction groups of ``group`` as rectangles ``tile``
    (`group_tile`) or row-major (None): the region `physical_cores` centres on the mesh."""
    if tile is None:
        return ceil_div(nblocks, per_row), min(per_row, nblocks)
    height, width = tile
    groups, per_band = ceil_div(nblocks, group), per_row // width
    return ceil_div(groups, per_band) * height, min(per_band, groups) * width


def group_tile(blocks_per_row: int, block_rows: int, nblocks: int, group: int
               ) -> tuple[int, int] | None:
    """(rows, cols) of blocks of the rectangle each reduction group of ``group`` consecutive
    blocks occupies when ``nblocks`` blocks fill a grid of ``block_rows x blocks_per_row``
    blocks: the squarest (then the widest) whose rectangles tile the grid, as a reduction in
    levels along both dimensions moves least over a square (`partition.collectives`); None
    when none does (the blocks are then laid row-major and a group may straddle a row's
    end)."""
    if group <= 1 or blocks_per_row < 1:  # (a grid that does not embed: priced, never placed)
        return None
    groups = ceil_div(nblocks, group)
    # |log w - log sqrt(group)| in integers: max(w*w, group) / min(w*w, group)
    for width in sorted(_divisors(group), key=lambda w: (max(w * w, group) / min(w * w, group),
                                                         -w)):
        if width > blocks_per_row:
            continue
        height = group // width
        if ceil_div(groups, (blocks_per_row // width)) * height <= block_rows:
            return height, width
    return None


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small)]


def shift_cycles(chip: Chip, moved: list[tuple[int, str, int]]) -> int:
    """Cycles of one shift step of an embedded plan: ``moved`` lists (bytes per core, driver,
    ring length) of every operand that moves; operands on the same driver share its links."""
    if not moved:
        return 0
    load: dict[str, int] = {}
    for nbytes, driver, _ in moved:
        load[driver] = load.get(driver, 0) + nbytes
    hops = max(hops_of_ring(t) for *_, t in moved)
    busiest = max(load.values())
    if busiest <= 0:
        return 0
    return chip.hop_latency_cycles * hops + ceil_div(busiest, chip.link_bytes_per_cycle)


def hops_of_ring(t: int) -> int:
    """Longest edge of an interleaved ring of ``t`` cores."""
    return 0 if t <= 1 else 1 if t == 2 else 2


def exchange_estimate(chip: Chip, remote_bytes: int, sent_bytes: int = 0,
                      region: tuple[int, int] | None = None, trees: int = 0) -> int:
    """Estimated cycles of a re-layout in which the busiest core receives ``remote_bytes``
    from cores anywhere in ``region`` (rows, cols: the union of the two ops' regions, which
    `physical_cores` centres on the mesh; the whole chip if None) and the busiest sender puts
    ``sent_bytes`` on a link: on a mesh, traffic to uniform destinations loads the middle
    link of a line of ``L`` cores with about ``L / 4`` times what each core receives and
    crosses half the region on average. A tile that many cores read leaves its sender once
    (the routes are multicast trees, `t10c.multicast`), so ``sent_bytes`` is the tile, not
    its copies. Fitted on 64 x 64 against the routed phases of the chosen plans (a mean
    factor of 1.5 too high or too low, README: Performance, Meshes). Where ``trees`` route
    trees share the busiest link (`transitions.broadcast_trees`), the routing colours run
    them in waves that each pay the hops (`t10c.multicast.waves`). The emulator routes the
    real thing."""
    if remote_bytes <= 0:
        return 0
    if not chip.is_mesh:
        return chip.transfer_cycles(remote_bytes)
    rows, cols = region or (chip.rows, chip.cols)
    hops = (rows + cols) // 2
    load = max(remote_bytes * max(1, max(rows, cols) // 4), sent_bytes)
    return phase_cycles(chip, load, hops, trees)


def relayout_estimate(chip: Chip, remote_bytes: int, have: tuple[int, int, int, int],
                      want: tuple[int, int, int, int], distinct: int) -> int:
    """Estimated cycles of a re-layout on a mesh (barrier not included), from the two ops'
    regions as they lie: ``have`` is the producer's (rows, cols) extent, its cores and the
    bytes each holds, ``want`` the consumer's extent and cores; its busiest core receives
    ``remote_bytes`` of a tensor of ``distinct`` bytes. Regions are concentric
    (`physical_cores`), so routes cross about half of each dimension of their union, and
    traffic to uniform destinations loads the middle link of a line of ``L`` cores with
    about ``L / 4`` times what a core receives; where each element has copies, the trees of
    the producer's cores along one side of its region share links (at most one per copy),
    in the routing colours' waves (`t10c.multicast.phase_cycles`). Three patterns cost less,
    and are priced by what bounds them:

    - into a region a quarter of the producer's size or less (a reduction's few cores):
      what all its cores receive crosses its boundary, about half of whose ``2 (rows +
      cols)`` links the dimension-order routes use (1.5x that, fitted);
    - out of a region a quarter of the consumer's size or less, each consumer tile from at
      most two producer cores (a vector broadcast into a GEMV's tiles): each producer
      core's tile leaves it once, in a tree, so the busiest link carries the tiles of the
      cores along the longer side of its region;
    - each consumer tile from more producer cores than that, on a chip with a colour limit:
      relayed (`t10c.multicast.relayed`), gathered near its sources (a quarter of the
      producer's extent, twice the tile on the busiest link), then spread to its readers,
      the ``sqrt(G)`` trees of ``G`` distinct tiles beside one another sharing the busiest
      link (fitted).

    Fitted against the routed phases of (producer plan, consumer plan) pairs, each input
    alone, on a 64 x 64 mesh and on wse2, where it is far closer to them than the solver's
    estimate (`exchange_estimate` across the union of the regions, an aligned plan's taken
    as the whole chip), which is up to 78x too high on the wafer's GEMV inputs. `refine`
    ranks its candidates by it; steering the solve with it did not give a faster plan (the
    README's Meshes section has the figures of both)."""
    if remote_bytes <= 0:
        return 0
    hp, wp, senders, sent = have
    hq, wq, receivers, _ = want
    rows, cols = max(hp, hq), max(wp, wq)
    hops = (rows + cols) // 2
    total = receivers * remote_bytes
    copies = total // max(senders * sent, 1)
    trees = min(max(hp, wp), copies)
    fan_in = remote_bytes // max(sent, 1)
    load = remote_bytes * max(1, max(rows, cols) // 4)
    if 4 * hq * wq <= hp * wp:
        load = min(load, max(remote_bytes, 3 * total // (2 * (hq + wq))))
    if copies > 1 and fan_in <= 2 and 4 * hp * wp <= hq * wq:
        load = min(load, max(remote_bytes, trees * sent))
    best = phase_cycles(chip, max(load, sent), hops, trees)
    if copies > 1 and fan_in > 2 and chip.routes_per_core:
        spread = math.isqrt(max(distinct // remote_bytes, 1) - 1) + 1
        best = min(best, phase_cycles(chip, 2 * remote_bytes, (hp + wp) // 4)
                   + phase_cycles(chip, spread * remote_bytes, (hp + wp + hq + wq) // 2,
                                  spread))
    return best


def describe(embed: Embedding | None, ncores: int) -> str:
    if embed is None:
        return "row-major (all-to-all numbering)"
    parts = []
    if embed.col_driver:
        parts.append(f"ring of {embed.col_ring} along {embed.col_driver} on the columns")
    if embed.row_driver:
        parts.append(f"ring of {embed.row_ring} along {embed.row_driver} on the rows")
    blocks = ceil_div(ncores, (embed.col_ring * embed.row_ring))
    parts.append(f"{blocks} blocks of {embed.row_ring} x {embed.col_ring}")
    return ", ".join(parts)


__all__ = ["Embedding", "choose", "embed_rows", "grid_axis", "grid_columns", "grid_coords",
           "grid_parts", "grid_physical_cores", "physical_cores", "shift_cycles", "group_tile",
           "exchange_estimate", "relayout_estimate", "region_span", "ring_lengths",
           "interleave", "ring_drivers",
           "hops_of_ring", "fits",
           "ROUTES_PER_RING"]
