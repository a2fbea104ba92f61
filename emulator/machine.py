"""The emulator: executes a `Program` on real data, all cores at once, and times it.

State is one array per live buffer shaped ``(cores, elems)`` in the buffer's dtype, and one
flag per buffer and core saying whether it has been written. Every instruction acts on all
cores with numpy (gathers with the program's tables); nothing loops over cores in Python.

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

import time

import numpy as np

from t10c.chips import Chip
from t10c.codegen.program import (
    Alloc,
    Compute,
    Exchange,
    Fill,
    Free,
    Load,
    Program,
    Reduce,
    Shift,
    Store,
    tile_elements,
)
from t10c.dtypes import DTYPES
from t10c.elementwise import COMBINES

from .kernels import evaluate, gather_slices, operand_sizes, to_storage
from .timing import (
    EmulatorError,
    PhaseRecord,
    Progress,
    Timeline,
    TimingMachine,
    _rows,
)

NP_DTYPES = {name: d.numpy for name, d in DTYPES.items()}

__all__ = ["EmulatorError", "Machine", "PhaseRecord", "Timeline", "emulate"]


class Machine(TimingMachine):
    """One emulated chip running one program on data: `TimingMachine`'s checks and clock,
    and one array per live buffer shaped ``(cores, elems)`` in the buffer's dtype."""

    def __init__(self, program: Program, chip: Chip) -> None:
        super().__init__(program, chip)
        self.mem: dict[int, np.ndarray] = {}
        self.outputs: dict[str, np.ndarray] = {}

    def run(self, inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray],
            progress: Progress | None = None) -> tuple[dict[str, np.ndarray], Timeline]:
        """Execute the whole program: the stored outputs and the timeline."""
        timeline = self.execute(inputs, constants, progress)
        return self.outputs, timeline

    # -- handlers: the timing handler first (it checks), then the values ----------------------
    def alloc(self, ins: Alloc) -> None:
        super().alloc(ins)
        b = self.prog.buffers[ins.buf]
        self.mem[ins.buf] = np.zeros((self.chip.cores, b.elems), dtype=NP_DTYPES[b.dtype])

    def free(self, ins: Free) -> None:
        super().free(ins)
        self.mem.pop(ins.buf, None)

    def load(self, ins: Load) -> None:
        super().load(ins)
        if ins.tensor not in self.host:
            raise EmulatorError(f"no host tensor {ins.tensor!r} to load")
        src = np.asarray(self.host[ins.tensor])
        if tuple(src.shape) != tuple(ins.shape):
            raise EmulatorError(f"host tensor {ins.tensor} has shape {src.shape}, the program "
                                f"expects {ins.shape}")
        rows = _rows(ins, ins.ncores)
        dst = self.mem[ins.buf]
        if ins.index is None:
            # replicated tiles are gathered once and copied to every core that holds them
            uniq, inverse = np.unique(ins.origin, axis=0, return_inverse=True)
            flat, valid = tile_elements(uniq, ins.tile, ins.shape)
            tiles = to_storage(np.where(valid, src.reshape(-1)[flat], 0), dst.dtype)
            dst[rows] = tiles[inverse.reshape(-1)]
            loaded = int(valid.sum(axis=1)[inverse.reshape(-1)].sum())
        else:
            flat, valid = ins.elements()
            dst[rows] = to_storage(np.where(valid, src.reshape(-1)[flat], 0), dst.dtype)
            loaded = int(valid.sum())
        self.timeline.host_bytes += loaded * dst.dtype.itemsize

    def fill(self, ins: Fill) -> None:
        super().fill(ins)
        dst = self.mem[ins.buf]
        dst[_rows(ins, ins.ncores)] = to_storage(np.asarray(float(ins.value)), dst.dtype)

    def exchange(self, ins: Exchange) -> None:
        super().exchange(ins)
        src, dst = self.mem[ins.src], self.mem[ins.dst]
        vals = src[np.maximum(ins.src_core, 0), np.maximum(ins.src_off, 0)]
        dst[_rows(ins, len(ins.src_core))] = to_storage(np.where(ins.src_core >= 0, vals, 0),
                                                        dst.dtype)

    def shift(self, ins: Shift) -> None:
        super().shift(ins)
        dst = self.mem[ins.dst]
        dst[_rows(ins, len(ins.src_core))] = to_storage(self.mem[ins.src][ins.src_core],
                                                        dst.dtype)

    def reduce(self, ins: Reduce) -> None:
        super().reduce(ins)
        src, dst = self.mem[ins.src], self.mem[ins.dst]
        chunk = dst.shape[1]
        combine = COMBINES[ins.combine]
        width = max(int(ins.offset.max(initial=0)) + chunk - src.shape[1], 0)
        pad = np.full((self.chip.cores, width), combine.identity, dtype=np.float32)
        ext = np.concatenate([src.astype(np.float32), pad], axis=1)
        cols = ins.offset[:, None] + np.arange(chunk)[None, :]  # (n, chunk)
        parts = ext[ins.group[:, :, None], cols[:, None, :]]  # (n, G, chunk)
        red = combine.ufunc.reduce(parts, axis=1)
        dst[_rows(ins, len(ins.group))] = to_storage(red, dst.dtype)

    def compute(self, ins: Compute) -> None:
        super().compute(ins)
        expr = self.prog.exprs[ins.expr]
        sub = dict(zip(expr.axis_names, ins.sub))
        n = len(ins.origin)
        rows = _rows(ins, n)
        placed = ins.cores is not None
        tiles = ins.tiles
        values = []
        for k, bid in enumerate(ins.ins):
            buf = self.mem[bid]
            buf = buf[rows] if placed else buf
            sizes = operand_sizes(expr, k, sub, tiles[k])
            values.append(gather_slices(buf, tiles[k], ins.offsets[k], sizes)[0])
        with np.errstate(all="ignore"):  # padded lanes may divide by zero; they are masked
            result = evaluate(expr, values, sub, ins.origin)
        out = self.mem[ins.out]
        k = len(ins.ins)
        if placed:  # work on a copy of the placed cores' rows, written back below
            whole, out = out, out[rows]
        view, idx = gather_slices(out, tiles[k], ins.offsets[k],
                                  operand_sizes(expr, k, sub, tiles[k]))
        if ins.accumulate:
            if expr.combine is None:
                raise EmulatorError(f"accumulates into {expr.name}, which has no combine")
            result = COMBINES[expr.combine].ufunc(view.astype(np.float32), result)
        full = out[:n].reshape((n, *tiles[k]))
        result = to_storage(result, full.dtype)  # masks (-3.4e38) saturate to -inf in fp16
        if idx is None:
            full[...] = result
        else:
            full[idx] = result
        if placed:
            whole[rows] = out

    def store(self, ins: Store) -> None:
        super().store(ins)
        src = self.mem[ins.src]
        self.outputs[ins.tensor] = src[ins.src_core, ins.src_off].astype(
            np.float32).reshape(ins.shape)


def emulate(program: Program, chip: Chip, inputs: dict[str, np.ndarray],
            constants: dict[str, np.ndarray], progress: Progress | None = None
            ) -> tuple[dict[str, np.ndarray], Timeline, float]:
    """Run ``program`` on ``chip``; returns outputs, timeline and wall seconds.
    ``progress("emulate", done, total)`` is called as the instructions go (at every op)."""
    start = time.perf_counter()
    outputs, timeline = Machine(program, chip).run(inputs, constants, progress)
    return outputs, timeline, time.perf_counter() - start
