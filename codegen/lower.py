"""Codegen: `Graph` + verified `Plan` + `Chip` -> SPMD `Program`.

Per op, in order:

1. allocate the output accumulator (below the inputs: it lives longer), then bring each input
   into the plan's layout: weights are loaded once before the run (all of them first, at the
   bottom of SRAM) and stay resident; graph inputs are loaded from the host; activations are
   re-laid out from wherever their producer left them by one ``Exchange`` per input after one
   barrier (the element tables are computed here, through any Reshape/Transpose views in
   between). When the producer's buffer already is the wanted layout on every core, it is used
   in place;
2. initialise the accumulator of a reduction and allocate a receive buffer per rotating
   operand;
3. for each step: one ``Compute`` per core; then, where a rotating operand's axis advances, a
   barrier and one ``Shift`` per moving operand from its ring source;
4. when several cores hold partial sums of the same output block, a barrier and a
   reduce-scatter;
5. record where every element of the result lives (its placement), and free what is dead.

Buffers get SRAM offsets from a first-fit allocator over live intervals (the same address on
every core, as the program is SPMD).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.digest import digest_of
from t10c.dtypes import dtype_bytes, on_chip_dtype
from t10c.elementwise import COMBINES
from t10c.ir import Graph, TensorExpr, distinct_rows, map_to_root, tile_elements
from t10c.multicast import distinct, prefer_multicast
from t10c.partition import Geometry, Plan, geometry
from t10c.partition.collectives import Scatter, chunk_elements, scatter_of
from t10c.partition.cost import fetches_epilogue_weights, idle_cores, spread_owner
from t10c.partition.dram import appended, dram_operands, store_waits, tail_index
from t10c.partition.space import tensor_sets
from t10c.partition.transitions import Views, hoisted_fetches, merged_phases, shared_inputs

from .epilogue import epilogue_index, extra_elements, program_exprs
from .memory import ALIGN, Layout, Rect, aligned, layout
from .pattern import (
    Pattern,
    encode,
    from_table,
    multicast_trees,
    received,
    spread_pattern,
)
from .program import (
    Alloc,
    Buffer,
    Compute,
    DmaLoad,
    DmaStore,
    DmaWait,
    Exchange,
    Fill,
    Free,
    Instr,
    Load,
    Program,
    Reduce,
    Shift,
    Store,
    Sync,
    exchange,
    indexed_load,
    pattern_load,
)


class CodegenError(RuntimeError):
    """A plan that codegen cannot honour (a bug upstream, reported with the op's name)."""


class StreamedOverflow(CodegenError):
    """A streamed program's online first-fit placed a buffer past the SRAM: `streamed_layout`
    lays the whole program out offline instead (best-fit, CP-SAT repair)."""


@dataclass(frozen=True)
class Placement:
    """Where each element of a (root) tensor lives: buffer, and per element core and offset."""

    buf: int
    core: np.ndarray  # int32 [numel]
    off: np.ndarray  # int32 [numel]


@dataclass
class _Cached:
    """An op's result and timing, for repeated layers in streamed (timing-only) runs."""

    elems: int
    dtype: str
    core: np.ndarray
    off: np.ndarray
    cores: np.ndarray  # the cores holding the result
    records: list = dataclasses.field(default_factory=list)  # the op's timeline records
    link_bytes: object = None  # the link loads the op added (the emulator's, sparse)
    #: the inputs of later ops it received early (`merged_phases`): (ops ahead, input,
    #: elements, dtype) of each buffer, None for an input read in place
    early: tuple[tuple[int, int, int | None, str], ...] = ()


class _Allocator:
    """The online first-fit allocator, or, given ``fixed`` addresses (an offline layout of
    the same program, by buffer id), one that hands those out."""

    def __init__(self, sram: int, fixed: tuple[int, ...] | None = None) -> None:
        self.sram = sram
        self.fixed = fixed
        self.live: dict[int, tuple[int, int]] = {}
        self.peak = 0

    def alloc(self, buf_id: int, nbytes: int) -> int:
        size = aligned(nbytes)
        if self.fixed is not None:
            return self._take(buf_id, self.fixed[buf_id], size)
        return self._take(buf_id, self._lowest_gap(size), size)

    def _lowest_gap(self, size: int, spans: Iterable[tuple[int, int]] | None = None) -> int:
        """The offset of the lowest free gap of ``size`` bytes between the live buffers (or
        ``spans``), past every one of them if none holds it."""
        offset = 0
        for start, end in sorted(self.live.values() if spans is None else spans):
            if start - offset >= size:
                break
            offset = max(offset, end)
        return offset

    def _highest_gap(self, size: int, top: int,
                     spans: Iterable[tuple[int, int]] | None = None) -> int | None:
        """The offset of the highest free gap of ``size`` bytes ending at most at ``top``
        between the live buffers (or ``spans``)."""
        top = top // ALIGN * ALIGN
        for start, end in sorted(self.live.values() if spans is None else spans,
                                 key=lambda r: -r[1]):
            if end <= top - size:
                break
            top = min(top, start // ALIGN * ALIGN)
        return top - size if top >= size else None

    def fit_top(self, sizes: list[int]) -> bool:
        """Whether buffers of ``sizes`` bytes, placed one after the other as `alloc_top`
        would place them, all end within the SRAM (nothing is allocated)."""
        if self.fixed is not None:
            return True
        spans = list(self.live.values())
        for nbytes in sizes:
            size = aligned(nbytes)
            offset = self._top_gap(size, spans)
            if offset + size > self.sram:
                return False
            spans.append((offset, offset + size))
        return True

    def _take(self, buf_id: int, offset: int, size: int) -> int:
        self.live[buf_id] = (offset, offset + size)
        self.peak = max(self.peak, offset + size)
        return offset

    def alloc_top(self, buf_id: int, nbytes: int) -> int:
        """The highest free gap that holds ``nbytes`` (first-fit from the bottom when none
        does): DRAM preloads live across several ops, and placing them at the top keeps them
        out of the way of the buffers that come and go below."""
        if self.fixed is not None:
            return self.alloc(buf_id, nbytes)
        size = aligned(nbytes)
        return self._take(buf_id, self._top_gap(size), size)

    def _top_gap(self, size: int, spans: list[tuple[int, int]] | None = None) -> int:
        """Where `alloc_top` places ``size`` bytes between the live buffers (or ``spans``):
        the highest free gap that holds them, else the lowest."""
        offset = self._highest_gap(size, self.sram, spans)
        return self._lowest_gap(size, spans) if offset is None else offset

    def alloc_high(self, buf_id: int, nbytes: int) -> int:
        """The highest free gap below the layout's peak so far (not raising it, so that the
        footprint stays what the buffers need), else `alloc_top`: for a buffer that lives
        across two ops (a hoisted fetch)."""
        size = aligned(nbytes)
        offset = None if self.fixed is not None else self._highest_gap(size, self.peak)
        return self.alloc_top(buf_id, nbytes) if offset is None else self._take(
            buf_id, offset, size)

    def free(self, buf_id: int) -> None:
        del self.live[buf_id]


class _Builder:
    def __init__(self, graph: Graph, plan: Plan, chip: Chip,
                 sink: Callable[[Instr], None] | None = None,
                 progress: Callable[[str, int, int], None] | None = None,
                 fixed: Layout | None = None) -> None:
        self.graph, self.plan, self.chip = graph, plan, chip
        self.progress = progress
        #: streaming: every instruction goes to ``sink`` as soon as its op is done and is not
        #: kept (timing-only runs of chips too large to hold the whole program)
        self.sink = sink
        #: streaming with an offline layout of the whole program (`streamed_layout`): its
        #: addresses by buffer id, so every op is generated (a replayed op would skip buffers)
        self.fixed = fixed
        #: whether a Compute carries its per-core slice tables (offsets, origin): a streamed
        #: program is timed or laid out, never run on data, and neither reads them (a
        #: wafer's ops have them for hundreds of thousands of cores at every step); it gets
        #: tables of no columns instead, which no program kept or verified ever holds
        self.tables = sink is None
        self.replays = hasattr(sink, "replay") and fixed is None
        #: a streamed run's online first-fit must fit as it goes (`StreamedOverflow`)
        self.check_fit = sink is not None and fixed is None
        self.keys: dict[str, tuple] = {}  # streaming: the op key behind each activation
        self.cache: dict[tuple, _Cached] = {}
        self.dtype = plan.dtype
        self.buffers: list[Buffer] = []
        self.instrs: list[Instr] = []
        self.alloc = _Allocator(chip.sram_bytes_per_core,
                                None if fixed is None else fixed.offsets)
        self.placement: dict[str, Placement] = {}
        self.pending: dict[str, int] = {}  # consumer reads left of each activation
        self.weights: dict[tuple[int, int], int] = {}  # (op, input) -> resident buffer
        self.extra_weights: dict[tuple[int, int], int] = {}  # (op, extra) -> resident buffer
        #: view tables by their chain of views, so that repeated layers share one (a KV
        #: cache's views are millions of elements; per tensor, they grew by the layer)
        self.views = Views(graph)
        self.view_digests: dict[tuple, bytes] = {}
        self.home: dict[str, Placement] = {}  # vgm: where each weight lives
        self.idle: dict[str, Placement] = {}  # where each epilogue weight waits
        #: (core, offset) of every element of a weight spread by `load_home`, by its sizes
        self.spread: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        #: chips with DRAM: (op, input) -> the buffer its DMA load fills, and per op the ops
        #: whose loads are issued at its start (`Plan.dram_issue`)
        self.dma: dict[tuple[int, int], int] = {}
        self.issued_at: dict[int, list[int]] = {}
        #: inputs that read the previous op's re-laid copy (`transitions.shared_inputs`): per
        #: (op, slot) of the keeping op, the (next op, slot) that takes it over; and the
        #: copies kept for the next op, by (op, slot) of their reader
        ints = tensor_sets(graph)[0]
        shared = shared_inputs(graph, plan.ops, chip, plan.dtype, ints)
        self.shared = frozenset(shared)
        self.keeps = {(i - 1, s): (i, slot) for (i, slot), s in shared.items()}
        self.kept: dict[tuple[int, int], int] = {}
        #: ops whose epilogue weights are fetched in the previous op's reduce-scatter
        #: superstep (`transitions.hoisted_fetches`), and those buffers by (op, extra)
        self.hoisted = hoisted_fetches(graph, plan.ops, chip, plan.dtype, ints)
        self.prefetched: dict[tuple[int, int], tuple[int, bool]] = {}
        self.hoisting = False  # allocating the buffers of a hoisted fetch (`prefetch`)
        #: ops whose inputs move in an earlier op's re-layout phase
        #: (`transitions.merged_phases`): per carrying op the ops it carries, and the buffers
        #: received early by (op, input)
        self.merged = merged_phases(graph, plan.ops, chip, plan.dtype, ints)
        self.carries: dict[int, list[int]] = {}
        for m, by in sorted(self.merged.items()):
            self.carries.setdefault(by, []).append(m)
        self.early: dict[tuple[int, int], tuple[int, bool]] = {}
        #: repeated layers: what an op's instructions are computed from (its geometry, the
        #: placement and layout of what it reads) gives the same tables, computed once
        self.memo: dict[tuple, object] = {}
        self.digests: dict[int, tuple[np.ndarray, bytes]] = {}
        self.geo_keys: dict[int, tuple] = {}
        #: per (pattern, cores, element size): (the pattern, kept alive, whether multicast)
        self.mcast: dict[tuple, tuple[Pattern, bool]] = {}
        for k, j in enumerate(plan.dram_issue):
            if j >= 0:
                self.issued_at.setdefault(j, []).append(k)
        #: where each op's DRAM loads were issued: the plan's points, or later where a
        #: streamed run's online first-fit could not place a preload at its point (`issue_dram`)
        self.issued = list(plan.dram_issue)
        #: chips with DRAM write every graph output back (`partition.dram.store_waits`): the
        #: producers whose stores each op waits for before it starts (len(ops): the end)
        self.store_wait: dict[int, list[int]] = {}
        if chip.has_dram:
            waits = store_waits(graph, plan.dram_schedule == "basic")
            if plan.dram_store_wait:  # where the schedule put them
                waits = {k: w for k, w in enumerate(plan.dram_store_wait) if w >= 0}
            for k, w in sorted(waits.items()):
                self.store_wait.setdefault(w, []).append(k)
        self.written_back = frozenset(k for ks in self.store_wait.values() for k in ks)

    # -- buffers --------------------------------------------------------------------------
    def new_buffer(self, name: str, elems: int, dtype: str, op: str, phase: str) -> int:
        bid = len(self.buffers)
        # DRAM preloads and hoisted fetches live across ops: high, out of the way of the
        # buffers that come and go below (the online first-fit is a streamed run's layout;
        # bert-large at batch 4 overflowed when a hoisted fetch took the lowest gap)
        place = (self.alloc.alloc_top if phase == "dram" else
                 self.alloc.alloc_high if self.hoisting else self.alloc.alloc)
        offset = place(bid, elems * dtype_bytes(dtype))
        if self.check_fit and offset + aligned(elems * dtype_bytes(dtype)) > self.alloc.sram:
            raise StreamedOverflow(f"{op}: the online first-fit put buffer %{name} at "
                                   f"[{offset}, {offset + elems * dtype_bytes(dtype)}), past "
                                   f"the {self.alloc.sram}-byte SRAM")
        self.buffers.append(Buffer(bid, name, elems, dtype, offset))
        self.instrs.append(Alloc(op, phase, bid))
        return bid

    def free(self, bid: int, op: str) -> None:
        self.alloc.free(bid)
        self.instrs.append(Free(op, "free", bid))

    def storage(self, tensor: str) -> str:
        return on_chip_dtype(self.graph.tensors[tensor].dtype, self.dtype)

    # -- element tables -------------------------------------------------------------------
    def to_root(self, tensor: str) -> np.ndarray:
        """For a view, the flat index in its root of each of its elements (cached, shared by
        views of the same chain: `partition.transitions.Views`)."""
        table = self.views.to_root(tensor)
        assert table is not None, f"{tensor} is not a view"
        return table

    def view_digest(self, tensor: str) -> bytes:
        """A digest of a view's table: of its chain of views (the shapes and permutations
        that make the table), so that the table is not built to be digested (a KV cache's
        through its transpose: 335 M elements at batch 32 with 2,048 tokens)."""
        key = self.views.chain(tensor)
        if key not in self.view_digests:
            self.view_digests[key] = digest_of(repr(key).encode())
        return self.view_digests[key]

    def geo_key(self, n: int, op: TensorExpr) -> tuple:
        """What op n's geometry is a function of (its expression, plan and tensor shapes):
        equal for repeated layers."""
        if n not in self.geo_keys:
            plan = self.plan.ops[n].unnamed
            shapes = tuple(self.graph.tensors[o.tensor].shape for o in (*op.operands, *op.extra))
            self.geo_keys[n] = (op.signature(), plan, shapes)
        return self.geo_keys[n]

    def digest(self, arr: np.ndarray) -> bytes:
        """A digest of ``arr``'s contents, once per array object (kept alive beside it, so
        that its id is not reused)."""
        hit = self.digests.get(id(arr))
        if hit is None:
            d = digest_of(np.ascontiguousarray(arr))
            hit = self.digests[id(arr)] = (arr, arr.dtype.str.encode() + d)
        return hit[1]

    def multicast(self, pattern: Pattern, geo: Geometry, itemsize: int) -> bool:
        """Whether an exchange by ``pattern`` into op ``geo``'s cores goes as multicast trees
        (meshes, where that is faster than its unicasts: `t10c.multicast.prefer_multicast`,
        the planner's rule too); decided once per pattern (repeated layers share them)."""
        if not self.chip.is_mesh:
            return False
        # (the cores' digest is not kept by array: every op's ``phys`` would stay alive)
        key = (id(pattern), digest_of(np.ascontiguousarray(geo.phys)), itemsize)
        hit = self.mcast.get(key)
        if hit is None:
            spelt, _ = multicast_trees(pattern, geo.phys)
            if spelt is None:  # relayed from its groups
                hit = (pattern, True)
            else:
                tree, src, dst, count, group = spelt
                hit = (pattern, prefer_multicast(self.chip, tree, src, dst, count * itemsize,
                                                 group))
            self.mcast[key] = hit
        return hit[1]

    def source_key(self, place: Placement, tensor: str) -> tuple:
        """Where the elements of ``tensor`` (read through its views) come from, by content."""
        view = self.view_digest(tensor) if self.graph.root(tensor) != tensor else b""
        src = self.buffers[place.buf]
        return (self.digest(place.core), self.digest(place.off), src.elems, src.dtype, view)

    def element_map(self, geo: Geometry, index: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(flat element of the operand's tensor per buffer element, validity), per core."""
        shape = self.graph.tensors[geo.op.operands[index].tensor].shape
        return tile_elements(geo.tile_origin(index, step), geo.tile_shape(index), shape)

    def bring_input(self, op: TensorExpr, geo: Geometry, index: int, moves: list[Exchange],
                    warm_up: bool = False, key: tuple | None = None) -> tuple[int, bool]:
        """Emit what puts input ``index`` in place; returns (buffer, owned by this op).
        ``key`` (`geo_key`) lets an activation's tables be those of an earlier op with the
        same geometry reading the same placement (repeated layers)."""
        operand = op.inputs[index]
        dtype = self.storage(operand.tensor)
        name = f"{op.name}.in{index}"
        root = self.graph.root(operand.tensor)
        home = warm_up and root in self.home
        if not home and (root in self.graph.constants or root in self.graph.inputs):
            phase = "resident" if root in self.graph.constants else "host"
            tile = geo.tile_shape(index)
            elems = math.prod(tile)
            bid = self.new_buffer(name, elems, dtype, op.name, phase)
            shape = self.graph.tensors[root].shape
            if root == operand.tensor:
                # (streamed: timed or laid out, never run, so no load's tiles are read: a
                # row per core of no columns, as a Compute's tables; a wafer's weights had
                # origins for hundreds of thousands of cores each)
                origin = geo.tile_origin(index, 0).astype(np.int32) if self.tables else \
                    np.empty((geo.ncores, 0), dtype=np.int32)
                self.instrs.append(Load(op.name, phase, bid, root, shape, tile, origin, None,
                                        _cores(geo)))
            else:  # through a view: element by element, each distinct tile once
                uniq, inverse = distinct_rows(geo.tile_origin(index, 0).astype(np.int32))
                flat, valid = tile_elements(uniq, tile, self.graph.tensors[operand.tensor].shape)
                table = np.where(valid, self.to_root(operand.tensor)[flat], -1)
                self.instrs.append(indexed_load(op.name, phase, bid, root, shape, elems, table,
                                                inverse, _cores(geo)))
            return bid, root not in self.graph.constants
        if home:
            place = self.home[root]
        elif root not in self.placement:
            raise CodegenError(f"{op.name}: input {operand.tensor} has not been computed")
        else:
            place = self.placement[root]
        memo: tuple | None = None if key is None else \
            ("in", key, index, home, dtype, self.source_key(place, operand.tensor))
        hit = self.memo.get(memo) if memo is not None else None
        if hit is None:
            hit = self.moved_elements(op, geo, index, place, dtype, home)
            if memo is not None:
                self.memo[memo] = hit
        moved: tuple[int, Pattern | None] = hit  # type: ignore[assignment]
        elems, pattern = moved
        if pattern is None:
            return place.buf, False
        phase = "fetch" if home else "relayout"
        bid = self.new_buffer(name, elems, dtype, op.name, phase)
        moves.append(exchange(op.name, phase, bid, place.buf, pattern, elems, _cores(geo),
                              self.multicast(pattern, geo, dtype_bytes(dtype))))
        return bid, True

    def moved_elements(self, op: TensorExpr, geo: Geometry, index: int, place: Placement,
                       dtype: str, home: bool) -> tuple[int, Pattern | None]:
        """(elements per core, the copy pattern) that bring activation input ``index`` from
        ``place`` into the plan's layout; no pattern when it already lies there."""
        operand = op.inputs[index]
        # each distinct tile's elements once: replicas of a tile receive the same elements
        uniq, inverse = distinct_rows(geo.tile_origin(index, 0))
        flat, valid = tile_elements(uniq, geo.tile_shape(index),
                                    self.graph.tensors[operand.tensor].shape)
        if self.graph.root(operand.tensor) != operand.tensor:
            flat = self.to_root(operand.tensor)[flat]
        elems = flat.shape[1]
        src_core = np.where(valid, place.core[flat], -1).astype(np.int32, copy=False)
        src_off = np.where(valid, place.off[flat], -1).astype(np.int32, copy=False)
        src = self.buffers[place.buf]
        # in place: every core's own tile (so no two cores share one), where it already lies
        in_place = (len(uniq) == geo.ncores and valid.all() and src.elems == elems
                    and src.dtype == dtype and geo.rotation_axis(index) is None
                    and (src_core[inverse] == geo.phys[:, None]).all()
                    and (src_off == np.arange(elems)[None, :]).all())
        if in_place and not home:
            return elems, None
        return elems, encode(src_core, src_off, inverse)

    # -- one op ---------------------------------------------------------------------------
    def load_weights(self, n: int, op: TensorExpr) -> None:
        """Load op n's constant inputs once, before the run: they stay resident at the bottom
        of SRAM, below everything that comes and goes. With ``home`` (warm-up) each weight
        is loaded once, spread evenly over all cores, and ops fetch from there."""
        for i, operand in enumerate(op.inputs):
            root = self.graph.root(operand.tensor)
            if root not in self.graph.constants or self.plan.ops[n].dram_weights:
                continue  # (weights in DRAM are loaded before each run: `issue_dram`)
            if self.plan.ops[n].home:
                if root not in self.home:
                    self.home[root] = self.load_home(root, op.name)
            else:
                geo = geometry(self.graph, op, self.plan.ops[n])
                self.weights[n, i] = self.bring_input(op, geo, i, [])[0]
        weights = [k for k, o in enumerate(op.extra)
                   if self.graph.root(o.tensor) in self.graph.constants]
        if weights and fetches_epilogue_weights(self.chip):  # fetched by each run
            for k in weights:
                root = self.graph.root(op.extra[k].tensor)
                if root not in self.idle:
                    self.idle[root] = self.load_home(root, op.name, idle_cores(self.chip))
        elif weights:  # one core, or a wafer: resident beside the result
            geo = geometry(self.graph, op, self.plan.ops[n])
            key = self.geo_key(n, op)
            flat, valid = self.final_elements(op, geo, key)[:2]
            for k in weights:
                self.extra_weights[n, k] = self.bring_extra(op, geo, k, flat, valid, [],
                                                            key)[0]

    def bring_extra(self, op: TensorExpr, geo: Geometry, k: int, flat: np.ndarray,
                    valid: np.ndarray, moves: list[Exchange], key: tuple | None = None
                    ) -> tuple[int, bool]:
        """Put epilogue operand ``extra[k]`` element for element beside the op's finished
        result (``flat``, ``valid``: `final_elements`); returns (buffer, owned by this op).
        Weights are fetched from their compact idle layout (`partition.cost.epilogue_cost`
        says why; loaded once before the run on a one-core chip), graph inputs loaded from
        the host, activations exchanged; all with the op's other inputs (one barrier)."""
        operand = op.extra[k]
        root = self.graph.root(operand.tensor)
        view = self.view_digest(operand.tensor) if root != operand.tensor else b""
        memo: tuple | None = None if key is None else ("extra", key, k, view)
        idx = self.memo.get(memo) if memo is not None else None
        if idx is None:
            idx = extra_elements(self.graph, op, k, flat, valid)
            if root != operand.tensor:
                idx = np.where(idx >= 0, self.to_root(operand.tensor)[np.maximum(idx, 0)], -1)
            if memo is not None:
                self.memo[memo] = idx
        assert isinstance(idx, np.ndarray)
        elems = flat.shape[1]
        bid = -1
        home = root in self.idle
        if not home and (root in self.graph.constants or root in self.graph.inputs):
            phase = "resident" if root in self.graph.constants else "host"
            bid = self.new_buffer(f"{op.name}.x{k}", elems, self.storage(operand.tensor),
                                  op.name, phase)
            # (`indexed_load`'s pattern, once for repeated layers)
            memo = None if key is None else ("extra-load", key, k, view)
            load = self.memo.get(memo) if memo is not None else None
            if load is None:
                load = encode(np.where(idx >= 0, 0, -1), idx, None)
                if memo is not None:
                    self.memo[memo] = load
            assert isinstance(load, Pattern)
            self.instrs.append(pattern_load(op.name, phase, bid, root,
                                            self.graph.tensors[root].shape, elems, load,
                                            _cores(geo)))
            return bid, root not in self.graph.constants
        if home:
            place = self.idle[root]
        elif root not in self.placement:
            raise CodegenError(f"{op.name}: input {operand.tensor} has not been computed")
        else:
            place = self.placement[root]
        memo = None if key is None else \
            ("extra-from", key, k, self.source_key(place, operand.tensor))
        pattern = self.memo.get(memo) if memo is not None else None
        if pattern is None:
            hit = np.maximum(idx, 0)
            src_core = np.where(idx >= 0, place.core[hit], -1).astype(np.int32)
            src_off = np.where(idx >= 0, place.off[hit], -1).astype(np.int32)
            pattern = from_table(src_core, src_off)
            if memo is not None:
                self.memo[memo] = pattern
        assert isinstance(pattern, Pattern)
        phase = "fetch" if home else "relayout"
        bid = self.new_buffer(f"{op.name}.x{k}", elems, self.storage(operand.tensor), op.name,
                              phase)
        moves.append(exchange(op.name, phase, bid, place.buf, pattern, elems, _cores(geo),
                              self.multicast(pattern, geo,
                                             dtype_bytes(self.storage(operand.tensor)))))
        return bid, True

    def load_home(self, tensor: str, op: str, over: range | None = None) -> Placement:
        """Element e of ``tensor`` on the (e // chunk)-th core of ``over`` (default: all
        cores) at offset e % chunk; the other cores hold padding."""
        numel = self.graph.tensors[tensor].numel
        over = over if over is not None else range(self.chip.cores)
        # built from its runs, not from a cores x chunk table (bert-large: 11 s of codegen)
        spread, chunk = spread_pattern(numel, self.chip.cores, over)
        bid = self.new_buffer(f"{tensor}.home", chunk, self.storage(tensor), op, "resident")
        shape = self.graph.tensors[tensor].shape
        self.instrs.append(pattern_load(op, "resident", bid, tensor, shape, chunk, spread,
                                        None))
        # where each element lies depends on the sizes only: weights of one shape share the
        # arrays (read-only), and their digests (bert-large: 1.8 GB and 3.6 s less)
        key = (numel, over.start, over.stop)
        if key not in self.spread:
            idx = np.arange(numel)
            self.spread[key] = (_frozen(spread_owner(numel, over).astype(np.int32)),
                                _frozen((idx % chunk).astype(np.int32)))
        return Placement(bid, *self.spread[key])

    # -- repeated layers (streaming) ----------------------------------------------------------
    def op_key(self, n: int, op: TensorExpr) -> tuple:
        """What op n's instructions depend on, buffer numbers aside: its expression and plan,
        and for each input where it comes from (a weight, a graph input, or the output of an
        op with the same expression and plan, read through the same view: where a result
        lies depends only on its producer's plan). Repeated layers share keys."""
        plan = self.plan.ops[n].unnamed
        sources = tuple(self.read_key(operand.tensor) for operand in op.reads)
        nin = len(op.inputs)
        return (op.signature(), plan, sources,
                tuple((n, i) in self.shared for i in range(nin)),
                tuple((n, i) in self.keeps for i in range(nin)), n in self.hoisted,
                n + 1 in self.hoisted, n in self.merged,
                tuple((m - n, self.early_key(m)) for m in self.carries.get(n, ())))

    def read_key(self, tensor: str) -> tuple:
        """Where an op's read of ``tensor`` comes from, buffer numbers aside: a weight, a graph
        input, or the output of an op with the same expression and plan (its key), each
        through the same view."""
        root = self.graph.root(tensor)
        view = self.view_digest(tensor) if root != tensor else b""
        if root in self.graph.constants:
            return ("weight", view)
        if root in self.graph.inputs:
            return ("input", self.graph.tensors[root].shape, view)
        return ("act", self.keys.get(root), view)

    def early_key(self, m: int) -> tuple:
        """What the inputs of op m that an earlier op brings depend on (`op_key`'s terms)."""
        op = self.graph.ops[m]
        return (op.signature(), self.plan.ops[m].unnamed,
                tuple((i, self.read_key(op.inputs[i].tensor)) for i in self.early_inputs(m)))

    def replay(self, n: int, op: TensorExpr, cached: _Cached) -> None:
        """Op n's timing is that of an earlier op with the same key: take its records and
        its result's placement instead of generating the instructions again."""
        out = self.new_buffer(f"{op.name}.out", cached.elems, cached.dtype, op.name, "compute")
        self.drain()
        self.sink.replay(op.name, cached)  # type: ignore[union-attr]
        self.sink.written(out, cached.cores)  # type: ignore[union-attr]
        self.replay_kept(n, op)
        self.replay_early(n, op, cached)
        self.free_dram(n)
        for operand in op.reads:
            root = self.graph.root(operand.tensor)
            if root in self.pending:
                self.pending[root] -= 1
                if self.pending[root] == 0:
                    self.free(self.placement[root].buf, op.name)
        self.placement[op.output.tensor] = Placement(out, cached.core, cached.off)

    def replay_early(self, n: int, op: TensorExpr, cached: _Cached) -> None:
        """A replayed op's share of the merged phases (`merged_phases`): the buffers it
        received early are freed, and those it brings for later ops are allocated, as
        written, where its own instructions would have left them."""
        for i in range(len(op.inputs)):
            took = self.early.pop((n, i), None)
            if took is not None and took[1]:
                self.free(took[0], op.name)
        for ahead, i, elems, dtype in cached.early:
            m = n + ahead
            later = self.graph.ops[m]
            if elems is None:  # read in place
                self.early[m, i] = (self.placement[self.graph.root(later.inputs[i].tensor)].buf,
                                    False)
                continue
            self.hoisting = True  # where `bring_early` put it
            bid = self.new_buffer(f"{later.name}.in{i}", elems, dtype, later.name, "relayout")
            self.hoisting = False
            self.drain()
            geo_m = geometry(self.graph, later, self.plan.ops[m])
            self.sink.written(bid, geo_m.phys)  # type: ignore[union-attr]
            self.early[m, i] = (bid, True)

    def replay_kept(self, n: int, op: TensorExpr) -> None:
        """A replayed op's share of the kept copies (`transitions.shared_inputs`): the copy it
        took from the previous op is freed or passed on, and a copy it keeps for the next op
        is allocated, as written, where the op's own instructions would have left it."""
        for k in range(len(op.extra)):  # epilogue weights the previous op fetched
            if (n, k) in self.prefetched:
                bid, own = self.prefetched.pop((n, k))
                if own:
                    self.free(bid, op.name)
        if n + 1 in self.hoisted:  # this op fetches the next op's, as written
            m = n + 1
            after = self.graph.ops[m]
            geo_m = geometry(self.graph, after, self.plan.ops[m])
            elems = self.final_elements(after, geo_m, self.geo_key(m, after))[0].shape[1]
            for k, extra in enumerate(after.extra):
                if (m, k) in self.extra_weights:
                    continue
                self.hoisting = True  # where `prefetch` put it
                bid = self.new_buffer(f"{after.name}.x{k}", elems, self.storage(extra.tensor),
                                      after.name, "fetch")
                self.hoisting = False
                self.drain()
                self.sink.written(bid, geo_m.phys)  # type: ignore[union-attr]
                self.prefetched[m, k] = (bid, True)
        geo = None
        for i, operand in enumerate(op.inputs):
            took = self.kept.pop((n, i), None)
            nxt = self.keeps.get((n, i))
            if nxt is None:
                if took is not None:
                    self.free(took, op.name)
                continue
            if took is None:
                geo = geo or geometry(self.graph, op, self.plan.ops[n])
                took = self.new_buffer(f"{op.name}.in{i}", math.prod(geo.tile_shape(i)),
                                       self.storage(operand.tensor), op.name, "relayout")
                self.drain()
                self.sink.written(took, geo.phys)  # type: ignore[union-attr]
            self.kept[nxt] = took

    # -- off-chip memory ----------------------------------------------------------------------
    def issue_dram(self, j: int) -> None:
        """At op j's start: the DMA loads of every op whose loads the schedule issues here,
        each into a fresh buffer in that op's layout (the preload footprint).

        In a streamed run (online first-fit), a preload that the layout cannot place within
        the SRAM here (the schedule counts bytes, and the buffers already placed leave no gap
        large enough) is issued at the next op instead, and so are the loads queued behind it
        (the queue is first-in first-out); an op's own loads are issued at its start whatever
        happens. `issued` says where each was issued."""
        pending = self.issued_at.get(j, [])
        for at, k in enumerate(pending):
            if k > j and self.check_fit and not self.alloc.fit_top(self.preload_bytes(k)):
                later = pending[at:]
                self.issued_at[j + 1] = later + self.issued_at.get(j + 1, [])
                for m in later:
                    self.issued[m] = j + 1
                del pending[at:]
                break
            op = self.graph.ops[k]
            p = self.plan.ops[k]
            geo = geometry(self.graph, op, p)
            for i in dram_operands(self.graph, op, p.dram_weights):
                operand = op.inputs[i]
                root = self.graph.root(operand.tensor)
                tile = geo.tile_shape(i)
                bid = self.new_buffer(f"{op.name}.in{i}", math.prod(tile),
                                      self.storage(operand.tensor), self.graph.ops[j].name,
                                      "dram")
                # tiles of the tensor as the op reads it (through a reshape, or a transpose
                # between reshapes: `Load.read_as`); through several transposes, a table of
                # every element
                table = None
                shape = self.graph.tensors[operand.tensor].shape
                transposed = self.graph.transposed(operand.tensor)
                if transposed is None and not self.graph.in_order(operand.tensor):
                    shape = self.graph.tensors[root].shape
                    flat, valid = self.element_map(geo, i, 0)
                    table = np.where(valid, self.to_root(operand.tensor)[flat],
                                     -1).astype(np.int32)
                src_shape, perm = transposed or ((), ())
                self.instrs.append(DmaLoad(
                    self.graph.ops[j].name, "dram", bid, root, shape,
                    tile, geo.tile_origin(i, 0).astype(np.int32), table, _cores(geo),
                    src_shape=src_shape, perm=perm))
                self.dma[k, i] = bid

    def preload_bytes(self, k: int) -> list[int]:
        """The bytes per core of each buffer op k's DMA loads fill (`issue_dram`)."""
        op, p = self.graph.ops[k], self.plan.ops[k]
        geo = geometry(self.graph, op, p)
        return [math.prod(geo.tile_shape(i)) * dtype_bytes(self.storage(op.inputs[i].tensor))
                for i in dram_operands(self.graph, op, p.dram_weights)]

    def wait_dram(self, n: int) -> None:
        """Before op n: wait for its DMA loads to land."""
        for (k, _), bid in sorted(self.dma.items()):
            if k == n:
                self.instrs.append(DmaWait(self.graph.ops[n].name, "dram", bid))

    def free_dram(self, n: int, live: list[int] | None = None) -> None:
        """After op n: free the buffers its DMA loads filled (or, for a rotated operand, the
        one of its pair that is still live: ``live`` per input)."""
        for (k, i), bid in sorted(self.dma.items()):
            if k != n:
                continue
            buf = bid if live is None else live[i]
            if buf in self.alloc.live:
                self.free(buf, self.graph.ops[n].name)
            del self.dma[k, i]

    def store_dram(self, n: int) -> None:
        """After op n: write its graph outputs back to DRAM (`DmaStore`), on the DMA queue."""
        if n not in self.written_back:
            return
        op = self.graph.ops[n]
        phys = geometry(self.graph, op, self.plan.ops[n]).phys.astype(np.int32)
        for t in self.graph.outputs:
            written = self.graph.written(t)  # an output grown in place: its new rows
            if self.graph.root(written) != op.output.tensor:
                continue
            shape = self.graph.tensors[t].shape
            grown = appended(self.graph, t)  # a KV cache: only the new rows are written
            index = None if grown is None else tail_index(shape, grown[1], grown[2])
            # the values: an output grown in place stores its new rows, whose own order is
            # the index's; any other output, the elements the index picks of it
            flat = np.arange(self.graph.tensors[written].numel) if written != t else \
                np.arange(math.prod(shape)) if index is None else index
            root, rflat = map_to_root(self.graph, written, flat)
            place = self.placement[root]
            self.instrs.append(DmaStore(
                op.name, "dram", t, shape, place.buf, place.core[rflat], place.off[rflat],
                self.storage(t), phys, index=None if index is None else index.astype(np.int32),
                base=grown[0] if grown is not None else ""))

    def wait_stores(self, n: int) -> None:
        """Before op n (or at the end, n = len(ops)): wait for the write-backs due here, and
        free the results no op reads any more."""
        name = self.graph.ops[min(n, len(self.graph.ops) - 1)].name
        for k in self.store_wait.get(n, ()):
            root = self.graph.ops[k].output.tensor
            buf = self.placement[root].buf
            self.instrs.append(DmaWait(name, "dram", buf))
            self.pending[root] -= 1
            if self.pending[root] == 0 and n < len(self.graph.ops):
                self.free(buf, name)

    def emit_op(self, n: int, op: TensorExpr) -> None:
        self.wait_stores(n)
        self.issue_dram(n)
        self.wait_dram(n)
        if not self.replays:
            return self.generate_op(n, op)
        key = self.op_key(n, op)
        self.keys[op.output.tensor] = key[:2]
        if key in self.cache:
            return self.replay(n, op, self.cache[key])
        self.drain()
        mark = self.sink.mark()  # type: ignore[union-attr]
        self.generate_op(n, op)
        self.drain()
        place = self.placement[op.output.tensor]
        buf = self.buffers[place.buf]
        early = []
        for m in self.carries.get(n, ()):
            for i in self.early_inputs(m):
                bid, own = self.early[m, i]
                early.append((m - n, i, self.buffers[bid].elems if own else None,
                              self.buffers[bid].dtype))
        self.cache[key] = self.sink.since(mark, _Cached(  # type: ignore[union-attr]
            buf.elems, buf.dtype, place.core, place.off, distinct(place.core),
            early=tuple(early)))

    def generate_op(self, n: int, op: TensorExpr) -> None:
        geo = geometry(self.graph, op, self.plan.ops[n])
        key = self.geo_key(n, op)
        nin = len(op.inputs)
        # the result first: it outlives the inputs, so it goes below them
        out_dtype = "fp32" if op.combine else self.storage(op.output.tensor)
        out_elems = math.prod(geo.tile_shape(nin))
        out = self.new_buffer(f"{op.name}.out", out_elems, out_dtype, op.name, "compute")
        moves: list[Exchange] = []
        cur: list[int] = []
        owned: list[bool] = []
        for i in range(nin):
            if (n, i) in self.weights:
                bid, own = self.weights[n, i], False
            elif (n, i) in self.dma:  # loaded from DRAM: freed after the op (`free_dram`)
                bid, own = self.dma[n, i], False
            elif (n, i) in self.kept:  # the previous op's copy, in this layout already
                bid, own = self.kept.pop((n, i)), True
            elif (n, i) in self.early:  # received in an earlier op's phase
                bid, own = self.early.pop((n, i))
            else:
                bid, own = self.bring_input(op, geo, i, moves, self.plan.ops[n].home, key)
            cur.append(bid)
            owned.append(own)
        extra: list[tuple[int, bool]] = []  # the epilogue's operands, beside the final result
        if op.extra:
            flat, valid = self.final_elements(op, geo, key)[:2]
            for k in range(len(op.extra)):
                if (n, k) in self.extra_weights:
                    extra.append((self.extra_weights[n, k], False))
                elif (n, k) in self.prefetched:  # fetched in the previous op's superstep
                    extra.append(self.prefetched.pop((n, k)))
                else:
                    extra.append(self.bring_extra(op, geo, k, flat, valid, moves, key))
        early = [mv for m in self.carries.get(n, ()) for mv in self.bring_early(m, op.name)]
        # one barrier before the exchange phase, unless every copy stays on its core
        if any(received(m.pattern(), geo.phys).any() for m in moves) or \
                any(received(mv.pattern(), phys).any() for mv, phys in early):
            self.instrs.append(Sync(op.name, "relayout"))
        moves += [mv for mv, _ in early]
        # the re-layouts together (an epilogue's activations with the inputs), as one phase
        # (on a mesh, of routes: the planner's `meshmove` prices them so), then the fetches
        moves.sort(key=lambda m: m.phase != "relayout")
        self.instrs.extend(moves)
        # inputs are in place: producers whose last reader this was can go
        for operand in op.reads:
            root = self.graph.root(operand.tensor)
            if root in self.pending:
                self.pending[root] -= 1
                if self.pending[root] == 0 and self.placement[root].buf not in cur:
                    self.free(self.placement[root].buf, op.name)

        if op.combine:
            identity = COMBINES[op.combine].identity
            self.instrs.append(Fill(op.name, "compute", out, identity, geo.ncores, _cores(geo)))
        cur.append(out)
        owned.append(True)
        recv = {}
        for i in range(nin + 1):
            if geo.rotation_axis(i) is not None:
                b = self.buffers[cur[i]]
                recv[i] = self.new_buffer(f"{op.name}.rx{i}", b.elems, b.dtype, op.name, "shift")

        tiles = tuple(geo.tile_shape(i) for i in range(nin + 1))
        for s in range(geo.steps):
            offsets, origin, movers, sources = self.step_tables(key, geo, nin, s, tuple(recv))
            self.instrs.append(Compute(
                op.name, "compute", n, cur[nin], tuple(cur[:nin]), geo.u, tiles, offsets,
                origin, op.combine is not None, self.cores_of(key, geo)))
            if s == geo.steps - 1:
                break
            if movers:
                self.instrs.append(Sync(op.name, "sync"))
            for i, source in zip(movers, sources):
                self.instrs.append(Shift(op.name, "shift", recv[i], cur[i], source,
                                         self.cores_of(key, geo)))
                cur[i], recv[i] = recv[i], cur[i]

        # resident weights that rotated go back to where they started, into their own buffer,
        # so that the program leaves them as it found them (one more ring shift)
        # (weights loaded from DRAM too: the cost model prices every rotated weight's return);
        # so do rotated inputs kept for the next op (`transitions.shared_inputs`), into their
        # receive buffer
        kept = {**self.weights, **{key: b for key, b in self.dma.items() if key[0] == n
                                   and self.graph.root(op.inputs[key[1]].tensor)
                                   in self.graph.constants}}
        restore = []
        for i in recv:
            if (n, i) in kept:
                home = kept[n, i]
            elif i < nin and owned[i] and (n, i) in self.keeps:
                home = recv[i]
            else:
                continue
            source = geo.phys[geo.restore_source(i)].astype(np.int32)
            if cur[i] == home and (source == geo.phys).all():
                continue  # already home: nothing moves, no shift, no barrier
            restore.append(Shift(op.name, "shift", home, cur[i], source, _cores(geo)))
            if cur[i] != home:
                cur[i], recv[i] = home, cur[i]
        if restore:
            self.instrs.append(Sync(op.name, "sync"))
            self.instrs.extend(restore)
        # a reduce-scatter after the restore shares its superstep (and barrier): the buffers
        # the restore reads stay allocated until the reduce has been emitted, so that the
        # reduce's result cannot take their addresses while they are being sent (the other
        # receive buffers go now, as the cost model counts: `partition.cost`)
        shared = bool(restore) and geo.reduce_group > 1
        sending = {i for i in recv if any(recv[i] == r.src for r in restore)} if shared \
            else set()
        for i in recv:
            if i not in sending:
                self.free(recv[i], op.name)
        for i in range(nin):
            if owned[i] and (n, i) in self.keeps:  # the next op reads this copy
                self.kept[self.keeps[n, i]] = cur[i]
            elif owned[i]:
                self.free(cur[i], op.name)
        self.free_dram(n, cur)
        for operand in op.inputs:  # a producer buffer used in place dies with this op
            root = self.graph.root(operand.tensor)
            if self.pending.get(root) == 0 and self.placement[root].buf in cur[:nin]:
                if self.placement[root].buf in self.alloc.live:
                    self.free(self.placement[root].buf, op.name)
        place = self.finish_output(op, geo, cur[nin], barrier=not shared, key=key)
        for i in sending:
            self.free(recv[i], op.name)
        if n + 1 in self.hoisted:
            self.prefetch(n + 1, op.name)
        self.placement[op.output.tensor] = place
        if op.epilogue is not None:
            self.emit_epilogue(n, geo, place.buf, [xb for xb, _ in extra])
        for xb, own in extra:
            if own:
                self.free(xb, op.name)

    def bring_early(self, m: int, by: str) -> list[tuple[Exchange, np.ndarray]]:
        """Bring op m's activation inputs now, in the re-layout phase of op ``by``
        (`transitions.merged_phases`), into buffers that live until op m (placed high, as a
        hoisted fetch's): the exchanges, as op ``by``'s (so that repeated layers replay them
        with it), each with the cores it writes."""
        op = self.graph.ops[m]
        geo = geometry(self.graph, op, self.plan.ops[m])
        moves: list[Exchange] = []
        self.hoisting = True
        for i in self.early_inputs(m):
            self.early[m, i] = self.bring_input(op, geo, i, moves, False, self.geo_key(m, op))
        self.hoisting = False
        return [(dataclasses.replace(mv, op=by), geo.phys) for mv in moves]

    def early_inputs(self, m: int) -> list[int]:
        """The inputs of op m that an earlier op's phase brings (`bring_early`): those an
        op computes."""
        op = self.graph.ops[m]
        return [i for i, operand in enumerate(op.inputs)
                if self.graph.root(operand.tensor) not in self.graph.constants
                and self.graph.root(operand.tensor) not in self.graph.inputs
                and (m, i) not in self.dma and (m, i) not in self.kept]

    def prefetch(self, m: int, by: str) -> None:
        """Fetch op m's epilogue weights now, in the reduce-scatter superstep op ``by`` just
        opened (`transitions.hoisted_fetches`): the exchanges are op ``by``'s, so that
        repeated layers replay them with it."""
        op = self.graph.ops[m]
        geo = geometry(self.graph, op, self.plan.ops[m])
        key = self.geo_key(m, op)
        flat, valid = self.final_elements(op, geo, key)[:2]
        moves: list[Exchange] = []
        self.hoisting = True
        for k in range(len(op.extra)):
            if (m, k) not in self.extra_weights:
                self.prefetched[m, k] = self.bring_extra(op, geo, k, flat, valid, moves, key)
        self.hoisting = False
        self.instrs.extend(dataclasses.replace(mv, op=by) for mv in moves)

    def step_tables(self, key: tuple, geo: Geometry, nin: int, s: int, rotating: tuple[int, ...]
                    ) -> tuple[tuple[np.ndarray, ...], np.ndarray, list[int],
                               list[np.ndarray]]:
        """Step ``s``'s Compute tables (every operand's slice offsets, the origin) and, after
        it, the operands that shift and each one's ring source: once per geometry (repeated
        layers share the arrays, read-only)."""
        memo = ("step", key, s, rotating)
        if memo not in self.memo:
            if self.tables:
                offsets = tuple(_frozen(geo.slice_offsets(i, s).astype(np.int32))
                                for i in range(nin + 1))
                origin = _frozen(geo.origin(s).astype(np.int64))
            else:  # (streamed: `tables`) a row per core still, of no columns
                origin = _frozen(np.empty((geo.ncores, 0), dtype=np.int64))
                offsets = (_frozen(np.empty((geo.ncores, 0), dtype=np.int32)),) * (nin + 1)
            movers: list[int] = []
            sources: list[np.ndarray] = []
            if s < geo.steps - 1:
                changed = geo.changes(s)
                movers = [i for i in rotating if geo.rotation_axis(i) in changed]
                sources = [_frozen(geo.phys[geo.shift_source(i, s)].astype(np.int32))
                           for i in movers]
            self.memo[memo] = (offsets, origin, movers, sources)
        return self.memo[memo]  # type: ignore[return-value]

    def cores_of(self, key: tuple, geo: Geometry) -> np.ndarray | None:
        """`_cores`, once per geometry."""
        memo = ("cores", key)
        if memo not in self.memo:
            cores = _cores(geo)
            self.memo[memo] = None if cores is None else _frozen(cores)
        return self.memo[memo]  # type: ignore[return-value]

    def emit_epilogue(self, n: int, geo: Geometry, out: int, extra: list[int]) -> None:
        """Op n's epilogue on every element of its finished result, in place (one Compute of
        the derived flat expression, `codegen.epilogue`)."""
        elems = self.buffers[out].elems
        ops = len(extra) + 2  # the result read, the extras, the result written
        zeros = np.zeros((geo.ncores, 1), dtype=np.int32)
        self.instrs.append(Compute(
            self.graph.ops[n].name, "compute", epilogue_index(self.graph, n), out,
            (out, *extra), (elems,), ((elems,),) * ops, (zeros,) * ops,
            np.zeros((geo.ncores, 1), dtype=np.int64), False, _cores(geo)))

    def final_elements(self, op: TensorExpr, geo: Geometry, key: tuple | None = None
                       ) -> tuple[np.ndarray, np.ndarray, Scatter | None]:
        """Where the result lies once the op is complete: (flat output element, validity) per
        core and element of the final buffer, and the reduce-scatter that puts it there
        (`partition.collectives`; None without one). Once per ``key`` (`geo_key`)."""
        if key is None:
            return self._final_elements(op, geo)
        memo = ("final", key)
        if memo not in self.memo:
            self.memo[memo] = self._final_elements(op, geo)
        return self.memo[memo]  # type: ignore[return-value]

    def _final_elements(self, op: TensorExpr, geo: Geometry
                        ) -> tuple[np.ndarray, np.ndarray, Scatter | None]:
        if geo.reduce_group == 1:
            flat, valid = self.element_map(geo, len(op.inputs), geo.steps - 1)
            return flat, valid, None
        scatter = scatter_of(geo)
        out = len(op.inputs)
        # element e of core c's chunk is element pos*chunk + e of its block buffer
        flat, valid = chunk_elements(geo.tile_origin(out, geo.steps - 1), geo.tile_shape(out),
                                     self.graph.tensors[op.output.tensor].shape, scatter.pos,
                                     scatter.chunk)
        return flat, valid, scatter

    def finish_output(self, op: TensorExpr, geo: Geometry, buf: int, barrier: bool = True,
                      key: tuple | None = None) -> Placement:
        """Reduce-scatter the result where cores hold partial sums (after a barrier, unless
        ``barrier`` is False: the restore shift's superstep is still open), and record where
        every element lies."""
        tensor = op.output.tensor
        numel = self.graph.tensors[tensor].numel
        flat, valid, scatter = self.final_elements(op, geo, key)
        if scatter is not None:
            # one barrier, then one Reduce per level (a K-tree on a mesh): level k's chunk
            # of the previous level's chunk, from the cores differing in digit k
            if barrier:
                self.instrs.append(Sync(op.name, "reduce"))
            dtype = self.buffers[buf].dtype
            phys = geo.phys.astype(np.int32)  # (an int32 table at once: ncores x members)
            for k, level in enumerate(scatter.levels):
                name = f"{op.name}.red" if k == len(scatter.levels) - 1 else f"{op.name}.red{k}"
                dst = self.new_buffer(name, level.chunk, dtype, op.name, "reduce")
                self.instrs.append(Reduce(op.name, "reduce", dst, buf, op.combine or "sum",
                                          phys[level.table],
                                          level.offset.astype(np.int32), _cores(geo),
                                          level.sizes.astype(np.int32)))
                self.free(buf, op.name)
                buf = dst
        memo = ("placed", key)
        placed = self.memo.get(memo) if key is not None else None
        if placed is None:
            placed = _placed(op, geo, flat, valid, numel)
            if key is not None:
                self.memo[memo] = placed
        assert isinstance(placed, tuple)
        return Placement(buf, placed[0], placed[1])

    def drain(self) -> None:
        if self.sink is not None:
            for ins in self.instrs:
                self.sink(ins)
            self.instrs.clear()

    # -- whole program ----------------------------------------------------------------------
    def build(self) -> Program:
        graph = self.graph
        for op in graph.ops:
            for operand in op.reads:
                root = graph.root(operand.tensor)
                if root not in graph.constants and root not in graph.inputs:
                    self.pending[root] = self.pending.get(root, 0) + 1
        for t in graph.outputs:
            root = graph.root(graph.written(t))
            self.pending[root] = self.pending.get(root, 0) + 1
        for n, op in enumerate(graph.ops):
            self.load_weights(n, op)
        self.drain()
        if self.progress:
            self.progress("codegen", 0, len(graph.ops))
        for n, op in enumerate(graph.ops):
            try:
                self.emit_op(n, op)
            except CodegenError:
                raise
            except Exception as exc:  # pragma: no cover - a bug: say where
                raise CodegenError(f"while generating op {op.name} ({op.source}): {exc}") from exc
            if op.output.tensor not in self.pending:  # nobody reads it
                self.free(self.placement[op.output.tensor].buf, op.name)
            self.store_dram(n)
            self.drain()
            if self.progress:
                self.progress("codegen", n + 1, len(graph.ops))
        self.wait_stores(len(graph.ops))
        stored = {graph.ops[k].output.tensor for k in self.written_back}
        for t in graph.outputs:
            written = graph.written(t)  # an output grown in place: its new rows
            if graph.root(written) in stored:
                continue  # in DRAM already
            root, rflat = map_to_root(graph, written, np.arange(graph.tensors[written].numel))
            if root not in self.placement:
                raise CodegenError(f"graph output {t} is not computed on chip")
            place = self.placement[root]
            shape = graph.tensors[t].shape
            grown = graph.appends.get(t)  # the host holds the input it grows, the past rows
            index = None if grown is None else tail_index(shape, grown.axis, grown.length)
            self.instrs.append(Store(
                "", "host", t, shape, place.buf, place.core[rflat], place.off[rflat],
                index=None if index is None else index.astype(np.int32),
                base=grown.base if grown is not None else ""))
        self.drain()
        if self.sink is not None:  # the online first-fit or the fixed addresses are the layout
            if self.fixed is None:
                live, method = 0, "first-fit (streamed)"
            else:
                live, method = self.fixed.live, f"{self.fixed.method} (streamed)"
            return Program(graph.name, self.chip.name, self.dtype, self.chip.cores,
                           tuple(self.buffers), program_exprs(graph), (), {}, graph.outputs,
                           self.alloc.peak, live, method)
        buffers, sram = self.place_buffers()
        inputs = {t: (graph.tensors[t].shape, graph.tensors[t].dtype) for t in graph.fed}
        peak = max((b.offset + b.nbytes for b in buffers), default=0)
        return Program(graph.name, self.chip.name, self.dtype, self.chip.cores,
                       buffers, program_exprs(graph), tuple(self.instrs), inputs, graph.outputs,
                       peak, sram.live, sram.method, dict(graph.gathers))

    def place_buffers(self) -> tuple[tuple[Buffer, ...], Layout]:
        """Final SRAM addresses: the better of the online first-fit and the offline best-fit,
        repaired by CP-SAT if neither fits (`memory.py`)."""
        start = {i.buf: n for n, i in enumerate(self.instrs) if isinstance(i, Alloc)}
        end = {i.buf: n for n, i in enumerate(self.instrs) if isinstance(i, Free)}
        rects = [Rect(start[b.id], end.get(b.id, len(self.instrs)),
                      aligned(b.nbytes)) for b in self.buffers]
        capacity = self.chip.sram_bytes_per_core
        sram = layout(rects, capacity)
        online = tuple(b.offset for b in self.buffers)
        if self.alloc.peak <= sram.peak and (self.alloc.peak <= capacity or sram.peak > capacity):
            sram = Layout(online, self.alloc.peak, sram.live, "first-fit")
        _check_fits(sram, self.chip)
        buffers = tuple(dataclasses.replace(b, offset=o) for b, o in zip(self.buffers,
                                                                         sram.offsets))
        return buffers, sram


def _check_fits(sram: Layout, chip: Chip) -> None:
    capacity = chip.sram_bytes_per_core
    if sram.peak > capacity:
        raise CodegenError(
            f"the SRAM layout needs {sram.peak} bytes per core ({sram.method}), "
            f"{chip.name} has {capacity}; at most {sram.live} bytes are alive at once, "
            f"so {100 * sram.fragmentation:.1f}% is lost to fragmentation. Use a chip with "
            "more SRAM, --dtype fp16, or compile with --front 4 for smaller plans")


def _placed(op: TensorExpr, geo: Geometry, flat: np.ndarray, valid: np.ndarray, numel: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """(core, offset) of every element of the result, from where each core's final buffer
    puts it (read-only: repeated layers share them)."""
    elems = flat.shape[1]
    core = np.full(numel, -1, dtype=np.int32)
    off = np.full(numel, -1, dtype=np.int32)
    cores = np.broadcast_to(geo.phys[:, None], flat.shape)
    offs = np.broadcast_to(np.arange(elems)[None, :], flat.shape)
    core[flat[valid]] = cores[valid]
    off[flat[valid]] = offs[valid]
    if (core < 0).any():
        raise CodegenError(f"{op.name}: {(core < 0).sum()} output elements are never computed")
    core.flags.writeable = False
    off.flags.writeable = False
    return core, off


def _frozen(arr: np.ndarray) -> np.ndarray:
    """``arr``, read-only: instructions of repeated layers share it."""
    arr.flags.writeable = False
    return arr


def _cores(geo: Geometry) -> np.ndarray | None:
    """The physical core of each table row, for ops placed on a mesh (None: rows are cores)."""
    return geo.phys.astype(np.int32) if geo.placed else None


def generate(graph: Graph, plan: Plan, chip: Chip,
             progress: Callable[[str, int, int], None] | None = None) -> Program:
    """Emit the SPMD program for ``graph`` under ``plan`` (which must have been verified),
    reporting ``progress("codegen", done, total)`` per op."""
    return _Builder(graph, plan, chip, progress=progress).build()


def stream(graph: Graph, plan: Plan, chip: Chip, buffers: list[Buffer],
           sink: Callable[[Instr], None],
           progress: Callable[[str, int, int], None] | None = None,
           fixed: Layout | None = None, issued: list[int] | None = None) -> Program:
    """Emit the program one op at a time into ``sink`` without keeping it: ``buffers`` fills
    up as buffers are created (the sink looks them up there). Returns the program's header
    (buffers and peak SRAM, no instructions).

    Buffers take the online first-fit's addresses, and `StreamedOverflow` is raised as soon
    as one lands past the SRAM; with ``fixed`` (`streamed_layout`'s), they take those. A
    DRAM preload the online first-fit cannot place at its issue point is issued later
    (`_Builder.issue_dram`); ``issued`` (if given) is filled with where each op's loads
    were issued."""
    builder = _Builder(graph, plan, chip, sink, progress, fixed)
    builder.buffers = buffers
    program = builder.build()
    if issued is not None:
        issued[:] = builder.issued
    return program


def streamed_layout(graph: Graph, plan: Plan, chip: Chip,
                    progress: Callable[[str, int, int], None] | None = None) -> Layout:
    """An offline layout of the whole program, for `stream` when the online first-fit does
    not fit: every op's instructions are generated once (none kept) to learn each buffer's
    lifetime, and the buffers are laid out best-fit. CP-SAT's repair, which a functional
    compile tries next, is not: on a whole streamed program (thousands of buffers) its
    presolve alone ran for minutes. Raises `CodegenError` if best-fit does not fit."""
    events: list[tuple[int, bool]] = []  # (buffer, allocated) in program order

    def record(ins: Instr) -> None:
        if isinstance(ins, (Alloc, Free)):
            events.append((ins.buf, isinstance(ins, Alloc)))

    builder = _Builder(graph, plan, chip, record, progress)
    builder.check_fit = False
    builder.build()
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for n, (buf, allocated) in enumerate(events):
        (start if allocated else end)[buf] = n
    rects = [Rect(start[b.id], end.get(b.id, len(events)), aligned(b.nbytes))
             for b in builder.buffers]
    sram = layout(rects, chip.sram_bytes_per_core, repair_ok=False)
    _check_fits(sram, chip)
    return sram
