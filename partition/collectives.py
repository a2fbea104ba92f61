"""Multi-level (K-tree) reduce-scatter on a mesh: its levels, its layout and its price.

After an op's steps, the ``G`` cores of a reduction group hold partial sums of the same block
of ``L`` elements, and a reduce-scatter leaves member ``p`` with elements ``[p x c, (p + 1) x
c)`` of the reduced block, ``c = ceil(L / G)``. Gathering every member's chunk directly over a
line of ``G`` cores loads the line's middle link with about ``G / 4`` blocks. As WaferLLM's
MeshGEMV does, t10c reduces in levels instead: the members of a group, laid as a rectangle
that never straddles a row's end (`place.group_tile`), are numbered by *digits*, each a set of
members along one mesh dimension (a row of the rectangle, a column, or a row's contiguous runs
and every run's ``k``-th core), and level ``k`` reduces among the members that differ only
in digit ``k``, each keeping ``1 / size`` of its chunk. The first level moves the most, the
later ones little; the busiest link of a level along a line carries, per receiver on one side,
its chunk from every sender on the other side.

Member ``p``'s digits are the mixed-radix digits of ``p`` in level order (the first level's
most significant), and level ``k``'s chunk is ``c x`` (the product of the later levels'
sizes), so the final share is ``[p x c, (p + 1) x c)`` as with one level: consumers and the
re-layout pricing (`transitions.result_owner`) see the same layout. Chunks past the block's
end are padding that no transfer carries (`Reduce.sizes`).

Every level is an ordinary `Reduce` instruction (codegen emits one per level), so the emulator
computes the same numbers and routes each level's real transfers; the planner prices the levels
with `reduce_estimate` over the rectangle `place.group_tile` makes. A group that is not a
rectangle on the mesh (a plan aligned to its producer, a chip without a grid) keeps one level.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import ceil_div
from t10c.ir import row_keys

from .place import Embedding, grid_parts, group_tile, region_width

if TYPE_CHECKING:
    from .plan import Geometry


def scatter_unit(elems: int, group: int) -> int:
    """Elements each member of a reduction group of ``group`` keeps of a block of ``elems``
    after the reduce-scatter (the final share; padding included)."""
    return ceil_div(elems, group)


@dataclass(frozen=True)
class Digit:
    """``size`` members along mesh axis ``axis`` (0: along a row, 1: along a column),
    ``stride`` cores apart; ``share`` interleaved groups use the same line's links; ``unit``
    is the digit's step in the member's position along its axis of the rectangle."""

    size: int
    axis: int
    stride: int
    share: int
    unit: int


@dataclass(frozen=True)
class Level:
    """One level of a group's reduce-scatter, for every core (rows are logical cores)."""

    size: int
    chunk: int  # elements each core keeps after the level (padding included)
    table: np.ndarray  # (ncores, size): logical cores of the core's level group, by digit
    offset: np.ndarray  # (ncores,): where the core's chunk starts in its previous chunk
    sizes: np.ndarray  # (ncores,): elements of that chunk inside the block (no padding)


@dataclass(frozen=True)
class Scatter:
    """A group reduce-scatter: ``members`` (blocks, G) logical cores by core id, the final
    position of every core, the final chunk and the levels in order."""

    members: np.ndarray
    pos: np.ndarray
    chunk: int
    levels: tuple[Level, ...]


def _line_busiest(sizes: np.ndarray) -> int:
    """Elements on the busiest link of a line whose member ``x`` gathers ``sizes[x]`` from
    every other member (dimension-order routes; both directions)."""
    g = len(sizes)
    if g <= 1:
        return 0
    x = np.arange(g - 1)
    below = np.cumsum(sizes)[:-1]  # receivers at or left of link x
    above = int(sizes.sum()) - below
    west = below * (g - 1 - x)  # from the senders right of the link
    east = above * (x + 1)
    return int(max(west.max(), east.max()))


@lru_cache(maxsize=1 << 16)
def _line_busiest_prefix(size: int, chunk: int, left: int) -> int:
    """`_line_busiest` of a line whose receivers hold ``min(chunk, what is left)`` of
    ``left`` elements in order (full chunks, one partial, then none), in O(1): both
    directions' loads are concave up to the last receiver, so only a few links can peak."""
    if size <= 1:
        return 0
    total = min(left, size * chunk)
    best = 0
    last = ceil_div(total, chunk) - 1  # the last receiver holding anything
    for x in {0, size - 2, last - 1, last, size // 2 - 1, (size - 1) // 2,
              total // (2 * chunk) - 1, ceil_div(total, (2 * chunk)) - 1}:
        if 0 <= x <= size - 2:
            got = min((x + 1) * chunk, total)
            best = max(best, got * (size - 1 - x), (total - got) * (x + 1))
    return best


def levels_cost(digits: tuple[Digit, ...], elems: int) -> int:
    """Elements the levels in order move over their busiest links (the chip-free measure by
    which `choose_levels` orders them)."""
    group = math.prod(d.size for d in digits)
    unit = scatter_unit(elems, group)
    rest, left, total = group, elems, 0  # left: block elements in the first line's chunk
    for d in digits:
        rest //= d.size
        chunk = unit * rest
        total += _line_busiest_prefix(d.size, chunk, left) * d.share
        left = min(left, chunk)
    return total


def _splits(n: int, stride: int, share: int, axis: int) -> list[tuple[Digit, ...]]:
    """Ways to number ``n`` members on a line: one digit, or two (contiguous runs of ``a``
    members, then every ``a``-th), ``a`` a divisor of ``n`` next to its square root."""
    if n <= 1:
        return [()]
    out: list[tuple[Digit, ...]] = [(Digit(n, axis, stride, share, 1),)]
    a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    for inner in sorted({a, n // a} - {1, n}):
        out.append((Digit(inner, axis, stride, share, 1),
                    Digit(n // inner, axis, stride * inner, share * inner, inner)))
    return out


@lru_cache(maxsize=65536)
def choose_levels(rows: int, cols: int, row_stride: int, col_stride: int, elems: int
                  ) -> tuple[Digit, ...]:
    """The levels for a group laid as a ``rows x cols`` rectangle of members (``col_stride``
    cores apart along a row, ``row_stride`` along a column, as many interleaved groups
    sharing each line): the order that moves the fewest elements over the busiest links
    (chip-free, so that codegen, the planner and the re-layout pricing agree); ties go to
    fewer levels."""
    best: tuple[int, int, tuple[Digit, ...]] | None = None
    for across in _splits(cols, col_stride, col_stride, 0):
        for down in _splits(rows, row_stride, row_stride, 1):
            for order in itertools.permutations(across + down):
                key = (levels_cost(order, elems), len(order), order)
                if best is None or key[:2] < best[:2]:
                    best = key
    assert best is not None
    return best[2]


def group_shape(chip: Chip, ncores: int, group: int, col_ring: int, row_ring: int
                ) -> tuple[int, int]:
    """(rows, cols) of the members of a reduction group of ``group`` consecutive blocks as
    `place.physical_cores` lays them (one member per block; `place.group_tile`). Where no
    rectangle tiles the chip the groups straddle rows and are priced as lines (optimistic)."""
    tile = _group_tile(chip, ncores, group, col_ring, row_ring)[0]
    return (1, group) if tile is None else tile


def _group_tile(chip: Chip, ncores: int, group: int, col_ring: int, row_ring: int
                ) -> tuple[tuple[int, int] | None, int]:
    """(`place.group_tile` of the op's region, the region's width in blocks), as
    `place.physical_cores` lays an op of ``ncores`` cores in blocks of ``row_ring x
    col_ring``."""
    return _grid_group_tile(chip.rows, chip.cols, ncores, group, col_ring, row_ring)


@lru_cache(maxsize=1 << 14)
def _grid_group_tile(rows: int, cols: int, ncores: int, group: int, col_ring: int,
                     row_ring: int) -> tuple[tuple[int, int] | None, int]:
    """`_group_tile` on a mesh of ``rows x cols`` (all it reads of the chip): the searches
    price the same few groups for thousands of candidate plans."""
    nblocks = ceil_div(ncores, col_ring * row_ring)
    width = region_width(Embedding(rows, cols, "", col_ring, "", row_ring), nblocks, group)
    return group_tile(width, rows // row_ring, nblocks, group), width


def _digit_values(digits: tuple[Digit, ...], height: int, width: int
                  ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[int]]:
    """Members of a ``height x width`` rectangle in row-major order: their row and column
    index, their value of every digit, and each digit's weight in the final position."""
    i, j = np.divmod(np.arange(height * width), width)
    along = {0: j, 1: i}
    values = [(along[d.axis] // d.unit) % d.size for d in digits]
    weights = [math.prod(d.size for d in digits[k + 1:]) for k in range(len(digits))]
    return i, j, values, weights


@lru_cache(maxsize=65536)
def routed_levels(height: int, width: int, row_stride: int, col_stride: int, elems: int,
                  elem_bytes: int) -> tuple[tuple[int, int, int], ...]:
    """(longest route in hops, busiest link's bytes, elements added) of every level of one
    group laid as a rectangle (`choose_levels`' order), its transfers routed along the
    rectangle's lines link by link as the emulator routes them; interleaved groups of other
    ring positions load the same lines (``stride`` of them). One compiled pass over the
    members per level (`t10c.meshkernels.level_loads`)."""
    from t10c.meshkernels import level_loads  # (numba: only where a mesh reduces)

    digits = choose_levels(height, width, row_stride, col_stride, elems)
    _, _, values, weights = _digit_values(digits, height, width)
    axis, size = (np.array([getattr(d, f) for d in digits], dtype=np.int64)
                  for f in ("axis", "size"))
    loads = level_loads(height, width, row_stride, col_stride, elems, elem_bytes,
                        scatter_unit(elems, height * width), axis, size,
                        np.array(weights, dtype=np.int64),
                        np.array(values, dtype=np.int64).reshape(len(digits), height * width))
    # interleaved groups of the other ring positions load the same lines: a line's links
    # carry ``stride`` groups' bytes (the stride across the line, not the digit's `share`)
    return tuple((hops, busiest * (col_stride if d.axis == 0 else row_stride), added)
                 for d, (hops, busiest, added) in zip(digits, loads.tolist()))


#: `reduce_estimate` by (the chip's identity, its arguments), with the chip held (so that its
#: identity is not reused): bert-large's searches on wse2 ask 74,778 times for 15,158
#: estimates, the costs of thousands of candidate plans over a few reduce groups each
_ESTIMATES: dict[tuple, tuple[Chip, tuple[int, int]]] = {}
_ESTIMATES_LIMIT = 1 << 16


def reduce_estimate(chip: Chip, ncores: int, group: int, col_ring: int, row_ring: int,
                    elems: int, elem_bytes: int, dtype: str) -> tuple[int, int]:
    """(cycles of the levels, the largest chunk a level keeps) of a mesh reduce-scatter of
    blocks of ``elems`` over groups of ``group`` members: the planner's price (the barrier
    not included)."""
    if group <= 1:
        return 0, elems
    key = (id(chip), ncores, group, col_ring, row_ring, elems, elem_bytes, dtype)
    got = _ESTIMATES.get(key)
    if got is not None and got[0] is chip:
        return got[1]
    estimate = _reduce_estimate(chip, ncores, group, col_ring, row_ring, elems, elem_bytes,
                                dtype)
    if len(_ESTIMATES) >= _ESTIMATES_LIMIT:
        _ESTIMATES.clear()
    _ESTIMATES[key] = (chip, estimate)
    return estimate


def _reduce_estimate(chip: Chip, ncores: int, group: int, col_ring: int, row_ring: int,
                     elems: int, elem_bytes: int, dtype: str) -> tuple[int, int]:
    tile, width = _group_tile(chip, ncores, group, col_ring, row_ring)
    if tile is None:
        # no rectangle tiles the region: one level over groups that straddle rows' ends,
        # their transfers crossing the region's width (codegen's fallback)
        unit = scatter_unit(elems, group)
        sizes = np.clip(elems - unit * np.arange(group), 0, unit)
        hops = width * col_ring - 1 + ceil_div(group, width)
        return (chip.hop_latency_cycles * hops
                + ceil_div(_line_busiest(sizes) * elem_bytes * col_ring,
                           chip.link_bytes_per_cycle)
                + chip.vector_cycles((group - 1) * unit, dtype)), unit
    rows, cols = tile
    digits = choose_levels(rows, cols, row_ring, col_ring, elems)
    first = scatter_unit(elems, group) * (group // digits[0].size)
    cycles = sum(chip.hop_latency_cycles * hops + ceil_div(most, chip.link_bytes_per_cycle)
                 + chip.vector_cycles(adds, dtype)
                 for hops, most, adds in routed_levels(rows, cols, row_ring, col_ring, elems,
                                                       elem_bytes))
    return cycles, first


def _row_keys(rows: np.ndarray) -> np.ndarray:
    """One int64 per row, ordered as the rows are lexicographically (equal rows, equal keys):
    `ir.row_keys`, or the rows' ranks where they are too wide for it. ``np.unique(axis=0)``
    finds the same order but sorts structured rows, seconds per plan on a wafer's 750,000
    cores."""
    key = row_keys(rows)
    if key is None:  # too wide for one int64: rank the rows
        return np.unique(rows, axis=0, return_inverse=True)[1].ravel().astype(np.int64)
    return key


def _members(geo: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """(members (blocks, G) logical cores by core id, position of each core among them):
    the blocks in their origins' order, each block's members by core id."""
    group = geo.reduce_group
    perm = _plain_perm(geo)
    if perm is not None:
        # a block's origin on dimension d is its digit on that dimension's axis times the
        # block: the blocks in their origins' order are the output axes' digits in the
        # dimensions' order, and a block's members by core id its reduction axes' digits in
        # theirs, so the core grid's axes moved (no sort of a wafer's cores)
        members = np.arange(geo.ncores, dtype=np.int64).reshape(geo.F).transpose(
            perm).reshape(-1, group)
    else:
        members = _sorted_members(geo)
    pos = np.empty(geo.ncores, dtype=np.int64)
    pos[members] = np.arange(group)[None, :]
    return members, pos


def _plain_perm(geo: Geometry) -> list[int] | None:
    """Where the output's dimensions are plain axes and it does not rotate: the grid's axes
    with the output's dimensions first, in their order, and the reduction axes after, in
    theirs (a core's block is its digits on the first, its member its digits on the rest);
    None otherwise."""
    out = len(geo.op.inputs)
    axes = geo.dim_axes(out)
    dims = [j for j in axes if isinstance(j, int)]
    red = [j for j, a in enumerate(geo.axes) if a not in geo.op.output.axes]
    if (geo.rotation_axis(out) is None and len(dims) == len(axes)
            and sorted([*dims, *red]) == list(range(len(geo.axes)))):
        return [*dims, *red]
    return None


def _sorted_members(geo: Geometry) -> np.ndarray:
    """`_members`' groups found by sorting the cores by their output tiles' origins (the
    definition; a rotating output's tiles move)."""
    origin = geo.tile_origin(len(geo.op.inputs), geo.steps - 1)
    order = np.argsort(_row_keys(origin), kind="stable")  # by block, then by core id
    return order.reshape(-1, geo.reduce_group)


def _rectangle(geo: Geometry, members: np.ndarray
               ) -> tuple[np.ndarray, int, int, int, int] | None:
    """Each group's members in physical row-major order, (blocks, rows, cols), with the
    rectangle's shape and strides, when every group is the same evenly spaced rectangle."""
    if geo.embed is None:
        return None
    phys = geo.phys[members]
    # row-major on the chip (by row, then column) is by physical core number
    ordered = members
    if phys.shape[1] > 1 and not (phys[:, 1:] > phys[:, :-1]).all():
        order = np.argsort(phys, axis=1)  # (a group's cores are distinct: no ties)
        phys = np.take_along_axis(phys, order, axis=1)
        ordered = np.take_along_axis(members, order, axis=1)
    rect = _evenly_spaced(*np.divmod(phys, geo.embed.cols))
    if rect is None:
        return None
    return (ordered.reshape(-1, rect[0], rect[1]), *rect)


def _evenly_spaced(r: np.ndarray, c: np.ndarray) -> tuple[int, int, int, int] | None:
    """(height, width, row stride, column stride) when the cores at rows ``r`` and columns
    ``c`` ((groups, G), each group's in row-major order) are in every group the same evenly
    spaced rectangle; None otherwise."""
    g = r.shape[1]
    height = int(np.count_nonzero(np.diff(r[0]))) + 1
    if g % height:
        return None
    width = g // height
    rr = r.reshape(-1, height, width)
    cc = c.reshape(-1, height, width)
    if (rr != rr[:, :, :1]).any() or (cc != cc[:, :1, :]).any():
        return None
    dc = np.diff(cc[:, 0, :], axis=1)
    dr = np.diff(rr[:, :, 0], axis=1)
    if (dc.size and (dc != dc.flat[0]).any()) or (dr.size and (dr != dr.flat[0]).any()):
        return None
    col_stride = int(dc.flat[0]) if dc.size else 1
    row_stride = int(dr.flat[0]) if dr.size else 1
    return height, width, row_stride, col_stride


def chunk_elements(origin: np.ndarray, tile: tuple[int, ...], shape: tuple[int, ...],
                   pos: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat index, valid), (ncores, chunk): the elements of a tensor of ``shape`` that core
    c keeps of its ``tile`` at ``origin[c]`` after a reduce-scatter, elements ``[pos[c] x
    chunk, (pos[c] + 1) x chunk)`` of the tile in row-major order. Padding past the tile's
    end or the tensor's is not valid (its index is clamped). The same as the whole tile's
    table at those columns, without building it: a wafer's cores times a tile is 100
    million entries where the chunks are a few."""
    elems = math.prod(tile)
    pos = np.asarray(pos, dtype=np.int64)
    # each member position's elements of the tile, by their coordinates in it: a table per
    # position (a group's few), read per core below, not divided out on every core
    local = (np.arange(int(pos.max(initial=0)) + 1, dtype=np.int64)[:, None] * chunk
             + np.arange(chunk, dtype=np.int64)[None, :])
    inside = local < elems
    local = np.minimum(local, elems - 1)
    within = []
    for d in reversed(range(len(tile))):
        local, at = np.divmod(local, tile[d])
        within.append(at)
    within.reverse()
    valid = inside[pos]
    flat = np.zeros((len(pos), chunk), dtype=np.int64)
    stride = 1
    for d in reversed(range(len(tile))):
        coord = within[d][pos]  # (a fresh array: worked on in place)
        coord += origin[:, d].astype(np.int64, copy=False)[:, None]
        valid &= coord >= 0
        valid &= coord < shape[d]
        np.clip(coord, 0, shape[d] - 1, out=coord)
        if stride != 1:
            coord *= stride
        flat += coord
        stride *= shape[d]
    return flat, valid


#: `scatter_positions` by what it depends on: the pricing asks for it twice per producer
#: layout (its boxes, and who owns each element), for every repeated layer
_WHERE: dict[tuple, tuple[np.ndarray, int]] = {}
_WHERE_LIMIT = 256


def scatter_of(geo: Geometry) -> Scatter:
    """The reduce-scatter of ``geo``'s plan (`Geometry.reduce_group` > 1): levels along the
    mesh when the groups are rectangles on it, else one level (every member's chunk from every
    other member)."""
    return _scatter_of(geo, True)


def scatter_positions(geo: Geometry) -> tuple[np.ndarray, int]:
    """Where `scatter_of` leaves the result: each logical core's final position in its group
    (`Scatter.pos`) and the elements a position keeps (`Scatter.chunk`), without its levels'
    tables; kept, read-only, for the next geometry alike. Made over the plan's core grid
    where its groups and their placement allow (`_grid_positions`), from the members'
    physical cores otherwise."""
    shapes = tuple(geo.shapes.get(o.tensor) for o in (*geo.op.operands, *geo.op.extra))
    key = (geo.op.signature(), geo.F, geo.T, geo.rot, geo.drivers, geo.chain, geo.embed,
           geo.cores, shapes)
    got = _WHERE.get(key)
    if got is None:
        pos = _grid_positions(geo)
        if pos is None:
            pos = _scatter_of(geo, False).pos
        pos.flags.writeable = False
        got = (pos, scatter_unit(math.prod(geo.tile_shape(len(geo.op.inputs))),
                                 geo.reduce_group))
        if len(_WHERE) >= _WHERE_LIMIT:
            _WHERE.clear()
        _WHERE[key] = got
    return got


def _grid_positions(geo: Geometry) -> np.ndarray | None:
    """`_scatter_of`'s final positions made over the plan's core grid, where a core's group
    is its digits on the output's axes and its member its digits on the reduction axes
    (`_plain_perm`), and the embedding places it at a part of the first plus a part of the
    second (`place.grid_parts`). Every group's members then lie as the first group's do,
    shifted: where the first group is an evenly spaced rectangle that no group's row wraps,
    its order and rectangle (`_rectangle`) are every group's, and a core's position is a
    function of its member digits alone, written over the grid by broadcasting. None
    elsewhere (the members' physical cores are gathered and sorted then)."""
    group = geo.reduce_group
    perm = _plain_perm(geo)
    if group <= 1 or geo.embed is None or geo.cores is not None or perm is None:
        return None
    reduction = set(geo.op.reduction_axes)
    parts = grid_parts(geo.F, geo.axes, reduction, geo.embed)
    red = perm[len(perm) - len(reduction):]
    if parts is None or parts[0] != frozenset(red):
        return None
    _, first, second = parts
    cols = geo.embed.cols
    # member m's core, less its group's first part: the same in every group
    offset = second.transpose(perm).reshape(group)
    order = np.argsort(offset, kind="stable")  # by physical core (a group's are distinct)
    base = first.reshape(-1)  # each group's first part (in some order of the groups)
    rect = _evenly_spaced(*np.divmod((base[0] + offset[order])[None], cols))
    # (a group whose rectangle would wrap past a row's end lies otherwise: the placements
    # `grid_parts` separates keep each group within its rows, checked on the groups' first
    # cores alone; where the first group is no rectangle, or some group wraps, the members'
    # cores are gathered as `_scatter_of` does)
    if rect is None or ((base + offset[order[0]]) % cols
                        + (rect[1] - 1) * rect[3] >= cols).any():
        return None
    height, width, row_stride, col_stride = rect
    elems = math.prod(geo.tile_shape(len(geo.op.inputs)))
    digits = choose_levels(height, width, row_stride, col_stride, elems)
    _, _, one, rests = _digit_values(digits, height, width)
    at = np.empty(group, dtype=np.int64)  # each member's final position
    at[order] = sum((v * r for v, r in zip(one, rests)), np.zeros(group, dtype=np.int64))
    final = np.empty(geo.F, dtype=np.int64)
    final.transpose(perm)[...] = at.reshape([1] * (len(perm) - len(red))
                                            + [geo.F[j] for j in red])
    return final.reshape(-1)


def _scatter_of(geo: Geometry, tables: bool) -> Scatter:
    members, pos = _members(geo)
    group = members.shape[1]
    elems = math.prod(geo.tile_shape(len(geo.op.inputs)))
    unit = scatter_unit(elems, group)
    rect = _rectangle(geo, members)
    if rect is None and geo.embed is not None and group > 1:
        # not a rectangle (a plan aligned to its producer's layout): levels over the members
        # in physical order as if on one line, so that no core gathers from all G members
        # (the numbers are the same whatever the layout; the emulator routes the real paths)
        order = np.argsort(geo.phys[members], axis=1, kind="stable")
        rect = (np.take_along_axis(members, order, axis=1)[:, None, :], 1, group, 1, 1)
    if rect is None or group <= 1:
        if not tables:
            return Scatter(members, pos, unit, ())
        table = np.empty((geo.ncores, group), dtype=np.int64)
        table[members.ravel()] = np.repeat(members, group, axis=0)
        sizes = np.clip(elems - pos * unit, 0, unit)
        return Scatter(members, pos, unit, (Level(group, unit, table, pos * unit, sizes),))
    ordered, height, width, row_stride, col_stride = rect
    digits = choose_levels(height, width, row_stride, col_stride, elems)
    # each member's position along the rectangle's rows and columns, then its digits
    blocks = ordered.shape[0]
    core = ordered.ravel()
    _, _, one, rests = _digit_values(digits, height, width)
    values = [np.tile(v, blocks) for v in one]
    p = sum(v * r for v, r in zip(values, rests))
    final = np.empty(geo.ncores, dtype=np.int64)
    final[core] = p
    if not tables:
        return Scatter(members, final, unit, ())
    by_p = np.empty((blocks, group), dtype=np.int64)
    block = np.repeat(np.arange(blocks), group)
    by_p[block, p] = core
    levels = []
    start = np.zeros(geo.ncores, dtype=np.int64)  # where the core's chunk starts in the block
    for d, v, rest in zip(digits, values, rests):
        chunk = unit * rest
        base = p - v * rest
        table = np.empty((geo.ncores, d.size), dtype=np.int64)
        table[core] = by_p[block[:, None], base[:, None] + np.arange(d.size)[None, :] * rest]
        offset = np.empty(geo.ncores, dtype=np.int64)
        offset[core] = v * chunk
        start = start + offset
        sizes = np.clip(elems - start, 0, chunk)
        levels.append(Level(d.size, chunk, table, offset, sizes))
    return Scatter(members, final, unit, tuple(levels))


__all__ = ["Digit", "Level", "Scatter", "choose_levels", "chunk_elements", "group_shape",
           "levels_cost", "reduce_estimate", "routed_levels", "scatter_of", "scatter_positions",
           "scatter_unit"]
