"""The reference executor: a `Program` run one core at a time, plainly and slowly.

This is the living definition of the instruction semantics documented in
`t10c.codegen.program`; the vectorised emulator (`machine.py`) is checked against it in
``tests/test_reference_executor.py``. Keep it obviously correct rather than fast: each core holds
a dict of 1-D buffers, and every instruction is a Python loop over cores with plain numpy per
core. Buffers keep their dtype (fp16, fp32, int32) and arithmetic is float32, as in the emulator.
An allocated buffer's contents are undefined: the emulator zero-fills it, the reference poisons it
(NaN, or the most negative int32), so a program that reads an element it never wrote cannot agree
with the emulator by accident. There is no timing and no SRAM or link checking.

    outputs = run_reference(program, chip, inputs, constants)
"""

from __future__ import annotations

import numpy as np

from t10c.chips import Chip
from t10c.codegen.program import (
    Alloc,
    Compute,
    DmaStore,
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
    unique_expand,
)
from t10c.dtypes import DTYPES
from t10c.elementwise import COMBINES

from .kernels import evaluate, operand_sizes, to_storage
from .timing import HANDLERS

NP_DTYPES = {name: d.numpy for name, d in DTYPES.items()}
POISON = {name: d.poison for name, d in DTYPES.items()}

Memory = list[dict[int, np.ndarray]]  # per core: buffer id -> 1-D array


def run_reference(program: Program, chip: Chip, inputs: dict[str, np.ndarray],
                  constants: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``program`` core by core; returns the stored outputs (float32, graph shapes)."""
    if program.cores != chip.cores:
        raise ValueError(f"program is for {program.cores} cores, chip {chip.name} has "
                         f"{chip.cores}")
    ref = Reference(program, program.host_tensors(inputs, constants))
    sources = {e.name: e.source for e in program.exprs}
    for n, ins in enumerate(program.instrs):
        try:
            ref.step(ins)
        except Exception as exc:
            where = f"instruction {n} ({type(ins).__name__}) of op {ins.op or '-'}"
            if sources.get(ins.op):
                where += f" (ONNX {sources[ins.op]})"
            raise RuntimeError(f"while executing {where}: {exc}") from exc
    return ref.outputs


class Reference:
    """The per-core interpreter: one handler per instruction class (the names of `HANDLERS`,
    which the emulator shares)."""

    def __init__(self, program: Program, host: dict[str, np.ndarray]) -> None:
        self.prog, self.host = program, host
        self.mem: Memory = [{} for _ in range(program.cores)]
        self.outputs: dict[str, np.ndarray] = {}
        self.handlers = {cls: getattr(self, name) for cls, name in HANDLERS.items()}

    def step(self, ins: Instr) -> None:
        handler = self.handlers.get(type(ins))
        if handler is None:
            raise TypeError(f"unknown instruction {type(ins).__name__}")
        handler(ins)

    @property
    def cores(self) -> range:
        return range(len(self.mem))

    @staticmethod
    def core(ins: Instr, row: int) -> int:
        """The physical core of table row ``row`` (`t10c.codegen.program`: an instruction with
        a ``cores`` array lists its rows' cores; without one, row c is core c)."""
        cores = getattr(ins, "cores", None)
        return row if cores is None else int(cores[row])

    def alloc(self, ins: Alloc) -> None:
        b = self.prog.buffers[ins.buf]
        for c in self.cores:
            self.mem[c][ins.buf] = np.full(b.elems, POISON[b.dtype], dtype=NP_DTYPES[b.dtype])

    def free(self, ins: Free) -> None:
        for c in self.cores:
            del self.mem[c][ins.buf]

    def sync(self, ins: Sync) -> None:
        pass

    def load(self, ins: Load) -> None:
        mem = self.mem
        value = ins.read_as(np.asarray(self.host[ins.tensor]))
        flat = value.reshape(-1)
        table = None
        if ins.indexed:  # the pattern's meaning is its table
            elems, valid = ins.elements()
            table = np.where(valid, elems, -1)
        for c in range(ins.ncores):
            buf = mem[self.core(ins, c)][ins.buf]
            if table is not None:
                idx = table[c]
                buf[:] = to_storage(np.where(idx >= 0, flat[np.maximum(idx, 0)], 0), buf.dtype)
                continue
            # the tile at origin[c], cut at the tensor's edge, zero beyond it
            block = np.zeros(ins.tile, dtype=buf.dtype)
            start = ins.origin[c]
            part = value[tuple(slice(int(s), int(s) + t) for s, t in zip(start, ins.tile))]
            block[tuple(slice(0, n) for n in part.shape)] = to_storage(part, block.dtype)
            buf[:] = block.reshape(-1)

    def dma_load(self, ins: Load) -> None:
        self.load(ins)  # the values are the same; when they land is the timing's business

    def dma_wait(self, ins: Instr) -> None:
        pass

    def dma_store(self, ins: DmaStore) -> None:
        # the DRAM copy is the output; when it is written is the timing's business
        self.outputs[ins.tensor] = ins.whole(self.gathered(ins), self.host)

    def fill(self, ins: Fill) -> None:
        for c in range(ins.ncores):
            buf = self.mem[self.core(ins, c)][ins.buf]
            buf[:] = to_storage(np.asarray(float(ins.value)), buf.dtype)

    def exchange(self, ins: Exchange) -> None:
        if ins.multicast:
            return self.multicast(ins)
        mem = self.mem
        # every core reads before any core writes (dst may be src)
        new = []
        src_core, src_off = ins.table()  # a pattern means its table
        for c in range(len(src_core)):
            vals = np.zeros_like(mem[self.core(ins, c)][ins.dst])
            for s in np.unique(src_core[c]):
                if s >= 0:
                    here = src_core[c] == s
                    vals[here] = to_storage(mem[s][ins.src][src_off[c][here]], vals.dtype)
            new.append(vals)
        for c, vals in enumerate(new):
            mem[self.core(ins, c)][ins.dst][:] = vals

    def multicast(self, ins: Exchange) -> None:
        """A multicast exchange as the chip runs it: every (distinct row pattern, source
        core) tree's elements are read once from the source into one packet, and the packet
        is written into every row of that pattern, where the row's runs from that source
        land. Every packet is read before any row is written (dst may be src)."""
        mem = self.mem
        p = ins.pattern()
        elems = self.prog.buffers[ins.dst].elems
        core, off = unique_expand(p, elems)
        packets: list[list[tuple[np.ndarray, np.ndarray]]] = []
        for u in range(p.patterns):
            mine = []
            for s in np.unique(core[u]):
                if s >= 0:
                    at = core[u] == s
                    mine.append((at, mem[int(s)][ins.src][off[u][at]].copy()))
            packets.append(mine)
        for c, u in enumerate(p.pat):
            dst = mem[self.core(ins, c)][ins.dst]
            vals = np.zeros_like(dst)
            for at, packet in packets[int(u)]:
                vals[at] = to_storage(packet, vals.dtype)
            dst[:] = vals

    def shift(self, ins: Shift) -> None:
        new = [self.mem[s][ins.src].copy() for s in ins.src_core]
        for c, vals in enumerate(new):
            dst = self.mem[self.core(ins, c)][ins.dst]
            dst[:] = to_storage(vals, dst.dtype)

    def reduce(self, ins: Reduce) -> None:
        chunk = self.prog.buffers[ins.dst].elems
        combine = COMBINES[ins.combine]
        new = []
        for c in range(len(ins.group)):
            start = int(ins.offset[c])
            total = np.full(chunk, combine.identity, dtype=np.float32)
            for g in ins.group[c]:
                part = np.full(chunk, combine.identity, dtype=np.float32)
                have = self.mem[g][ins.src][start: start + chunk]  # identity past the end
                part[: len(have)] = have
                total = combine.ufunc(total, part)
            new.append(total)
        for c, vals in enumerate(new):
            dst = self.mem[self.core(ins, c)][ins.dst]
            dst[:] = to_storage(vals, dst.dtype)

    def compute(self, ins: Compute) -> None:
        mem = self.mem
        expr = self.prog.exprs[ins.expr]
        sub = dict(zip(expr.axis_names, ins.sub))
        buffers = (*ins.ins, ins.out)

        def block(c: int, k: int) -> tuple[np.ndarray, tuple[slice, ...]]:
            """Core c's operand k as its tile (a view), and the slices of its sub-task."""
            tile = mem[self.core(ins, c)][buffers[k]].reshape(ins.tiles[k])
            sizes = operand_sizes(expr, k, sub, tile.shape)
            region = tuple(slice(int(o), int(o) + s) for o, s in zip(ins.offsets[k][c], sizes))
            if tile[region].shape != tuple(sizes):
                raise IndexError(f"operand {k} block {region} falls outside its tile "
                                 f"{tile.shape}")
            return tile, region

        for c in range(len(ins.origin)):
            values = []
            for k in range(len(ins.ins)):
                tile, region = block(c, k)
                values.append(tile[region][None])  # a core axis of size 1 for `evaluate`
            with np.errstate(all="ignore"):  # padded lanes may divide by zero; they are masked
                result = evaluate(expr, values, sub, ins.origin[c: c + 1])[0]
            out, region = block(c, len(ins.ins))
            if ins.accumulate:
                if expr.combine is None:
                    raise ValueError(f"accumulates into {expr.name}, which has no combine")
                result = COMBINES[expr.combine].ufunc(out[region].astype(np.float32), result)
            out[region] = to_storage(result, out.dtype)

    def store(self, ins: Store) -> None:
        self.outputs[ins.tensor] = ins.whole(self.gathered(ins), self.host)

    def gathered(self, ins: Store) -> np.ndarray:
        """The elements ``ins`` stores, in its table's order, core by core."""
        core, off = ins.src_core.reshape(-1), ins.src_off.reshape(-1)
        out = np.full(core.size, np.nan, dtype=np.float32)  # NaN: stored by no core
        for c in self.cores:
            mine = core == c
            out[mine] = self.mem[c][ins.src][off[mine]]
        return out
