"""Off-chip memory (DRAM): which operands stream from it, and when each op's loads are issued.

On a chip with DRAM (`Chip.has_dram`) two kinds of operands come from it:

- graph inputs (a decode step's KV cache, token ids): they live in DRAM and every op that
  reads one loads its tiles by DMA before it runs, as it loaded them from the host before;
- weights that the whole-graph choice puts there: every op with weights gets, beside each
  front plan, its "DRAM twin" (`dram_twin`): the same plan with the weights not resident
  (their cold bytes gone) and loaded into the plan's layout by DMA before each run.

An op's hot footprint (its plan's hot bytes) includes the loaded tiles; its preload
footprint (`OpPlan.dram_bytes_per_core`) is what the tiles occupy from the moment their
load is issued. A DMA load is priced by `Chip.dram_cycles` (edge channels over the network,
or a bank per core), one load per operand, one after the other on the chip's DMA queue.

The schedule (`schedule`) decides, for every op with DRAM operands, at the start of which
earlier op its loads are issued (its preload depth), so that they overlap the compute of the
ops in between, within the SRAM those ops leave free. The DMA queue is first-in first-out in
op order; an op waits for its own loads to land (its stall). Three schedules:

- ``elk``: every load is issued as early as the SRAM left over allows (ELK's preload, built
  greedily in op order: an earlier issue never delays a later load on a FIFO queue), unless
  a uniform depth or load-then-execute waits less (an early load can delay a write-back);
- ``static``: one fixed preload depth D for every op, the largest (up to `MAX_STATIC_DEPTH`)
  at which every op's preloads fit;
- ``basic``: load, then execute: an op's loads start when the op before it has finished, and
  nothing overlaps them.

Every graph output is written back to DRAM (`store_waits`: a decode step's new KV cache, read
by the next step from there): a DMA store of the tensor (of a KV cache only the new token's
rows, `appended`: the past rows are in DRAM already), issued on the same queue as the op
that computes it ends. The result stays in SRAM, its bytes counted in the footprint of every
op it spans, through its last reader and one op more, over which the store runs; the cores
wait for the store at the start of the op after that (at the end of the step if there is
none) and free it. ``elk`` waits as much later as the SRAM left over allows; under
``basic`` nothing overlaps: the cores wait for the store at the next op.

The emulator executes the same schedule (`DmaLoad` at the issue op, `DmaStore` as the producer
ends, `DmaWait` before the op) with the same clock, so the predicted stalls are what it
measures.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import DTYPES, IntTensors
from t10c.ir import Append, Gathered, Graph, TensorExpr, Window, tile_counts

from .bounds import tensor_bytes
from .cost import element_bytes
from .plan import OpPlan, geometry

SCHEDULES = ("elk", "static", "basic")
#: the deepest uniform preload the ``static`` schedule tries
MAX_STATIC_DEPTH = 8


def dram_operands(graph: Graph, op: TensorExpr, weights: bool) -> list[int]:
    """The inputs of ``op`` loaded from DRAM: graph inputs, and with ``weights`` its
    constant inputs too."""
    found = []
    for i, o in enumerate(op.inputs):
        root = graph.root(o.tensor)
        if root in graph.inputs or (weights and root in graph.constants):
            found.append(i)
    return found


def dram_figures(graph: Graph, op: TensorExpr, p: OpPlan, chip: Chip, dtype: str,
                 ints: IntTensors, weights: bool) -> tuple[int, int, int]:
    """(bytes per core, DMA cycles, weight bytes per core) of plan ``p``'s DRAM loads: one
    load per DRAM operand of the tile each of the plan's cores holds (its bytes in SRAM; the
    load carries the tensor's elements it holds, `Chip.dma_load_cycles`)."""
    geo = geometry(graph, op, p)
    per_core = cycles = weight = 0
    for i in dram_operands(graph, op, weights):
        size, tile = element_bytes(op, i, dtype, ints), geo.tile_shape(i)
        nbytes = size * math.prod(tile)
        per_core += nbytes
        counts = tile_counts(geo.tile_origin(i, 0), tile, graph.tensors[op.inputs[i].tensor].shape)
        cycles += chip.dma_load_cycles(size, counts, geo.phys)
        if graph.root(op.inputs[i].tensor) in graph.constants:
            weight += nbytes
    return per_core, cycles, weight


def with_dram_inputs(graph: Graph, op: TensorExpr, front: list[OpPlan], chip: Chip,
                     dtype: str, ints: IntTensors) -> list[OpPlan]:
    """The front with the DMA loads of its graph inputs priced (their tiles are hot already)."""
    if not dram_operands(graph, op, weights=False):
        return front
    out = []
    for p in front:
        per_core, cycles, _ = dram_figures(graph, op, p, chip, dtype, ints, weights=False)
        out.append(dataclasses.replace(p, dram_bytes_per_core=per_core, dram_cycles=cycles))
    return out


def dram_twins(graph: Graph, op: TensorExpr, front: list[OpPlan], chip: Chip, dtype: str,
               ints: IntTensors) -> list[OpPlan]:
    """Every resident-weight plan of the front again with its weights in DRAM: no longer
    resident, loaded by DMA into the plan's layout before each run."""
    if not any(graph.root(o.tensor) in graph.constants for o in op.inputs):
        return []
    twins = []
    for p in front:
        if p.home:
            continue
        per_core, cycles, weight = dram_figures(graph, op, p, chip, dtype, ints, weights=True)
        if not weight:
            continue
        twins.append(dataclasses.replace(p, cold_bytes_per_core=p.cold_bytes_per_core - weight,
                                         dram_bytes_per_core=per_core, dram_cycles=cycles,
                                         dram_weights=True))
    return twins


def store_waits(graph: Graph, basic: bool = False) -> dict[int, int]:
    """Per op whose result is a graph output (written back to DRAM on a chip with DRAM):
    the op at whose start the cores wait for its DMA stores, ``len(graph.ops)`` for the end
    of the step. The store runs beside the op after the result's last reader (``basic``:
    beside nothing, the cores wait at the next op)."""
    producer = {op.output.tensor: i for i, op in enumerate(graph.ops)}
    last: dict[int, int] = {}
    for i, op in enumerate(graph.ops):
        for o in op.reads:
            if graph.root(o.tensor) in producer:
                last[producer[graph.root(o.tensor)]] = i
    n = len(graph.ops)
    waits = {}
    for t in graph.outputs:
        p = producer.get(graph.root(graph.written(t)))
        if p is not None:
            waits[p] = min(n, p + 1 if basic else max(last.get(p, p), p) + 2)
    return waits


def appended(graph: Graph, tensor: str) -> tuple[str, int, int] | None:
    """For a graph output that a graph input's DRAM copy already begins (a decode step's
    ``present`` KV cache: the ``past`` one, with the new token's rows concatenated along one
    axis): (that input, the axis, its length there); None for any other output. Only the
    rows past that length are written back, into the input's DRAM copy grown in place.

    The producer must be the lowered Concat: the sum of the input read at offset 0 and the
    new rows read ``length`` past it (out-of-range reads are zero), so that the first rows
    of the result are the input's exactly; or the output is grown in place with no op
    (`grow_in_place`)."""
    if tensor in graph.appends:
        grown = graph.appends[tensor]
        return grown.base, grown.axis, grown.length
    op = next((o for o in graph.ops if o.output.tensor == graph.root(tensor)), None)
    if op is None or op.body != ("add", ("in", 0), ("in", 1)) or len(op.inputs) != 2 \
            or op.combine is not None or op.epilogue is not None:
        return None
    base = graph.root(op.inputs[0].tensor)
    shape, have = graph.tensors[tensor].shape, graph.tensors[base].shape
    if base not in graph.inputs or len(shape) != len(have):
        return None
    axes = [d for d, (a, b) in enumerate(zip(shape, have)) if a != b]
    if len(axes) != 1 or have[axes[0]] >= shape[axes[0]]:
        return None
    length = have[axes[0]]
    windows = [[dim for dim in o.axes if isinstance(dim, Window)] for o in op.inputs]
    if [len(w) for w in windows] != [1, 1] or [w[0].offset for w in windows] != [
            0, -length] or windows[0][0].terms != windows[1][0].terms:
        return None
    return base, axes[0], length


def grow_in_place(graph: Graph) -> Graph:
    """``graph`` with the outputs that grow a graph input in place (`appended`: a decode
    step's ``present`` KV cache, the ``past`` one with the step's new rows concatenated)
    no longer computed, where nothing else reads them (attention reads ``past`` and the new
    rows apart, `t10c.frontend.rewrite.split_cache_concat`): the Concat's op is dropped and
    the output recorded as grown in place (`t10c.ir.Append`), its new rows written back
    into the input's DRAM copy by the op that computes them. On a chip with DRAM the past
    rows are there already; computing the concatenation loaded all of them into SRAM, by
    DMA, only to store none of them (with LLaMA-2-13B's cache at batch 32 and 2,048 tokens,
    53.7 GB a step). On a chip without DRAM the cache is an input that the host loads, and
    the host is given the new rows (`Store.index`): computing the concatenation re-laid the
    whole cache out on chip into the Concat's layout (on the wafer, LLaMA-3-8B's 8 MB of keys
    a layer, 1,625 cycles), while a decode loop keeps the cache where the step reads it and
    adds the new rows there, a move of a few kilobytes that the step does not charge.

    Views between the output and the Concat's result, and between the input and what the
    Concat reads of it, must keep the element order (reshapes), and the new rows must be the
    output's elements past the input's in that order, or the output stays computed."""
    read = graph.read_roots()
    producer = {op.output.tensor: op for op in graph.ops}
    appends = dict(graph.appends)
    dropped = set()
    for t in graph.outputs:
        grown = appended(graph, t)
        root = graph.root(t)
        if grown is None or root in read or t in graph.appends or \
                sum(graph.root(u) == root for u in graph.outputs) != 1:
            continue
        base, axis, length = grown
        op = producer[root]
        past, rows = op.inputs
        d = next(k for k, dim in enumerate(rows.axes) if isinstance(dim, Window))
        shape = graph.tensors[root].shape
        cut = -rows.axes[d].offset  # type: ignore[union-attr]
        if not (graph.in_order(t) and graph.in_order(past.tensor)) or \
                graph.tensors[rows.tensor].shape != tuple(
                    n - cut if k == d else n for k, n in enumerate(shape)) or \
                [x for k, x in enumerate(rows.axes) if k != d] != \
                [x for k, x in enumerate(op.output.axes) if k != d] or \
                not np.array_equal(tail_index(graph.tensors[t].shape, axis, length),
                                   tail_index(shape, d, cut)):
            continue  # the rows permuted, or the input read in another order: computed
        appends[t] = Append(base, rows.tensor, axis, length)
        dropped.add(op.name)
    if not dropped:
        return graph
    return dataclasses.replace(graph, ops=tuple(o for o in graph.ops if o.name not in dropped),
                               appends=appends)


def gather_by_dma(graph: Graph) -> Graph:
    """``graph`` with each lookup of a weight table by graph-input ids (an embedding: ONNX
    Gather along the table's first dimension, nothing fused into it) read from DRAM by the
    DMA engine instead of computed on chip: the op is dropped and its result becomes a graph
    input that the caller does not feed, the table's rows at the ids (`t10c.ir.Gathered`).
    Every op that reads it loads its tiles by DMA, as it loads any graph input on a chip with
    DRAM: the rows the ids pick, not the table.

    The lookup as an op had its table either resident (the whole table in every step's
    SRAM) or loaded into SRAM by DMA before each run (all of it, to pick a few rows), and its
    ids loaded too; the gathered rows cost a load of one row an id. The ids are the step's
    input, known when it is launched, so the rows are read where the DRAM holds them, before
    anything on chip has run (as Graphcore's host embeddings stream looked-up rows in)."""
    outputs = set(graph.outputs) | {a.base for a in graph.appends.values()}
    gathers = dict(graph.gathers)
    dropped = set()
    for op in graph.ops:
        if op.body != ("take", 0, 1) or op.combine != "sum" or op.epilogue is not None \
                or op.prologue or op.extra:
            continue
        table, ids = op.inputs
        out, source = op.output.tensor, graph.root(ids.tensor)
        if table.tensor not in graph.constants or source not in graph.inputs \
                or not graph.in_order(ids.tensor) or source in graph.gathers \
                or out in outputs or op.take_dim() != 0:
            continue  # (ids read through reshapes: the input's values in its order)
        shape = graph.tensors[table.tensor].shape
        if tuple(op.output.axes) != tuple(ids.axes) + tuple(table.axes[1:]) or \
                graph.tensors[out].shape != graph.tensors[ids.tensor].shape + shape[1:]:
            continue  # not ``table[ids]`` in this order
        gathers[out] = Gathered(table.tensor, source)
        dropped.add(op.name)
    if not dropped:
        return graph
    return dataclasses.replace(
        graph, ops=tuple(o for o in graph.ops if o.name not in dropped),
        inputs=graph.inputs + tuple(t for t in gathers if t not in graph.gathers),
        gathers=gathers)


def tail_index(shape: tuple[int, ...], axis: int, length: int) -> np.ndarray:
    """The flat positions, ascending, of the elements of a ``shape`` tensor at ``length`` or
    more along ``axis`` (a KV cache's new rows)."""
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    rows = np.arange(length, shape[axis], dtype=np.int64)
    return ((np.arange(outer, dtype=np.int64)[:, None, None] * shape[axis] + rows[None, :, None])
            * inner + np.arange(inner, dtype=np.int64)[None, None, :]).reshape(-1)


def stored_elements(graph: Graph, tensor: str) -> int:
    """How many elements of graph output ``tensor`` a write-back stores (`appended`)."""
    grown = appended(graph, tensor)
    numel = graph.tensors[tensor].numel
    if grown is None:
        return numel
    _, axis, length = grown
    extent = graph.tensors[tensor].shape[axis]
    return numel // extent * (extent - length)


def store_cycles(graph: Graph, n: int, p: OpPlan, chip: Chip, dtype: str,
                 ints: IntTensors) -> int:
    """Cycles of the DMA stores that write op n's graph outputs back under plan ``p``
    (`Chip.dram_store_cycles`, one store per output tensor, back to back on the queue)."""
    op = graph.ops[n]
    # DRAM holds the tensor in its storage type (an accumulator's fp32 is stored rounded)
    size = element_bytes(op, len(op.inputs), dtype, ints) if op.combine is None else \
        DTYPES[dtype].bytes
    held = p.out_bytes_per_core // element_bytes(op, len(op.inputs), dtype, ints) * size
    phys = geometry(graph, op, p).phys
    return sum(chip.dram_store_cycles(stored_elements(graph, t) * size, held, phys)
               for t in graph.outputs if graph.root(graph.written(t)) == op.output.tensor)


def extra_cycles(front: list[OpPlan], mode: str) -> list[int]:
    """What each plan's DRAM loads add to the op's cycles in the whole-graph choice: all of
    them, whatever the schedule (``mode``). How much of a load the ops before it hide is the
    schedule's to find (`schedule`), and crediting an op with its own cycles (the load at
    best overlaps that long) steered the choice, on llama-tiny-decode, to plans slower on
    chip behind loads that were not hidden after all; charging the whole load makes the
    choice minimise compute plus DRAM time, the same plans for every schedule, so that the
    schedules compare like with like."""
    del mode
    return [p.dram_cycles for p in front]


@dataclass(frozen=True)
class Schedule:
    """When every op's DRAM loads are issued and how long the op waits for them."""

    mode: str
    issue: tuple[int, ...]  # per op: the op at whose start its loads are issued (-1: none)
    stall: tuple[int, ...]  # per op: cycles it waits for its loads before it runs
    depth: int = -1  # static: the uniform preload depth used
    #: per op: the op at whose start the cores wait for its write-backs (len(ops): the end
    #: of the step; -1: it writes nothing back)
    store_wait: tuple[int, ...] = ()


def schedule(plans: Sequence[OpPlan], on_chip: Sequence[int], memory: Sequence[int],
             cap: int, mode: str, stores: Sequence[tuple[int, int, int]] = ()) -> Schedule:
    """Issue points and stalls of ``plans`` (``on_chip[i]``: op i's cycles on chip with its
    re-layout; ``memory[i]``: the bytes per core in use at op i, its own loaded tiles and
    the results held for their stores included) within ``cap`` bytes per core; ``stores``:
    (op, the earliest op its stores may be waited at, their cycles) of every write-back
    (`store_waits`). Under ``elk`` a result waits for its store as late as the SRAM left
    over allows (the store then hides behind more ops); the others wait at the earliest.
    The last op's stall includes the wait for the stores still in flight at the end."""
    if mode not in SCHEDULES:
        raise ValueError(f"unknown DRAM schedule {mode!r}: use {', '.join(SCHEDULES)}")
    n = len(plans)
    need = [p.dram_bytes_per_core for p in plans]
    loads = [i for i in range(n) if plans[i].dram_cycles]
    at_own_op = [i if i in set(loads) else -1 for i in range(n)]

    def made(issue: list[int], late: bool, depth: int = -1) -> Schedule:
        waits = _store_waits(plans, issue, need, memory, cap, stores, late)
        timed = [(p, w, c) for (p, _, c), w in zip(stores, waits)]
        store_wait = [-1] * n
        for (p, _, _), w in zip(stores, waits):
            store_wait[p] = w
        return Schedule(mode, tuple(issue), stalls(plans, on_chip, issue, timed), depth,
                        tuple(store_wait) if stores else ())

    if mode == "basic":
        return made(at_own_op, False)
    if mode == "static":
        for depth in range(MAX_STATIC_DEPTH, 0, -1):
            fixed = _issue(loads, n, need, memory, cap, depth)
            if fixed is not None:
                return made(fixed, False, depth)
        return made(at_own_op, False, 0)
    early = _issue(loads, n, need, memory, cap, None)
    assert early is not None  # depth 0 (issue at the op itself) always fits
    # on the one FIFO queue an early load can hold up a write-back behind it: the earliest
    # issue is not always the fastest, so ELK's schedule is the best of it, every uniform
    # depth that fits and load-then-execute (the first of equals: the earliest)
    best = made(early, True)
    if stores:
        for depth in range(MAX_STATIC_DEPTH, -1, -1):
            fixed = _issue(loads, n, need, memory, cap, depth) if depth else at_own_op
            if fixed is not None:
                other = made(fixed, True)
                if sum(other.stall) < sum(best.stall):
                    best = other
    return best


def _store_waits(plans: Sequence[OpPlan], issue: Sequence[int], need: Sequence[int],
                 memory: Sequence[int], cap: int, stores: Sequence[tuple[int, int, int]],
                 late: bool) -> list[int]:
    """Where each store of ``stores`` is waited for: at its earliest op, or (``late``) as
    much later as the SRAM beside the preloads of ``issue`` allows, each result held one
    op more at a time (its bytes: the producer plan's result, `OpPlan.out_bytes_per_core`)."""
    if not late:
        return [w for _, w, _ in stores]
    n = len(plans)
    extra = [0] * n  # preloaded and held bytes at each op beyond ``memory``
    for k, j in enumerate(issue):
        if j >= 0:
            for m in range(j, k):
                extra[m] += need[k]
    waits = []
    for p, w, _ in stores:
        held = plans[p].out_bytes_per_core
        while w < n and memory[w] + extra[w] + held <= cap:
            extra[w] += held
            w += 1
        waits.append(w)
    return waits


def _issue(loads: list[int], n: int, need: list[int], memory: Sequence[int], cap: int,
           depth: int | None) -> list[int] | None:
    """Issue points in op order, each as early as the SRAM allows (``depth`` None) or exactly
    ``depth`` ops ahead (None returned if that does not fit somewhere); FIFO: never before
    the previous load's issue point."""
    extra = [0] * n  # preloaded bytes held at each op beyond its own
    issue = [-1] * n
    last = 0
    for k in loads:
        if depth is not None:
            j = max(k - depth, last, 0)
            if any(memory[m] + extra[m] + need[k] > cap for m in range(j, k)):
                return None
        else:
            j = k
            while j > last and memory[j - 1] + extra[j - 1] + need[k] <= cap:
                j -= 1
        for m in range(j, k):
            extra[m] += need[k]
        issue[k] = j
        last = j
    return issue


def stalls(plans: Sequence[OpPlan], on_chip: Sequence[int], issue: Sequence[int],
            stores: Sequence[tuple[int, int, int]] = ()) -> tuple[int, ...]:
    """Each op's wait for its loads (and for the stores due at its start), on one FIFO DMA
    queue (the emulator's clock); a load issued at its own op (basic) starts when the op
    before it has finished, a store when its op has."""
    by_op: dict[int, list[int]] = {}
    for k, j in enumerate(issue):
        if j >= 0:
            by_op.setdefault(j, []).append(k)
    stored: dict[int, list[tuple[int, int]]] = {}  # by the op at whose start they are issued
    for p, w, c in stores:
        stored.setdefault(p + 1, []).append((w, c))
    now = free = 0
    ready: dict[int, int] = {}
    done: dict[int, int] = {}  # by the op that waits for them
    stall: list[int] = []
    n = len(plans)
    for i in range(n + 1):
        for w, c in stored.get(i, ()):
            free = max(now, free) + c
            done[w] = max(done.get(w, 0), free)
        wait = max(done.get(i, 0) - now, 0)
        now += wait
        if i == n:  # the stores still in flight at the end
            if stall:
                stall[-1] += wait
            break
        for k in by_op.get(i, ()):
            free = max(now, free) + plans[k].dram_cycles
            ready[k] = free
        load = max(ready.get(i, 0) - now, 0)
        stall.append(wait + load)
        now += load + on_chip[i]
    return tuple(stall)


def dram_bytes_needed(graph: Graph, dtype: str) -> int:
    """Bytes of DRAM the graph's weights and inputs occupy (all of them live there on a chip
    with DRAM: the board holds the model; SRAM holds copies). Rows gathered from a table
    (`gather_by_dma`) are read where the table lies and take none of their own."""
    return sum(tensor_bytes(graph, name, dtype) for name in (*graph.constants, *graph.fed))
