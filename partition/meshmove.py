"""Re-layouts on a mesh priced as routed: the exchanges of a choice of plans, tree by tree.

For the chosen plans (`transitions.relayout_cycles`) every moving input of an op is the
exchange codegen emits (`codegen.lower.moved_elements`): consumer cores whose tiles start at
the same place read the same elements, so each (distinct tile, producer core holding some of
it) is one multicast tree to the cores of that tile; where multicast is not faster than the
unicasts (the colours' waves, `t10c.multicast.multicast_routes`, the rule codegen follows)
the input goes as one unicast per (producer core, consumer core). All of an op's inputs move
in one phase after one barrier: their trees and unicasts are routed together, link by link,
as the emulator routes them; the weights a plan fetches from their idle layouts follow, as a
phase of their own behind the same barrier (`transitions.route_fetches`). The prediction is
exact, short of two distinct input tile origins whose element tables are equal (codegen then
merges their trees; only padding does that); an epilogue operand's trees are per distinct
table already (a bias broadcast over the result's rows is read alike by every row).

Routing every pair of plans this way would be too slow for the solver's edges, which keep
their estimate (`place.exchange_estimate`); this prices the choice the solver made, and that
choice's routed phases rescale each consumer op's edges for a second solve
(`partition._recalibrated`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from t10c import forked
from t10c.chips import Chip
from t10c.digest import digest_arrays
from t10c.ir import Graph, distinct_rows, ranges
from t10c.multicast import (
    EXPANDED_ENTRIES,
    Relay,
    check_pairs,
    grouped_relay,
    multicast_routes,
    phase_cycles,
    remember_ways,
    routing_key,
    tree_cycles,
    tree_parts,
    unicast_parts,
    ways_mark,
    ways_since,
)

from .collectives import chunk_elements, scatter_positions
from .cost import spread_owner
from .epilogue import extra_elements
from .plan import Geometry, OpPlan, geometry

if TYPE_CHECKING:  # (transitions imports this module when it prices a mesh)
    from .transitions import Want


@dataclass(frozen=True)
class Moved:
    """One input's exchange: per (tree, destination) its tree, source core, destination
    core and bytes, and whether it goes as multicast."""

    tree: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    multicast: bool
    #: a relayed exchange (`t10c.multicast.Relay`): the entries above are its gather (as
    #: unicasts), and these trees (`route_trees`' arguments) its spread, after the phase
    spread: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class Pending:
    """An input's exchange not yet built: its digest (owner, layout, tensor, element size)
    and how to build it. `phase` builds it only when the op's phase is not known yet."""

    key: bytes
    make: Callable[[], Moved]
    #: the elements its destination cores read, whether they move or not (how long it
    #: takes to build and route, roughly)
    size: int = 0


#: phase cycles by the digests of the inputs moved: repeated layers move alike. Only the
#: cycles are kept (a wafer's exchange is millions of (tree, destination) entries)
_PHASES: dict[tuple[bytes, ...], int] = {}
_PHASES_LIMIT = 1 << 16


@dataclass(frozen=True)
class Spread:
    """A tensor of ``numel`` elements spread evenly over the cores ``over`` (a weight's idle
    layout, `cost.spread_owner`), as an exchange's owner: its per-element cores are made
    only when the exchange is built (a wafer's weights: hundreds of MB each)."""

    numel: int
    over: range

    def owner(self) -> np.ndarray:
        return spread_owner(self.numel, self.over)

    def key(self) -> np.ndarray:
        return np.asarray([self.numel, self.over.start, self.over.stop], dtype=np.int64)


def _cores(owner: np.ndarray | Spread) -> np.ndarray:
    """Each root element's core."""
    return owner.owner() if isinstance(owner, Spread) else owner


def _held(owner: np.ndarray | Spread) -> np.ndarray:
    """What an owner contributes to an exchange's digest."""
    return owner.key() if isinstance(owner, Spread) else owner


def moved_input(chip: Chip, owner: np.ndarray | Spread, want: Want, shape: tuple[int, ...],
                to_root: np.ndarray | None, nbytes: int) -> Pending:
    """The exchange that brings a tensor of ``shape`` (through the view ``to_root``, None
    for a root) whose root element e lies on physical core ``owner[e]`` into the tiles
    ``want`` asks for, ``nbytes`` per element (`codegen.lower.moved_elements`)."""

    def make() -> Moved:
        uniq, inverse = distinct_rows(want.origin)
        flat, valid = _whole_tiles(uniq, tuple(int(s) for s in want.shape), shape)
        if to_root is not None:
            flat = to_root[flat]
        return _moved(chip, _cores(owner), flat, valid, inverse, want.phys, nbytes)

    return Pending(digest_arrays(_held(owner), want.origin, want.shape, want.phys,
                                 np.asarray(shape), to_root, np.asarray([nbytes])), make,
                   len(want.phys) * math.prod(int(s) for s in want.shape))


def _finished_tiles(graph: Graph, i: int, plan: OpPlan) -> tuple[
        Geometry, np.ndarray, tuple[int, ...], tuple[int, ...], int | None, np.ndarray]:
    """Op i's result tiles after its last step under ``plan``: (geometry, each core's tile
    origin, the tile, the result's shape, the elements a core keeps of its tile after the
    reduce-scatter or None for none, each core's position in its group: which chunk it
    keeps, `collectives.scatter_positions`)."""
    op = graph.ops[i]
    geo = geometry(graph, op, plan)
    out = len(op.inputs)
    origin = geo.tile_origin(out, geo.steps - 1)
    tile, shape = geo.tile_shape(out), graph.tensors[op.output.tensor].shape
    if geo.reduce_group > 1:
        pos, chunk = scatter_positions(geo)
        return geo, origin, tile, shape, chunk, pos
    return geo, origin, tile, shape, None, np.zeros(len(origin), dtype=np.int64)


def extra_index(graph: Graph, i: int, k: int, plan: OpPlan, to_root: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray]:
    """The root elements of activation ``extra[k]`` of op i that each core reads beside its
    finished result, slot by slot as codegen's buffer holds them (-1: none), for the distinct
    tiles (and chunks of them) the cores finish with, and which of those each core has:
    ((distinct, slots), (cores,))."""
    op = graph.ops[i]
    _, origin, tile, shape, chunk, pos = _finished_tiles(graph, i, plan)
    # cores whose tiles (and chunks of them) start alike read alike
    uniq, inverse = distinct_rows(np.concatenate([origin, pos[:, None]], axis=1))
    if chunk is not None:
        flat, valid = chunk_elements(uniq[:, :-1], tile, shape, uniq[:, -1], chunk)
    else:
        flat, valid = _whole_tiles(uniq[:, :-1], tile, shape)
    idx = extra_elements(graph, op, k, flat, valid)
    if to_root is not None:
        idx = np.where(idx >= 0, to_root[np.maximum(idx, 0)], -1)
    return idx, inverse


def extra_received(graph: Graph, i: int, k: int, plan: OpPlan, owner: np.ndarray,
                   to_root: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """All-to-all: (each physical core of op i, the elements of activation ``extra[k]`` it
    receives from another core), as codegen's exchange moves them (`moved_extra`)."""
    idx, inverse = extra_index(graph, i, k, plan, to_root)
    phys = geometry(graph, graph.ops[i], plan).phys
    src = np.where(idx >= 0, owner[np.maximum(idx, 0)], -1)[inverse]
    return phys, np.count_nonzero((src >= 0) & (src != phys[:, None]), axis=1)


def moved_extra(chip: Chip, graph: Graph, i: int, k: int, plan: OpPlan,
                owner: np.ndarray | Spread, to_root: np.ndarray | None, nbytes: int) -> Pending:
    """The exchange that puts activation ``extra[k]`` of op i (its root element e on core
    ``owner[e]``, read through ``to_root``) beside each core's finished result, element for
    element (`codegen.lower.bring_extra`): in the op's re-layout phase too."""
    op = graph.ops[i]
    geo, origin, tile, shape, _, pos = _finished_tiles(graph, i, plan)

    def make() -> Moved:
        idx, inverse = extra_index(graph, i, k, plan, to_root)
        # tiles that start apart may read the same elements (a bias broadcast over the rows
        # of the result): codegen's trees are per distinct table, so these share theirs
        idx, again = distinct_rows(idx)
        return _moved(chip, _cores(owner), np.maximum(idx, 0), idx >= 0, again[inverse],
                      geo.phys, nbytes)

    shape_of = graph.tensors[op.extra[k].tensor].shape
    return Pending(digest_arrays(_held(owner), origin, pos, np.asarray(tile), geo.phys,
                                 np.asarray(shape), to_root,
                                 np.frombuffer(repr((op.extra[k].axes, op.output.axes, shape_of,
                                                     geo.reduce_group, nbytes)).encode(),
                                               dtype=np.uint8)), make,
                   len(geo.phys) * math.prod(tile))


def _whole_tiles(origin: np.ndarray, tile: tuple[int, ...], shape: tuple[int, ...]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(flat index, inside the tensor) of every element of each row's tile at ``origin``,
    row-major within the tile (codegen's buffer order): the one chunk of a group of one."""
    return chunk_elements(origin, tile, shape, np.zeros(len(origin), dtype=np.int64),
                          math.prod(tile))


def _moved(chip: Chip, owner: np.ndarray, flat: np.ndarray, valid: np.ndarray,
           inverse: np.ndarray, phys: np.ndarray, nbytes: int) -> Moved:
    """Row u of ``flat`` (its ``valid`` elements) is what the cores ``phys[r]`` with
    ``inverse[r] == u`` read; root element e lies on core ``owner[e]``."""
    rows_of = np.broadcast_to(np.arange(len(flat), dtype=np.int64)[:, None], flat.shape)
    src = owner[flat[valid]].astype(np.int64)
    # per (distinct row, source core): the elements it takes, one tree
    base = chip.cores + 1
    keys, count = np.unique(rows_of[valid] * base + src, return_counts=True)
    k_row, k_src = keys // base, keys % base
    # every core of a distinct row is a destination of that row's trees
    order = np.argsort(inverse, kind="stable")
    per_row = np.bincount(inverse, minlength=len(flat))
    start = np.concatenate([[0], np.cumsum(per_row)])
    n = per_row[k_row]
    if int(n.sum()) > EXPANDED_ENTRIES:  # relayed, never spelt out (codegen's rule too)
        relay = grouped_relay(chip, k_row, k_src, count * nbytes, inverse[order],
                              phys.astype(np.int64)[order])
        return Moved(np.arange(len(relay.gather[0])), *relay.gather, False, relay.spread)
    check_pairs(int(n.sum()), len(phys), "the planner cannot price its re-layout on this "
                "machine; a shorter --seq-len or a smaller --batch needs fewer")
    # a tree's entries are its row's destinations in order; each array made once (a
    # wafer's broadcast is tens of millions of entries)
    tree = np.repeat(np.arange(len(keys), dtype=np.int64), n)
    dst = phys.astype(np.int64)[order].take(ranges(start[k_row], n))
    src_t, bytes_t = np.repeat(k_src, n), np.repeat(count * nbytes, n)
    routes = multicast_routes(chip, tree, src_t, dst, bytes_t, np.repeat(k_row, n))
    if isinstance(routes, Relay):
        return Moved(np.arange(len(routes.gather[0])), *routes.gather, False, routes.spread)
    if routes is None:
        return Moved(tree, src_t, dst, bytes_t, False)
    return Moved(*routes, True)


def phase(chip: Chip, pending: list[Pending]) -> int:
    """Cycles of one exchange phase moving the ``pending`` inputs (barrier not included):
    multicast inputs as trees, the others as unicasts, routed together
    (`emulator.routing.route_phase` computes the same); once per distinct phase."""
    key = _phase_key(routing_key(chip), pending)
    cycles = _PHASES.get(key)
    if cycles is None:
        cycles = _routed(chip, [p.make() for p in pending])
        _keep(key, cycles)
    return cycles


#: the elements read (`Pending.size`) from which the phases to route are shared among forked
#: processes: on wse2 a phase reading 5 M takes about a second to build and route, and a
#: fork about a tenth of one
FORKED_ELEMENTS = 1 << 22


def route_ahead(chip: Chip, phases: list[list[Pending]]) -> None:
    """Route the distinct ones among ``phases`` not routed yet in forked processes
    (`t10c.forked.map_forked`), so that `phase` finds them done, where there are several
    and they read `FORKED_ELEMENTS` or more; otherwise nothing (`phase` routes each when
    asked). A phase's cycles, and how each of its exchanges goes
    (`t10c.multicast.remember_ways`: codegen asks the same), are the same wherever they are
    worked out. bert-large's first choice on wse2 has 23 distinct phases to route, 25 M
    elements read, 6.6 s in one process."""
    routing = routing_key(chip)
    todo: dict[tuple[bytes, ...], list[Pending]] = {}
    for pending in phases:
        key = _phase_key(routing, pending)
        if pending and key not in _PHASES:
            todo.setdefault(key, pending)
    sizes = [sum(p.size for p in pending) for pending in todo.values()]
    if len(todo) < 2 or sum(sizes) < FORKED_ELEMENTS:
        return

    def route(pending: list[Pending]) -> tuple[int, list]:
        mark = ways_mark()
        cycles = _routed(chip, [p.make() for p in pending])
        return cycles, ways_since(mark)

    routed = forked.map_forked(route, list(todo.values()), sizes, forked.jobs())
    for key, (cycles, ways) in zip(todo, routed):
        remember_ways(ways)
        _keep(key, cycles)


def _phase_key(routing: bytes, pending: list[Pending]) -> tuple[bytes, ...]:
    """A phase's `_PHASES` key: the chip's routing and its inputs' digests."""
    return (routing, *(p.key for p in pending))


def _keep(key: tuple[bytes, ...], cycles: int) -> None:
    if len(_PHASES) >= _PHASES_LIMIT:
        _PHASES.clear()
    _PHASES[key] = cycles


def _apart(trees: list[np.ndarray]) -> np.ndarray:
    """The tree numbers of several exchanges, one after another, numbered apart."""
    offset, ids = 0, []
    for t in trees:
        ids.append(t + offset)
        offset = int(ids[-1].max(initial=offset - 1)) + 1
    return np.concatenate(ids)


def _routed(chip: Chip, inputs: list[Moved]) -> int:
    """Cycles of one phase moving ``inputs``: the multicast ones' trees and the others'
    unicasts routed together (`t10c.meshkernels.phase_busiest`), then the relayed ones'
    spreads as a stage of their own."""
    from t10c import meshkernels  # (numba, only where a mesh is routed)

    trees = [m for m in inputs if m.multicast]
    unicasts = [m for m in inputs if not m.multicast]

    def joined(ms: list[Moved], field: str) -> np.ndarray:
        return np.concatenate([getattr(m, field) for m in ms])

    hops, busiest, most = meshkernels.phase_busiest(
        chip.grid, chip.topology == "torus2d",
        unicast_parts(*(joined(unicasts, f) for f in ("src", "dst", "nbytes")))
        if unicasts else (),
        tree_parts(_apart([m.tree for m in trees]),
                   *(joined(trees, f) for f in ("src", "dst", "nbytes"))) if trees else ())
    cycles = 0 if hops < 0 else phase_cycles(chip, busiest, hops, most)
    spreads = [m.spread for m in inputs if m.spread is not None]
    if spreads:  # relayed exchanges' second stage, after the rest (the emulator's order)
        cycles += tree_cycles(chip, _apart([sp[0] for sp in spreads]),
                              *(np.concatenate([sp[k] for sp in spreads]) for k in (1, 2, 3)))
    return cycles
