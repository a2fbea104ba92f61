"""Re-layout costs between a producer's plan and a consumer's plan (the solver's (C3) edges).

The producer leaves every element of its result on one physical core (its output tile after
the last step, or after a reduce-scatter the chunk of it that the core finished); the consumer
wants every core it runs on to hold a box of the operand's tensor (its input tile at step 0),
read through any Reshape/Transpose views in between. A core receives every element of its box
that it does not already hold; all the inputs of one op move in one exchange phase after one
barrier, which lasts as long as the busiest core needs:

    remote(c) = |want(c) within the tensor| - |elements of want(c) left on core c|
    cycles(op) = sync + transfer(max_c sum over inputs of remote(c) * bytes per element),
                 or 0 when nothing moves (codegen then emits neither barrier nor transfer).

An op that warms its weights up (`OpPlan.home`) fetches them in the same exchange phase, so
its re-layout adds no barrier of its own. These are the elements the emulator counts from
codegen's exchange tables, so on an all-to-all chip the prediction is exact.

The overlap is computed box against box (`boxes.py`): a producer leaves a box per core, or
after a reduce-scatter a row-major chunk of it (a few boxes), and views carry the boxes
(a transpose permutes them; a reshape that splits or merges dimensions cuts each into the
flat ranges it covers, and those into boxes of the new shape). Where that would take more
boxes than the tensor has elements, and for 0-d tensors, it is counted element by element
(each element's owning core, looked up in the consumer's box on that core). Both are computed
once per distinct pair of layouts.

The solver prices each edge on its own (`edge_cost`: that input's transfer and a barrier):
for an op with several moving inputs that is an upper bound of the joint phase (one barrier,
the busiest core's sum), which `relayout_cycles` computes exactly for the chosen plans. (A
barrier indicator per op shared by its edges made CP-SAT's search on bert-large stall at the
greedy's objective, 9% worse.) On a mesh the transfer is `place.exchange_estimate` (routes
across the mesh, not one hop): an estimate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from t10c.chips import Chip
from t10c.digest import digest_arrays
from t10c.dtypes import IntTensors
from t10c.ir import Graph, last_product, map_to_root, tile_elements

from .boxes import BoxSet, chunk_boxes, clipped, overlap, reshaped, transposed
from .collectives import chunk_elements, scatter_positions, scatter_unit
from .cost import (
    element_bytes,
    epilogue_cost,
    fetch_bytes,
    fetch_estimate,
    fetches_epilogue_weights,
    final_share,
    idle_cores,
    kept_bytes,
    plan_cost,
    spread_owner,
)
from .place import exchange_estimate, region_span, relayout_estimate
from .plan import KERNEL_CORES, Cycles, Geometry, HashedKey, OpPlan, geometry
from .pod import chip_wanted, element_cross, spread_cross
from .solve import MemoryTerms, SolverOptions, chosen_memory, liveness

if TYPE_CHECKING:  # (meshmove builds on this module)
    from .meshmove import Pending, Spread


@dataclass(frozen=True)
class Want:
    """The boxes a consumer plan wants of one input: per logical core its origin, one shape,
    and the physical core each logical core runs on."""

    origin: np.ndarray  # (ncores, ndim), may be negative (windows start in the padding)
    shape: np.ndarray  # (ndim,)
    phys: np.ndarray  # (ncores,)

    def digest(self) -> bytes:
        return digest_arrays(*(np.asarray(a, dtype=np.int64)
                               for a in (self.origin, self.shape, self.phys)))


@dataclass(frozen=True)
class Have:
    """Where a producer plan leaves its result, in the consumer's operand's index space:
    either boxes per producer core (``boxes``, `boxes.BoxSet` over the producer's logical
    cores, and ``phys``, the physical core each runs on: a wafer's small plans use a few
    hundred of its 850,000 cores), or the owning physical core of every element (``owner``,
    flat; -1 for none)."""

    boxes: BoxSet | None = None
    owner: np.ndarray | None = None  # (numel,) int32
    phys: np.ndarray | None = None  # (producer cores,), with ``boxes``

    def digest(self) -> bytes:
        parts = (self.boxes.lo, self.boxes.size, self.phys) if self.boxes is not None \
            else (None, None, None)
        return digest_arrays(*parts, self.owner)

    def boxes_on(self, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The boxes (lo, size: (K, len(phys), ndim), fresh arrays) held on each of the
        physical cores ``phys``: empty where no producer core runs."""
        assert self.boxes is not None
        at = self._at(phys)
        none = at < 0
        at[none] = 0
        lo, size = self.boxes.lo[:, at], self.boxes.size[:, at]
        size[:, none] = 0
        return lo, size

    def holding(self, phys: np.ndarray) -> np.ndarray:
        """Per physical core of ``phys``, whether the producer left any element there."""
        held = self._held
        return np.where(phys < len(held), held[np.minimum(phys, len(held) - 1)], False) \
            if len(held) else np.zeros(len(phys), dtype=bool)

    def holds_on_all(self, phys: np.ndarray) -> bool:
        """Whether the producer left some element on every one of the distinct physical
        cores ``phys`` (not if they outnumber the cores it left any on)."""
        if len(phys) > self._holders:
            return False
        held = self._held
        return not len(phys) or (int(phys.max()) < len(held) and bool(held[phys].all()))

    @cached_property
    def _held(self) -> np.ndarray:
        """Per physical core up to the last one the producer uses, whether it left any
        element there."""
        if self.boxes is None:
            return self._owned
        assert self.phys is not None
        held = np.zeros(int(self.phys.max(initial=-1)) + 1, dtype=bool)
        held[self.phys] = self._nonempty
        return held

    @cached_property
    def _holders(self) -> int:
        """How many physical cores the producer left some element on."""
        return int(np.count_nonzero(self._held))

    @cached_property
    def _owned(self) -> np.ndarray:
        """Element-wise owners: per physical core up to the last owner, whether it owns an
        element (a mask, not the sorted owners: a wafer's tensors have a few hundred
        thousand elements to sort, its cores a mask of 850,000 bytes to fill)."""
        assert self.owner is not None
        owned = np.zeros(int(self.owner.max(initial=-1)) + 1, dtype=bool)
        owned[self.owner[self.owner >= 0]] = True
        return owned

    @cached_property
    def _nonempty(self) -> np.ndarray:
        """Per producer core, whether any of its boxes holds an element."""
        assert self.boxes is not None
        return np.asarray((last_product(self.boxes.size) > 0).any(axis=0))

    def _at(self, phys: np.ndarray) -> np.ndarray:
        """The producer core on each physical core of ``phys``, -1 for none (a fresh array)."""
        where = self._where
        return np.where(phys < len(where), where[np.minimum(phys, len(where) - 1)], -1)

    @cached_property
    def _where(self) -> np.ndarray:
        """The producer core on each physical core up to the last one used, -1 for none."""
        assert self.phys is not None
        where = np.full(int(self.phys.max(initial=0)) + 1, -1, dtype=np.int32)
        where[self.phys] = np.arange(len(self.phys))
        return where


def result_owner(graph: Graph, j: int, plan: OpPlan) -> np.ndarray:
    """(numel,): the physical core that holds each element of op ``j``'s result after it ran
    (codegen's placement of the result, `codegen.lower.finish_output`)."""
    op = graph.ops[j]
    geo = geometry(graph, op, plan)
    out = len(op.inputs)
    shape = graph.tensors[op.output.tensor].shape
    origin, tile = geo.tile_origin(out, geo.steps - 1), geo.tile_shape(out)
    if geo.reduce_group > 1:  # each core's chunk of its tile alone
        pos, chunk = scatter_positions(geo)
    else:  # the whole tile: one chunk
        pos, chunk = np.zeros(len(origin), dtype=np.int64), math.prod(tile)
    if len(origin) >= KERNEL_CORES:
        from .kernels import as_int64, chunk_owner  # (numba)

        return chunk_owner(as_int64(origin), as_int64(tile), as_int64(shape), as_int64(pos),
                           chunk, as_int64(geo.phys), math.prod(shape))
    flat, valid = chunk_elements(origin, tile, shape, pos, chunk)
    owner = np.full(math.prod(shape), -1, dtype=np.int32)
    owner[flat[valid]] = np.broadcast_to(geo.phys[:, None], flat.shape)[valid]
    return owner


def result_boxes(geo: Geometry, any_chunk: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """The box each logical core holds of the result after the op, (origins, shape), when
    every core holds one of one shape: always without a reduce-scatter, and with one when
    the group divides the tile's outermost dimension longer than 1 (each member's chunk of
    the row-major tile is then whole rows of it). With ``any_chunk`` (the aligned plans,
    `align.py`), wherever each member's chunk is a box: whole rows of some dimension's run
    (``chunk = k x`` the product of the dimensions after it, ``k`` dividing that
    dimension); members whose chunk lies wholly in the padding (a group larger than the
    tile, as a decode step's matvec reduced over hundreds of cores leaves) hold a box past
    the tensor's end, which holds nothing. (The re-layout pricing takes such chunks element
    by element, `result_box_set`: on a wafer, faster than a box per core.) None otherwise."""
    out = len(geo.op.inputs)
    origin = geo.tile_origin(out, geo.steps - 1)
    shape = np.asarray(geo.tile_shape(out))
    if geo.reduce_group == 1:
        return origin, shape
    outer = [d for d, n in enumerate(shape) if n > 1]
    if not any_chunk and (not outer or shape[outer[0]] % geo.reduce_group):
        return None
    chunk = scatter_unit(math.prod(shape), geo.reduce_group)  # (`scatter_of`'s unit)
    inner = 1
    for d in range(len(shape) - 1, -1, -1):
        if chunk % inner == 0 and shape[d] % (chunk // inner) == 0:
            break
        inner *= int(shape[d])
    else:
        return None
    pos, unit = scatter_positions(geo)
    if unit != chunk:
        return None
    run = chunk // inner
    box = np.ones_like(shape)
    box[d] = run
    box[d + 1:] = shape[d + 1:]
    start = pos.astype(np.int64) * chunk  # the chunk's first element, row-major in the tile
    held = start < math.prod(shape)
    within = np.stack(np.unravel_index(np.where(held, start, 0), tuple(shape)), axis=1)
    origin = origin + within
    # a chunk in the padding: a box past the tensor's end (of every dimension), holding nothing
    origin[~held] = np.iinfo(np.int32).max
    return origin, box


def producer_have(graph: Graph, j: int, plan: OpPlan, tensor: str,
                  to_root: np.ndarray | None, views: Views | None = None,
                  by_box: bool = False) -> Have:
    """Where plan ``plan`` of op ``j`` leaves the elements of ``tensor``: its result, or a
    view of it. Boxes (`result_box_set`), carried through the views from the root up, where
    ``tensor`` is the result itself or ``by_box`` asks for it and the boxes stay few;
    otherwise element by element, through ``to_root`` (the flat root index of each element of
    the view, or `Views.to_root`'s)."""
    links = []
    t = tensor
    while t in graph.views:
        links.append(graph.views[t])
        t = graph.views[t].source
    # a box of no dimension cannot be empty: 0-d tensors are counted by element
    scalar = not graph.tensors[t].shape or any(not v.shape for v in links)
    if (to_root is None or by_box) and not scalar:
        # boxes cost their count times the cores, elements the tensor's size: boxes are
        # kept while fewer (one box per core always: a wafer's 850,000 cores hold a few
        # per-core boxes of a 32,000-element tensor less cheaply than its owner table)
        limit = max(graph.tensors[tensor].numel, math.prod(plan.F))
        got = views.root_boxes(j, plan, limit) if views is not None \
            else result_box_set(graph, j, plan, limit)
        boxes = got[0] if got is not None else None
        for view in reversed(links):  # from the root up
            if boxes is None:
                break
            if view.perm is not None:
                boxes = transposed(boxes, view.perm)
            else:
                boxes = reshaped(boxes, graph.tensors[view.source].shape, view.shape, limit)
        if boxes is not None and got is not None:
            return Have(boxes=boxes, phys=got[1])
    if to_root is None and links:
        to_root = views.to_root(tensor) if views is not None else \
            map_to_root(graph, tensor, np.arange(graph.tensors[tensor].numel))[1]
    owner = views.owner(j, plan) if views is not None else result_owner(graph, j, plan)
    return Have(owner=owner if to_root is None else owner[to_root])


def result_box_set(graph: Graph, j: int, plan: OpPlan, limit: int
                   ) -> tuple[BoxSet, np.ndarray] | None:
    """The boxes of its result each of its cores holds after op ``j`` ran under ``plan``,
    per logical core, and the physical core each runs on: its tile, or after a
    reduce-scatter the row-major chunk of it it keeps (one box where the chunks are whole
    rows, `result_boxes`), clipped to the tensor; None where a chunk's boxes times the
    cores would pass ``limit``."""
    op = graph.ops[j]
    geo = geometry(graph, op, plan)
    shape = graph.tensors[op.output.tensor].shape
    box = result_boxes(geo)
    # (a chunk is at most `boxes.range_boxes`' count of boxes)
    if box is None and (2 ** len(shape) - 1) * len(geo.phys) > limit:
        return None
    if box is not None:
        origin, tile = box
        logical = clipped(origin[None].astype(np.int64),
                          np.broadcast_to(np.asarray(tile, dtype=np.int64), origin.shape)[None],
                          shape)
    else:
        out = len(op.inputs)
        pos, chunk = scatter_positions(geo)
        logical = chunk_boxes(geo.tile_origin(out, geo.steps - 1), geo.tile_shape(out), pos,
                              chunk, shape)
    return logical, np.asarray(geo.phys)


def consumer_want(graph: Graph, i: int, slot: int, plan: OpPlan) -> Want:
    """The boxes plan ``plan`` of op ``i`` wants of input ``slot`` (its tiles at step 0)."""
    geo = geometry(graph, graph.ops[i], plan)
    return Want(geo.tile_origin(slot, 0), np.asarray(geo.tile_shape(slot)), geo.phys)


def remote_counts(haves: list[Have], want: Want, extent: np.ndarray, coords: np.ndarray | None,
                  wanted: np.ndarray | None = None) -> np.ndarray:
    """(len(haves), ncores): the elements each consumer core must receive, per producer
    layout. ``coords`` (ndim, numel) are the multi-indices of the tensor's elements (needed
    only for element-wise layouts); ``wanted``: `_wanted` of ``want``, if the caller has it."""
    if wanted is None:
        wanted = _wanted(want, extent)
    # the wanted box within the tensor, once for every box layout: an overlap is then
    # max(min(his) - max(los), 0) per dimension
    bounds = _bounds(want, extent) if any(have.owner is None for have in haves) else None
    out = np.empty((len(haves), len(want.origin)), dtype=np.int64)
    owned = []
    for k, have in enumerate(haves):
        if have.owner is not None:
            owned.append(k)
            continue
        assert bounds is not None
        # (the gathers are copies, for `overlap` to overwrite)
        out[k] = wanted - overlap(*have.boxes_on(want.phys), *bounds)
    if owned:
        assert coords is not None
        owners = [haves[k].owner for k in owned]
        for k, local in zip(owned, _local_counts(owners, want, coords)):  # type: ignore[arg-type]
            out[k] = wanted - local
    return out


def _wanted(want: Want, extent: np.ndarray) -> np.ndarray:
    """Each consumer core's wanted box cut to the tensor: its elements
    (`kernels.wanted_elements` from `KERNEL_CORES`; below, column by column)."""
    origin = want.origin
    if len(origin) >= KERNEL_CORES:
        from .kernels import as_int64, wanted_elements  # (numba)

        return wanted_elements(as_int64(origin), as_int64(want.shape), as_int64(extent))
    elems = np.ones(len(origin), dtype=np.int64)
    for d in range(origin.shape[1]):
        col = origin[:, d]
        run = np.minimum(col + want.shape[d], extent[d])
        run -= np.maximum(col, 0)
        np.maximum(run, 0, out=run)
        elems *= run
    return elems


def _bounds(want: Want, extent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each consumer core's wanted box cut to the tensor: (lo, hi), each (ncores, ndim); only
    where a box layout is counted against it (an edge's element-wise layouts and those
    short-cut by `most_remote` need only `_wanted`: three in four of bert-large's on a
    wafer)."""
    origin = want.origin
    w_lo = np.maximum(origin, 0)
    w_hi = np.empty_like(w_lo)
    for d in range(origin.shape[1]):
        hi = w_hi[:, d]
        np.add(origin[:, d], want.shape[d], out=hi)
        np.minimum(hi, extent[d], out=hi)
    return w_lo, w_hi


def most_remote(haves: list[Have], want: Want, extent: np.ndarray, coords: np.ndarray | None
                ) -> np.ndarray:
    """`remote_counts`' maximum over the consumer cores, per producer layout: where some core
    that wants the most elements of all holds none of the producer's, that most (a wafer's
    GEMV hands the next one a vector of which most of its 750,000 cores hold nothing, in
    boxes or, reduce-scattered, element by element), with no core counted; the others
    counted."""
    wanted = _wanted(want, extent)
    top = int(wanted.max(initial=0))
    at_top = want.phys[wanted == top]
    out = np.zeros(len(haves), dtype=np.int64)
    counted = []
    for k, have in enumerate(haves):
        if top and not have.holds_on_all(at_top):
            out[k] = top
        else:
            counted.append(k)
    if counted:
        out[counted] = remote_counts([haves[k] for k in counted], want, extent,
                                     coords, wanted).max(axis=1, initial=0)
    return out


def _local_counts(owners: list[np.ndarray], want: Want, coords: np.ndarray
                  ) -> Iterator[np.ndarray]:
    """Per element-wise layout (each element's owning physical core, -1 for none), the
    elements each consumer core already holds of its box: an element can be local only to
    the consumer core running on its owner. Lookups are by physical core + 1 (so that -1 is
    slot 0): from `KERNEL_CORES` one pass over the elements (`kernels.local_counts`); below,
    one gather per dimension and element."""
    size = max(max(int(o.max(initial=0)) for o in owners), int(want.phys.max())) + 2
    if len(want.phys) >= KERNEL_CORES:
        from .kernels import as_int64, local_counts  # (numba)

        consumer = np.full(size, -1, dtype=np.int64)  # the consumer core on each physical core
        consumer[want.phys + 1] = np.arange(len(want.phys))
        origin, shape = as_int64(want.origin), as_int64(want.shape)
        coords = np.ascontiguousarray(coords, dtype=np.int32)
        for owner in owners:
            yield local_counts(np.ascontiguousarray(owner, dtype=np.int32), coords, consumer,
                               origin, shape, len(want.phys))
        return
    logical = np.full(size, -1, dtype=np.int32)  # the consumer core on each physical core
    logical[want.phys + 1] = np.arange(len(want.phys), dtype=np.int32)
    on = np.flatnonzero(logical >= 0)
    # per dimension, the box origin of the consumer core on each physical core; where none
    # runs, an origin no element reaches (unsigned: a negative offset wraps around past any
    # tile size)
    tables = []
    for d in range(len(coords)):
        table = np.full(size, -(1 << 30), dtype=np.int32)
        table[want.phys + 1] = want.origin[:, d]
        tables.append(table)
    for owner in owners:
        slot = owner + 1
        ok = logical[slot] >= 0 if not tables else None  # a 0-d tensor: no box to be in
        for d, table in enumerate(tables):
            inside = (coords[d] - table[slot]).view(np.uint32) < np.uint32(want.shape[d])
            ok = inside if ok is None else (ok & inside)
        assert ok is not None
        per_core = np.bincount(slot[ok], minlength=size)
        local = np.zeros(len(want.phys), dtype=np.int64)
        local[logical[on]] = per_core[on]
        yield local


#: the most elements any consumer core must receive, by (producer layout, consumer layout,
#: tensor shape) digests: a function of those alone (no chip rate, no SRAM size), and the
#: same pairs recur in the second solve's edges, in repeated layers' edges that differ
#: elsewhere and in every compile of a sweep's worker
_MOST: dict[tuple[bytes, bytes, tuple[int, ...]], int] = {}
_MOST_LIMIT = 1 << 18


#: the bytes of producer layouts one edge keeps while it prices its consumer layouts
_BUILT_LIMIT = 1 << 29


def _nbytes(have: Have) -> int:
    """What ``have`` takes, its table by physical core (`Have.boxes_on`) counted whether
    built yet or not."""
    if have.boxes is None:
        return have.owner.nbytes if have.owner is not None else 0
    assert have.phys is not None
    return (have.boxes.lo.nbytes + have.boxes.size.nbytes + have.phys.nbytes
            + 4 * (int(have.phys.max(initial=0)) + 1))


class _Built(dict):
    """One edge's producer layouts by digest, built once for all its consumer layouts (a
    wafer's take tens of milliseconds each), the oldest dropped past `_BUILT_LIMIT` bytes."""

    def keep(self, key: bytes, have: Have) -> Have:
        total = sum(_nbytes(h) for h in self.values()) + _nbytes(have)
        while self and total > _BUILT_LIMIT:
            total -= _nbytes(self.pop(next(iter(self))))
        self[key] = have
        return have


def _most_remote(graph: Graph, j: int, i: int, slot: int, have_plans: list[OpPlan],
                 have_keys: list[bytes], consumer: OpPlan, want_key: bytes, views: Views,
                 built: _Built) -> np.ndarray:
    """Per producer layout (``have_plans``, digests ``have_keys``), the most elements one
    consumer core of plan ``consumer`` must receive (`remote_counts`' maximum over the
    consumer cores), each computed once per process: the layouts are built only then, and
    kept in ``built`` for the edge's other consumer layouts."""
    tensor = graph.ops[i].inputs[slot].tensor
    shape = graph.tensors[tensor].shape
    keys = [(h, want_key, tuple(shape)) for h in have_keys]
    missing = [k for k, key in enumerate(keys) if key not in _MOST]
    if missing:
        todo = [built[have_keys[k]] if have_keys[k] in built else
                built.keep(have_keys[k], views.have(j, have_plans[k], tensor))
                for k in missing]
        want = views.want(i, slot, consumer)
        coords = views.coords(shape) if any(h.owner is not None for h in todo) else None
        counts = most_remote(todo, want, np.asarray(shape), coords)
        if len(_MOST) + len(missing) > _MOST_LIMIT:
            _MOST.clear()
        for k, c in zip(missing, counts):
            _MOST[keys[k]] = int(c)
    return np.array([_MOST[key] for key in keys], dtype=np.int64)


#: the exact re-layout pricing (`relayout_cycles`) asks again and again about the same input
#: under the same pair of layouts: bert-base's 18 calls (the greedy's, the solves', the
#: realignment's, the shared copies' trials, the baselines') differ in a few ops each, its 12
#: layers repeat one another, and a sweep's points share layouts. Per (consumer op, input,
#: producer op, view chain, layouts, cores): the consumer cores' physical cores and the
#: elements each receives; off meshes only (a wafer's per-core arrays are too large to keep)
_MOVED: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
#: at most this many per-core figures kept (8 bytes each: 128 MiB)
_MOVED_LIMIT = 1 << 24
#: `Views.crossing` and `Views.fetch_crossing` by what they depend on (a few integers each)
_CROSSINGS: dict[tuple, np.ndarray] = {}
_CROSSINGS_LIMIT = 1 << 16
#: on meshes, by the same key: the most elements a consumer core receives, all the routed
#: pricing asks of `Views.moved` there (a wafer's 32 layers compute it once, not 32 times)
_MOST_MOVED: dict[tuple, int] = {}
_MOST_MOVED_LIMIT = 1 << 16
#: `consumer_want(...).digest()` by (op, input, layout), and `producer_have(...).digest()` by
#: (op, view chain, layout): an edge's prices look its layouts up by these digests
#: (`_MOST`), and build the layouts only for the pairs not yet counted
_WANTS: dict[tuple, bytes] = {}
_HAVES: dict[tuple, bytes] = {}
_DIGESTS_LIMIT = 1 << 16
#: box entries (8 bytes each) a compile keeps of producers' layouts (`Views.have`): 256 MiB
_KEPT_LIMIT = 1 << 25


class Views:
    """Per view tensor, the flat root index of each element, and per tensor the multi-index
    of each element (computed once per compile)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._roots: dict[tuple, np.ndarray] = {}
        self._coords: dict[tuple[int, ...], np.ndarray] = {}
        self._owners: dict[tuple, np.ndarray] = {}
        self._op_keys: dict[int, HashedKey] = {}
        self._terms: MemoryTerms | None = None
        self._consts: frozenset[str] | None = None
        self._last_want: tuple[tuple | None, Want | None] = (None, None)
        self._haves: dict[tuple, Have] = {}
        self._boxes: dict[tuple, tuple[BoxSet, np.ndarray] | None] = {}
        self._kept = 0  # box entries in ``_haves``
        self._kept_costs: dict[tuple, Any] = {}  # `kept_bytes`, `kept_cycles`
        self._kept_chip: Chip | None = None
        self._pending: dict[tuple, tuple[bytes, int]] = {}
        self._extras: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}

    def const_tensors(self) -> frozenset[str]:
        """The tensors that are weights or views of weights."""
        if self._consts is None:
            self._consts = frozenset(n for n in self.graph.tensors
                                     if self.graph.root(n) in self.graph.constants)
        return self._consts

    def terms(self) -> MemoryTerms:
        """`solve.liveness` of the graph, once per compile."""
        if self._terms is None:
            self._terms = liveness(self.graph)
        return self._terms

    def op_key(self, i: int) -> HashedKey:
        """What op ``i``'s geometry reads besides a plan: its expression and tensor shapes
        (equal for repeated layers), as one `plan.HashedKey` per distinct value."""
        if i not in self._op_keys:
            op = self.graph.ops[i]
            self._op_keys[i] = HashedKey.of((op.signature(), tuple(
                self.graph.tensors[o.tensor].shape for o in (*op.operands, *op.extra))))
        return self._op_keys[i]

    def want(self, i: int, slot: int, plan: OpPlan) -> Want:
        """`consumer_want`; the last one built is kept (an edge digests a consumer layout,
        then counts it against the producer layouts)."""
        key = (self.op_key(i), slot, plan.layout)
        if self._last_want[0] != key:
            self._last_want = (key, consumer_want(self.graph, i, slot, plan))
        return self._last_want[1]  # type: ignore[return-value]

    def want_digest(self, i: int, slot: int, plan: OpPlan) -> bytes:
        """`consumer_want(...).digest()`, once per (op, input, layout) in this process."""
        key = (self.op_key(i), slot, plan.layout)
        if key not in _WANTS:
            if len(_WANTS) >= _DIGESTS_LIMIT:
                _WANTS.clear()
            _WANTS[key] = self.want(i, slot, plan).digest()
        return _WANTS[key]

    def have_digest(self, j: int, plan: OpPlan, tensor: str,
                    built: _Built | None = None) -> bytes:
        """`producer_have(...).digest()` of op ``j``'s result read as ``tensor``, once per
        (op, view chain, layout) in this process; a layout built for it is kept in
        ``built``."""
        key = (self.op_key(j), self.chain(tensor), plan.layout)
        if key not in _HAVES:
            if len(_HAVES) >= _DIGESTS_LIMIT:
                _HAVES.clear()
            have = self.have(j, plan, tensor)
            _HAVES[key] = have.digest()
            if built is not None:
                built.keep(_HAVES[key], have)
        return _HAVES[key]

    def moved(self, i: int, slot: int, j: int, consumer: OpPlan, producer: OpPlan,
              chip: Chip) -> tuple[np.ndarray, np.ndarray]:
        """Input ``slot`` of op ``i`` under plan ``consumer``, fed by op ``j`` under plan
        ``producer``: the consumer's logical cores' physical cores, and the elements each
        receives (remembered in `_MOVED` off meshes)."""
        graph = self.graph
        operand = graph.ops[i].inputs[slot]
        key = None if chip.is_mesh else self.moved_key(i, slot, j, consumer, producer, chip)
        got = _MOVED.get(key) if key else None
        if got is None:
            shape = graph.tensors[operand.tensor].shape
            have = self.have(j, producer, operand.tensor)
            want = consumer_want(graph, i, slot, consumer)
            coords = self.coords(shape) if have.owner is not None else None
            remote = remote_counts([have], want, np.asarray(shape), coords)[0]
            phys = np.array(want.phys)
            for a in (phys, remote):
                a.flags.writeable = False
            got = (phys, remote)
            if key:
                if (len(_MOVED) + 1) * 2 * chip.cores > _MOVED_LIMIT:
                    _MOVED.clear()
                _MOVED[key] = got
        return got

    def moved_key(self, i: int, slot: int, j: int, consumer: OpPlan, producer: OpPlan,
                  chip: Chip) -> tuple:
        """What `moved` depends on: (ops, input, view chain, layouts, chip cores and grid)."""
        return (self.op_key(i), slot, self.op_key(j),
                self.chain(self.graph.ops[i].inputs[slot].tensor), consumer.layout,
                producer.layout, chip.cores, chip.grid)

    def fetch_crossing(self, i: int, plan: OpPlan, chip: Chip, dtype: str,
                       int_tensors: IntTensors) -> np.ndarray:
        """A pod: (2, chips), the bytes into and out of each chip of op ``i``'s weight
        fetches under ``plan`` (`pod_fetches`): warmed-up weights from their spread over
        every core into the input tiles, epilogue weights from their spread over
        `idle_cores` beside the finished result (`_fetched`), each element once per chip
        that wants it from another; kept per (op, layout)."""
        key = ("fetch", self.op_key(i), plan.layout, plan.home, dtype, chip.cores,
               chip.chips, tuple(self.chain(o.tensor) for o in self.graph.ops[i].reads))
        got = _CROSSINGS.get(key)
        if got is not None:
            return got
        graph, op = self.graph, self.graph.ops[i]
        got = np.zeros((2, chip.chips), dtype=np.int64)
        for slot, operand in enumerate(op.inputs):
            root = graph.root(operand.tensor)
            if plan.home and root in graph.constants:
                owner = _spread(graph.tensors[root].numel, range(chip.cores))
                dst, elems = self._wanted_by_chip(i, slot, plan, chip)
                got += np.stack(element_cross(chip, dst, elems, owner)) * element_bytes(
                    op, slot, dtype, int_tensors)
        idle = idle_cores(chip)
        for k, operand in enumerate(op.extra):
            root = graph.root(operand.tensor)
            if root in graph.constants and fetches_epilogue_weights(chip):
                owner = _spread(graph.tensors[root].numel, idle)
                got += self._extra_cross(i, k, plan, chip, owner) * int_tensors.bytes_of(
                    operand.tensor, dtype)
        _remember(key, got)
        return got

    def _extra_cross(self, i: int, k: int, plan: OpPlan, chip: Chip,
                     owner: np.ndarray | Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """A pod: (2, chips), the elements of ``extra[k]`` of op ``i`` under ``plan``, owned
        as ``owner`` says, that cross into and out of each chip (`pod.element_cross`)."""
        from .meshmove import extra_index  # (builds on this)

        idx, inverse = extra_index(self.graph, i, k, plan,
                                   self.to_root(self.graph.ops[i].extra[k].tensor))
        rows = idx[inverse]
        phys = geometry(self.graph, self.graph.ops[i], plan).phys
        on = np.broadcast_to(chip.chip_of(np.asarray(phys, np.int64))[:, None], rows.shape)
        return np.stack(element_cross(chip, on.ravel(), rows.ravel(), owner))

    def _wanted_by_chip(self, i: int, slot: int, plan: OpPlan, chip: Chip
                        ) -> tuple[np.ndarray, np.ndarray]:
        """(chip, root element) of every element of input ``slot``'s tiles (step 0) that op
        ``i``'s cores want under ``plan``, each distinct tile of a chip once (-1: padding)."""
        tensor = self.graph.ops[i].inputs[slot].tensor
        want = consumer_want(self.graph, i, slot, plan)
        shape = self.graph.tensors[tensor].shape
        boxes = np.unique(np.column_stack([chip.chip_of(np.asarray(want.phys, np.int64)),
                                           np.asarray(want.origin, np.int64)]), axis=0)
        flat, valid = tile_elements(boxes[:, 1:], tuple(int(x) for x in want.shape), shape,
                                    np.int64)
        elems = np.where(valid, flat, -1)
        to_root = self.to_root(tensor)
        if to_root is not None:
            elems = np.where(elems >= 0, to_root[np.maximum(elems, 0)], -1)
        return np.broadcast_to(boxes[:, :1], elems.shape).ravel(), elems.ravel()

    def crossing(self, i: int, slot: int, j: int, consumer: OpPlan, producer: OpPlan,
                 chip: Chip) -> np.ndarray:
        """A pod: (in, out) per chip, the elements of input ``slot`` of op ``i`` under plan
        ``consumer``, fed by op ``j`` under plan ``producer``, that cross between chips in
        its re-layout (`pod.element_cross`: each once per chip that wants it), as (2, chips),
        remembered per process by `moved_key`."""
        key = ("input", *self.moved_key(i, slot, j, consumer, producer, chip), chip.chips)
        got = _CROSSINGS.get(key)
        if got is None:
            dst, elems = self._wanted_by_chip(i, slot, consumer, chip)
            got = np.stack(element_cross(chip, dst, elems, self.owner(j, producer)))
            _remember(key, got)
        return got

    def most_moved(self, i: int, slot: int, j: int, consumer: OpPlan, producer: OpPlan,
                   chip: Chip) -> int:
        """The most elements of input ``slot`` of op ``i`` that one of its cores receives
        (`moved`), remembered per process by `moved_key`."""
        key = self.moved_key(i, slot, j, consumer, producer, chip)
        got = _MOST_MOVED.get(key)
        if got is None:
            got = int(self.moved(i, slot, j, consumer, producer, chip)[1].max(initial=0))
            if len(_MOST_MOVED) >= _MOST_MOVED_LIMIT:
                _MOST_MOVED.clear()
            _MOST_MOVED[key] = got
        return got

    def kept_bytes(self, i: int, plan: OpPlan, slots: frozenset[int], chip: Chip, dtype: str,
                   int_tensors: IntTensors) -> int:
        """`cost.kept_bytes` of op ``i`` under ``plan`` keeping ``slots``, once per (op
        expression, plan, slots, dtype) while the chip stays the same."""
        if not slots:
            return 0
        return self._keeping("bytes", i, plan, slots, chip, dtype, lambda geo: kept_bytes(
            geo, slots, chip, dtype, int_tensors, self.const_tensors(), plan.home))

    def kept_cycles(self, i: int, plan: OpPlan, slots: frozenset[int], chip: Chip, dtype: str,
                    int_tensors: IntTensors) -> tuple[Cycles, Cycles]:
        """`cost.plan_cost`'s cycles of op ``i`` under ``plan``, without and with keeping
        ``slots`` for the next op, once per (op expression, plan, slots, dtype) while the
        chip stays the same."""
        def both(geo: Geometry) -> tuple[Cycles, Cycles]:
            consts = self.const_tensors()
            return (plan_cost(geo, chip, dtype, int_tensors, consts, plan.home)[0],
                    plan_cost(geo, chip, dtype, int_tensors, consts, plan.home, slots)[0])
        return self._keeping("cycles", i, plan, slots, chip, dtype, both)

    def _keeping(self, what: str, i: int, plan: OpPlan, slots: frozenset[int], chip: Chip,
                 dtype: str, make: Callable[[Geometry], Any]) -> Any:
        if self._kept_chip is not chip:
            self._kept_costs.clear()
            self._kept_chip = chip
        key = (what, self.op_key(i), plan.unnamed, slots, dtype)
        if key not in self._kept_costs:
            self._kept_costs[key] = make(geometry(self.graph, self.graph.ops[i], plan))
        return self._kept_costs[key]

    def extra_moved(self, i: int, k: int, source: int, consumer: OpPlan, producer: OpPlan,
                    chip: Chip) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Off a mesh: activation ``extra[k]`` of op ``i`` under plan ``consumer``, made by op
        ``source`` under plan ``producer``, as codegen moves it beside the finished result:
        (the op's physical cores, the elements each receives from another core, on a pod
        the elements that cross into and out of each chip, `pod.element_cross`, or None),
        kept per layouts."""
        from .meshmove import extra_received  # (builds on this)

        tensor = self.graph.ops[i].extra[k].tensor
        key = (self.op_key(i), k, consumer.layout, self.op_key(source),
               producer.layout, self.chain(tensor), chip.cores, chip.chips)
        got = self._extras.get(key)
        if got is None:
            to_root = self.to_root(tensor)
            phys, remote = extra_received(self.graph, i, k, consumer,
                                          self.owner(source, producer), to_root)
            crossed = (self._extra_cross(i, k, consumer, chip, self.owner(source, producer))
                       if chip.is_pod else None)
            got = (phys, remote, crossed)
            self._extras[key] = got
        return got

    def pending(self, key: tuple, build: Callable[[], Pending]) -> Pending:
        """``build()``, a routed exchange (`meshmove.Pending`), with its digest looked up by
        ``key`` (what the exchange depends on: ops, inputs, layouts, views, element size and
        chip) where it was built before in this compile. The digest hashes per-core tables
        of the whole chip (a wafer's take milliseconds), and the passes after the solve price
        hundreds of trial choices that differ from one another in a few ops; the exchange
        itself is built only when its phase has not been routed yet."""
        from .meshmove import Pending  # (builds on this)

        known = self._pending.get(key)
        if known is None:
            got = build()
            self._pending[key] = (got.key, got.size)
            return got
        return Pending(known[0], lambda: build().make(), known[1])

    def have(self, j: int, plan: OpPlan, tensor: str) -> Have:
        """`producer_have` of op ``j``'s result read as ``tensor``: box against box where
        the boxes stay few through its views, element by element otherwise. Kept per (op,
        view chain, layout) while they take little memory (repeated layers, and the
        digest and the count of one edge, ask for the same)."""
        key = (self.op_key(j), self.chain(tensor), plan.layout)
        got = self._haves.get(key)
        if got is None:
            got = producer_have(self.graph, j, plan, tensor, None, self, by_box=True)
            size = _nbytes(got) // 8 if got.boxes is not None else 0
            if size and size <= _KEPT_LIMIT:
                if self._kept + size > _KEPT_LIMIT:
                    self._haves.clear()
                    self._kept = 0
                self._haves[key] = got
                self._kept += size
        return got

    def root_boxes(self, j: int, plan: OpPlan, limit: int
                   ) -> tuple[BoxSet, np.ndarray] | None:
        """`result_box_set`, once per op expression and layout while they take little
        memory (``limit`` follows from the op's shapes and layout, in its key)."""
        key = (self.op_key(j), plan.layout)
        if key in self._boxes:
            return self._boxes[key]
        got = result_box_set(self.graph, j, plan, limit)
        if got is None or got[0].lo.size * 2 <= _KEPT_LIMIT // 8:
            if len(self._boxes) > 4096:
                self._boxes.clear()
            self._boxes[key] = got
        return got

    def owner(self, j: int, plan: OpPlan) -> np.ndarray:
        """`result_owner`, once per op expression and plan (repeated layers share it)."""
        key = (self.op_key(j), plan.unnamed)
        if key not in self._owners:
            self._owners[key] = result_owner(self.graph, j, plan)
            self._owners[key].flags.writeable = False
        return self._owners[key]

    def chain(self, tensor: str) -> tuple:
        """The views from ``tensor`` down to its root, as (shape, perm) pairs, and the root's
        shape: equal for repeated layers, so it keys caches (empty for a root)."""
        links = []
        while tensor in self.graph.views:
            view = self.graph.views[tensor]
            links.append((view.shape, view.perm))
            tensor = view.source
        return (tuple(links), self.graph.tensors[tensor].shape) if links else ()

    def same_read(self, a: str, b: str) -> bool:
        """Whether tensors ``a`` and ``b`` hold the same elements in the same places: one
        tensor, or views of one root through the same chain (the frontend gives each reader
        of a reshaped activation its own view tensor: Softmax's max and sum)."""
        return a == b or (self.graph.root(a) == self.graph.root(b)
                          and self.chain(a) == self.chain(b))

    def to_root(self, tensor: str) -> np.ndarray | None:
        """For a view, the flat root index of each of its elements (None for a root)."""
        key = self.chain(tensor)
        if not key:
            return None
        if key not in self._roots:
            numel = self.graph.tensors[tensor].numel
            self._roots[key] = map_to_root(self.graph, tensor, np.arange(numel))[1]
            self._roots[key].flags.writeable = False
        return self._roots[key]

    def coords(self, shape: tuple[int, ...]) -> np.ndarray:
        """(ndim, numel): every element's multi-index (no rows for a 0-d tensor)."""
        if shape not in self._coords:
            numel = int(np.prod(shape, dtype=np.int64))
            self._coords[shape] = np.stack(np.unravel_index(np.arange(numel), shape)).astype(
                np.int32) if shape else np.zeros((0, numel), dtype=np.int32)
        return self._coords[shape]


def barrier_cycles(chip: Chip) -> int:
    """What an op pays once when any of its inputs moves: the barrier and, on an all-to-all
    chip, the exchange's latency (`Chip.transfer_cycles` counts it once per phase)."""
    return chip.sync_cycles + (0 if chip.is_mesh else chip.hop_latency_cycles)


def fetches(graph: Graph, i: int, plan: OpPlan, chip: Chip) -> bool:
    """Whether plan ``plan`` of op ``i`` fetches weights before it runs (it warms its weights
    up, or its epilogue reads one: `cost.epilogue_cost`): that fetch has a barrier of its own
    (`cost.plan_cost`), which codegen shares with the re-layout."""
    op = graph.ops[i]
    if fetches_epilogue_weights(chip) and op.epilogue is not None and \
            any(graph.root(o.tensor) in graph.constants for o in op.extra):
        return True
    return plan.home and any(graph.root(o.tensor) in graph.constants for o in op.inputs)


def _transfer(chip: Chip, nbytes: int, cross: int = 0) -> int:
    """The all-to-all exchange's bandwidth term (its latency is in `barrier_cycles`); on a
    pod, at least the busiest chip's ``cross`` bytes over its links (`Chip.exchange_cycles`)."""
    if nbytes <= 0:
        return 0
    return chip.exchange_cycles(nbytes, cross) - chip.hop_latency_cycles


def edge_cost(graph: Graph, j: int, i: int, slot: int, producer: list[OpPlan],
              consumer: list[OpPlan], chip: Chip, dtype: str, int_tensors: IntTensors,
              views: Views | None = None, extents: bool = False
              ) -> tuple[tuple[int | None, ...], ...]:
    """Re-layout cycles of input ``slot`` of op ``i`` alone, barrier included, for every
    (producer plan, consumer plan) pair of the edge from op ``j``; None marks a pair the
    solver must not choose (a plan aligned to this input beside a producer plan that leaves
    another layout). ``extents``: a mesh-aware pair is priced from the two regions as they
    lie (`place.relayout_estimate`, as `refine` ranks its moves), not by the solver's
    estimate."""
    views = views or Views(graph)
    op = graph.ops[i]
    operand = op.inputs[slot]
    nbytes = element_bytes(op, slot, dtype, int_tensors)
    have_plans: list[OpPlan] = []  # a producer plan per distinct layout it leaves
    have_index: list[int] = []
    seen: dict[bytes, int] = {}
    built = _Built()  # producer layouts, built once for every consumer layout
    for p in producer:
        key = views.have_digest(j, p, operand.tensor, built)
        if key not in seen:
            seen[key] = len(have_plans)
            have_plans.append(p)
        have_index.append(seen[key])
    have_keys = list(seen)  # in the order of ``have_plans``
    # on a mesh, mesh-aware plans price the exchange by its routes (an estimate); plans made
    # under the all-to-all assumption price it as that assumption says
    aware = any(routed_on(chip, q) for q in consumer)
    columns: dict[bytes, np.ndarray] = {}
    wanted: dict[bytes, int | None] = {}  # a pod: the most distinct bytes a chip wants
    cols = []
    wants = []
    for q in consumer:
        key = views.want_digest(i, slot, q)
        if key not in columns:
            columns[key] = _most_remote(graph, j, i, slot, have_plans, have_keys, q, key,
                                        views, built)
            wanted[key] = (int(_chip_want(graph, i, slot, q, chip).max()) * nbytes
                           if chip.is_pod else None)
        cols.append(columns[key])
        wants.append(wanted[key])
    # a consumer plan that warms its weights up has paid the barrier (not the latency)
    shared = [fetches(graph, i, q, chip) and not chip.is_mesh for q in consumer]
    barrier = barrier_cycles(chip)
    if aware:  # each pair's exchange crosses the union of the two ops' regions
        have_region = [_region(graph, j, p, chip) for p in producer]
        want_region = [_region(graph, i, q, chip) for q in consumer]
        if extents:
            have_side = [(*_extent(graph, j, p, chip), math.prod(p.F), p.out_bytes_per_core)
                         for p in producer]
            want_side = [(*_extent(graph, i, q, chip), math.prod(q.F), 0) for q in consumer]
            distinct = graph.tensors[operand.tensor].numel * nbytes
    rows = []
    for n, (p, at) in enumerate(zip(producer, have_index)):
        row: list[int | None] = []
        for m, (col, q_aligned, q_shared, ncores, chip_want) in enumerate(zip(
                cols, (q.aligned == slot for q in consumer), shared,
                (math.prod(q.F) for q in consumer), wants)):
            remote = int(col[at])
            cyc: int | None
            if q_aligned and remote:
                cyc = None  # an aligned plan runs only beside the layouts it was built for
            elif not remote:
                cyc = 0
            elif q_shared:  # the barrier is the warm-up's
                cyc = chip.exchange_cycles(remote * nbytes,
                                           spread_cross(chip, ncores, remote * nbytes,
                                                        chip_want))
            elif aware and extents:
                cyc = barrier + relayout_estimate(chip, remote * nbytes, have_side[n],
                                                  want_side[m], distinct)
            elif aware:  # the producer's tile leaves once (multicast trees)
                (hp, wp), (hq, wq) = have_region[n], want_region[m]
                trees = broadcast_trees(hp, wp, math.prod(p.F), p.out_bytes_per_core,
                                        ncores, remote * nbytes)
                cyc = barrier + exchange_estimate(chip, remote * nbytes, p.out_bytes_per_core,
                                                  (max(hp, hq), max(wp, wq)), trees)
            elif chip.is_mesh:
                cyc = barrier + chip.transfer_cycles(remote * nbytes)
            else:
                cyc = barrier + _transfer(chip, remote * nbytes,
                                          spread_cross(chip, ncores, remote * nbytes,
                                                       chip_want))
            row.append(cyc)
        rows.append(tuple(row))
    return tuple(rows)


def broadcast_trees(rows: int, cols: int, senders: int, sent: int, receivers: int,
                    received: int) -> int:
    """Route trees an exchange puts on its busiest link, estimated, for the colours' waves
    (`t10c.multicast`): where each element is copied to many cores (a vector broadcast into
    a GEMV's tiles), every sender's tree spans the consumer's region, and the trees of the
    senders along one side of the producer's region (``rows x cols`` cores) leave it over
    the same links; at most as many as each element has copies (``receivers`` cores
    receiving ``received`` bytes each, from ``senders`` holding ``sent`` each). Routed on
    wse2, a 4096-vector broadcast into the tiles of a 4096 x 14336 GEMV (k = 256, n = 1024)
    from 64 x 64, 32 x 32, 16 x 16 and 8 x 8 producer cores put 128, 32, 16 and 8 trees on
    the busiest link; this gives 64, 32, 16 and 8."""
    copies = (receivers * received) // max(senders * sent, 1)
    return min(max(rows, cols), copies)


def _region(graph: Graph, k: int, plan: OpPlan, chip: Chip) -> tuple[int, int]:
    """(rows, cols) of the mesh region op ``k`` runs on under ``plan`` (the whole chip for a
    plan made under the all-to-all assumption)."""
    if plan.embed is None:
        return chip.rows, chip.cols
    op = graph.ops[k]
    return region_span(plan.F, op.axis_names, set(op.reduction_axes), plan.embed)


def _extent(graph: Graph, k: int, plan: OpPlan, chip: Chip) -> tuple[int, int]:
    """(rows, cols) of the cores op ``k`` runs on under ``plan``, as they lie: `_region`,
    but an aligned plan's the bounding box of the cores it was given."""
    if plan.cores is not None:
        row, col = np.divmod(np.asarray(plan.cores, dtype=np.int64), chip.cols)
        return int(row.max() - row.min()) + 1, int(col.max() - col.min()) + 1
    return _region(graph, k, plan, chip)


def _chip_want(graph: Graph, i: int, slot: int, plan: OpPlan, chip: Chip) -> np.ndarray:
    """A pod: per chip, the distinct elements of input ``slot`` its cores want under
    ``plan`` (`pod.chip_wanted`), once per (op expression and shapes, input, layout, pod) in
    this process (read-only): every choice the post-solve passes try re-prices its inputs."""
    op = graph.ops[i]
    key = (op.signature(), tuple(graph.tensors[o.tensor].shape for o in op.operands), slot,
           plan.layout, chip.cores, chip.chips, chip.grid)
    got = _CHIP_WANTS.get(key)
    if got is None:
        want = consumer_want(graph, i, slot, plan)
        shape = graph.tensors[op.inputs[slot].tensor].shape
        got = chip_wanted(chip, want.origin, want.shape, want.phys, np.asarray(shape))
        got.flags.writeable = False
        if len(_CHIP_WANTS) >= _DIGESTS_LIMIT:
            _CHIP_WANTS.clear()
        _CHIP_WANTS[key] = got
    return got


#: `_chip_want` by what it depends on (a few integers each)
_CHIP_WANTS: dict[tuple, np.ndarray] = {}


def shared_inputs(graph: Graph, plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip,
                  dtype: str, int_tensors: IntTensors, views: Views | None = None
                  ) -> dict[tuple[int, int], int]:
    """Inputs that read the previous op's re-laid copy instead of receiving their own:
    ``{(op, slot): slot of op - 1}``.

    When two consecutive ops read the same activation (the same tensor, or views of it
    through the same chain, `Views.same_read`: Softmax's max and sum) in the same layout at
    their first step (equal boxes on the same cores), the first op's received buffer stays
    allocated and the second reads it: its re-layout moves nothing for that input
    (bert-base's q, k and v read the LayerNorm's result alike). A first op that rotates the
    input shifts it back to its step-0 placement after its last step (one more ring shift,
    `kept_restores`, taken to cost less than the re-layout it saves), where the input would
    otherwise move (the second op may rotate it again: LLaMA-3-8B's gate and up projections
    on a wafer). The buffer then lives through the first op's reduce-scatter and epilogue:
    where the first plan's hot bytes do not cover it there (`cost.kept_bytes`), only if the
    SRAM the chosen plans leave at that op (the solver's (C2) with its default reserve)
    does. Chips without DRAM only (DRAM preloads are placed beside the op buffers); on a
    mesh the copy is kept on the cores that received it, and the routed pricing of the
    chosen plans (`meshmove`) sees the phase it saves. Codegen follows this map
    (`codegen.lower`), and `relayout_cycles` prices it."""
    return _sharing(graph, plans, chip, dtype, int_tensors, views or Views(graph))[0]


def _sharing(graph: Graph, plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip, dtype: str,
             int_tensors: IntTensors, views: Views
             ) -> tuple[dict[tuple[int, int], int], list[int]]:
    """`shared_inputs`, and the SRAM per op the chosen plans and the kept copies leave."""
    if chip.has_dram:
        return {}, [0] * len(plans)
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    slack = _slack(plans, chip, views)
    out: dict[tuple[int, int], int] = {}
    for i in range(1, len(graph.ops)):
        op, prev = graph.ops[i], graph.ops[i - 1]
        taken: frozenset[int] = frozenset()  # the slots op i - 1 keeps
        for slot, operand in enumerate(op.inputs):
            j = producer.get(graph.root(operand.tensor))
            if j is None:
                continue
            want = None
            for s, o in enumerate(prev.inputs):
                if s in taken or not views.same_read(o.tensor, operand.tensor):
                    continue
                want = want or views.want_digest(i, slot, plans[i])
                if views.want_digest(i - 1, s, plans[i - 1]) != want:
                    continue
                # a rotated copy returns home for the next op (one more ring shift): only
                # where that input would move otherwise
                if plans[i - 1].rot[s] and not _would_move(views, i, slot, j, plans, chip):
                    break
                more = (views.kept_bytes(i - 1, plans[i - 1], taken | {s}, chip, dtype,
                                         int_tensors)
                        - views.kept_bytes(i - 1, plans[i - 1], taken, chip, dtype,
                                           int_tensors))
                if more <= slack[i - 1]:
                    slack[i - 1] -= more
                    out[i, slot] = s
                    taken |= {s}
                    break
    return out, slack


def _would_move(views: Views, i: int, slot: int, j: int,
                plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip) -> bool:
    """Whether input ``slot`` of op i, produced by op j, moves before op i runs."""
    if chip.is_mesh:
        return views.most_moved(i, slot, j, plans[i], plans[j], chip) > 0
    return bool(views.moved(i, slot, j, plans[i], plans[j], chip)[1].any())


def kept_restores(graph: Graph, plans: tuple[OpPlan, ...], chip: Chip, dtype: str,
                  int_tensors: IntTensors, views: Views | None = None
                  ) -> tuple[OpPlan, ...]:
    """The chosen plans with the cycles of their kept copies' return (`shared_inputs`): a
    plan that keeps an input it rotates for the next op shifts it back to its step-0
    placement after the last step (`cost.plan_cost` with ``kept``), which codegen emits.
    Applied once, to the final choice (the sharing does not depend on the plans' cycles)."""
    views = views or Views(graph)
    keeping: dict[int, set[int]] = {}
    for (i, _), s in _sharing(graph, plans, chip, dtype, int_tensors, views)[0].items():
        if plans[i - 1].rot[s]:
            keeping.setdefault(i - 1, set()).add(s)
    if not keeping:
        return plans
    out = list(plans)
    for k, slots in sorted(keeping.items()):
        p = plans[k]
        base, more = views.kept_cycles(k, p, frozenset(slots), chip, dtype, int_tensors)
        out[k] = dataclasses.replace(p, cycles=dataclasses.replace(
            p.cycles, shift=p.cycles.shift + more.shift - base.shift,
            sync=p.cycles.sync + more.sync - base.sync,
            reduce=p.cycles.reduce + more.reduce - base.reduce))
    return tuple(out)


def _slack(plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip, views: Views) -> list[int]:
    """The SRAM per op that the chosen plans leave, short of the solver's reserve ((C2))."""
    cap = SolverOptions().sram_cap(chip.sram_bytes_per_core)
    return [cap - int(u) for u in chosen_memory(views.terms(), plans)]


def hoisted_fetches(graph: Graph, plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip,
                    dtype: str, int_tensors: IntTensors, views: Views | None = None,
                    sharing: tuple[dict[tuple[int, int], int], list[int]] | None = None
                    ) -> frozenset[int]:
    """Ops whose epilogue weights (a bias) are fetched in the previous op's reduce-scatter
    superstep instead of after a barrier of their own.

    A fetch reads a weight's idle copy, which nothing writes, so it can move in any earlier
    exchange phase. Where an op would open an exchange phase only for that fetch (its inputs
    are in place or read the previous op's copy, `shared_inputs`: bert-base's k and v), and
    the previous op ends with a reduce-scatter, the fetch joins that superstep and the op's
    barrier goes. The fetched buffers then live through the previous op's epilogue: only
    where the SRAM the chosen plans leave there holds them. `relayout_cycles` prices the
    barrier saved, codegen follows the same set. (``sharing``: `_sharing` of the same plans,
    when the caller has it.)"""
    views = views or Views(graph)
    shared, slack = sharing or _sharing(graph, plans, chip, dtype, int_tensors, views)
    slack = list(slack)
    if chip.is_mesh or chip.has_dram:
        return frozenset()
    const_tensors = views.const_tensors()
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    out = set()
    for i in range(1, len(graph.ops)):
        op, p = graph.ops[i], plans[i]
        if p.home or op.epilogue is None or not fetches(graph, i, p, chip) or \
                any(graph.root(o.tensor) not in graph.constants for o in op.extra):
            continue
        if geometry(graph, graph.ops[i - 1], plans[i - 1]).reduce_group <= 1:
            continue
        if any(views.moved(i, slot, j, p, plans[j], chip)[1].any()
               for slot, j in _moved_inputs(graph, i, producer, shared)):
            continue
        geo = geometry(graph, op, p)
        share = final_share(geo)
        fetched = epilogue_cost(op, share, chip, dtype, int_tensors, const_tensors,
                                geo.shapes).fetched
        if fetched <= slack[i - 1]:
            slack[i - 1] -= fetched
            out.add(i)
    return frozenset(out)


def _remember(key: tuple, crossed: np.ndarray) -> None:
    """Keep a pod crossing in `_CROSSINGS` (read-only), emptied when it grows too long."""
    crossed.flags.writeable = False
    if len(_CROSSINGS) >= _CROSSINGS_LIMIT:
        _CROSSINGS.clear()
    _CROSSINGS[key] = crossed


def _spread(numel: int, over: range) -> Callable[[np.ndarray], np.ndarray]:
    """The cores of elements of a tensor spread over ``over`` (`cost.spread_owner`), without
    making the whole table (a 13B model's weights: tens of millions of elements each)."""
    return lambda elems: spread_owner(numel, over, elems)


def _moved_inputs(graph: Graph, i: int, producer: dict[str, int],
                  shared: dict[tuple[int, int], int]) -> Iterator[tuple[int, int]]:
    """Op i's inputs that an op produced and that do not read the previous op's copy, each
    as (slot, producer)."""
    for slot, operand in enumerate(graph.ops[i].inputs):
        j = producer.get(graph.root(operand.tensor))
        if j is not None and (i, slot) not in shared:
            yield slot, j


def routed_on(chip: Chip, plan: OpPlan) -> bool:
    """Whether ``plan``'s re-layouts are priced by routing: on a mesh, a plan placed for it,
    mesh-aware (embedded) or aligned to the cores its producer left (`align.py`); plans made
    under the all-to-all assumption keep that assumption's estimate."""
    return chip.is_mesh and (plan.embed is not None or plan.cores is not None
                             or plan.aligned >= 0)  # (aligned on row-major cores: None)


@dataclass
class _Phase:
    """What an op's re-layout phase moves: per core the bytes it receives and, on a pod, per
    chip the bytes that cross into it and out of it (all-to-all chips, pods); on a mesh the
    exchanges as routed (`meshmove.Pending`) or, for plans made under the all-to-all
    assumption, the estimate."""

    received: np.ndarray
    cross: np.ndarray  # (2, chips): bytes in, bytes out
    routed: list
    estimate: int = 0
    #: on a mesh, the weights fetched from their idle layouts, routed (`route_fetches`):
    #: codegen sends them after the re-layouts, as a phase of their own after the same barrier
    fetched: list = dataclasses.field(default_factory=list)

    @staticmethod
    def empty(chip: Chip) -> _Phase:
        # (a mesh's phases are routed: no per-core count, which on a wafer would be 7 MB
        # per op and pricing)
        return _Phase(np.zeros(0 if chip.is_mesh else chip.cores, dtype=np.int64),
                      np.zeros((2, max(chip.chips, 1)), dtype=np.int64), [])  # a pod

    def moves(self) -> bool:
        return bool(self.routed) or bool(self.fetched) or self.estimate > 0 or \
            bool(self.received.any())

    def with_(self, other: _Phase) -> _Phase:
        return _Phase(self.received + other.received, self.cross + other.cross,
                      [*self.routed, *other.routed], self.estimate + other.estimate,
                      [*self.fetched, *other.fetched])


def _phase_of(graph: Graph, i: int, plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip,
              dtype: str, int_tensors: IntTensors, views: Views, producer: dict[str, int],
              shared: dict[tuple[int, int], int], fetch: bool = False) -> _Phase:
    """Op i's re-layout phase under ``plans``: its moved inputs and, on a mesh, the
    activations its epilogue reads (codegen moves them in the same phase); with ``fetch``,
    a mesh plan's weight fetches routed (`route_fetches`)."""
    op = graph.ops[i]
    got = _Phase.empty(chip)
    for slot, j in _moved_inputs(graph, i, producer, shared):
        nbytes = element_bytes(op, slot, dtype, int_tensors)
        if chip.is_mesh:  # (only the most a core receives: kept per process)
            most = views.most_moved(i, slot, j, plans[i], plans[j], chip)
            if not most:
                continue
            if routed_on(chip, plans[i]):
                got.routed.append(views.pending(
                    ("input", views.moved_key(i, slot, j, plans[i], plans[j], chip), nbytes),
                    _moved_input(graph, i, slot, plans[i], views.owner(j, plans[j]), chip,
                                 views, nbytes)))
            else:  # the all-to-all assumption's estimate: each input on its own
                got.estimate += chip.transfer_cycles(most * nbytes)
            continue
        phys, remote = views.moved(i, slot, j, plans[i], plans[j], chip)
        if chip.is_pod and remote.any():
            got.cross += views.crossing(i, slot, j, plans[i], plans[j], chip) * nbytes
        np.add.at(got.received, phys, remote * nbytes)
    if not chip.is_mesh:  # activations the epilogue reads, moved in the same phase
        for k, operand in enumerate(op.extra):
            source = producer.get(graph.root(operand.tensor))
            if source is not None:
                nbytes = int_tensors.bytes_of(operand.tensor, dtype)
                phys, remote, crossed = views.extra_moved(i, k, source, plans[i],
                                                          plans[source], chip)
                if crossed is not None:
                    got.cross += crossed * nbytes
                np.add.at(got.received, phys, remote * nbytes)
    elif routed_on(chip, plans[i]):  # activations the epilogue reads
        for k, operand in enumerate(op.extra):  # move in the same phase (codegen's)
            source = producer.get(graph.root(operand.tensor))
            if source is not None:
                nbytes = int_tensors.bytes_of(operand.tensor, dtype)
                got.routed.append(views.pending(
                    ("extra", views.op_key(i), k, plans[i].layout, views.op_key(source),
                     plans[source].layout, views.chain(operand.tensor), nbytes,
                     chip.cores, chip.grid),
                    _moved_extra(graph, i, k, plans[i], views.owner(source, plans[source]),
                                 chip, views, nbytes)))
    if fetch and routed_on(chip, plans[i]) and fetches(graph, i, plans[i], chip):
        got.fetched = _fetched(graph, i, plans[i], chip, dtype, int_tensors, views)
    return got


def _fetched(graph: Graph, i: int, plan: OpPlan, chip: Chip, dtype: str,
             int_tensors: IntTensors, views: Views) -> list:
    """The exchanges that bring op i's weights from their idle layouts (`cost.spread_owner`)
    into ``plan``'s tiles, as codegen emits them: warmed-up weights (`OpPlan.home`, spread
    over every core) into their input tiles, epilogue weights (spread over `idle_cores`)
    beside the finished result."""
    from .meshmove import Spread  # (builds on this)

    op = graph.ops[i]
    out = []
    for slot, operand in enumerate(op.inputs):
        root = graph.root(operand.tensor)
        if plan.home and root in graph.constants:
            spread = Spread(graph.tensors[root].numel, range(chip.cores))
            nbytes = element_bytes(op, slot, dtype, int_tensors)
            out.append(views.pending(
                ("fetch", views.op_key(i), slot, plan.layout, views.chain(operand.tensor),
                 spread, nbytes, chip.cores, chip.grid),
                _moved_input(graph, i, slot, plan, spread, chip, views, nbytes)))
    idle = idle_cores(chip)
    for k, operand in enumerate(op.extra):
        root = graph.root(operand.tensor)
        if root in graph.constants and fetches_epilogue_weights(chip):
            spread = Spread(graph.tensors[root].numel, idle)
            nbytes = int_tensors.bytes_of(operand.tensor, dtype)
            out.append(views.pending(
                ("fetch extra", views.op_key(i), k, plan.layout,
                 views.chain(operand.tensor), spread, nbytes, chip.cores, chip.grid),
                _moved_extra(graph, i, k, plan, spread, chip, views, nbytes)))
    return out


def _moved_input(graph: Graph, i: int, slot: int, plan: OpPlan, owner: np.ndarray | Spread,
                 chip: Chip, views: Views, nbytes: int) -> Callable[[], Pending]:
    """How to build the exchange of input ``slot`` of op i under ``plan`` from ``owner``
    (`meshmove.moved_input`), for `Views.pending`."""
    from .meshmove import moved_input  # (builds on this)

    def build() -> Pending:
        tensor = graph.ops[i].inputs[slot].tensor
        return moved_input(chip, owner, consumer_want(graph, i, slot, plan),
                           graph.tensors[tensor].shape, views.to_root(tensor), nbytes)
    return build


def _moved_extra(graph: Graph, i: int, k: int, plan: OpPlan, owner: np.ndarray | Spread,
                 chip: Chip, views: Views, nbytes: int) -> Callable[[], Pending]:
    """How to build the exchange of epilogue operand ``k`` of op i under ``plan`` from
    ``owner`` (`meshmove.moved_extra`), for `Views.pending`."""
    from .meshmove import moved_extra  # (builds on this)

    def build() -> Pending:
        return moved_extra(chip, graph, i, k, plan, owner,
                           views.to_root(graph.ops[i].extra[k].tensor), nbytes)
    return build


def _phase_cycles(graph: Graph, i: int, plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip,
                  part: _Phase, hoisted: frozenset[int]) -> int:
    """Cycles of op i's re-layout phase moving ``part``, its barrier included (the barrier of
    a plan that fetches weights is the plan's own, `cost.plan_cost`)."""
    from .meshmove import phase  # (builds on this)

    if chip.is_mesh:
        mesh_cycles = phase(chip, part.routed) if part.routed else part.estimate
        mesh_cycles += phase(chip, part.fetched) if part.fetched else 0
        return barrier_cycles(chip) + mesh_cycles if mesh_cycles else 0
    most = int(part.received.max(initial=0))
    cross = int(part.cross.max(initial=0)) if chip.is_pod else 0
    if fetches(graph, i, plans[i], chip):  # the barrier is the plan's (its fetch's),
        # unless the fetch rides in the previous op's reduce-scatter superstep
        return chip.exchange_cycles(most, cross) - (chip.sync_cycles if i in hoisted else 0)
    return chip.sync_cycles + chip.exchange_cycles(most, cross) if most else 0


def merged_phases(graph: Graph, plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip,
                  dtype: str, int_tensors: IntTensors, views: Views | None = None
                  ) -> dict[int, int]:
    """Ops whose inputs move in an earlier op's re-layout phase: ``{op: the op whose phase
    carries them}``.

    Every re-layout phase costs a barrier and its own latency (on a wafer, the longest
    route's hundreds of hops), so an op whose moved inputs were all computed before an
    earlier op's phase may receive them in that phase (the first such that opens one) and
    open none itself: LLaMA's k projection beside q's, k's rotary beside q's, the value
    cache's Concat beside them. It does so only where the merged phase costs less than the
    two apart (on a mesh, more trees on a link can mean more waves: q, k and v together cost
    more than apart on a wafer), and where the SRAM the chosen plans leave at every op from
    the carrier to it holds the buffers received early. Not for ops that fetch weights,
    whose epilogue reads other operands, or that read or keep a copy beside the next op
    (`shared_inputs`), nor on chips with DRAM or in pods. `relayout_cycles` prices it,
    codegen follows the same map."""
    return _merging(graph, plans, chip, dtype, int_tensors, views or Views(graph))[0]


def _merging(graph: Graph, plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip, dtype: str,
             int_tensors: IntTensors, views: Views, fetch: bool = False
             ) -> tuple[dict[int, int], list[_Phase], frozenset[int]]:
    """`merged_phases`, every op's own phase (with ``fetch``, its routed weight fetches:
    `route_fetches`) and the hoisted fetches."""
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    sharing = _sharing(graph, plans, chip, dtype, int_tensors, views)
    shared = sharing[0]
    hoisted = hoisted_fetches(graph, plans, chip, dtype, int_tensors, views, sharing)
    parts = [_phase_of(graph, i, plans, chip, dtype, int_tensors, views, producer, shared,
                       fetch) for i in range(len(graph.ops))]
    merged: dict[int, int] = {}
    if chip.has_dram or chip.is_pod:
        return merged, parts, hoisted
    # the SRAM left after the kept copies; an op whose superstep takes the next op's fetch
    # (`hoisted_fetches`) is not spanned by an early buffer, so that the two never compete
    slack = _slack(plans, chip, views) if chip.is_mesh else list(sharing[1])
    keeping = {i for i, _ in shared} | {i - 1 for i, _ in shared}
    carried: dict[int, _Phase] = {}  # each carrier's phase with what it carries so far

    def alone(i: int) -> bool:
        return (not fetches(graph, i, plans[i], chip) and not graph.ops[i].extra
                and i not in hoisted and i not in keeping and parts[i].moves()
                and (not chip.is_mesh or routed_on(chip, plans[i])))

    candidates = [i for i in range(len(graph.ops)) if alone(i)]
    for m in candidates:
        moved = list(_moved_inputs(graph, m, producer, shared))
        after = max((j for _, j in moved), default=-1)
        n = next((c for c in candidates if after < c < m and c not in merged), None)
        if n is None:
            continue
        op = graph.ops[m]
        geo = geometry(graph, op, plans[m])
        early = sum(math.prod(geo.tile_shape(slot)) * element_bytes(op, slot, dtype, int_tensors)
                    for slot, _ in moved)
        if any(slack[k] < early or k + 1 in hoisted for k in range(n, m)):
            continue
        both = carried.get(n, parts[n]).with_(parts[m])
        if (_phase_cycles(graph, n, plans, chip, both, hoisted)
                >= _phase_cycles(graph, n, plans, chip, carried.get(n, parts[n]), hoisted)
                + _phase_cycles(graph, m, plans, chip, parts[m], hoisted)):
            continue
        carried[n] = both
        merged[m] = n
        for k in range(n, m):
            slack[k] -= early
    for n, part in carried.items():
        parts[n] = part
    for m in merged:
        parts[m] = _Phase.empty(chip)
    return merged, parts, hoisted


def relayout_cycles(graph: Graph, plans: tuple[OpPlan, ...] | list[OpPlan], chip: Chip,
                    dtype: str, int_tensors: IntTensors, views: Views | None = None,
                    fetch: bool = False) -> list[int]:
    """The re-layout cycles before every op for one choice of plans, all inputs of an op in
    one phase (exactly what the emulator measures on an all-to-all chip); an input that reads
    the previous op's copy (`shared_inputs`) moves nothing, and an op whose inputs move in an
    earlier op's phase (`merged_phases`) has none: they are priced in that phase. On a mesh,
    mesh-aware plans' exchanges are routed as codegen emits them, multicast trees and all
    (`meshmove`)."""
    from .meshmove import route_ahead  # (builds on this)

    views = views or Views(graph)
    _, parts, hoisted = _merging(graph, plans, chip, dtype, int_tensors, views, fetch)
    if chip.is_mesh:
        route_ahead(chip, [p for part in parts for p in (part.routed, part.fetched)])
    return [_phase_cycles(graph, i, plans, chip, part, hoisted) for i, part in enumerate(parts)]


def pod_fetches(graph: Graph, plans: tuple[OpPlan, ...], chip: Chip, dtype: str,
                int_tensors: IntTensors, views: Views) -> tuple[OpPlan, ...]:
    """The chosen plans, on a pod, with the bytes of their weight fetches that cross between
    chips counted element by element (`pod.element_cross`, `Views.fetch_crossing`) instead
    of estimated as spread evenly (`cost.fetch_estimate`): the fetch phase as the emulator
    times it. Elsewhere the plans as they are."""
    if not chip.is_pod:
        return plans
    consts = views.const_tensors()
    out = list(plans)
    for i, p in enumerate(plans):
        if not fetches(graph, i, p, chip):
            continue
        geo = geometry(graph, graph.ops[i], p)
        epi = epilogue_cost(geo.op, final_share(geo), chip, dtype, int_tensors, consts,
                            geo.shapes)
        estimate, _ = fetch_estimate(geo, chip, dtype, int_tensors, consts, p.home, epi)
        fetched = fetch_bytes(geo, chip, dtype, int_tensors, consts, p.home, epi)
        crossed = int(views.fetch_crossing(i, p, chip, dtype, int_tensors).max(initial=0))
        exact = chip.exchange_cycles(fetched, crossed) if fetched else 0
        out[i] = dataclasses.replace(p, cycles=dataclasses.replace(
            p.cycles, shift=p.cycles.shift - estimate + exact))
    return tuple(out)


def route_fetches(graph: Graph, plans: tuple[OpPlan, ...], chip: Chip, dtype: str,
                  int_tensors: IntTensors, views: Views | None = None
                  ) -> tuple[tuple[OpPlan, ...], list[int]] | None:
    """The chosen plans with their weight fetches routed, and the re-layout cycles with them.

    The solver prices a mesh plan's fetch from its weights' idle layout by an estimate, in
    the plan's own shift and sync (`cost.fetch_estimate`), which the emulator routes.
    Codegen sends the fetch after the re-layout, behind the same barrier. So for each routed
    plan (`routed_on`) that fetches, the estimate leaves the plan's cycles, and the fetch,
    routed as codegen emits it (`_fetched`), joins its re-layout phase: exact, as the
    re-layouts are; on a mesh with DRAM too (its epilogue weights are fetched so). Plans
    under the all-to-all assumption keep the estimate; None when no plan's fetch is routed
    (``relayout`` stands)."""
    if not chip.is_mesh:
        return None
    routed = [i for i, p in enumerate(plans) if routed_on(chip, p) and fetches(graph, i, p, chip)]
    if not routed:
        return None
    views = views or Views(graph)
    consts = views.const_tensors()
    out = list(plans)
    for i in routed:
        p = plans[i]
        shift, sync = fetch_estimate(geometry(graph, graph.ops[i], p), chip, dtype, int_tensors,
                                     consts, p.home)
        out[i] = dataclasses.replace(p, cycles=dataclasses.replace(
            p.cycles, shift=p.cycles.shift - shift, sync=p.cycles.sync - sync))
    chosen = tuple(out)
    return chosen, relayout_cycles(graph, chosen, chip, dtype, int_tensors, views, fetch=True)
