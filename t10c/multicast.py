"""Multicast on a 2D mesh or torus: route trees, their link loads and the routing colours
they take (shared by the emulator, which times codegen's exchanges, and by the planner, which
prices the re-layouts of a choice of plans).

A tree carries ``b`` bytes from one source core to a set of destination cores, routed
dimension-order one of two ways, whichever takes fewer links (X first on a tie): X first,
as unicasts go (`emulator/routing.py`), along the source's row to every destination column,
then along each such column to the destination rows; or Y first, along the source's column
to every destination row, then along each such row. On a torus each leg goes the shorter way
round (a tie the way that does not wrap). The tree is the union of those routes to its
destinations, and each of its links carries the bytes once: a router copies a wavelet onto
every outgoing link of the tree. A tree of one destination is that destination's unicast
route. A colour's route on the WSE is whatever its routers are configured to forward, so
either order is one tree; Y first is what a chunk of a vector broadcast into one row of a
GEMV's tiles wants (up one column, then along the row, not along the source's row and up
every column), the layout WaferLLM's MeshGEMV keeps.

Routing resources: on the WSE a route is a colour configured on every router it passes, and
a router holds 24 of them (Cerebras SDK documentation, sdk.cerebras.net: "24 routable
colors"; `Chip.routes_per_core`). Trees that share a link need a colour each there, so a
phase whose busiest link carries ``n`` trees runs in ``ceil(n / routes_per_core)`` waves,
each setting up its routes anew: the phase pays the longest route's hop latency once per
wave, and the busiest link's bytes once (every byte is carried once, whatever the wave):

    cycles = hop_latency x hops x waves + ceil(busiest link's bytes / link bandwidth)

``routes_per_core = 0`` means no limit (one wave).

An exchange's trees are grouped one of two ways, whichever is faster (`exchange_trees`):
one tree per (group of destinations that read alike, source core), each carrying what that
group reads, or one tree per source core to every core that reads any of its elements,
carrying all of them once (each destination keeps the elements it reads and drops the
others, as a core takes the wavelets of a colour it needs). The second sends more bytes
but takes far fewer colours where a source feeds many groups a little each, as when a
vector is broadcast into a GEMV's tiles: there the waves, not the bytes, set the time.
Where the waves would cost more than sending every copy on its own, an exchange falls back
to unicast. Codegen, the emulator and the planner follow these rules alike, one function
(`multicast_routes`); unicasts take no colours in this model.

An exchange can also be relayed (`relayed`), where that is faster than its trees and its
unicasts. The cores that read one distinct pattern are a group. Each group's elements are
first gathered, as unicasts, onto one of its cores: the one nearest the mean of its
sources. That core then sends them on as one tree to the rest of the group. A vector left
one element per core by a wide reduce-scatter and read in chunks by a GEMV's cores then
takes one tree per chunk instead of one per element: fewer colours, fewer waves.
(LLaMA-3-8B decode on wse2, o_proj's input: 2,762 cycles as unicasts, 3,556 as trees in 6
waves, 678 relayed.) In a phase, the gathers run with the phase's other transfers; the
trees that spread the groups' elements run after them.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from t10c.chips import Chip
from t10c.digest import hasher
from t10c.dtypes import ceil_div, fmt_bytes

#: bytes of working memory one (core, source core) pair of an exchange takes while its counts
#: and routes are worked out (measured: 75 M pairs of one wse2 exchange peaked at 24 GB)
PAIR_BYTES = 320


def physical_memory() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_pairs(pairs: int, rows: int, hint: str = "a plan whose cores read from fewer "
                "cores (the mesh-aware strategy, t10) or a smaller chip would fit") -> None:
    """Refuse an exchange whose (core, source core) pairs cannot be counted and routed in
    half this machine's memory (the compile's other state is held beside them), naming how
    much they need and ``hint``, what would fit, rather than be killed by the system partway
    (codegen's exchanges, and the planner's routed pricing of them, `partition/meshmove.py`)."""
    need, have = pairs * PAIR_BYTES, physical_memory()
    if have and 2 * need > have:
        raise MemoryError(
            f"an exchange of {pairs:,} (core, source core) pairs (each of {rows:,} cores "
            f"reads from {pairs / max(rows, 1):.0f} cores on average) needs about "
            f"{fmt_bytes(need)} to count and route, more than half of this machine's "
            f"{fmt_bytes(have)}; {hint}")


def leg(start: np.ndarray, end: np.ndarray, size: int, torus: bool
        ) -> tuple[np.ndarray, np.ndarray]:
    """(signed length, length) of the legs from ``start`` to ``end`` on a line or ring of
    ``size``."""
    delta = end - start
    if torus:
        fwd = delta % size
        # the shorter way round; a tie goes the way that does not wrap, as on a mesh
        delta = np.where(fwd < size - fwd, fwd, np.where(fwd > size - fwd, fwd - size, delta))
    return delta, np.abs(delta)


@dataclass(frozen=True)
class Trees:
    """One phase's route trees routed: per directed link the bytes and the trees it carries
    ((4, rows, cols) each, as `emulator.routing.Routed.loads`), and the longest route."""

    loads: np.ndarray
    counts: np.ndarray
    hops: int


def route_trees(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
                nbytes: np.ndarray) -> Trees | None:
    """Route the trees of one phase. One entry per (tree, destination): ``tree`` numbers the
    tree (any integers; entries of a tree share its source and bytes), ``src`` its source
    core, ``dst`` the destination core, ``nbytes`` the tree's bytes. A destination that is
    its tree's source receives nothing over the mesh. None when nothing moves.

    Each tree goes X first (along the source's row, then along each destination column) or
    Y first (along the source's column, then along each destination row), whichever takes
    fewer links (X first on a tie): a vector chunk broadcast into one row of a GEMV's tiles
    climbs one column and runs along that row, instead of running along the source's row and
    climbing every column (module doc). The links are loaded by a compiled kernel
    (`t10c.meshkernels.phase_loads`), `ROUTE_CHUNK` entries of whole trees at a time.
    Unicasts: `route_unicasts`."""
    from t10c import meshkernels  # (numba, only where a mesh is routed)

    loads = np.zeros((4, *chip.grid), dtype=np.int64)
    trees = np.zeros((4, *chip.grid), dtype=np.int64)
    hops = meshkernels.phase_loads(chip.grid, chip.topology == "torus2d", (),
                                   tree_parts(tree, src, dst, nbytes), loads, trees)
    return None if hops < 0 else Trees(loads, trees, hops)


def tree_parts(tree: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
               ) -> Iterator[tuple[np.ndarray, ...]]:
    """`route_trees`' arguments as the kernels take them: broadcast, a tree's entries
    together, `ROUTE_CHUNK` entries of whole trees at a time as contiguous int64."""
    tree, src, dst, nbytes = (np.ravel(a) for a in np.broadcast_arrays(tree, src, dst, nbytes))
    if len(tree) > 1 and not bool((tree[1:] >= tree[:-1]).all()):
        order = np.argsort(tree, kind="stable")  # a tree's entries together
        tree, src, dst, nbytes = tree[order], src[order], dst[order], nbytes[order]
    for part in _whole_trees(tree):
        yield _int64(part, tree, src, dst, nbytes)


def unicast_parts(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
                  ) -> Iterator[tuple[np.ndarray, ...]]:
    """`route_unicasts`' arguments as the kernels take them: broadcast, `ROUTE_CHUNK`
    transfers at a time as contiguous int64."""
    src, dst, nbytes = (np.ravel(a) for a in np.broadcast_arrays(src, dst, nbytes))
    for start in range(0, len(src), ROUTE_CHUNK):
        yield _int64(slice(start, start + ROUTE_CHUNK), src, dst, nbytes)


#: entries routed at a time (`route_trees`, `route_unicasts`): a wafer's exchange runs to
#: tens of millions of them (LLaMA-3-8B decode on wse2: 29 M), and int64 copies of all at
#: once would take gigabytes
ROUTE_CHUNK = 1 << 19


def _whole_trees(tree: np.ndarray) -> Iterator[slice]:
    """Slices of about `ROUTE_CHUNK` entries of the sorted ``tree`` numbers, each ending
    where a tree does (a tree longer than a chunk is one slice)."""
    start, n = 0, len(tree)
    while start < n:
        end = start + ROUTE_CHUNK
        if end >= n:
            end = n
        else:  # back to the first entry of the tree at ``end``, or on to the end of the first
            end = int(np.searchsorted(tree, tree[end], side="left"))
            if end <= start:
                end = int(np.searchsorted(tree, tree[start], side="right"))
        yield slice(start, end)
        start = end


def _int64(part: slice, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The slice ``part`` of each array, as contiguous int64 (what the kernels take)."""
    return tuple(np.ascontiguousarray(a[part], dtype=np.int64) for a in arrays)


def route_unicasts(chip: Chip, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
                   ) -> Trees | None:
    """`route_trees` where every (``src``, ``dst``, ``nbytes``) transfer is a tree of its
    own, routed X first; the trees per link are not counted (``Trees.counts`` is all zeros:
    unicasts take no colours). By the compiled kernel (`t10c.meshkernels.phase_loads`),
    `ROUTE_CHUNK` transfers at a time."""
    from t10c import meshkernels  # (numba, only where a mesh is routed)

    loads = np.zeros((4, *chip.grid), dtype=np.int64)
    hops = meshkernels.phase_loads(chip.grid, chip.topology == "torus2d",
                                   unicast_parts(src, dst, nbytes), (), loads)
    return None if hops < 0 else Trees(loads, np.zeros((4, *chip.grid), dtype=np.int64), hops)


def distinct(x: np.ndarray, first: bool = False, inverse: bool = False) -> Any:
    """`np.unique` of a 1-d array (its values; with ``first`` and ``inverse`` also
    each value's first index and each element's value number, in that order), without the
    sort where ``x`` is sorted already: an exchange's entries come tree by tree, millions of
    them on a wafer, and sorting them again was a tenth of bert-large's compile there."""
    x = np.asarray(x).ravel()
    if len(x) > 1 and not bool((x[1:] >= x[:-1]).all()):
        if first or inverse:
            return np.unique(x, return_index=first, return_inverse=inverse)  # type: ignore[call-overload]
        # values only: sorted (a stable sort runs fast over an exchange's ordered runs),
        # not hashed, as np.unique would (3x slower on a wafer's 29 M entries)
        x = np.sort(x, kind="stable")
    new = np.empty(len(x), dtype=bool)
    new[:1] = True
    np.not_equal(x[1:], x[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    out = [x[starts]]
    if first:
        out.append(starts)
    if inverse:
        out.append(np.cumsum(new, dtype=np.intp) - 1)
    return out[0] if len(out) == 1 else tuple(out)


def count_distinct(x: np.ndarray) -> int:
    """How many distinct values the 1-d array ``x`` holds (`distinct`; a count over core
    numbers where they are not sorted)."""
    x = np.asarray(x).ravel()
    if len(x) and x.dtype.kind in "iu" and x.min() >= 0 and x.max() < max(4 * len(x), 1 << 20):
        return int(np.count_nonzero(np.bincount(x)))
    return len(distinct(x))


def waves(chip: Chip, most_trees: int) -> int:
    """Waves a phase runs in when its busiest link carries ``most_trees`` trees (see the
    module doc)."""
    if not chip.routes_per_core or most_trees <= chip.routes_per_core:
        return 1
    return ceil_div(most_trees, chip.routes_per_core)


def phase_cycles(chip: Chip, busiest: int, hops: int, most_trees: int = 0) -> int:
    """Cycles of a mesh exchange phase: its longest route's latency once per wave, plus the
    busiest link's bytes over the link bandwidth (0 when nothing moves)."""
    if busiest <= 0:
        return 0
    return (chip.hop_latency_cycles * hops * waves(chip, most_trees)
            + ceil_div(busiest, chip.link_bytes_per_cycle))


def tree_cycles(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
                nbytes: np.ndarray) -> int:
    """Cycles of a phase that moves only the trees given (`route_trees`' arguments); the
    kernels keep the busiest link alone (`t10c.meshkernels.phase_busiest`), not every
    link's load."""
    from t10c import meshkernels  # (numba, only where a mesh is routed)

    hops, busiest, most = meshkernels.phase_busiest(chip.grid, chip.topology == "torus2d", (),
                                                    tree_parts(tree, src, dst, nbytes))
    return 0 if hops < 0 else phase_cycles(chip, busiest, hops, most)


def unicast_cycles(chip: Chip, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> int:
    """Cycles of a phase that sends every (source, destination) transfer on its own: each
    entry a tree of one destination, which takes no colour."""
    from t10c import meshkernels  # (numba, only where a mesh is routed)

    hops, busiest, _ = meshkernels.phase_busiest(chip.grid, chip.topology == "torus2d",
                                                 unicast_parts(src, dst, nbytes), ())
    return 0 if hops < 0 else phase_cycles(chip, busiest, hops)


def by_source(tree: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The trees of an exchange (`route_trees`' arguments) merged into one per source core:
    to every destination of any of that source's trees, carrying the bytes of all of them
    (an upper bound where two trees of a source carry the same element). Numbered by the
    source core."""
    tree, src, dst, nbytes = (np.asarray(a, dtype=np.int64).ravel()
                              for a in np.broadcast_arrays(tree, src, dst, nbytes))
    _, first = distinct(tree, first=True)
    total = np.bincount(src[first], weights=nbytes[first]).astype(np.int64)
    base = int(dst.max(initial=0)) + 1
    pair = distinct(src * base + dst)
    s, d = pair // base, pair % base
    return s, s, d, total[s]


def exchange_trees(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
                   nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The trees an exchange sends when it goes as multicast: its trees as given (one per
    group of destinations and source, `route_trees`' arguments) or merged per source core
    (`by_source`), whichever phase is faster on its own (the given ones on a tie)."""
    return _exchange_trees(chip, tree, src, dst, nbytes)[1]


def _exchange_trees(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
                    nbytes: np.ndarray
                    ) -> tuple[bool, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                               int | None]:
    """`exchange_trees`, whether its trees are merged per source, and their `tree_cycles`
    where they were worked out to choose (None where there was no choice)."""
    given = _given(tree, src, dst, nbytes)
    if count_distinct(given[0]) == count_distinct(given[1]):  # one tree per source already
        return False, given, None
    merged = by_source(tree, src, dst, nbytes)
    fused, apart = tree_cycles(chip, *merged), tree_cycles(chip, *given)
    if fused < apart:
        return True, merged, fused
    return False, given, apart


def _given(tree: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An exchange's trees as given (`route_trees`' arguments), as arrays."""
    return np.asarray(tree).ravel(), np.asarray(src).ravel(), np.asarray(dst), \
        np.asarray(nbytes)


#: `multicast_routes`' last answers, by the chip (held, so that its id is not reused) and a
#: digest of the exchange (`exchange_digest`): the planner prices an exchange, codegen decides
#: how it goes and the emulator times it, each asking for the same routes (on wse2, 41 of a
#: one-layer LLaMA-3-8B decode cut's 109 calls repeat an earlier one; with codegen's entries
#: in another order than the planner's, 60 of the whole step's 123). A few only: the arrays
#: run to wafer sizes.
_ROUTES: OrderedDict[tuple[int, bytes], tuple[Chip, Any]] = OrderedDict()
ROUTES_KEPT = 16

_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element by element (uint64, wrapping)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def exchange_digest(tree: np.ndarray, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                    group: np.ndarray | None) -> bytes:
    """A digest of an exchange (`multicast_routes`' arguments) that does not depend on the
    order of its entries or on how its trees and groups are numbered, only on what it is.

    With groups (each tree one (group, source core); a group's trees go to the group's
    destinations, and no two groups share one: codegen's patterns, the planner's distinct
    tiles), an entry is (source, destination, bytes, its group's lowest destination), and
    the digest is the number of entries, trees and groups and two sums of a 64-bit mix of
    the entries (a multiset hash): the planner's entries (tree by tree) and codegen's (core
    by core) hash alike, and both are one pass, where hashing the bytes of a wafer's arrays
    took seconds. Without groups, or on a chip of 2^21 cores or more, a digest of the arrays
    as they are."""
    src, dst, nbytes = (np.asarray(a).ravel() for a in np.broadcast_arrays(src, dst, nbytes))
    cores = int(max(src.max(initial=0), dst.max(initial=0))) + 1
    if group is None or cores >= 1 << 21 or not len(src):
        digest = hasher()
        for a in (tree, src, dst, nbytes, group):
            a = np.ascontiguousarray(np.asarray(a) if a is not None else np.zeros(0))
            digest.update(f"{a.dtype.str}{a.shape}|".encode())
            digest.update(a.data)
        return b"raw" + digest.digest()
    group = np.broadcast_to(group, src.shape).ravel()
    if group.min() < 0 or group.max() >= max(4 * len(group), 1 << 20):
        group = np.unique(group, return_inverse=True)[1].ravel()
    lowest = np.full(int(group.max()) + 1, cores, dtype=np.int64)
    np.minimum.at(lowest, group, dst)
    sums = np.zeros(2, dtype=np.uint64)
    for start in range(0, len(src), ROUTE_CHUNK):  # (in chunks, as `route_trees` goes)
        part = slice(start, start + ROUTE_CHUNK)
        key = (src[part].astype(np.uint64) | (dst[part].astype(np.uint64) << np.uint64(21))
               | (lowest[group[part]].astype(np.uint64) << np.uint64(42)))
        h = _mix(key ^ _mix(nbytes[part].astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)))
        sums += (h.sum(dtype=np.uint64),
                 _mix(h ^ np.uint64(0xD6E8FEB86659FD93)).sum(dtype=np.uint64))
    counts = (len(src), count_distinct(np.asarray(tree).ravel()), count_distinct(group))
    return repr(("multiset", counts, [int(x) for x in sums])).encode()


def multicast_routes(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
                     nbytes: np.ndarray, group: np.ndarray | None = None
                     ) -> Relay | tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """How an exchange of these trees (`route_trees`' arguments) goes, whichever is fastest,
    each on its own phases, waves included: relayed (`relayed`, given each entry's
    ``group``), as its trees (`exchange_trees`, returned), or as unicasts (None). The one
    rule codegen, the emulator and the planner follow. The arrays returned are read-only:
    they are kept for the next caller that asks the same exchange (`_ROUTES`,
    `exchange_digest`), whose own arrays may list its entries in another order: the routes
    returned are the same transfers, their loads the same."""
    digest = exchange_digest(tree, src, dst, nbytes, group)
    key = (id(chip), digest)
    hit = _ROUTES.get(key)
    if hit is not None:
        _ROUTES.move_to_end(key)
        return hit[1]
    routing = routing_key(chip)
    way = _WAYS.get((routing, digest))
    if way is None:
        way, routes = _routes(chip, tree, src, dst, nbytes, group)
        remember_ways([((routing, digest), way)])
    else:  # decided before, for arrays since dropped: only the way's arrays are made again
        routes = _the_way(way, chip, tree, src, dst, nbytes, group)
    for a in (routes.gather + routes.spread if isinstance(routes, Relay) else routes or ()):
        a.flags.writeable = False
    _ROUTES[key] = (chip, routes)
    if len(_ROUTES) > ROUTES_KEPT:
        _ROUTES.popitem(last=False)
    return routes


#: how each exchange went (`multicast_routes`), by the chip's routing and the exchange's digest:
#: unlike the routes, a word each, so the planner's every decision is still there when codegen
#: and the emulator ask (on wse2, an exchange of 29 M entries takes 10 s to decide)
_WAYS: dict[tuple[bytes, bytes], str] = {}
_WAYS_LIMIT = 1 << 16
#: how many times `_WAYS` was emptied at its limit (`ways_mark`)
_WAYS_CLEARED = [0]


def remember_ways(ways: list[tuple[tuple[bytes, bytes], str]]) -> None:
    """Keep these decisions (`_WAYS`' entries), as `multicast_routes` keeps its own."""
    for key, way in ways:
        if len(_WAYS) >= _WAYS_LIMIT:
            _WAYS.clear()
            _WAYS_CLEARED[0] += 1
        _WAYS[key] = way


def ways_mark() -> tuple[int, int]:
    """Where the decisions kept so far end, for `ways_since`."""
    return _WAYS_CLEARED[0], len(_WAYS)


def ways_since(mark: tuple[int, int]) -> list[tuple[tuple[bytes, bytes], str]]:
    """The decisions kept after ``mark`` (every one kept, if `_WAYS` was emptied since): what
    a forked process decided, for the one it works for to `remember_ways`."""
    cleared, size = mark
    items = list(_WAYS.items())
    return items if cleared != _WAYS_CLEARED[0] else items[size:]


def routing_key(chip: Chip) -> bytes:
    """The fields of ``chip`` that how its exchanges are routed and timed depends on: equal
    for chips that route alike (a sweep's points that differ elsewhere)."""
    return repr((chip.grid, chip.topology, chip.cores, chip.hop_latency_cycles,
                 chip.link_bytes_per_cycle, chip.routes_per_core)).encode()


def _routes(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
            nbytes: np.ndarray, group: np.ndarray | None
            ) -> tuple[str, Relay | tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None]:
    """`multicast_routes`' answer worked out, with the way it goes ("relay", "trees",
    "by source": the trees merged per source, `exchange_trees`, or "unicast")."""
    merged, chosen, trees = _exchange_trees(chip, tree, src, dst, nbytes)
    if trees is None:
        trees = tree_cycles(chip, *chosen)
    unicast = unicast_cycles(chip, src, dst, nbytes)
    if group is not None:
        relay = relayed(chip, tree, src, dst, nbytes, group, min(unicast, trees))
        if relay is not None:
            return "relay", relay
    if 0 < trees < unicast:
        return ("by source" if merged else "trees"), chosen
    return "unicast", None


def _the_way(way: str, chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
             nbytes: np.ndarray, group: np.ndarray | None
             ) -> Relay | tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The routes of an exchange that goes ``way`` (`_routes`), made from its arrays."""
    if way == "relay" and group is not None:
        return relay_stages(chip, tree, src, dst, nbytes, group)
    if way == "by source":
        return by_source(tree, src, dst, nbytes)
    if way == "trees":
        return _given(tree, src, dst, nbytes)
    return None


def prefer_multicast(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
                     nbytes: np.ndarray, group: np.ndarray | None = None) -> bool:
    """Whether an exchange of these trees goes as multicast trees or relayed, not as
    unicasts (`multicast_routes`)."""
    return multicast_routes(chip, tree, src, dst, nbytes, group) is not None


@dataclass(frozen=True)
class Relay:
    """An exchange sent in two stages (`relayed`): ``gather`` (src, dst, bytes), unicasts
    that bring each group's elements to one of its destination cores, then ``spread``
    (`route_trees`' arguments), one tree per group from that core to the group's other
    destinations."""

    gather: tuple[np.ndarray, np.ndarray, np.ndarray]
    spread: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def relay_stages(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
                 nbytes: np.ndarray, group: np.ndarray) -> Relay:
    """The two stages of an exchange whose trees (`route_trees`' arguments) are grouped by
    ``group`` (per entry: the trees of a group go to the same destinations, the cores that
    read one distinct pattern): each group's relay is its destination nearest the mean of
    its trees' sources (the lowest core on a tie), which receives every tree's bytes of the
    group as unicasts and sends them on as one tree."""
    tree, src, dst, nbytes, group = (np.asarray(a, dtype=np.int64).ravel()
                                     for a in np.broadcast_arrays(tree, src, dst, nbytes, group))
    _, first = distinct(tree, first=True)  # one entry per tree: its group and source
    t_group, t_src, t_bytes = group[first], src[first], nbytes[first]
    g_ids, t_g = np.unique(t_group, return_inverse=True)
    t_g = t_g.reshape(-1)
    p_g, p_dst = _group_destinations(tree, dst, group, g_ids, t_g, first, chip.cores)
    return _relay(chip, t_g, t_src, t_bytes, p_g, p_dst, len(g_ids))


#: (tree, destination) entries above which an exchange is never spelt out entry by entry:
#: it goes relayed, built from its trees and its groups' destinations alone
#: (`grouped_relay`), whichever way would be faster. A broadcast of a few distinct tiles, each
#: from hundreds of source cores, to hundreds of thousands of cores is billions of bytes
#: spelt out (LLaMA-3-8B's LM head in a 64-token prefill on wse2: 175 M entries, 53 GiB to
#: route), and a few hundred thousand relayed. The largest exchange of a decode step on
#: wse2 has 29 M, decided as before
EXPANDED_ENTRIES = 1 << 25


def grouped_relay(chip: Chip, t_group: np.ndarray, t_src: np.ndarray, t_bytes: np.ndarray,
                  p_group: np.ndarray, p_dst: np.ndarray) -> Relay:
    """`relay_stages` of an exchange given as its trees, per tree its group, source core and
    bytes, and its groups' destinations, per (group, destination core) pair (each group's
    trees go to all of its destinations, and no two groups share one: codegen's patterns,
    the planner's distinct tiles): the same stages, the trees never multiplied out by their
    destinations. Destinations of a group without trees are left out."""
    t_group, t_src, t_bytes, p_group, p_dst = (np.asarray(a, dtype=np.int64).ravel()
                                               for a in (t_group, t_src, t_bytes, p_group,
                                                         p_dst))
    g_ids, t_g = np.unique(t_group, return_inverse=True)
    at = np.searchsorted(g_ids, p_group)
    has = (at < len(g_ids)) & (g_ids[np.minimum(at, len(g_ids) - 1)] == p_group)
    pair = distinct(at[has] * chip.cores + p_dst[has])
    return _relay(chip, t_g.reshape(-1), t_src, t_bytes, pair // chip.cores,
                  pair % chip.cores, len(g_ids))


def _relay(chip: Chip, t_g: np.ndarray, t_src: np.ndarray, t_bytes: np.ndarray,
           p_g: np.ndarray, p_dst: np.ndarray, ng: int) -> Relay:
    """The stages, from each tree's group number (0 .. ``ng`` - 1), source and bytes, and
    each group's destinations (``p_g``, ``p_dst``: sorted by group, every group has some).
    A group's relay is its destination nearest the mean of its sources (the least core
    number among the nearest): the least of ``far x cores + core`` over the group's run."""
    rows, cols = chip.grid
    torus = chip.topology == "torus2d"
    sr, sc = np.divmod(t_src, cols)
    per = np.bincount(t_g, minlength=ng)
    mean_r = np.bincount(t_g, weights=sr, minlength=ng) / per
    mean_c = np.bincount(t_g, weights=sc, minlength=ng) / per
    dr, dc = np.divmod(p_dst, cols)
    far = (leg(np.rint(mean_c[p_g]).astype(np.int64), dc, cols, torus)[1]
           + leg(np.rint(mean_r[p_g]).astype(np.int64), dr, rows, torus)[1])
    starts = np.searchsorted(p_g, np.arange(ng))
    relay = np.minimum.reduceat(far * chip.cores + p_dst, starts) % chip.cores  # per group
    total = np.bincount(t_g, weights=t_bytes, minlength=ng).astype(np.int64)
    there = relay[p_g]
    on = p_dst != there
    return Relay((t_src, relay[t_g], t_bytes), (p_g[on], there[on], p_dst[on], total[p_g][on]))


def _group_destinations(tree: np.ndarray, dst: np.ndarray, group: np.ndarray,
                        g_ids: np.ndarray, t_g: np.ndarray, first: np.ndarray, cores: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Every (group, destination) of an exchange once, sorted (``g_ids``: the distinct
    groups; per distinct tree its group's number ``t_g`` and its first entry ``first``).
    The trees of a group go to the same destinations (`relay_stages`), so they are the
    destinations of each group's first tree: a pass over the entries instead of a sort of
    them all (a wafer's broadcast is tens of millions of entries, its pairs a few hundred
    thousand). Where the entries do not add up to that (a tree with more or fewer
    destinations than its group's first), every entry's pair; the count cannot see a tree
    that goes to as many other places, which the callers rule out."""
    leads = np.full(len(g_ids), len(t_g), dtype=np.int64)
    np.minimum.at(leads, t_g, np.arange(len(t_g)))
    lead_trees = tree[first[leads]]
    top = int(tree.max())
    if top < 4 * len(tree) + (1 << 20):  # tree numbers, as the callers give them
        lead = np.zeros(top + 1, dtype=bool)
        lead[lead_trees] = True
        mine = lead[tree]
    else:
        mine = np.isin(tree, lead_trees)
    pair = distinct(np.searchsorted(g_ids, group[mine]) * cores + dst[mine])
    p_g = pair // cores
    if int(np.bincount(t_g, minlength=len(g_ids)) @ np.bincount(p_g, minlength=len(g_ids))) \
            != len(tree):
        pair = distinct(np.searchsorted(g_ids, group) * cores + dst)
        p_g = pair // cores
    return p_g, pair % cores


def relay_cycles(chip: Chip, relay: Relay) -> int:
    """Cycles of a relayed exchange on its own: its gather's phase, then its spread's."""
    return unicast_cycles(chip, *relay.gather) + tree_cycles(chip, *relay.spread)


def relayed(chip: Chip, tree: np.ndarray, src: np.ndarray, dst: np.ndarray,
            nbytes: np.ndarray, group: np.ndarray, within: int) -> Relay | None:
    """The exchange's two stages (`relay_stages`) where they take fewer trees and fewer than
    ``within`` cycles (the faster of its trees and its unicasts, `multicast_routes`); None
    otherwise. Where a few cores each feed many trees a little (an element a core, after a
    wide reduce-scatter), one tree per group takes fewer colours, and so fewer waves, than a
    tree per source."""
    if not chip.routes_per_core:  # no colour limit: the trees run in one wave, a relay adds a stage
        return None
    relay = relay_stages(chip, tree, src, dst, nbytes, group)
    if count_distinct(relay.spread[0]) >= count_distinct(tree):
        return None  # no fewer trees
    return relay if relay_cycles(chip, relay) < within else None
