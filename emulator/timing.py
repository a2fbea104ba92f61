"""The timing machine: a `Program`'s clock, SRAM and written flags, without values.

`TimingMachine` is the emulator without data: one handler per instruction class (the table
`HANDLERS`, looked up by the instruction's class as torch.fx looks up ``node.op``) that checks
what the chip would refuse, marks what every core has written and times the instruction.
`Machine` (`machine.py`) extends each handler with the values; a timing-only run uses this
class alone, so both share one timing code. The timing model is described in `machine.py`.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from t10c.chips import Chip
from t10c.codegen.program import (
    DTYPE_BYTES,
    Alloc,
    Compute,
    DmaLoad,
    DmaStore,
    DmaWait,
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
    Sync,
    chip_pair_counts,
    multicast_trees,
    pair_counts,
    received,
)
from t10c.costs import compute_cycles
from t10c.digest import hasher
from t10c.ir import tile_counts
from t10c.multicast import Relay, exchange_trees, grouped_relay, multicast_routes

from .routing import Routed, route_phase

Progress = Callable[[str, int, int], None]


V = TypeVar("V")


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
    dram_bytes: int = 0  # bytes loaded from off-chip DRAM during the run (all cores)
    dram_store_bytes: int = 0  # bytes written back to DRAM during the run
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


#: the handler (a method name) of every instruction class
HANDLERS: dict[type[Instr], str] = {
    Alloc: "alloc", Free: "free", Load: "load", Fill: "fill", Sync: "sync",
    Exchange: "exchange", Shift: "shift", Reduce: "reduce", Compute: "compute", Store: "store",
    DmaLoad: "dma_load", DmaStore: "dma_store", DmaWait: "dma_wait",
}


class TimingMachine:
    """One emulated chip running one program for its timing: buffers hold no values, only who
    has written them."""

    def __init__(self, program: Program, chip: Chip) -> None:
        if program.cores != chip.cores:
            raise EmulatorError(f"program is for {program.cores} cores, chip {chip.name} has "
                                f"{chip.cores}")
        self.prog, self.chip = program, chip
        self.written: dict[int, np.ndarray] = {}
        self.live: dict[int, tuple[int, int]] = {}
        self.spans = Spans()  # the live buffers' byte ranges, for the overlap check
        self.in_use = 0  # bytes per core of the live buffers
        self.timeline = Timeline(chip.clock_hz)
        self.now = 0
        self.pending = np.zeros(chip.cores, dtype=np.int64)  # bytes received this exchange
        #: a pod: bytes each chip receives from, and sends to, other chips this exchange
        self.pod_in = np.zeros(chip.chips, dtype=np.int64)
        self.pod_out = np.zeros(chip.chips, dtype=np.int64)
        self.pending_op = ""
        self.pending_phase = ""
        self.transfers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # mesh: src, dst, B
        #: mesh: multicast trees of this phase, (tree, src, dst, bytes) per destination
        self.trees: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.tree_ids = 0  # trees numbered so far this phase
        #: mesh: the second stage of this phase's relayed exchanges (`t10c.multicast.Relay`),
        #: trees that run once the phase's other transfers are done
        self.spread: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.spread_ids = 0
        self.credit = 0  # cycles of the last compute step, which an overlapped shift hides in
        self.routes: dict[tuple, Routed] = {}  # routes by a digest of their transfers
        #: per live buffer, the arrays of cores a read of it was checked on (`check_read`),
        #: with the mask of its written cores they were checked against: the instructions
        #: of a compute's steps read their buffers on the same cores again and again
        self.checked: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
        #: link loads of replayed ops not added yet (`replay`, `finish`): by the id of
        #: each, the loads (held, so that the id is not reused) and how many replays
        self.replayed: dict[int, list[Any]] = {}
        #: an exchange pattern's (sources, destinations, counts, crossing pairs on a pod)
        self.counted: ByArrays[tuple[np.ndarray, np.ndarray, np.ndarray,
                                     tuple[np.ndarray, np.ndarray, np.ndarray] | None]] = \
            ByArrays()
        self.host: dict[str, np.ndarray] = {}
        self.executed = 0  # instructions stepped so far: the index of the next one
        #: bound methods, so that a subclass's handlers are the ones called
        self.handlers: dict[type[Instr], Callable[[Any], None]] = {
            cls: getattr(self, name) for cls, name in HANDLERS.items()}
        self.sources = {e.name: e.source for e in program.exprs}
        #: the DMA engine (chips with DRAM): when its queue is free, and when each buffer's
        #: load lands (with the cores it fills)
        self.dma_free = 0
        self.dma_ready: dict[int, tuple[int, np.ndarray | slice]] = {}
        #: buffers being written back to DRAM: when their last store is done
        self.dma_stores: dict[int, int] = {}

    # -- driving --------------------------------------------------------------------------
    def execute(self, inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray],
                progress: Progress | None = None) -> Timeline:
        """Execute the whole program; ``progress("emulate", done, total)`` at every op."""
        self.check_inputs(inputs)
        try:
            host = self.prog.host_tensors(inputs, constants)
        except ValueError as exc:
            raise EmulatorError(str(exc)) from None
        total = len(self.prog.instrs)
        if progress is not None:
            progress("emulate", 0, total)
        op = None
        for n, ins in enumerate(self.prog.instrs):
            if progress is not None and ins.op != op and ins.op:
                op = ins.op
                progress("emulate", n, total)
            self.step(ins, host)
        self.flush()
        if progress is not None:
            progress("emulate", total, total)
        return self.timeline

    def check_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        for name, (shape, _) in self.prog.inputs.items():
            if name not in inputs:
                raise EmulatorError(f"missing input {name!r} (shape {shape})")
            if tuple(inputs[name].shape) != tuple(shape):
                raise EmulatorError(f"input {name!r} has shape {inputs[name].shape}, the program "
                                    f"was compiled for {shape}")

    def step(self, ins: Instr, host: dict[str, np.ndarray] | None = None) -> None:
        """Execute one instruction; any failure is re-raised naming the instruction (its index
        among those stepped, its kind, its op and the op's ONNX node)."""
        n = self.executed
        self.executed += 1
        if host is not None:
            self.host = host
        try:
            handler = self.handlers[type(ins)]
        except KeyError:
            raise self.wrap(n, ins, "unknown instruction") from None
        try:
            handler(ins)
        except Exception as exc:  # noqa: BLE001 - every failure gets the instruction's name
            raise self.wrap(n, ins, str(exc) or type(exc).__name__) from exc

    def wrap(self, n: int, ins: Instr, msg: str) -> EmulatorError:
        where = f"instruction {n} ({type(ins).__name__}) of op {ins.op or '-'}"
        source = self.sources.get(ins.op, "")
        if source:
            where += f" (ONNX {source})"
        return EmulatorError(f"while executing {where}: {msg}")

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

    def receive_trees(self, op: str, phase: str, tree: np.ndarray, src: np.ndarray,
                      dst: np.ndarray, nbytes: np.ndarray) -> None:
        """Queue multicast trees (mesh; `t10c.multicast.route_trees`' arguments, trees
        numbered from 0) of one phase."""
        if self.pending_phase and (op, phase) != (self.pending_op, self.pending_phase):
            self.flush()
        self.pending_op, self.pending_phase = op, phase
        ntrees = int(tree.max(initial=-1)) + 1
        self.trees.append((tree + self.tree_ids, src, dst, nbytes))
        self.tree_ids += ntrees

    def receive_relay(self, op: str, phase: str, relay: Relay) -> None:
        """Queue a relayed exchange (mesh): its gather with the phase's transfers, its spread
        after them."""
        self.receive(op, phase, *relay.gather)
        tree, src, dst, nbytes = relay.spread
        self.spread.append((tree + self.spread_ids, src, dst, nbytes))
        self.spread_ids += int(tree.max(initial=-1)) + 1

    def cross(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> None:
        """On a pod, count the bytes of transfers (``nbytes[k]`` from core ``src[k]`` to
        ``dst[k]``, queued by `receive`) that cross from one chip to another."""
        a, b = self.chip.chip_of(src), self.chip.chip_of(dst)
        far = a != b
        np.add.at(self.pod_out, a[far], nbytes[far])
        np.add.at(self.pod_in, b[far], nbytes[far])

    def cross_chips(self, src: np.ndarray, dst_chip: np.ndarray, count: np.ndarray,
                    size: int) -> None:
        """On a pod, count ``count[k]`` elements of ``size`` bytes sent from core ``src[k]``
        to chip ``dst_chip[k]`` (another chip) once, whatever the cores there that read
        them (the chip fans them out over its own exchange)."""
        nbytes = count.astype(np.int64) * size
        np.add.at(self.pod_out, self.chip.chip_of(src), nbytes)
        np.add.at(self.pod_in, dst_chip, nbytes)

    def timed(self, src: np.ndarray | None, dst: np.ndarray | None, nbytes: np.ndarray | None,
              key: tuple | None = None,
              trees: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
              ) -> tuple[int, int, int]:
        """(cycles, bytes, hops) of one phase of transfers on a mesh, counting link loads
        (``src``, ``dst``, ``nbytes`` broadcast together, `route`; None: no unicast), and of
        its multicast ``trees`` (`route_phase`).

        Steps of a rotation and repeated layers route the same transfers again and again:
        routes are remembered by a digest of the transfers (or ``key``, one of the arrays
        they are made from). Only the last few: each holds the loads of every link."""
        unicast = None if src is None else (src, dst, nbytes)
        if key is None:
            key = tuple(k for arrays in (unicast, trees) if arrays is not None
                        for k in (len(arrays), *_digest(*arrays)))
        routed = self.routes.pop(key, None)
        if routed is None:
            routed = route_phase(self.chip, unicast, trees)  # type: ignore[arg-type]
        self.routes[key] = routed  # the most recent last
        while len(self.routes) > _ROUTES_KEPT:
            del self.routes[next(iter(self.routes))]
        if routed.loads is not None:
            if self.timeline.link_bytes is None:
                self.timeline.link_bytes = np.zeros_like(routed.loads)
            self.timeline.link_bytes += routed.loads
        return routed.cycles, routed.max_link_bytes, routed.max_hops

    def flush(self) -> None:
        if not self.pending_phase:
            return
        if self.chip.is_mesh:
            src = dst = nbytes = None
            if self.transfers:
                src, dst, nbytes = (np.concatenate(x) for x in zip(*self.transfers))
            trees = tuple(np.concatenate(x) for x in zip(*self.trees)) if self.trees else None
            cycles, most, hops = self.timed(src, dst, nbytes, trees=trees)  # type: ignore
            if self.spread:  # relayed exchanges' second stage, after the rest
                spread = tuple(np.concatenate(x) for x in zip(*self.spread))
                more, most2, hops2 = self.timed(None, None, None, trees=spread)  # type: ignore
                cycles, most, hops = cycles + more, max(most, most2), max(hops, hops2)
            self.transfers, self.trees, self.tree_ids = [], [], 0
            self.spread, self.spread_ids = [], 0
        else:
            most, hops = int(self.pending.max()), 1
            cross = int(max(self.pod_in.max(), self.pod_out.max()))
            cycles = self.chip.exchange_cycles(most, cross)
            self.pending[:] = 0
            self.pod_in[:] = 0
            self.pod_out[:] = 0
        if self.pending_phase == "shift" and self.chip.overlap:
            cycles = max(cycles - self.credit, 0)
        self.credit = 0
        self.record(self.pending_op, self.pending_phase, cycles, most, hops if most else 0)
        self.pending_phase = ""

    # -- streamed timing-only runs: repeated layers ----------------------------------------
    def mark(self) -> tuple[int, np.ndarray | None]:
        """Where the timeline stands (records and link loads), before an op."""
        self.finish()
        links = self.timeline.link_bytes
        return len(self.timeline.records), None if links is None else links.copy()

    def since(self, mark: tuple[int, np.ndarray | None], cached: Any) -> Any:
        """Store on ``cached`` what the timeline gained since ``mark``: one op's records."""
        self.finish()
        start, links = mark
        cached.records = [(r.phase, r.cycles, r.bytes_per_core, r.hops)
                          for r in self.timeline.records[start:]]
        if self.timeline.link_bytes is not None:
            cached.link_bytes = _LinkDelta.of(
                self.timeline.link_bytes - (0 if links is None else links))
        return cached

    def replay(self, op: str, cached: Any) -> None:
        """Append the records of an earlier op with the same instructions, as op ``op``. Its
        link loads are added by `finish`, once per distinct op times its replays (a wafer's
        are megabytes, and its repeated layers replay them hundreds of times)."""
        self.flush()
        for phase, cycles, nbytes, hops in cached.records:
            self.record(op, phase, cycles, nbytes, hops)
        if cached.link_bytes is not None:
            self.replayed.setdefault(id(cached.link_bytes), [cached.link_bytes, 0])[1] += 1
        self.credit = 0

    def finish(self) -> None:
        """`flush`, and add the link loads of the replays so far to the timeline's (sums of
        whole bytes: the same in any order). The timeline is whole once this is called."""
        self.flush()
        for delta, times in self.replayed.values():
            if self.timeline.link_bytes is None:
                self.timeline.link_bytes = np.zeros(delta.shape, dtype=np.int64)
            delta.add_to(self.timeline.link_bytes, times)
        self.replayed.clear()

    def mark_written(self, buf: int, cores: np.ndarray) -> None:
        self.written[buf][cores] = True

    # -- checks ---------------------------------------------------------------------------
    def check_read(self, buf: int,
                   cores: np.ndarray | slice | Callable[[], np.ndarray]) -> None:
        """Refuse a read of ``buf`` on ``cores`` (or on the cores a function returns, called
        only when some core has not written ``buf``) where some core never wrote it."""
        if buf not in self.written:
            raise EmulatorError(f"buffer %{self.prog.buffers[buf].name} is not allocated")
        written = self.written[buf]
        held = self.checked.get(buf)
        if held is not None and held[0] is not written:  # (another allocation of it)
            held = None
        keep = isinstance(cores, np.ndarray)
        if callable(cores):  # the cores are costly to find: only when some core did not write
            if written.all():
                return
            cores = cores()
        elif held is not None and any(c is cores for c in held[1]):
            return  # these cores were checked: what they wrote stays written until freed
        if not np.all(written[cores]):
            raise EmulatorError(f"reads buffer %{self.prog.buffers[buf].name}, which some core "
                                "never wrote")
        if keep:
            if held is None:
                held = self.checked[buf] = (written, [])
            held[1].append(cores)  # type: ignore[arg-type]
            del held[1][:-_CHECKED_KEPT]

    def check_sources(self, src_core: np.ndarray, padding: bool = False) -> None:
        """Every source core exists (-1 is allowed where it means padding)."""
        if not src_core.size:
            return
        if src_core.max() >= self.chip.cores:
            raise EmulatorError(f"transfer from core {int(src_core.max())}, which does not exist")
        if src_core.min() < (-1 if padding else 0):
            raise EmulatorError(f"transfer from core {int(src_core.min())}, which does not exist")
        # all-to-all exchange: every pair of cores is linked (mesh links come with mesh chips)

    def itemsize(self, buf: int) -> int:
        return DTYPE_BYTES[self.prog.buffers[buf].dtype]

    # -- handlers -------------------------------------------------------------------------
    def alloc(self, ins: Alloc) -> None:
        b = self.prog.buffers[ins.buf]
        start, end = b.offset, b.offset + b.nbytes
        if end > self.chip.sram_bytes_per_core:
            raise EmulatorError(f"buffer %{b.name} [{start}, {end}) overflows the "
                                f"{self.chip.sram_bytes_per_core}-byte SRAM")
        other = self.spans.overlapping(start, end)
        if other is not None:
            raise EmulatorError(f"buffer %{b.name} overlaps live buffer "
                                f"%{self.prog.buffers[other].name}")
        self.live[ins.buf] = (start, end)
        self.spans.add(start, end, ins.buf)
        self.written[ins.buf] = np.zeros(self.chip.cores, dtype=bool)
        # running totals: every live buffer raised the peak when it was allocated
        self.in_use += end - start
        self.timeline.peak_sram_bytes_per_core = max(self.timeline.peak_sram_bytes_per_core, end)
        self.timeline.sram_samples.append((self.now, self.in_use))

    def free(self, ins: Free) -> None:
        if ins.buf not in self.live:
            raise EmulatorError(f"frees buffer %{self.prog.buffers[ins.buf].name}, which is not "
                                "allocated")
        if ins.buf in self.dma_ready or ins.buf in self.dma_stores:
            kind = "load" if ins.buf in self.dma_ready else "store"
            raise EmulatorError(f"frees buffer %{self.prog.buffers[ins.buf].name} while its "
                                f"DMA {kind} is in flight")
        start, end = self.live.pop(ins.buf)
        self.spans.remove(start, end, ins.buf)
        self.written.pop(ins.buf)
        self.checked.pop(ins.buf, None)
        self.in_use -= end - start
        self.timeline.sram_samples.append((self.now, self.in_use))

    def load(self, ins: Load) -> None:
        self.mark_live(ins.buf)
        self.written[ins.buf][_rows(ins, ins.ncores)] = True

    def fill(self, ins: Fill) -> None:
        self.mark_live(ins.buf)
        self.written[ins.buf][_rows(ins, ins.ncores)] = True

    def mark_live(self, buf: int) -> None:
        if buf not in self.written:
            raise EmulatorError(f"writes buffer %{self.prog.buffers[buf].name}, which is not "
                                "allocated")
        if buf in self.dma_stores:
            raise EmulatorError(f"writes buffer %{self.prog.buffers[buf].name} while its DMA "
                                "store is in flight")

    def sync(self, ins: Sync) -> None:
        self.flush()
        self.record(ins.op, "sync", self.chip.sync_cycles)

    def exchange(self, ins: Exchange) -> None:
        if ins.pat is not None:
            return self.exchange_pattern(ins)
        src_core = ins.src_core
        assert src_core is not None  # the verifier's: a table where there is no pattern
        n = len(src_core)
        rows, here = _rows(ins, n), _phys(ins, n)
        self.check_sources(src_core, padding=True)
        self.check_read(ins.src, lambda: _cores_in(src_core, self.chip.cores))
        self.mark_live(ins.dst)
        self.written[ins.dst][rows] = True
        size = self.itemsize(ins.dst)
        if self.chip.is_mesh and ins.multicast:
            self.multicast_exchange(ins, ins.pattern(), here, size)
        elif self.chip.is_mesh:
            self.receive(ins.op, ins.phase, *_pairs(src_core, here, size))
        else:  # received bytes per core: a remote element counts wherever it comes from
            table = src_core
            if table.size and table.min() >= 0:  # no padding: all but the local elements
                remote = table.shape[1] - np.count_nonzero(table == here[:, None], axis=1)
            else:
                remote = np.count_nonzero((table >= 0) & (table != here[:, None]), axis=1)
            self.receive(ins.op, ins.phase, np.full(n, -1), here, remote * size)
            if self.chip.is_pod:  # each element once per destination chip (fanned out)
                assert ins.src_off is not None
                self.cross_chips(*_chip_pairs(src_core, ins.src_off, here,
                                              self.chip.cores_per_chip), size)

    def exchange_pattern(self, ins: Exchange) -> None:
        """An exchange given as a copy pattern: the same checks and bytes as its table,
        counted from the runs without expanding them."""
        p = ins.pattern()
        n = p.rows
        rows, here = _rows(ins, n), _phys(ins, n)
        run_core = p.runs[:, 0]
        self.check_sources(run_core, padding=True)
        self.check_read(ins.src, lambda: _cores_in(run_core, self.chip.cores))
        self.mark_live(ins.dst)
        self.written[ins.dst][rows] = True
        size = self.itemsize(ins.dst)
        if self.chip.is_mesh and ins.multicast:  # a tree per (distinct row, source core)
            self.multicast_exchange(ins, p, here, size)
            return
        src, dst, count, crossing = self.pattern_counts(ins, p, here)
        self.receive(ins.op, ins.phase, src, dst, count * size)
        if crossing is not None:
            self.cross_chips(crossing[0], crossing[1], crossing[2], size)

    def pattern_counts(self, ins: Exchange, p: Pattern, here: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                  tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
        """The elements a unicast pattern exchange ``ins`` moves: (sources, destinations,
        counts, and on a pod the pairs of chips they cross between), source -1 where only
        what each core receives matters (an all-to-all chip). Repeated layers exchange by the
        same patterns: off a mesh, the counts are worked out once (`counted`)."""
        key = (p.pat, p.start, p.runs, ins.cores)
        counted = self.counted.get(key)
        if counted is not None:
            return counted
        if self.chip.is_mesh:  # (a wafer's pairs are too many to keep for every pattern)
            src, dst, count = pair_counts(p, here)
            keep = src != dst
            return src[keep], dst[keep], count[keep], None
        crossing: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if self.chip.is_pod:  # which bytes cross between chips: each element once per
            # destination chip, which fans it out to its cores
            crossing = chip_pair_counts(p, here, self.chip.cores_per_chip, self.chip.chips)
        counted = (np.full(len(here), -1), here, received(p, here), crossing)
        self.counted.put(key, counted)
        return counted

    def multicast_exchange(self, ins: Exchange, p: Pattern, here: np.ndarray, size: int
                           ) -> None:
        """Queue a multicast exchange as codegen and the planner route it
        (`t10c.multicast.multicast_routes`): relayed, or as its trees (also where unicasts
        would be faster: the program asks for multicast)."""
        spelt, grouped = multicast_trees(p, here)
        if grouped is not None:  # relayed from its groups, never spelt out
            t_group, t_src, t_count, p_group, p_dst = grouped
            self.receive_relay(ins.op, ins.phase, grouped_relay(
                self.chip, t_group, t_src, t_count * size, p_group, p_dst))
            return
        assert spelt is not None
        tree, src, dst, count, group = spelt
        nbytes = count * size
        routes = multicast_routes(self.chip, tree, src, dst, nbytes, group)
        if isinstance(routes, Relay):
            self.receive_relay(ins.op, ins.phase, routes)
        else:
            self.receive_trees(ins.op, ins.phase, *(
                routes if routes is not None else exchange_trees(self.chip, tree, src, dst,
                                                                 nbytes)))

    def shift(self, ins: Shift) -> None:
        n = len(ins.src_core)
        rows, here = _rows(ins, n), _phys(ins, n)
        self.check_sources(ins.src_core)
        self.check_read(ins.src, ins.src_core)
        self.mark_live(ins.dst)
        self.written[ins.dst][rows] = True
        size = np.full(n, self.prog.buffers[ins.dst].nbytes, dtype=np.int64)
        self.receive(ins.op, "shift", ins.src_core.astype(np.int64), here, size)
        if self.chip.is_pod:
            self.cross(ins.src_core.astype(np.int64), here, size)

    def reduce(self, ins: Reduce) -> None:
        self.flush()
        n = len(ins.group)
        rows, here = _rows(ins, n), _phys(ins, n)
        self.check_sources(ins.group)
        self.check_read(ins.src, ins.group.ravel())
        self.mark_live(ins.dst)
        chunk = self.prog.buffers[ins.dst].elems
        group = ins.group.shape[1]
        self.written[ins.dst][rows] = True
        add = self.chip.vector_cycles((group - 1) * chunk, self.prog.dtype)
        nbytes = chunk * self.itemsize(ins.dst)
        if self.chip.is_mesh:  # each core gathers its chunk from every other member
            # (only the chunk's real elements: padding past the block is never sent)
            real = (np.full(n, chunk, dtype=np.int64) if ins.sizes is None
                    else np.minimum(ins.sizes.astype(np.int64), chunk))
            # (broadcast views: `route` takes them a few rows at a time)
            members = np.broadcast_to(here[:, None], ins.group.shape)
            sent = np.broadcast_to((real * self.itemsize(ins.dst))[:, None], ins.group.shape)
            key = ("reduce", *_digest(ins.group, here, real))
            cycles, most, hops = self.timed(ins.group, members, sent, key)
            self.record(ins.op, "reduce", cycles + add, most, hops)
        else:
            remote = (group - 1) * nbytes
            cross = 0
            if self.chip.is_pod:  # each member gathers its chunk from every other member
                members = np.broadcast_to(here[:, None], ins.group.shape).ravel()
                self.cross(ins.group.ravel().astype(np.int64), members,
                           np.full(members.size, nbytes, dtype=np.int64))
                cross = int(max(self.pod_in.max(), self.pod_out.max()))
                self.pod_in[:] = 0
                self.pod_out[:] = 0
            self.record(ins.op, "reduce", self.chip.exchange_cycles(remote, cross) + add,
                        remote)
        self.credit = 0

    def compute(self, ins: Compute) -> None:
        self.flush()
        expr = self.prog.exprs[ins.expr]
        rows = _rows(ins, len(ins.origin))
        for bid in ins.ins + ((ins.out,) if ins.accumulate else ()):
            self.check_read(bid, rows)
        self.mark_live(ins.out)
        self.written[ins.out][rows] = True
        cycles = compute_cycles(expr, dict(zip(expr.axis_names, ins.sub)), self.chip,
                                self.prog.dtype)
        self.record(expr.name, "compute", cycles)
        self.credit = cycles

    def store(self, ins: Store) -> None:
        self.check_sources(ins.src_core)
        self.check_read(ins.src, lambda: _cores_in(ins.src_core, self.chip.cores))


    # -- off-chip memory ----------------------------------------------------------------------
    def dma_load(self, ins: DmaLoad) -> None:
        """Start a DMA load: the engine takes it when its queue is free and works beside the
        cores; the buffer is written when its `DmaWait` finds the load landed."""
        if not self.chip.has_dram:
            raise EmulatorError(f"DMA load from DRAM on {self.chip.name}, which has none")
        self.mark_live(ins.buf)
        if ins.buf in self.dma_ready:
            raise EmulatorError(f"DMA load into buffer %{self.prog.buffers[ins.buf].name}, "
                                "which already has one in flight")
        self.flush()  # the clock stands where the cores are
        buf = self.prog.buffers[ins.buf]
        size = DTYPE_BYTES[buf.dtype]
        rows = _rows(ins, ins.ncores)
        cores = ins.ncores if isinstance(rows, slice) else rows
        # the tensor's elements each core's tile holds (not the padding past its edge)
        if ins.indexed:
            counts = ins.elements()[1].sum(axis=1)
        else:
            counts = tile_counts(ins.origin, ins.tile, ins.shape)
        cycles = self.chip.dma_load_cycles(size, counts, cores)
        self.dma_free = max(self.now, self.dma_free) + cycles
        self.dma_ready[ins.buf] = (self.dma_free, rows)
        self.timeline.dram_bytes += int(counts.sum()) * size

    def dma_store(self, ins: DmaStore) -> None:
        """Start a write-back: the engine takes it when its queue is free (after every load
        and store issued before it) and reads the buffer beside the cores, which may not
        write or free it before its `DmaWait`."""
        if not self.chip.has_dram:
            raise EmulatorError(f"DMA store to DRAM on {self.chip.name}, which has none")
        TimingMachine.store(self, ins)  # its checks: the sources exist and wrote it
        if ins.src in self.dma_ready:
            raise EmulatorError(f"DMA store from buffer %{self.prog.buffers[ins.src].name}, "
                                "which has a DMA load in flight")
        self.flush()  # the clock stands where the cores are
        held = self.prog.buffers[ins.src].elems * DTYPE_BYTES[ins.dtype]
        cores = self.chip.cores if ins.cores is None else ins.cores
        cycles = self.chip.dram_store_cycles(ins.nbytes, held, cores)
        self.dma_free = max(self.now, self.dma_free) + cycles
        self.dma_stores[ins.src] = self.dma_free  # (stores queue in order: the last is last)
        self.timeline.dram_store_bytes += ins.nbytes

    def dma_wait(self, ins: DmaWait) -> None:
        """The cores stall until the buffer's DMA load has landed, or its stores are done
        (phase "dram")."""
        if ins.buf in self.dma_stores:
            self.flush()
            self.record(ins.op, "dram", max(self.dma_stores.pop(ins.buf) - self.now, 0))
            return
        if ins.buf not in self.dma_ready:
            raise EmulatorError(f"waits for buffer %{self.prog.buffers[ins.buf].name}, which "
                                "has no DMA load in flight")
        self.mark_live(ins.buf)
        self.flush()
        ready, rows = self.dma_ready.pop(ins.buf)
        self.record(ins.op, "dram", max(ready - self.now, 0))
        self.written[ins.buf][rows] = True


@dataclass(frozen=True)
class _LinkDelta:
    """The link loads one op adds, kept for its replays: sparse (the links it used and
    their bytes) unless it used most links. A dense copy is 24 MB on a wafer, per op."""

    shape: tuple[int, ...]
    index: np.ndarray | None  # flat link indices (None: ``values`` is dense)
    values: np.ndarray

    @staticmethod
    def of(delta: np.ndarray) -> _LinkDelta:
        used = np.flatnonzero(delta)
        if 3 * len(used) < delta.size:
            return _LinkDelta(delta.shape, used.astype(np.int32), delta.ravel()[used])
        return _LinkDelta(delta.shape, None, delta)

    def add_to(self, loads: np.ndarray, times: int = 1) -> None:
        """Add these loads, ``times`` over, to ``loads`` (of ``shape``) in place."""
        values = self.values if times == 1 else self.values * times
        if self.index is None:
            loads += values
        else:
            loads.reshape(-1)[self.index] += values


class Spans:
    """Byte ranges ``[start, end)`` of live buffers, none overlapping another, kept sorted so
    that a new range's overlap is found by bisection, not by a pass over every live buffer:
    ranges overlap where ``start < e and s < end`` (an empty range overlaps a range it lies
    strictly inside). The non-empty ranges, sorted by start, are sorted by end too; the empty
    ones are kept apart, by position."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.ids: list[int] = []
        self.points: list[tuple[int, int]] = []  # empty ranges: (position, buffer)

    def overlapping(self, start: int, end: int) -> int | None:
        """A live buffer whose range overlaps ``[start, end)``, or None."""
        j = bisect.bisect_left(self.starts, end)  # the ranges that start before ``end``
        if j and self.ends[j - 1] > start:  # the one of them that ends last
            return self.ids[j - 1]
        if start < end:  # an empty range strictly inside [start, end)
            k = bisect.bisect_right(self.points, (start, sys.maxsize))
            if k < len(self.points) and self.points[k][0] < end:
                return self.points[k][1]
        return None

    def add(self, start: int, end: int, buf: int) -> None:
        if start == end:
            bisect.insort(self.points, (start, buf))
            return
        j = bisect.bisect_left(self.starts, start)
        self.starts.insert(j, start)
        self.ends.insert(j, end)
        self.ids.insert(j, buf)

    def remove(self, start: int, end: int, buf: int) -> None:
        if start == end:
            self.points.remove((start, buf))
            return
        j = bisect.bisect_left(self.starts, start)
        del self.starts[j], self.ends[j], self.ids[j]


class ByArrays(Generic[V]):
    """Values keyed by arrays' contents (and a hashable ``extra``), looked up first by the
    arrays' identities: a program's repeated layers share one array per distinct pattern,
    and copying and hashing their bytes at every instruction took a few percent of a
    functional run. Equal arrays that are different objects find the same value by their
    bytes (then by identity too). The arrays must not change once keyed (a program's
    tables do not); the identities are kept with references, so an id is never reused."""

    def __init__(self) -> None:
        self.by_bytes: dict[tuple, V] = {}
        self.by_id: dict[tuple, tuple[tuple[np.ndarray | None, ...], V]] = {}

    def get(self, arrays: tuple[np.ndarray | None, ...], extra: Hashable = None) -> V | None:
        ident = (extra, tuple(map(id, arrays)))
        hit = self.by_id.get(ident)
        if hit is not None and all(a is b for a, b in zip(hit[0], arrays)):
            return hit[1]
        value = self.by_bytes.get(self._key(arrays, extra))
        if value is not None:
            self.by_id[ident] = (arrays, value)
        return value

    def put(self, arrays: tuple[np.ndarray | None, ...], value: V, extra: Hashable = None
            ) -> None:
        self.by_bytes[self._key(arrays, extra)] = value
        self.by_id[(extra, tuple(map(id, arrays)))] = (arrays, value)

    @staticmethod
    def _key(arrays: tuple[np.ndarray | None, ...], extra: Hashable) -> tuple:
        return (extra, tuple(None if a is None else (a.dtype.str, a.shape, a.tobytes())
                             for a in arrays))


def _rows(ins: Instr, n: int) -> np.ndarray | slice:
    """The cores an instruction's table rows stand for, as an index into core arrays."""
    cores = getattr(ins, "cores", None)
    return slice(0, n) if cores is None else cores


def _phys(ins: Instr, n: int) -> np.ndarray:
    cores = getattr(ins, "cores", None)
    return np.arange(n, dtype=np.int64) if cores is None else cores.astype(np.int64)


#: arrays of cores kept per buffer (`TimingMachine.check_read`): the last few reads' (a
#: wafer's are megabytes each)
_CHECKED_KEPT = 4
#: elements hashed at a time by `_digest`
_DIGEST_SLICE = 1 << 22
#: routes remembered (`TimingMachine.timed`): a rotation's steps repeat the last one or two
_ROUTES_KEPT = 8


def _digest(*arrays: np.ndarray) -> tuple[int, ...]:
    """A 128-bit fingerprint of integer arrays (`t10c.digest`) over each one's shape and its
    values as int64 in row-major order, so that equal values give equal keys whatever their
    dtype. Taken a block of leading rows at a time, so that a broadcast view of a wafer-wide
    table is never copied whole."""
    h = hasher()
    for a in arrays:
        h.update(repr(a.shape).encode())
        if a.ndim == 0:
            h.update(np.asarray(a, dtype=np.int64).tobytes())
            continue
        rows = max(1, _DIGEST_SLICE // max(1, math.prod(a.shape[1:])))
        for lo in range(0, a.shape[0], rows):
            h.update(np.ascontiguousarray(a[lo:lo + rows], dtype=np.int64).data)
    d = h.digest()
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")


def _chip_pairs(src_core: np.ndarray, src_off: np.ndarray, here: np.ndarray, per_chip: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src core, destination chip, distinct elements) of an element table whose row r
    lands on core ``here[r]``: what crosses from another chip, each element once per chip
    (`codegen.pattern.chip_pair_counts` for a table)."""
    chip = np.broadcast_to((np.asarray(here, dtype=np.int64) // per_chip)[:, None],
                           src_core.shape)
    src = src_core.astype(np.int64)
    far = (src >= 0) & (src // per_chip != chip)
    key = np.unique((chip[far] * (int(src.max(initial=0)) + 1) + src[far]) * (1 << 32)
                    + src_off[far].astype(np.int64))
    pair, count = np.unique(key >> 32, return_counts=True)
    base = int(src.max(initial=0)) + 1
    return pair % base, pair // base, count.astype(np.int64)


def _pairs(src_core: np.ndarray, here: np.ndarray, itemsize: int
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
