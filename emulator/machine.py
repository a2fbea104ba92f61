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

The emulator refuses, naming the instruction and op: a read of a buffer that was never written
on some core, a buffer outside SRAM or overlapping a live one, a transfer from a core that does
not exist or over a link the chip lacks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from t10c.chips import Chip
from t10c.codegen.program import (
    DTYPE_BYTES,
    Alloc,
    Compute,
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
    tile_elements,
)
from t10c.costs import compute_cycles
from t10c.dtypes import DTYPES

from .kernels import IDENTITY, evaluate, gather_slices, operand_sizes
from .routing import Routed, route

NP_DTYPES = {name: d.numpy for name, d in DTYPES.items()}


class EmulatorError(RuntimeError):
    """The program did something the chip would not allow."""


@dataclass
class PhaseRecord:
    op: str
    phase: str
    start: int
    cycles: int
    bytes_per_core: int = 0  # all-to-all: most bytes a core received; mesh: busiest link's bytes
    hops: int = 0  # mesh: the longest route of the phase


@dataclass
class Timeline:
    """What the run did, in order: per op and phase, cycles and bytes; SRAM use over time."""

    clock_hz: float
    records: list[PhaseRecord] = field(default_factory=list)
    sram_samples: list[tuple[int, int]] = field(default_factory=list)  # (cycle, bytes per core)
    peak_sram_bytes_per_core: int = 0
    host_bytes: int = 0
    #: mesh chips: bytes carried by every directed link over the run, (4, rows, cols) as in
    #: `routing.Routed.loads`
    link_bytes: np.ndarray | None = None

    @property
    def cycles(self) -> int:
        return sum(r.cycles for r in self.records)

    @property
    def latency_s(self) -> float:
        return self.cycles / self.clock_hz

    def by_op(self) -> dict[str, dict[str, int]]:
        """Cycles per op and phase, ops in program order."""
        table: dict[str, dict[str, int]] = {}
        for r in self.records:
            row = table.setdefault(r.op, {})
            row[r.phase] = row.get(r.phase, 0) + r.cycles
        return table


class Machine:
    """One emulated chip running one program."""

    def __init__(self, program: Program, chip: Chip, data: bool = True) -> None:
        if program.cores != chip.cores:
            raise EmulatorError(f"program is for {program.cores} cores, chip {chip.name} has "
                                f"{chip.cores}")
        self.prog, self.chip = program, chip
        self.mem: dict[int, np.ndarray] = {}
        self.written: dict[int, np.ndarray] = {}
        self.live: dict[int, tuple[int, int]] = {}
        self.timeline = Timeline(chip.clock_hz)
        self.now = 0
        self.pending = np.zeros(chip.cores, dtype=np.int64)  # bytes received this exchange
        self.pending_op = ""
        self.pending_phase = ""
        self.transfers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # mesh: src, dst, B
        self.credit = 0  # cycles of the last compute step, which an overlapped shift hides in
        #: False in timing-only runs: buffers hold no values, only who has written them
        self.data = data
        self.routes: dict[bytes, Routed] = {}  # routes by a digest of their transfers
        self.outputs: dict[str, np.ndarray] = {}

    # -- timing ---------------------------------------------------------------------------
    def record(self, op: str, phase: str, cycles: int, nbytes: int = 0, hops: int = 0) -> None:
        if cycles or nbytes:
            self.timeline.records.append(PhaseRecord(op, phase, self.now, cycles, nbytes, hops))
            self.now += cycles

    def receive(self, op: str, phase: str, src: np.ndarray, dst: np.ndarray,
                nbytes: np.ndarray) -> None:
        """Queue transfers (``nbytes[k]`` from core ``src[k]`` to ``dst[k]``) of one phase."""
        if self.pending_phase and (op, phase) != (self.pending_op, self.pending_phase):
            self.flush()
        self.pending_op, self.pending_phase = op, phase
        if self.chip.is_mesh:
            self.transfers.append((src, dst, nbytes))
        else:  # only what each core receives matters
            np.add.at(self.pending, dst, np.where(src != dst, nbytes, 0))

    def timed(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
              ) -> tuple[int, int, int]:
        """(cycles, bytes, hops) of one phase of transfers on a mesh, counting link loads.

        Steps of a rotation and repeated layers route the same transfers again and again:
        routes are remembered by a digest of the transfers."""
        key = _digest(src, dst, nbytes)
        routed = self.routes.get(key)
        if routed is None:
            routed = route(self.chip, src, dst, nbytes)
            self.routes[key] = routed
        if routed.loads is not None:
            if self.timeline.link_bytes is None:
                self.timeline.link_bytes = np.zeros_like(routed.loads)
            self.timeline.link_bytes += routed.loads
        return routed.cycles, routed.max_link_bytes, routed.max_hops

    def flush(self) -> None:
        if not self.pending_phase:
            return
        if self.chip.is_mesh:
            src, dst, nbytes = (np.concatenate(x) for x in zip(*self.transfers))
            cycles, most, hops = self.timed(src, dst, nbytes)
            self.transfers = []
        else:
            most, hops = int(self.pending.max()), 1
            cycles = self.chip.transfer_cycles(most)
            self.pending[:] = 0
        if self.pending_phase == "shift" and self.chip.overlap:
            cycles = max(cycles - self.credit, 0)
        self.credit = 0
        self.record(self.pending_op, self.pending_phase, cycles, most, hops if most else 0)
        self.pending_phase = ""

    # -- streamed timing-only runs: repeated layers ----------------------------------------
    def mark(self) -> tuple[int, np.ndarray | None]:
        """Where the timeline stands (records and link loads), before an op."""
        self.flush()
        links = self.timeline.link_bytes
        return len(self.timeline.records), None if links is None else links.copy()

    def since(self, mark: tuple[int, np.ndarray | None], cached: Any) -> Any:
        """Store on ``cached`` what the timeline gained since ``mark``: one op's records."""
        self.flush()
        start, links = mark
        cached.records = [(r.phase, r.cycles, r.bytes_per_core, r.hops)
                          for r in self.timeline.records[start:]]
        if self.timeline.link_bytes is not None:
            cached.link_bytes = self.timeline.link_bytes - (0 if links is None else links)
        return cached

    def replay(self, op: str, cached: Any) -> None:
        """Append the records of an earlier op with the same instructions, as op ``op``."""
        self.flush()
        for phase, cycles, nbytes, hops in cached.records:
            self.record(op, phase, cycles, nbytes, hops)
        if cached.link_bytes is not None:
            if self.timeline.link_bytes is None:
                self.timeline.link_bytes = np.zeros_like(cached.link_bytes)
            self.timeline.link_bytes += cached.link_bytes
        self.credit = 0

    def mark_written(self, buf: int, cores: np.ndarray) -> None:
        self.written[buf][cores] = True

    # -- checks ---------------------------------------------------------------------------
    def fail(self, ins: Instr, msg: str) -> EmulatorError:
        return EmulatorError(f"while executing {type(ins).__name__} of op {ins.op or '-'}: {msg}")

    def read(self, ins: Instr, buf: int, cores: np.ndarray | int) -> np.ndarray:
        if buf not in self.written:
            raise self.fail(ins, f"buffer %{self.prog.buffers[buf].name} is not allocated")
        ok = self.written[buf][:cores] if isinstance(cores, int) else self.written[buf][cores]
        if not np.all(ok):
            raise self.fail(ins, f"reads buffer %{self.prog.buffers[buf].name}, which some core "
                                 "never wrote")
        return self.mem.get(buf)  # type: ignore[return-value]

    def check_sources(self, ins: Instr, src_core: np.ndarray) -> None:
        if src_core.size and (src_core.max() >= self.chip.cores):
            raise self.fail(ins, f"transfer from core {int(src_core.max())}, which does not exist")
        # all-to-all exchange: every pair of cores is linked (mesh links come with mesh chips)

    # -- execution ------------------------------------------------------------------------
    def run(self, inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray]
            ) -> tuple[dict[str, np.ndarray], Timeline]:
        host = {**constants, **inputs}
        for name, (shape, _) in self.prog.inputs.items():
            if name not in inputs:
                raise EmulatorError(f"missing input {name!r} (shape {shape})")
            if tuple(inputs[name].shape) != tuple(shape):
                raise EmulatorError(f"input {name!r} has shape {inputs[name].shape}, the program "
                                    f"was compiled for {shape}")
        for ins in self.prog.instrs:
            self.step(ins, host)
        self.flush()
        return self.outputs, self.timeline

    def step(self, ins: Instr, host: dict[str, np.ndarray]) -> None:
        chip = self.chip
        data = self.data
        if isinstance(ins, Alloc):
            b = self.prog.buffers[ins.buf]
            start, end = b.offset, b.offset + b.nbytes
            if end > chip.sram_bytes_per_core:
                raise self.fail(ins, f"buffer %{b.name} [{start}, {end}) overflows the "
                                     f"{chip.sram_bytes_per_core}-byte SRAM")
            for other, (s, e) in self.live.items():
                if start < e and s < end:
                    raise self.fail(ins, f"buffer %{b.name} overlaps live buffer "
                                         f"%{self.prog.buffers[other].name}")
            self.live[ins.buf] = (start, end)
            if data:
                self.mem[ins.buf] = np.zeros((chip.cores, b.elems), dtype=NP_DTYPES[b.dtype])
            self.written[ins.buf] = np.zeros(chip.cores, dtype=bool)
            in_use = sum(e - s for s, e in self.live.values())
            self.timeline.peak_sram_bytes_per_core = max(
                self.timeline.peak_sram_bytes_per_core, max(e for _, e in self.live.values()))
            self.timeline.sram_samples.append((self.now, in_use))
        elif isinstance(ins, Free):
            self.live.pop(ins.buf)
            self.mem.pop(ins.buf, None)
            self.written.pop(ins.buf)
            self.timeline.sram_samples.append((self.now, sum(e - s for s, e in
                                                             self.live.values())))
        elif isinstance(ins, Load):
            rows = _rows(ins, ins.ncores)
            if data:
                self.load(ins, host, rows)
            self.written[ins.buf][rows] = True
        elif isinstance(ins, Fill):
            rows = _rows(ins, ins.ncores)
            if data:
                self.mem[ins.buf][rows] = ins.value
            self.written[ins.buf][rows] = True
        elif isinstance(ins, Sync):
            self.flush()
            self.record(ins.op, "sync", chip.sync_cycles)
        elif isinstance(ins, Exchange):
            n = len(ins.src_core)
            rows, here = _rows(ins, n), _phys(ins, n)
            self.check_sources(ins, ins.src_core)
            src = self.read(ins, ins.src, _cores_in(ins.src_core, self.chip.cores))
            if data:
                dst = self.mem[ins.dst]
                vals = src[np.maximum(ins.src_core, 0), np.maximum(ins.src_off, 0)]
                dst[rows] = np.where(ins.src_core >= 0, vals, 0).astype(dst.dtype)
            self.written[ins.dst][rows] = True
            size = self.itemsize(ins.dst)
            if chip.is_mesh:
                self.receive(ins.op, ins.phase, *_pairs(ins.src_core, here, size, chip.cores))
            else:  # received bytes per core: a remote element counts wherever it comes from
                remote = ((ins.src_core >= 0) & (ins.src_core != here[:, None])).sum(axis=1)
                self.receive(ins.op, ins.phase, np.full(n, -1), here, remote * size)
        elif isinstance(ins, Shift):
            n = len(ins.src_core)
            rows, here = _rows(ins, n), _phys(ins, n)
            self.check_sources(ins, ins.src_core)
            src = self.read(ins, ins.src, ins.src_core)
            if data:
                self.mem[ins.dst][rows] = src[ins.src_core]
            self.written[ins.dst][rows] = True
            size = np.full(n, self.prog.buffers[ins.dst].nbytes, dtype=np.int64)
            self.receive(ins.op, "shift", ins.src_core.astype(np.int64), here, size)
        elif isinstance(ins, Reduce):
            self.flush()
            n = len(ins.group)
            rows, here = _rows(ins, n), _phys(ins, n)
            self.check_sources(ins, ins.group)
            src = self.read(ins, ins.src, ins.group.ravel())
            chunk = self.prog.buffers[ins.dst].elems
            group = ins.group.shape[1]
            if data:
                dst = self.mem[ins.dst]
                width = max(int(ins.offset.max(initial=0)) + chunk - src.shape[1], 0)
                pad = np.full((chip.cores, width), IDENTITY[ins.combine], dtype=np.float32)
                ext = np.concatenate([src.astype(np.float32), pad], axis=1)
                cols = ins.offset[:, None] + np.arange(chunk)[None, :]  # (n, chunk)
                parts = ext[ins.group[:, :, None], cols[:, None, :]]  # (n, G, chunk)
                red = parts.sum(axis=1) if ins.combine == "sum" else parts.max(axis=1)
                dst[rows] = red.astype(dst.dtype)
            self.written[ins.dst][rows] = True
            add = chip.vector_cycles((group - 1) * chunk, self.prog.dtype)
            nbytes = chunk * self.itemsize(ins.dst)
            if chip.is_mesh:  # each core gathers its chunk from every other member
                members = np.broadcast_to(here[:, None], ins.group.shape)
                cycles, most, hops = self.timed(ins.group.ravel(), members.ravel(),
                                                np.full(members.size, nbytes, dtype=np.int64))
                self.record(ins.op, "reduce", cycles + add, most, hops)
            else:
                remote = (group - 1) * nbytes
                self.record(ins.op, "reduce", chip.transfer_cycles(remote) + add, remote)
            self.credit = 0
        elif isinstance(ins, Compute):
            self.flush()
            self.compute(ins)
        elif isinstance(ins, Store):
            src = self.read(ins, ins.src, _cores_in(ins.src_core, self.chip.cores))
            if data:
                self.outputs[ins.tensor] = src[ins.src_core, ins.src_off].astype(
                    np.float32).reshape(ins.shape)
        else:  # pragma: no cover
            raise self.fail(ins, "unknown instruction")

    def load(self, ins: Load, host: dict[str, np.ndarray], rows: np.ndarray | slice) -> None:
        src = np.asarray(host[ins.tensor])
        if tuple(src.shape) != tuple(ins.shape):
            raise self.fail(ins, f"host tensor {ins.tensor} has shape {src.shape}, the "
                                 f"program expects {ins.shape}")
        dst = self.mem[ins.buf]
        if ins.index is None:
            # replicated tiles are gathered once and copied to every core that holds them
            uniq, inverse = np.unique(ins.origin, axis=0, return_inverse=True)
            flat, valid = tile_elements(uniq, ins.tile, ins.shape)
            tiles = np.where(valid, src.reshape(-1)[flat], 0).astype(dst.dtype)
            dst[rows] = tiles[inverse.reshape(-1)]
            loaded = int(valid.sum(axis=1)[inverse.reshape(-1)].sum())
        else:
            flat, valid = ins.elements()
            dst[rows] = np.where(valid, src.reshape(-1)[flat], 0).astype(dst.dtype)
            loaded = int(valid.sum())
        self.timeline.host_bytes += loaded * dst.dtype.itemsize

    def itemsize(self, buf: int) -> int:
        return DTYPE_BYTES[self.prog.buffers[buf].dtype]

    def compute(self, ins: Compute) -> None:
        expr = self.prog.exprs[ins.expr]
        sub = dict(zip(expr.axis_names, ins.sub))
        n = len(ins.origin)
        rows = _rows(ins, n)
        cycles = compute_cycles(expr, sub, self.chip, self.prog.dtype)
        if not self.data:
            for bid in ins.ins + ((ins.out,) if ins.accumulate else ()):
                self.read(ins, bid, rows)
            self.written[ins.out][rows] = True
            self.record(expr.name, "compute", cycles)
            self.credit = cycles
            return
        placed = ins.cores is not None
        tiles = ins.tiles
        values = []
        for k, bid in enumerate(ins.ins):
            buf = self.read(ins, bid, rows)
            buf = buf[rows] if placed else buf
            sizes = operand_sizes(expr, k, sub, tiles[k])
            values.append(gather_slices(buf, tiles[k], ins.offsets[k], sizes)[0])
        with np.errstate(all="ignore"):  # padded lanes may divide by zero; they are masked
            result = evaluate(expr, values, sub, ins.origin)
        out = self.mem[ins.out]
        k = len(ins.ins)
        if ins.accumulate:
            self.read(ins, ins.out, rows)
        if placed:  # work on a copy of the placed cores' rows, written back below
            whole, out = out, out[rows]
        view, idx = gather_slices(out, tiles[k], ins.offsets[k],
                                  operand_sizes(expr, k, sub, tiles[k]))
        if ins.accumulate:
            combine = np.add if expr.combine == "sum" else np.maximum
            result = combine(view.astype(np.float32), result)
        full = out[:n].reshape((n, *tiles[k]))
        with np.errstate(over="ignore"):  # masks (-3.4e38) saturate to -inf in fp16 on purpose
            if idx is None:
                full[...] = result
            else:
                full[idx] = result
        if placed:
            whole[rows] = out
        self.written[ins.out][rows] = True
        self.record(expr.name, "compute", cycles)
        self.credit = cycles


def _rows(ins: Instr, n: int) -> np.ndarray | slice:
    """The cores an instruction's table rows stand for, as an index into core arrays."""
    cores = getattr(ins, "cores", None)
    return slice(0, n) if cores is None else cores


def _phys(ins: Instr, n: int) -> np.ndarray:
    cores = getattr(ins, "cores", None)
    return np.arange(n, dtype=np.int64) if cores is None else cores.astype(np.int64)


_MIX = np.random.default_rng(0x7104).integers(1, 2 ** 63, size=(2, 1 << 18), dtype=np.uint64)


def _digest(*arrays: np.ndarray) -> tuple:
    """A 128-bit fingerprint of integer arrays: two random-weighted sums modulo 2^64 per
    array (cheaper than hashing the bytes of the large tables of wafer-sized chips)."""
    key: list[int] = []
    for a in arrays:
        flat = np.ascontiguousarray(a, dtype=np.int64).ravel().view(np.uint64)
        n = len(flat)
        reps = -(-n // _MIX.shape[1])
        with np.errstate(over="ignore"):
            for w in _MIX:
                if reps > 1:  # each repetition of the weights gets its own multiplier
                    block = np.repeat(np.arange(1, reps + 1, dtype=np.uint64), len(w))[:n]
                    weights = np.tile(w, reps)[:n] * (block * np.uint64(0x9E3779B97F4A7C15))
                else:
                    weights = w[:n]
                key.append(int((flat * weights).sum(dtype=np.uint64)))
        key.append(n)
    return tuple(key)


def _pairs(src_core: np.ndarray, here: np.ndarray, itemsize: int, cores: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, bytes) per distinct pair of cores of an element table whose row r lands on
    core ``here[r]``; -1 entries (padding) move nothing. Each row is sorted and its runs
    counted, which is cheaper than a global unique over the whole table."""
    n, e = src_core.shape
    if not n or not e:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    srt = np.sort(src_core, axis=1)
    start = np.ones(srt.shape, dtype=bool)
    start[:, 1:] = srt[:, 1:] != srt[:, :-1]
    r, c = np.nonzero(start)
    first = r.astype(np.int64) * e + c
    counts = np.append(first[1:], n * e) - first
    src = srt[r, c].astype(np.int64)
    dst = np.asarray(here, dtype=np.int64)[r]
    keep = (src >= 0) & (src != dst)
    return src[keep], dst[keep], counts[keep] * itemsize


def _cores_in(table: np.ndarray, cores: int) -> np.ndarray:
    """The distinct cores a table refers to (-1 entries ignored), in O(size)."""
    counts = np.bincount(table.ravel().astype(np.int64) + 1, minlength=cores + 1)
    return np.flatnonzero(counts[1:])


def emulate(program: Program, chip: Chip, inputs: dict[str, np.ndarray],
            constants: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Timeline, float]:
    """Run ``program`` on ``chip``; returns outputs, timeline and wall seconds."""
    start = time.perf_counter()
    outputs, timeline = Machine(program, chip).run(inputs, constants)
    return outputs, timeline, time.perf_counter() - start
