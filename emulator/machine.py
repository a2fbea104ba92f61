"""The emulator: executes a `Program` on real data, all cores at once, and times it.

State is one array per live buffer shaped ``(cores, elems)``, and one flag per buffer and core
saying whether it has been written. Float buffers are held in float32, every value rounded to
the buffer's dtype when it is written (so an fp16 buffer holds exactly fp16 values, and
reading it for a computation costs no cast). Every instruction acts on all cores with numpy
and nothing loops over cores in Python: a compute step is one batched contraction (or one
broadcast elementwise evaluation) over every core's sub-task; an exchange is one flat gather
of the table into the source buffers, in cache-sized blocks of table rows; loads cut tiles
from a blocked view of the host tensor. Rows that many cores share (a weight's tiles, an
exchange's shared rows) are kept once (`Memory`) and read by contractions as broadcast views;
a loaded tensor is cut when first read (by a thread, ahead, into the memory of tiles no
instruction reads any more: `dead_tiles`), and a take reads the rows it picks from the host
tensor. A contraction that writes whole rows writes its products straight
into the buffer (rounded there). Large matmuls, roundings, elementwise bodies and gathers are
shared among the host's cores by threads; no value depends on it. What a run works out from
the program alone (gather indices, reduce member lists, exchange byte counts) is made before
the timed run (`Prepared`), as onnxruntime makes its session. The per-core reference
executor (`reference.py`) is the definition this is checked against
(``tests/test_emulator_speed.py``).

Timing is bulk-synchronous: compute phases, then a barrier (``Sync``), then an exchange phase.
On an all-to-all chip (IPU) the phase lasts as long as the busiest core needs to receive its
bytes (`Chip.transfer_cycles`). On a mesh or torus every transfer is routed dimension-order
(`routing.py`), the bytes on every link are counted, and the phase lasts the longest route's
hop latency plus the busiest link's bytes over the link bandwidth. Local copies cost nothing;
host loads and stores are outside the timed region and are counted apart. On a chip whose
compute and transfers overlap (`Chip.overlap`: the WSE and Tensix chips), a shift phase that
follows a compute step costs only what it takes beyond that step (the rotation is
double-buffered); otherwise (IPU) compute and exchange alternate.

The emulator refuses, naming the instruction (its index and kind), its op and the op's ONNX
node: a read of a buffer that was never written on some core, a buffer outside SRAM or
overlapping a live one, a transfer from a core that does not exist or over a link the chip
lacks; any other failure inside an instruction (a numpy error) is reported the same way.

`Machine` is `TimingMachine` (`timing.py`: the checks and the clock) plus the values: each of
its handlers calls the timing handler, then moves the data. A timing-only run uses
`TimingMachine` alone.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from t10c.chips import Chip
from t10c.codegen.program import (
    Alloc,
    Compute,
    DmaLoad,
    DmaStore,
    Exchange,
    Fill,
    Free,
    Instr,
    Load,
    Pattern,
    Program,
    Reduce,
    Shift,
    Store,
    unique_expand,
)
from t10c.codegen.program import width as pattern_width
from t10c.dtypes import DTYPES, ceil_div
from t10c.elementwise import COMBINES
from t10c.ir import TensorExpr, tile_counts, tile_elements

from .kernels import (
    THREADS,
    Replicated,
    evaluate,
    gather_slices,
    operand_sizes,
    prepare,
    put_slices,
    round_fp16,
    share,
    to_storage,
)
from .timing import (
    ByArrays,
    EmulatorError,
    PhaseRecord,
    Progress,
    Timeline,
    TimingMachine,
    _phys,
    _rows,
)

NP_DTYPES = {name: d.numpy for name, d in DTYPES.items()}
#: the dtype the emulator holds a buffer's values in: floats as float32 (each value rounded to
#: the buffer's own dtype when written, so every fp16 value is exactly an fp16 value), because
#: computing reads float32 and numpy's fp16 casts cost several times a copy; integers as they are
HELD = {name: np.dtype(np.float32) if np.dtype(d.numpy).kind == "f" else np.dtype(d.numpy)
        for name, d in DTYPES.items()}

__all__ = ["EmulatorError", "Machine", "PhaseRecord", "Prepared", "Timeline", "emulate"]


class Machine(TimingMachine):
    """One emulated chip running one program on data: `TimingMachine`'s checks and clock,
    and one array per live buffer shaped ``(cores, elems)`` (`HELD`: fp16 values in float32)."""

    def __init__(self, program: Program, chip: Chip, prepared: Prepared | None = None
                 ) -> None:
        super().__init__(program, chip)
        if prepared is None:  # made as the run goes
            prepared = Prepared(program, chip)
        elif prepared.program is not program or prepared.chip != chip:
            raise ValueError("prepared for another program or chip")
        self.mem = Memory()
        self.outputs: dict[str, np.ndarray] = {}
        self.dtypes = [b.dtype for b in program.buffers]
        self.host_held: dict[tuple[str, str], np.ndarray] = {}
        self.prepared = prepared
        self.patterns = prepared.patterns
        self.counted = prepared.counted
        self.pool = Pool()
        self.base: dict[int, np.ndarray] = {}  # each live buffer's memory, flat (for the pool)
        #: buffers in reused memory: the cores whose row still holds an old buffer's values
        self.dirty: dict[int, np.ndarray] = {}
        #: loaded tiles are cut (and rounded) in a thread of their own, ahead of the compute
        #: steps that read them (they depend on nothing else), except a take's table, which
        #: is never cut (`take_table`): the loads of those, by instruction index
        self.ahead: ThreadPoolExecutor | None = None
        self.uncut = prepared.uncut
        #: where loaded tiles are read for the last time (`dead_tiles`), and the memory each
        #: buffer's tiles were cut into: given back to the pool there, for later cuts (a
        #: cut ahead of the main thread takes the memory of the layers it has passed)
        self.dead = prepared.dead
        self.cut_memory: dict[int, HostTiles] = {}
        #: dead tiles' memory, for later cuts only: a cut that took a freed buffer's memory
        #: would leave the next buffer fresh pages to fault in, on the main thread
        self.tile_pool = Pool()

    def step(self, ins: Instr, host: dict[str, np.ndarray] | None = None) -> None:
        n = self.executed
        super().step(ins, host)
        for buf in self.dead.get(n, ()):
            self.mem.pop(buf, None)  # no instruction reads it before its Free
            self.give_back(buf)

    def give_back(self, buf: int) -> None:
        """The memory buffer ``buf``'s loaded tiles were cut into, to the pool (they are dead,
        and the cut is done)."""
        cut = self.cut_memory.pop(buf, None)
        if cut is not None:
            if cut.ready is not None:
                cut.ready.result()  # (a load freed unread: its cut may still be writing)
            for flat in cut.memory:
                self.tile_pool.give(flat)

    def run(self, inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray],
            progress: Progress | None = None) -> tuple[dict[str, np.ndarray], Timeline]:
        """Execute the whole program: the stored outputs and the timeline. The objects alive
        when it starts (the program's instructions and tables, tens of thousands) are left
        out of the interpreter's collections until it ends (`gc.freeze`): a full collection
        walked them all, 36 ms of bert-base's run."""
        gc.freeze()
        try:
            timeline = self.execute(inputs, constants, progress)
        finally:
            gc.unfreeze()
            if self.ahead is not None:
                self.ahead.shutdown(cancel_futures=True)
                self.ahead = None
        return self.outputs, timeline

    def stored(self, buf: int, values: np.ndarray, src: int | None = None,
               owned: bool = False, into: np.ndarray | None = None) -> np.ndarray:
        """``values`` as buffer ``buf`` holds them: rounded to its dtype (saturating, as
        `to_storage`), in its held dtype (in place, if ``owned``: the caller's own array).
        Values moved from buffer ``src`` of the same or a narrower float dtype are exact
        already and are not rounded again. With ``into`` (float32 rows of ``buf`` holding as
        many values, contiguous), the values are stored there and it is returned."""
        name = self.dtypes[buf]
        held = HELD[name]
        if into is not None:
            if NP_DTYPES[name] == np.float16 and values.dtype == np.float32:
                return round_fp16(values, out=into)
            np.copyto(into.reshape(values.shape), self.stored(buf, values, src, owned))
            return into
        if src is not None and self.exact(buf, src):
            return values.astype(held, copy=False)
        if NP_DTYPES[name] != held:  # fp16 held in float32: round to fp16's values
            if values.dtype == np.float32 and NP_DTYPES[name] == np.float16:
                contiguous = owned and values.flags.c_contiguous
                return round_fp16(values, out=values if contiguous else None)
            return to_storage(values, NP_DTYPES[name]).astype(held)
        return to_storage(values, held)

    def exact(self, buf: int, src: int) -> bool:
        """Whether every value buffer ``src`` holds is exactly a value of ``buf``'s dtype."""
        a, b = self.dtypes[buf], self.dtypes[src]
        return a == b or (a == "fp32" and b == "fp16")

    # -- handlers: the timing handler first (it checks), then the values ----------------------
    def alloc(self, ins: Alloc) -> None:
        super().alloc(ins)
        b = self.prog.buffers[ins.buf]
        shape, held = (self.chip.cores, b.elems), HELD[b.dtype]
        elems = math.prod(shape)
        words = ceil_div(elems * held.itemsize, 4)  # (the pool's memory is float32)
        flat = self.pool.take(words)
        if flat is None:
            flat = np.empty(words, dtype=np.float32)
        # a freed buffer's memory, or fresh memory, not zeroed (a calloc may clear it on the
        # spot, where the buffer's writes would fault its pages in anyway): no row may be
        # read before it is written (`rewrite`)
        self.mem[ins.buf] = flat[:words].view(held)[:elems].reshape(shape)
        self.dirty[ins.buf] = np.ones(shape[0], dtype=bool)
        self.base[ins.buf] = flat

    def free(self, ins: Free) -> None:
        super().free(ins)
        self.mem.pop(ins.buf, None)
        self.give_back(ins.buf)
        self.dirty.pop(ins.buf, None)
        flat = self.base.pop(ins.buf, None)
        if flat is not None:
            self.pool.give(flat)

    def wrote(self, buf: int, rows: np.ndarray | slice) -> None:
        """Rows ``rows`` of ``buf`` were written whole: they hold no old values any more."""
        dirty = self.dirty.get(buf)
        if dirty is not None:
            dirty[rows] = False
            if not dirty.any():
                del self.dirty[buf]

    def rewrite(self, buf: int, rows: np.ndarray | slice) -> None:
        """Before a part of rows ``rows`` of ``buf`` is written: the rows that still hold an
        old buffer's values are zeroed, as fresh memory is (the rest of a row that a compute
        step writes in parts must read as zero, whatever the memory held before)."""
        dirty = self.dirty.get(buf)
        if dirty is None:
            return
        cores = np.arange(len(dirty))[rows]
        cores = cores[dirty[cores]]
        if len(cores):
            self.mem[buf][cores] = 0
        self.wrote(buf, rows)

    def load(self, ins: Load) -> None:
        super().load(ins)
        self.timeline.host_bytes += self.load_values(ins)

    def dma_load(self, ins: DmaLoad) -> None:
        # the values land at once (nothing reads them before the DmaWait, which the timing
        # handler enforces); the DRAM array is the host's copy of the tensor
        super().dma_load(ins)
        self.load_values(ins)

    def load_values(self, ins: Load) -> int:
        """Cut ``ins``'s tiles from the host tensor into its buffer; returns the bytes."""
        if ins.tensor not in self.host:
            raise EmulatorError(f"no host tensor {ins.tensor!r} to load")
        src = np.asarray(self.host[ins.tensor])
        if src.size != math.prod(ins.shape):
            raise EmulatorError(f"host tensor {ins.tensor} has shape {src.shape}, the program "
                                f"expects {ins.shape}")
        src = ins.read_as(src)
        rows = _rows(ins, ins.ncores)
        dst = self.mem[ins.buf]
        self.wrote(ins.buf, rows)
        if ins.pat is not None:
            p = ins.pattern()
            assert p is not None
            host = self.rounded(ins.tensor, ins.buf, src)
            vals = self.patterns.gather(p, host.reshape(1, -1))
            copy_rows(vals, p.pat, dst, rows)
            runs = p.runs.astype(np.int64)
            owner = np.repeat(np.arange(p.patterns), np.diff(p.start))
            valid = np.bincount(owner, weights=np.where(runs[:, 0] >= 0, runs[:, 2], 0),
                                minlength=p.patterns).astype(np.int64)
            loaded = int(valid[p.pat].sum())  # valid elements per pattern, per row
        elif ins.index is None:
            # replicated tiles are gathered once and copied to every core that holds them
            uniq, inverse = self.prepared.distinct_tiles(ins.origin)
            cut = HostTiles(src, uniq, ins.tile, inverse,
                            partial(self.stored, ins.buf, owned=True), dst.dtype,
                            pool=self.tile_pool)
            self.give_back(ins.buf)  # (a buffer loaded again)
            if isinstance(rows, slice):  # cut when read: a take reads only its rows
                if self.executed - 1 not in self.uncut:
                    if self.ahead is None:
                        self.ahead = ThreadPoolExecutor(1, thread_name_prefix="t10c-cut")
                    cut = dataclasses.replace(cut, ready=self.ahead.submit(cut.cut))
                self.mem.defer(ins.buf, cut)
                self.cut_memory[ins.buf] = cut
            else:
                copy_rows(cut.cut(), inverse, dst, rows)
                for flat in cut.memory:  # copied onto the cores: dead already
                    self.tile_pool.give(flat)
            loaded = int(cut.counts()[inverse].sum())
        else:
            flat, valid = ins.elements()
            vals = np.take(self.rounded(ins.tensor, ins.buf, src).reshape(-1), flat)
            dst[rows] = vals if valid.all() else np.where(valid, vals, 0)
            loaded = int(valid.sum())
        return loaded * self.itemsize(ins.buf)

    def rounded(self, tensor: str, buf: int, value: np.ndarray) -> np.ndarray:
        """Host tensor ``tensor`` as buffer ``buf`` holds its values: rounded to the buffer's
        dtype once per tensor and dtype (a weight's tiles are loaded onto many cores)."""
        key = (tensor, self.dtypes[buf])
        held = self.host_held.get(key)
        if held is None:
            held = self.host_held[key] = self.stored(buf, value)
        return held

    def fill(self, ins: Fill) -> None:
        super().fill(ins)
        rows = _rows(ins, ins.ncores)
        value = self.stored(ins.buf, np.asarray(float(ins.value)))
        if isinstance(rows, slice) and self.mem.lazy_rows(ins.buf) <= ins.ncores:
            # one row that every filled core shares, copied when read as a buffer (an
            # accumulator that a contraction then writes whole is never copied: `compute`)
            row = np.full((1, self.prog.buffers[ins.buf].elems), value,
                          dtype=HELD[self.dtypes[ins.buf]])
            self.mem.share(ins.buf, row, np.zeros(ins.ncores, dtype=np.intp))
        else:
            self.mem[ins.buf][rows] = value
        self.wrote(ins.buf, rows)

    def exchange(self, ins: Exchange) -> None:
        super().exchange(ins)
        src, dst = self.mem[ins.src], self.mem[ins.dst]
        n = ins.nrows
        rows = _rows(ins, n)
        self.wrote(ins.dst, rows)  # every row it writes, it writes whole
        if ins.pat is not None:  # each distinct row gathered once, then copied to its rows
            p = ins.pattern()  # rounded once per distinct row, before the copies
            if (ins.dst != ins.src and isinstance(rows, slice) and p.patterns == p.rows
                    and self.exact(ins.dst, ins.src) and src.dtype == dst.dtype
                    and np.array_equal(p.pat, np.arange(p.rows))):
                self.patterns.gather(p, src, dst[rows])  # every row its own: in place
                return
            vals = self.stored(ins.dst, self.patterns.gather(p, src), ins.src)
            if isinstance(rows, slice) and p.patterns < p.rows:  # copied when read as a buffer
                self.mem.share(ins.dst, vals.astype(dst.dtype, copy=False), p.pat)
            else:
                copy_rows(vals, p.pat, dst, rows)
            return
        if ins.dst != ins.src and isinstance(rows, slice) and self.exact(ins.dst, ins.src):
            out = dst[rows]  # gathered straight into the destination buffers
        else:  # every core reads before any core writes (dst may be src)
            out = np.empty((n, dst.shape[1]), dtype=src.dtype)
        gather_exchange(ins, src, out)
        if out.base is not dst:
            dst[rows] = self.stored(ins.dst, out, ins.src)

    def shift(self, ins: Shift) -> None:
        super().shift(ins)
        dst = self.mem[ins.dst]
        dst[_rows(ins, len(ins.src_core))] = self.stored(ins.dst, self.mem[ins.src][ins.src_core],
                                                         ins.src)
        self.wrote(ins.dst, _rows(ins, len(ins.src_core)))

    def reduce(self, ins: Reduce) -> None:
        super().reduce(ins)
        src, dst = self.mem[ins.src], self.mem[ins.dst]
        chunk = dst.shape[1]
        combine = COMBINES[ins.combine]
        offset = ins.offset.astype(np.intp)
        lists = self.member_lists(ins.group) if chunk > 1 else None
        if lists is not None and len(lists[0]) * src.shape[1] <= len(ins.group) * chunk:
            # rows that combine the same members in the same order share one combine of
            # the members' whole rows, each row then taking its chunk of it (its elements
            # combined as the row's own chunks would be, in the same order; past the end of
            # src, the combine's identity): a few whole-row copies, not a chunk per row
            rows_of, which = lists
            whole = src[rows_of[:, 0]].astype(np.float32, copy=False)  # (a fresh array)
            for j in range(1, rows_of.shape[1]):
                combine.ufunc(whole, src[rows_of[:, j]].astype(np.float32, copy=False),
                              out=whole)
            past = int(offset.max(initial=0)) + chunk - src.shape[1]
            if past > 0:
                whole = np.concatenate([whole, np.full((len(whole), past), combine.identity,
                                                       dtype=np.float32)], axis=1)
            red = sliding_window_view(whole, chunk, axis=1)[which, offset]
            dst[_rows(ins, len(ins.group))] = self.stored(ins.dst, red, owned=True)
            self.wrote(ins.dst, _rows(ins, len(ins.group)))
            return
        last = src.shape[1] - chunk  # the last offset whose chunk lies inside src
        over = offset > last  # these rows' chunks run past the end of src
        if over.any() and last < 0:  # src is narrower than a chunk: padded whole
            pad = np.full((self.chip.cores, -last), combine.identity, dtype=np.float32)
            src = np.concatenate([src.astype(np.float32), pad], axis=1)
            last, over = 0, np.zeros_like(over)
        # members' chunks: whole chunks cut from a window view of the buffers (a copy per
        # chunk, not an index per element); a chunk past the end of src is cut at the last
        # offset, then moved down and the combine's identity put after it
        windows = sliding_window_view(src, chunk, axis=1)  # (cores, starts, chunk)
        group, start = ins.group.astype(np.intp), np.minimum(offset, last)
        moves = [(np.flatnonzero(offset - last == shift), max(chunk - shift, 0), shift)
                 for shift in np.unique(offset[over] - last).tolist()]

        def members(j: slice | int) -> np.ndarray:
            """Member(s) ``j``'s chunks of every row, ``(n, [members,] chunk)``."""
            parts = windows[group[:, j], start[:, None] if isinstance(j, slice) else start]
            parts = parts.astype(np.float32, copy=False)
            for r, keep, shift in moves:  # (a chunk may lie past the end whole)
                if keep:
                    parts[r, ..., :keep] = parts[r, ..., shift:]
                parts[r, ..., keep:] = combine.identity
            return parts

        if chunk > 1:  # one member at a time, in order: the bits of the reduce over members
            red = members(0)  # (numpy sums an axis that is not the last one in order)
            for j in range(1, group.shape[1]):
                combine.ufunc(red, members(j), out=red)
        else:  # (along a last axis of one, numpy sums pairwise)
            red = combine.ufunc.reduce(members(slice(None)), axis=1)
        dst[_rows(ins, len(ins.group))] = self.stored(ins.dst, red, owned=True)
        self.wrote(ins.dst, _rows(ins, len(ins.group)))

    def member_lists(self, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`Prepared.member_lists`."""
        return self.prepared.member_lists(group)

    def compute(self, ins: Compute) -> None:
        super().compute(ins)
        expr = self.prog.exprs[ins.expr]
        sub = dict(zip(expr.axis_names, ins.sub))
        n = len(ins.origin)
        rows = _rows(ins, n)
        placed = ins.cores is not None
        tiles = ins.tiles
        values: list[np.ndarray | Replicated] = []
        table = self.take_table(ins) if expr.body[0] == "take" and not placed else None
        for k, bid in enumerate(ins.ins):
            sizes = operand_sizes(expr, k, sub, tiles[k])
            offsets = ins.offsets[k]
            if table is not None and k == expr.body[1]:  # each element's position, plus one
                where = np.broadcast_to(np.arange(1, math.prod(tiles[k]) + 1, dtype=np.float32),
                                        (n, math.prod(tiles[k])))
                values.append(gather_slices(where, tiles[k], offsets, sizes)[0])
                continue
            shared = None if placed else self.mem.tiles(bid)
            if shared is not None and n:
                blocks, index = shared  # the distinct tiles' blocks, and each core's tile
                dense = partial(self.operand, bid, tiles[k], offsets, sizes)
                if (offsets == offsets[0]).all():
                    cut = np.broadcast_to(offsets[0], (len(blocks), len(offsets[0])))
                    values.append(Replicated(
                        gather_slices(blocks, tiles[k], cut, sizes)[0], index[:n], dense))
                else:
                    values.append(replicated_at(blocks, tiles[k], sizes, dense,
                                                *self.prepared.pairs(index, n, offsets)))
                continue
            values.append(self.operand(bid, tiles[k], offsets, sizes, rows if placed else None))
        k = len(ins.ins)
        sizes = operand_sizes(expr, k, sub, tiles[k])
        whole_rows = (not placed and tuple(sizes) == tuple(tiles[k])
                      and self.prog.buffers[ins.out].elems == math.prod(sizes))
        # a product of whole rows that replaces them (no accumulation, or into the combine's
        # identity): written into the buffer's rows at once, not stored from a temporary
        into, fresh = None, None
        if (whole_rows and table is None and n and ins.out not in ins.ins
                and HELD[self.dtypes[ins.out]] == np.float32):
            fresh = not ins.accumulate or self.filled_with_identity(ins.out, n, expr)
            if fresh:
                self.rewrite(ins.out, rows)
                into = self.mem[ins.out][:n]
                if not into.flags.c_contiguous:
                    into = None
        with np.errstate(all="ignore"):  # padded lanes may divide by zero; they are masked
            result = evaluate(expr, values, sub, ins.origin, out=into)
        if into is not None and np.may_share_memory(result, into):
            if NP_DTYPES[self.dtypes[ins.out]] == np.float16:
                round_fp16(into, out=into)
            return
        if table is not None:  # the positions picked: their values, cut from the host tensor
            picked = result.astype(np.int64) - 1
            cores = np.arange(n).reshape((n,) + (1,) * (picked.ndim - 1))
            result = table.read(cores, picked).astype(np.float32)
        self.rewrite(ins.out, rows)  # a sub-block of each row: the rest must read as zero
        accumulate = ins.accumulate and not (whole_rows and (
            fresh if fresh is not None else self.filled_with_identity(ins.out, n, expr)))
        out = self.mem[ins.out]
        if placed:  # work on a copy of the placed cores' rows, written back below
            whole, out = out, out[rows]
        if accumulate:
            if expr.combine is None:
                raise EmulatorError(f"accumulates into {expr.name}, which has no combine")
            view, at = gather_slices(out, tiles[k], ins.offsets[k], sizes)
            combine = COMBINES[expr.combine].ufunc
            if (self.dtypes[ins.out] == "fp32" and result.dtype == np.float32
                    and (at is None or all(isinstance(i, slice) for i in at))):
                # an fp32 buffer's own sub-block (a view): combined in place, as stored
                combine(view, result, out=view)
                if placed:
                    whole[rows] = out
                return
            result = combine(view.astype(np.float32, copy=False), result)
        if whole_rows and result.dtype == np.float32 and out.dtype == np.float32:
            # whole rows: stored straight into the buffers (rounded on the way)
            self.stored(ins.out, result, into=out[:n])
            return
        # masks (-3.4e38) saturate to -inf in fp16
        put_slices(out, tiles[k], ins.offsets[k], sizes, self.stored(ins.out, result))
        if placed:
            whole[rows] = out

    def filled_with_identity(self, buf: int, n: int, expr: TensorExpr) -> bool:
        """Whether rows ``[0, n)`` of ``buf``, and no others, are one row that they share (a
        `fill`'s) holding the identity of ``expr``'s combine: an accumulation into them whole
        is its result. If so, the row is dropped (not copied onto the cores)."""
        held = self.mem.shared.get(buf)
        if held is None or expr.combine is None or len(held[0]) != 1 or len(held[1]) != n:
            return False
        if not (held[0] == np.float32(COMBINES[expr.combine].identity)).all():
            return False
        del self.mem.shared[buf]
        return True

    def take_table(self, ins: Compute) -> HostTiles | None:
        """The table of a take whose tiles are not cut yet (`HostTiles`), if it is one: the
        take runs on each element's position and reads the values it picks from the host."""
        expr = self.prog.exprs[ins.expr]
        table = self.mem.later.get(ins.ins[expr.body[1]])
        if table is None or math.prod(ins.tiles[expr.body[1]]) >= 1 << 24:
            return None  # (positions are carried as float32: exact below 2^24)
        return table

    def operand(self, buf: int, tile: tuple[int, ...], offsets: np.ndarray,
                sizes: tuple[int, ...], rows: np.ndarray | slice | None = None) -> np.ndarray:
        """Every core's sub-block of ``sizes`` at ``offsets`` of buffer ``buf`` (of the
        placed cores ``rows``, if given)."""
        values = self.mem[buf]
        return gather_slices(values if rows is None else values[rows], tile, offsets, sizes)[0]

    def dma_store(self, ins: DmaStore) -> None:
        # the values are taken as the store is issued: nothing writes the buffer before its
        # DmaWait (the timing handler enforces it); the DRAM copy is the output
        super().dma_store(ins)
        self.outputs[ins.tensor] = ins.whole(self.store_values(ins), self.host)

    def store(self, ins: Store) -> None:
        super().store(ins)
        self.outputs[ins.tensor] = ins.whole(self.store_values(ins), self.host)

    def store_values(self, ins: Store) -> np.ndarray:
        """The elements ``ins`` stores (in its table's order), gathered from the cores."""
        return self.mem[ins.src][ins.src_core, ins.src_off].astype(np.float32)


def emulate(program: Program, chip: Chip, inputs: dict[str, np.ndarray],
            constants: dict[str, np.ndarray], progress: Progress | None = None,
            prepared: Prepared | None = None
            ) -> tuple[dict[str, np.ndarray], Timeline, float]:
    """Run ``program`` on ``chip``; returns outputs, timeline and wall seconds: the run's,
    once the process's kernels are made (`prepare`) and the program's tables (`Prepared`,
    made here unless given), as the reference's wall time is its session's run, after the
    session is made. ``progress("emulate", done, total)`` is called as the instructions go
    (at every op)."""
    prepare()
    if prepared is None:
        prepared = Prepared.of(program, chip)
    start = time.perf_counter()
    outputs, timeline = Machine(program, chip, prepared).run(inputs, constants, progress)
    return outputs, timeline, time.perf_counter() - start


class Prepared:
    """What a run of ``program`` on ``chip`` works out from the program alone, never from
    values: the gather index of every copy pattern (`Gathers`), the member lists of the
    reduces (`member_lists`), the distinct tiles of the tiled loads (`distinct_tiles`), the
    bytes each core receives in every pattern exchange (`TimingMachine.pattern_counts`), where
    each loaded buffer's tiles die (`dead_tiles`) and which loads are tables a take reads
    uncut (`uncut_tables`). `of` works these out before a run (as onnxruntime makes its
    session before it runs one: `emulate` times the run); the few a run meets only as it goes
    (the (tile, offset) pairs a rotating step reads: `pairs`) are made at their first use.
    A `Machine` given none makes them all as it meets them. Runs of one program may share one
    (nothing in it changes once made; the caches only fill)."""

    def __init__(self, program: Program, chip: Chip) -> None:
        self.program, self.chip = program, chip
        self.patterns = Gathers()
        #: member lists, distinct tiles and (tile, offset) pairs, by their tables (`_once`)
        self.made: dict[tuple[int, ...], tuple[tuple[np.ndarray, ...],
                                               tuple[np.ndarray, np.ndarray]]] = {}
        self.counted: ByArrays[Any] = ByArrays()
        self.dead = dead_tiles(program)
        self.uncut = uncut_tables(program)

    @classmethod
    def of(cls, program: Program, chip: Chip) -> Prepared:
        """Everything made now, for the program's instructions as they stand."""
        made = cls(program, chip)
        timing = TimingMachine(program, chip)
        timing.counted = made.counted
        elems = [b.elems for b in program.buffers]
        for ins in program.instrs:
            if isinstance(ins, Exchange) and ins.pat is not None:
                p = ins.pattern()
                made.patterns.index(p, elems[ins.src], pattern_width(p))
                if not chip.is_mesh:  # (a mesh's are not kept)
                    timing.pattern_counts(ins, p, _phys(ins, p.rows))
            elif isinstance(ins, Load):  # (as `Machine.load_values` reads it)
                if ins.pat is not None:
                    p = ins.pattern()
                    assert p is not None
                    made.patterns.index(p, math.prod(ins.shape), pattern_width(p))
                elif ins.index is None:
                    made.distinct_tiles(ins.origin)
            elif isinstance(ins, Reduce) and elems[ins.dst] > 1:
                made.member_lists(ins.group)
        return made

    def _once(self, arrays: tuple[np.ndarray, ...], extra: int,
              make: Callable[[], tuple[np.ndarray, np.ndarray]]
              ) -> tuple[np.ndarray, np.ndarray]:
        """``make()``, once per tuple of tables (by identity: the tables of repeated layers
        are one array each; held, so that an id is not reused) and ``extra``."""
        key = (*map(id, arrays), extra)
        got = self.made.get(key)
        if got is None or any(a is not b for a, b in zip(got[0], arrays)):
            got = self.made[key] = (arrays, make())
        return got[1]

    def member_lists(self, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A reduce's distinct rows of members (in their order) and each row's among them,
        once per table (repeated layers' reduces share theirs)."""
        return self._once((group,), 0, lambda: unique_rows(group.astype(np.intp)))

    def distinct_tiles(self, origin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A tiled load's distinct tile origins and each core's among them (`unique_rows`),
        once per table: the cores' tile index is then one array for every load of the
        table, which `pairs` finds again."""
        return self._once((origin,), 1, lambda: unique_rows(origin))

    def pairs(self, index: np.ndarray, n: int, offsets: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """The distinct pairs (tile, offsets...) of cores ``[0, n)`` reading tile
        ``index[c]`` at ``offsets[c]``, and each core's pair (`replicated_at`), once per
        pair of tables."""
        return self._once((index, offsets), 2 + n, lambda: tile_pairs(index[:n], offsets))


class Memory(dict[int, np.ndarray]):
    """The live buffers' values by buffer id, each ``(cores, elems)``. A buffer whose cores
    hold few distinct rows (a loaded weight's tiles, an exchange's shared rows) may be kept as
    the rows and each core's row (`shared`), which a contraction reads as it is
    (`Replicated`); a loaded buffer may be kept as its host tensor, not cut yet (`later`),
    which a take reads from; any other access cuts the tiles and copies them onto the cores
    first, so that everything else sees a plain array."""

    def __init__(self) -> None:
        super().__init__()
        self.shared: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.later: dict[int, HostTiles] = {}

    def share(self, buf: int, tiles: np.ndarray, index: np.ndarray) -> None:
        """Rows ``[0, len(index))`` of ``buf`` are ``tiles[index]`` (not copied yet)."""
        self.later.pop(buf, None)
        self.shared[buf] = (tiles, index)

    def defer(self, buf: int, tiles: HostTiles) -> None:
        """Rows ``[0, len(tiles.index))`` of ``buf`` are the host tiles ``tiles`` (not cut)."""
        self.shared.pop(buf, None)
        self.later[buf] = tiles

    def lazy_rows(self, buf: int) -> int:
        """How many of ``buf``'s rows are kept as shared rows or uncut tiles (0: none)."""
        later = self.later.get(buf)
        if later is not None:
            return len(later.index)
        shared = self.shared.get(buf)
        return 0 if shared is None else len(shared[1])

    def tiles(self, buf: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Buffer ``buf``'s distinct rows and each core's row, if it is kept so (cut now)."""
        later = self.later.pop(buf, None)
        if later is not None:
            self.shared[buf] = (later.cut(), later.index)
        return self.shared.get(buf)

    def __getitem__(self, buf: int) -> np.ndarray:
        values = super().__getitem__(buf)
        shared = self.tiles(buf)
        if shared is not None:
            del self.shared[buf]
            copy_rows(shared[0], shared[1], values, slice(0, len(shared[1])))
        return values

    def __setitem__(self, buf: int, values: np.ndarray) -> None:
        self.shared.pop(buf, None)
        self.later.pop(buf, None)
        super().__setitem__(buf, values)

    def pop(self, buf: int, default: Any = None) -> Any:
        self.shared.pop(buf, None)
        self.later.pop(buf, None)
        return super().pop(buf, default)


@dataclass(frozen=True)
class HostTiles:
    """A loaded buffer not cut yet: core c holds the ``tile``-shaped block of ``host`` at
    ``origin[index[c]]`` (zero outside the tensor), every value as ``store`` rounds it into
    the buffer, held as ``dtype``."""

    host: np.ndarray
    origin: np.ndarray  # (distinct tiles, ndim)
    tile: tuple[int, ...]
    index: np.ndarray
    store: Callable[[np.ndarray], np.ndarray]  # (of an array of its own: may round in place)
    dtype: np.dtype
    ready: Future[np.ndarray] | None = None  # `cut` under way in another thread
    #: where float32 tiles are cut into (memory no instruction reads any more), if anywhere;
    #: ``memory`` then holds the array they were cut into, to give back once they are dead
    pool: Pool | None = None
    memory: list[np.ndarray] = dataclasses.field(default_factory=list)

    def cut(self) -> np.ndarray:
        """The distinct tiles, ``(len(origin), elems)``, rounded (each value once)."""
        if self.ready is not None:
            return self.ready.result()
        out = None
        if self.pool is not None and self.host.dtype == np.float32:
            size = len(self.origin) * math.prod(self.tile)
            if not self.memory:
                flat = self.pool.take(size)
                self.memory.append(np.empty(size, dtype=np.float32) if flat is None else flat)
            out = self.memory[0][:size].reshape(len(self.origin), -1)
        return self.store(load_tiles(self.host, self.origin, self.tile, out)[0]).astype(
            self.dtype, copy=False)

    def counts(self) -> np.ndarray:
        """How many elements of each distinct tile lie inside the tensor."""
        return tile_counts(self.origin, self.tile, self.host.shape)

    def read(self, cores: np.ndarray, elems: np.ndarray) -> np.ndarray:
        """The values at flat positions ``elems`` of cores ``cores``' tiles (broadcast
        together; a negative position reads zero), as the cut buffer holds them."""
        cores, elems = np.broadcast_arrays(cores, elems)
        out = np.zeros(elems.shape, dtype=self.dtype)
        # only the positions read (a take over a table split by rows misses on most cores)
        at = np.flatnonzero(elems.reshape(-1) >= 0)
        if not at.size:
            return out
        # each position's coordinates in its tile, last dimension first (not
        # np.unravel_index: numpy 2.4 gets it wrong on large arrays when a dimension is 1)
        rest, coords = elems.reshape(-1)[at], []
        for t in self.tile[::-1]:
            rest, c = np.divmod(rest, t)
            coords.append(c)
        coords.reverse()
        corner = self.origin[self.index[cores.reshape(-1)[at]]]  # (positions read, ndim)
        inside = np.ones(at.size, dtype=bool)
        flat = np.zeros(at.size, dtype=np.int64)
        for d, size in enumerate(self.host.shape):
            x = corner[:, d] + coords[d]
            inside &= (x >= 0) & (x < size)
            flat = flat * size + np.clip(x, 0, size - 1)
        values = self.store(np.take(self.host.reshape(-1), flat)).astype(self.dtype, copy=False)
        out.reshape(-1)[at] = np.where(inside, values, np.zeros((), dtype=self.dtype))
        return out


class Pool:
    """Freed memory (flat float32 arrays, any 4-byte dtype viewed on them): freed buffers', or
    loaded tiles' that no instruction reads again (`Machine.tile_pool`, which the cut thread
    takes from), kept up to a budget of bytes for later buffers or tiles: repeated layers
    allocate the same sizes, and fresh memory costs a page fault per page at its first
    write, several times the write itself (README: Performance, Emulator speed)."""

    BUDGET = 1 << 30

    def __init__(self) -> None:
        self.free: list[np.ndarray] = []
        self.bytes = 0
        self.lock = threading.Lock()

    def take(self, elems: int) -> np.ndarray | None:
        """The smallest kept array of at least ``elems`` elements (and at most twice as many:
        a small buffer does not hold a large array), or None."""
        with self.lock:
            best = None
            for k, flat in enumerate(self.free):
                if elems <= flat.size <= 2 * elems and (best is None
                                                        or flat.size < self.free[best].size):
                    best = k
            if best is None:
                return None
            flat = self.free.pop(best)
            self.bytes -= flat.nbytes
            return flat

    def give(self, flat: np.ndarray) -> None:
        """Keep ``flat`` for a later buffer, if the budget allows."""
        with self.lock:
            if self.bytes + flat.nbytes <= self.BUDGET:
                self.free.append(flat)
                self.bytes += flat.nbytes


def dead_tiles(program: Program) -> dict[int, tuple[int, ...]]:
    """Instruction index -> the buffers whose loaded tiles (a tiled `Load`'s) it reads for
    the last time: no instruction reads or writes the buffer after it until its `Free` (or
    the program's end). A buffer written after its load keeps its memory until its Free."""
    last: dict[int, int | None] = {}  # loaded buffer -> its last read so far
    dead: dict[int, list[int]] = {}

    def end(buf: int) -> None:
        j = last.pop(buf, None)
        if j is not None:
            dead.setdefault(j, []).append(buf)

    for i, ins in enumerate(program.instrs):
        reads: tuple[int, ...]
        writes: tuple[int, ...]
        if isinstance(ins, Compute):
            reads, writes = ins.ins, (ins.out,)
        elif isinstance(ins, (Exchange, Shift, Reduce)):
            reads, writes = (ins.src,), (ins.dst,)
        elif isinstance(ins, Store):
            reads, writes = (ins.src,), ()
        elif isinstance(ins, (Load, Fill)):
            reads, writes = (), (ins.buf,)
        else:
            reads, writes = (), ()
        for buf in reads:
            if buf in last:
                last[buf] = i
        for buf in writes:
            last.pop(buf, None)
        if isinstance(ins, Load) and ins.pat is None and ins.index is None:
            last[ins.buf] = None
        elif isinstance(ins, Free):
            end(ins.buf)
    for buf in list(last):
        end(buf)
    return {i: tuple(bufs) for i, bufs in dead.items()}


def uncut_tables(program: Program) -> frozenset[int]:
    """The indices of the tiled loads whose buffer is next read as a take's table."""
    loaded: dict[int, int] = {}  # buffer -> the index of its last tiled load not read yet
    found = set()
    for i, ins in enumerate(program.instrs):
        if isinstance(ins, Load) and ins.pat is None and ins.index is None:
            loaded[ins.buf] = i
        elif isinstance(ins, Compute):
            expr = program.exprs[ins.expr]
            for k, buf in enumerate(ins.ins):
                j = loaded.pop(buf, None)
                if j is not None and expr.body[0] == "take" and k == expr.body[1]:
                    found.add(j)
        elif isinstance(ins, (Exchange, Shift, Reduce, Store)):
            loaded.pop(ins.src, None)
    return frozenset(found)


def copy_rows(values: np.ndarray, which: np.ndarray, dst: np.ndarray,
              rows: np.ndarray | slice) -> None:
    """``dst[rows] = values[which]``: straight into the buffers where ``rows`` is a slice
    (no temporary of every row), else through one."""
    if isinstance(rows, slice) and values.dtype == dst.dtype:
        np.take(values, which, axis=0, out=dst[rows], mode="clip")  # in range: unbuffered
    else:
        dst[rows] = values[which]


def tile_pairs(index: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows (tile, offsets...) of cores reading tile ``index[c]`` at
    ``offsets[c]`` (`replicated_at`'s pairs), and each core's among them."""
    return unique_rows(np.column_stack([index, offsets]))


def replicated_at(blocks: np.ndarray, tile: tuple[int, ...], sizes: tuple[int, ...],
                  dense: Callable[[], np.ndarray], pairs: np.ndarray, which: np.ndarray
                  ) -> Replicated:
    """The sub-blocks of ``sizes`` at each core's own offsets of its tile ``blocks[i]``, as
    the distinct ``pairs`` (i, offsets...)' sub-blocks and each core's pair (``which``;
    `tile_pairs`): a replicated weight read at a different place by each core of a ring
    (a rotating plan's step) is cut from its few distinct tiles, not first copied onto every
    core."""
    windows = sliding_window_view(blocks.reshape((len(blocks), *tile)), sizes,
                                  axis=tuple(range(1, len(tile) + 1)))
    return Replicated(windows[(pairs[:, 0],) + tuple(pairs[:, 1:].T)], which, dense)


def unique_rows(origin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``origin`` (n, ndim) and each row's index among them, as
    ``np.unique(origin, axis=0, return_inverse=True)`` but through one integer key per row."""
    low = origin.min(axis=0, initial=0)
    span = origin.max(axis=0, initial=0) - low + 1
    if not origin.size or math.prod(int(x) for x in span) >= 2 ** 62:
        uniq, inverse = np.unique(origin, axis=0, return_inverse=True)
        return uniq, inverse.reshape(-1)
    key = np.ravel_multi_index(tuple((origin - low).T), tuple(int(x) for x in span))
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return origin[first], inverse.reshape(-1)


def load_tiles(host: np.ndarray, origin: np.ndarray, tile: tuple[int, ...],
               out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every ``tile``-shaped block of ``host`` at ``origin[c]`` (zero outside the tensor), as
    (len(origin), elems) (into ``out``, if given: contiguous, of that shape and ``host``'s
    dtype), and how many elements of each lie inside the tensor.

    Tiles on the tile grid (the common case) are cut from a blocked view of the tensor (padded
    to whole tiles) by indexing whole blocks; others are gathered element by element. A
    transposed view of a contiguous array (a load through `Load.perm`: a tied LM head) is
    cut in the array's own order, then each tile transposed (`_transposed_tiles`)."""
    order = _contiguous_order(host)
    if order is not None:
        return _transposed_tiles(host, origin, tile, order, out)
    tiles, counts = _load_tiles(host, origin, tile, out)
    if out is not None and not np.may_share_memory(tiles, out):
        out[...] = tiles
        tiles = out
    return tiles, counts


def _load_tiles(host: np.ndarray, origin: np.ndarray, tile: tuple[int, ...],
                out: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """`load_tiles` of a tensor in its own order: the grid of whole tiles into ``out``, if
    given; other tiles into arrays of their own."""
    shape = host.shape
    n = len(origin)
    edge = np.asarray(shape, dtype=np.int64)[None, :] - origin
    counts = np.prod(np.clip(edge, 0, np.asarray(tile, dtype=np.int64)), axis=1,
                     dtype=np.int64) if len(tile) else np.ones(n, dtype=np.int64)
    t = np.asarray(tile, dtype=np.int64)
    grid = [ceil_div(s, b) if b else 0 for s, b in zip(shape, tile)]
    if not (len(tile) and all(tile) and (origin >= 0).all() and not (origin % t).any()
            and (origin // t < np.asarray(grid)).all()):
        return edge_tiles(host, origin, tile), counts
    # whole tiles from a blocked view of the tensor's whole tiles; those at its far edges
    # (cut by the tensor's end) element by element
    full = [s // b for s, b in zip(shape, tile)]
    where = origin // t
    inside = (where < np.asarray(full)).all(axis=1)
    nd = len(tile)
    split = [x for f, b in zip(full, tile) for x in (f, b)]
    whole = host[tuple(slice(0, f * b) for f, b in zip(full, tile))]
    blocks = whole.reshape(split).transpose([*range(0, 2 * nd, 2), *range(1, 2 * nd, 2)])
    if n == math.prod(grid) and np.array_equal(where, np.indices(grid).reshape(nd, -1).T):
        # every tile of the grid in order (a weight cut whole): one strided copy of the whole
        # tiles, not an index per tile; the edge tiles after it
        tiles = np.empty((*grid, *tile), dtype=host.dtype) if out is None else \
            out.reshape(*grid, *tile)
        tiles[tuple(slice(0, f) for f in full)] = blocks
        tiles = tiles.reshape(n, -1)
        if not inside.all():
            tiles[~inside] = edge_tiles(host, origin[~inside], tile)
        return tiles, counts
    if inside.all():
        return blocks[tuple(where.T)].reshape(n, -1), counts
    tiles = np.empty((n, math.prod(tile)), dtype=host.dtype)
    if inside.any():
        tiles[inside] = blocks[tuple(where[inside].T)].reshape(int(inside.sum()), -1)
    tiles[~inside] = edge_tiles(host, origin[~inside], tile)
    return tiles, counts


def _contiguous_order(host: np.ndarray) -> list[int] | None:
    """The axis order in which ``host`` is a C-contiguous array, if it is a transpose of one
    (and not one already), else None."""
    if host.ndim < 2 or host.flags.c_contiguous or not host.size:
        return None
    order = sorted(range(host.ndim), key=lambda d: -host.strides[d])
    return order if np.transpose(host, order).flags.c_contiguous else None


#: elements of a transposed host's tiles cut at once (`_transposed_tiles`): a few MiB
TRANSPOSED_CHUNK = 1 << 20


def _transposed_tiles(host: np.ndarray, origin: np.ndarray, tile: tuple[int, ...],
                      order: list[int], out: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """`load_tiles` of ``host``, a transposed view of the C-contiguous ``host.transpose(order)``:
    the tiles cut from that array (whole rows of memory, where reading the view tile by tile
    strides across it, several times slower) a few at a time, each then transposed back
    within the cache."""
    flat = np.transpose(host, order)
    n, elems = len(origin), math.prod(tile)
    if out is None:
        out = np.empty((n, elems), dtype=host.dtype)
    counts = np.empty(n, dtype=np.int64)
    cut = tuple(tile[d] for d in order)
    back = [0, *(1 + order.index(d) for d in range(host.ndim))]
    step = max(1, TRANSPOSED_CHUNK // max(elems, 1))
    for lo in range(0, n, step):
        part, counts[lo:lo + step] = load_tiles(flat, origin[lo:lo + step][:, order], cut)
        out[lo:lo + step].reshape(-1, *tile)[...] = part.reshape(-1, *cut).transpose(back)
    return out, counts


def edge_tiles(host: np.ndarray, origin: np.ndarray, tile: tuple[int, ...]) -> np.ndarray:
    """The ``tile``-shaped blocks of ``host`` at ``origin`` (zero outside the tensor),
    gathered element by element: (len(origin), elems)."""
    flat, valid = tile_elements(origin, tile, host.shape)
    vals = np.take(host.reshape(-1), flat)
    return vals if valid.all() else np.where(valid, vals, 0)


class Gathers:
    """Gather indices of copy patterns, built once per distinct pattern and source width
    (repeated layers exchange by the same patterns) and kept up to a budget of bytes."""

    BUDGET = 1 << 28

    def __init__(self) -> None:
        self.cache: ByArrays[tuple[np.ndarray, np.ndarray | None]] = ByArrays()
        self.bytes = 0

    def index(self, p: Pattern, src_width: int, width: int
              ) -> tuple[np.ndarray, np.ndarray | None]:
        """(flat index into a ``(cores, src_width)`` array, padding mask or None) of every
        distinct pattern's elements, ``(patterns, width)``."""
        hit = self.cache.get((p.start, p.runs), src_width)
        if hit is not None:
            return hit
        core, off = unique_expand(p, width)
        hole = core < 0
        flat = np.where(hole, 0, core * src_width + off)
        entry = flat, (hole if hole.any() else None)
        size = flat.nbytes + (hole.nbytes if entry[1] is not None else 0)
        if self.bytes + size <= self.BUDGET:
            self.cache.put((p.start, p.runs), entry, src_width)
            self.bytes += size
        return entry

    def gather(self, p: Pattern, src: np.ndarray, out: np.ndarray | None = None
               ) -> np.ndarray:
        """Every distinct pattern's values gathered from ``src`` (cores, elems), zero on
        padding: ``(patterns, width)`` (into ``out``, if given, of ``src``'s dtype); a large
        gather is shared among the machine's cores, by rows."""
        flat, hole = self.index(p, src.shape[1], pattern_width(p))
        if out is None:
            out = np.empty(flat.shape, dtype=src.dtype)
        source = src.reshape(-1)
        rows = len(flat)
        parts = min(THREADS, flat.size // SHARED_GATHER, rows)
        if parts < 2:
            np.take(source, flat, out=out)
        else:
            cuts = [rows * k // parts for k in range(parts + 1)]
            share(lambda a, b: np.take(source, flat[a:b], out=out[a:b]), cuts)
        if hole is not None:
            out[hole] = 0
        return out


#: elements a gather must move to be shared among threads
SHARED_GATHER = 1 << 18


#: elements of an exchange table gathered at once: the int64 index of a block stays in cache
GATHER_BLOCK = 1 << 17


def gather_exchange(ins: Exchange, src: np.ndarray, out: np.ndarray) -> None:
    """``out[r, e] = src[src_core[r, e], src_off[r, e]]``, zero where ``src_core`` is -1: the
    exchange's table as one flat gather into the source buffers' ``(cores, elems)`` array,
    done in blocks of table rows so that the index (built in int64, which numpy gathers with
    fastest) never leaves the cache."""
    core, off = ins.src_core, ins.src_off
    assert core is not None and off is not None  # a table exchange
    n, width = core.shape
    padded = bool(core.size) and int(core.min()) < 0
    flat_src = src.reshape(-1)
    step = max(1, GATHER_BLOCK // max(width, 1))
    for r in range(0, n, step):
        block = core[r:r + step]
        flat = block.astype(np.int64)
        flat *= src.shape[1]
        flat += off[r:r + step]
        if padded:
            hole = block < 0
            flat[hole] = 0  # any element will do: overwritten with zero below
            vals = np.take(flat_src, flat)
            vals[hole] = 0
            out[r:r + step] = vals
        else:
            out[r:r + step] = np.take(flat_src, flat)
