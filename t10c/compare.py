"""Compare plans: compile and emulate a model under several strategies and chips, side by side.

The strategies are listed in `t10c.strategies` (t10, no-rotation, vgm and, for meshes,
all-to-all); all are compiled by the same pipeline, executed by the same emulator and checked
against onnxruntime like t10c's own plans. On a mesh, the emulator routes the all-to-all plans'
transfers on the real mesh, so comparing them with ``t10`` shows what the mesh-aware embedding
and costs are worth (`t10c mesh-compare`).

A run is judged against its plan's bounds (`t10c.partition.bounds`): the roofline (the
model's FLOPs at the chip's peak matrix rate in the storage dtype) and the ideal.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.driver import (
    Compiled,
    CompileOptions,
    Progress,
    RunResult,
    compile_model,
    run_compiled,
)
from t10c.partition import Bounds
from t10c.strategies import search_options


def strategy_options(strategy: str, base: CompileOptions = CompileOptions()) -> CompileOptions:
    """``base`` with its search options changed as ``strategy`` asks (`t10c.strategies`)."""
    return dataclasses.replace(base, search=search_options(strategy, base.search))


@dataclass(frozen=True)
class Entry:
    """One model compiled for one chip under one strategy, and its run."""

    model: str
    chip: Chip
    strategy: str
    compiled: Compiled | None
    result: RunResult | None
    error: str = ""
    flops: int = 0
    dtype: str = "fp16"
    compile_wall_s: float = math.nan
    bounds: Bounds | None = None
    batch: int | None = None  # the zoo model's batch size, if one was asked for

    def slim(self) -> Entry:
        """The figures without the program, model and outputs (for long benchmark runs)."""
        result = self.result and dataclasses.replace(self.result, outputs={}, reference={})
        return dataclasses.replace(self, compiled=None, result=result)

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def latency_s(self) -> float:
        return self.result.timeline.latency_s if self.result else math.nan

    @property
    def roofline_fraction(self) -> float:
        """The compute roofline (`partition.bounds`) as a fraction of the emulated latency."""
        if not self.result or self.bounds is None:
            return math.nan
        return self.bounds.fractions(self.result.timeline.cycles)[0]

    @property
    def ideal_fraction(self) -> float:
        """The ideal (every op at its fastest plan) as a fraction of the emulated latency."""
        if not self.result or self.bounds is None:
            return math.nan
        return self.bounds.fractions(self.result.timeline.cycles)[1]

    @property
    def exchange_fraction(self) -> float:
        """The exchange bound (`partition.bounds.exchange_cycles`) as a fraction of the
        emulated latency; NaN where the chip has none."""
        if not self.result or self.bounds is None:
            return math.nan
        return self.bounds.of_exchange(self.result.timeline.cycles)

    @property
    def compile_s(self) -> float:
        return self.compile_wall_s


#: the chips this process has compiled for once already (`warm_up`)
_WARM: set[str] = set()


def warm_up(chip: Chip, options: CompileOptions) -> None:
    """Compile a small matmul for ``chip`` once per process and chip, untimed, so that the
    one-time costs (imports, the solver's first start, the frontend's first model) are not
    charged to whichever strategy happens to compile first. It changes no result."""
    if chip.name in _WARM:
        return
    _WARM.add(chip.name)
    try:
        compile_model("matmul-64x64x64", chip, dataclasses.replace(
            options, seq_len=None, batch=None, pinned={}, timing_only=True, weights=False))
    except ValueError:  # a chip too small even for this: the real compile will say why
        pass


def run_entry(model: str, chip: Chip, strategy: str, options: CompileOptions, seed: int = 0,
              progress: Progress | None = None) -> Entry:
    """Compile and emulate; a failure (say the baseline does not fit) is recorded, not raised.
    ``progress`` is told about every stage (see `t10c.driver.compile_model`). The compile time
    excludes the process's one-time warm-up (`warm_up`)."""
    warm_up(chip, options)
    try:
        compiled = compile_model(model, chip, strategy_options(strategy, options), progress)
    except ValueError as exc:  # frontend and planner errors are ValueErrors
        return Entry(model, chip, strategy, None, None, str(exc).splitlines()[0],
                     batch=options.batch)
    result = RunResult.timed(compiled) if options.timing_only else \
        run_compiled(compiled, seed, progress)
    return Entry(model, chip, strategy, compiled, result, flops=compiled.graph.flops(),
                 dtype=compiled.plan.dtype, compile_wall_s=compiled.timings["total_s"],
                 bounds=compiled.plan.bounds, batch=options.batch)


def speedup(entries: list[Entry], entry: Entry, over: str) -> float:
    """How much faster ``entry`` is than strategy ``over`` on the same model, batch and chip."""
    for other in entries:
        if (other.model, other.batch, other.chip.name, other.strategy) == \
                (entry.model, entry.batch, entry.chip.name, over):
            return other.latency_s / entry.latency_s if other.result and entry.result \
                else math.nan
    return math.nan


def sram_per_core(compiled: Compiled) -> np.ndarray:
    """Peak bytes each core holds: a buffer counts on the cores its instructions use."""
    from t10c.codegen.program import Alloc, Compute, Exchange, Free, Load, Reduce, Shift

    prog = compiled.program
    cores = prog.cores
    used: dict[int, np.ndarray] = {}  # per buffer, the cores its instructions touch

    def touch(buf: int, ins, n: int) -> None:
        mask = used.setdefault(buf, np.zeros(cores, dtype=bool))
        placed = getattr(ins, "cores", None)
        mask[placed if placed is not None else slice(0, n)] = True

    for ins in prog.instrs:
        n = (ins.ncores if isinstance(ins, Load) else len(ins.origin) if isinstance(ins, Compute)
             else ins.nrows if isinstance(ins, Exchange)
             else len(ins.src_core) if isinstance(ins, Shift)
             else len(ins.group) if isinstance(ins, Reduce) else 0)
        for name in ("buf", "dst", "out"):
            if hasattr(ins, name):
                touch(getattr(ins, name), ins, n)
        if isinstance(ins, Compute):
            for b in ins.ins:
                touch(b, ins, n)
    now = np.zeros(cores, dtype=np.int64)
    peak = np.zeros(cores, dtype=np.int64)
    none = np.zeros(cores, dtype=bool)
    for ins in prog.instrs:
        if isinstance(ins, Alloc):
            now[used.get(ins.buf, none)] += prog.buffers[ins.buf].nbytes
            np.maximum(peak, now, out=peak)
        elif isinstance(ins, Free):
            now[used.get(ins.buf, none)] -= prog.buffers[ins.buf].nbytes
    return peak


@dataclass(frozen=True)
class Capacity:
    """Per strategy, the largest batch of one model that fitted one chip among the batches
    run (0: none did), and the throughput there in samples per second."""

    model: str
    chip: str
    batch: dict[str, int]
    throughput: dict[str, float]

    def gain(self, strategy: str, over: str) -> float:
        """How many times ``over``'s best throughput ``strategy``'s is (NaN if either has none):
        each at its own largest batch, which is how a memory-bound server would run."""
        a, b = self.throughput.get(strategy, 0.0), self.throughput.get(over, 0.0)
        return a / b if a and b else math.nan

    def as_dict(self) -> dict[str, object]:
        return {"model": self.model, "chip": self.chip, "largest_batch": self.batch,
                "samples_per_s": {s: round(v, 3) for s, v in self.throughput.items()}}


def largest_batches(entries: list[Entry], strategies: list[str]) -> list[Capacity]:
    """The largest batch each strategy fitted, per model and chip, of the entries' batches
    (entries without a batch size are left out)."""
    out: dict[tuple[str, str], Capacity] = {}
    for e in entries:
        if e.batch is None:
            continue
        key = (e.model, e.chip.name)
        cap = out.setdefault(key, Capacity(e.model, e.chip.name, dict.fromkeys(strategies, 0),
                                           dict.fromkeys(strategies, 0.0)))
        if e.result is not None and e.batch > cap.batch.get(e.strategy, 0):
            cap.batch[e.strategy] = e.batch
            cap.throughput[e.strategy] = e.batch / e.latency_s
    return list(out.values())
