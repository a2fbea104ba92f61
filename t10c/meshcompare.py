"""Mesh-aware plans against plans made under the all-to-all assumption, on one mesh chip.

T10 priced every ring shift as one hop, which holds on the IPU's all-to-all exchange. On a 2D
mesh a ring laid out in row-major core order wraps around across the grid, and transfers share
links. `t10c mesh-compare` compiles each workload twice for the same mesh chip:

- ``t10`` (mesh-aware): rings embedded with interleaving (every shift at most 2 hops), shifts
  priced by hops and the busiest link, reductions placed close (`partition/place.py`);
- ``all-to-all``: the same search and solver pricing shifts as one hop, cores numbered
  row-major, as T10 would;

and emulates both on the mesh, where the emulator routes every transfer dimension-order and
charges the busiest link. The ratio is the all-to-all plan's latency over the mesh-aware one's;
a decode step's row also reads in tokens per second (one token per step, batch 1).
Functional runs (checked against onnxruntime) are used where the chip is small enough, timing-only
runs otherwise. A side that cannot be compiled (its plans do not fit the chip, or an exchange
would not fit this machine's memory: the all-to-all assumption's row-major reductions on a
wafer) is recorded with the reason, and the other rows still run (`t10c mesh-compare` fails,
with the first reason, only when every side failed); a result that does not match
onnxruntime stops the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from t10c.chips import Chip
from t10c.compare import strategy_options
from t10c.driver import CompileOptions, Progress, compile_model, run_compiled
from t10c.emulator import Timeline

#: functional emulation above this many cores takes too long and too much memory: time only
FUNCTIONAL_CORES = 16384


@dataclass(frozen=True)
class Side:
    """One workload under one strategy: its emulated timeline and what the compile took."""

    timeline: Timeline
    predicted_cycles: int
    wall_s: float
    max_rel_err: float | None  # None for timing-only runs

    @property
    def longest_shift(self) -> int:
        return max((r.hops for r in self.timeline.records if r.phase == "shift"), default=0)

    @property
    def busiest_link(self) -> int:
        return max((r.bytes_per_core for r in self.timeline.records
                    if r.phase in ("shift", "relayout", "fetch", "reduce")), default=0)


@dataclass(frozen=True)
class Failed:
    """A side that could not be compiled, and why (the error's first line)."""

    reason: str


@dataclass(frozen=True)
class Row:
    workload: str
    label: str
    aware: Side | Failed
    assumed: Side | Failed

    @property
    def decode(self) -> bool:
        """A decode step (one token per run): its row reads in tokens per second."""
        return self.label.startswith("decode step")

    @property
    def ratio(self) -> float | None:
        """How many times longer the all-to-all-assumption plan runs on the mesh (None
        when a side failed)."""
        if isinstance(self.aware, Failed) or isinstance(self.assumed, Failed):
            return None
        return self.assumed.timeline.cycles / max(self.aware.timeline.cycles, 1)

    def summary(self) -> str:
        """The row in one line, as logged when it is done."""
        ratio = self.ratio
        return (f"{self.label}: mesh-aware {_us(self.aware)}, all-to-all assumed "
                f"{_us(self.assumed)}" + (f": {ratio:.2f}x" if ratio is not None else ""))


def _us(side: Side | Failed) -> str:
    if isinstance(side, Failed):
        return f"failed ({side.reason})"
    return f"{side.timeline.latency_s * 1e6:.1f} us"


def _failure_types() -> tuple[type[BaseException], ...]:
    """The errors that make a side's result "failed", not the run's: its plans do not fit
    (`PlanError`), codegen or the emulator cannot hold it (`CodegenError` wrapping a
    `MemoryError`, `EmulatorError`), or the machine runs out of memory."""
    from t10c.codegen import CodegenError
    from t10c.emulator import EmulatorError
    from t10c.partition import PlanError

    return PlanError, CodegenError, EmulatorError, MemoryError


def run_side(model: str, chip: Chip, strategy: str, base: CompileOptions, timing_only: bool,
             progress: Progress | None = None) -> Side:
    """Compile ``model`` under ``strategy`` and emulate it (``progress`` hears every stage)."""
    start = time.perf_counter()
    options = dataclasses.replace(strategy_options(strategy, base), timing_only=timing_only,
                                  weights=not timing_only)
    compiled = compile_model(model, chip, options, progress)
    if timing_only:
        assert compiled.timeline is not None
        return Side(compiled.timeline, compiled.plan.total_cycles,
                    time.perf_counter() - start, None)
    result = run_compiled(compiled, progress=progress)
    if not result.ok:
        raise ValueError(f"{model} ({strategy}) does not match onnxruntime on {chip.name}: "
                         f"max relative error {result.max_rel_err:.2e}")
    return Side(result.timeline, compiled.plan.total_cycles, time.perf_counter() - start,
                result.max_rel_err)


def mesh_compare(workloads: list[tuple[str, str]] | list[tuple[str, str, int | None]],
                 chip: Chip, base: CompileOptions,
                 timing_only: bool | None = None, log: Callable[[str], None] | None = None,
                 progress: Callable[[], AbstractContextManager[Progress]] | None = None
                 ) -> list[Row]:
    """Compile and emulate every (label, model) of ``workloads`` both ways on ``chip`` (a
    third item, when given, is the model's ``seq_len``: a decode step's KV cache);
    ``progress()`` makes a fresh progress display for each compile."""
    if not chip.is_mesh:
        raise ValueError(f"{chip.name} is {chip.topology}: mesh-compare needs a mesh2d or "
                         "torus2d chip (wse2, wse3, wormhole-n150, blackhole-p150, or a .toml)")
    if timing_only is None:
        timing_only = chip.cores > FUNCTIONAL_CORES
    rows = []
    for label, model, *rest in workloads:
        options = dataclasses.replace(base, seq_len=rest[0]) if rest and rest[0] else base
        sides: dict[str, Side | Failed] = {}
        for strategy in ("t10", "all-to-all"):
            if log:
                log(f"[{label}: {model} on {chip.name}, {strategy}"
                    f"{', timing only' if timing_only else ''}]")
            try:
                with progress() if progress else contextlib.nullcontext() as report:
                    sides[strategy] = run_side(model, chip, strategy, options, timing_only,
                                               report)
            except _failure_types() as exc:
                sides[strategy] = Failed((str(exc).splitlines() or [type(exc).__name__])[0])
        rows.append(Row(model, label, sides["t10"], sides["all-to-all"]))
        if log:  # each row as it is done (a long run's later rows may take hours)
            log(rows[-1].summary())
    return rows


def _cell(sides: tuple[Side | Failed, ...], value: Callable[[Side], str]) -> str:
    """One figure of both sides, "mesh-aware / all-to-all"."""
    return " / ".join(value(x) if isinstance(x, Side) else "failed" for x in sides)


def table(rows: list[Row], chip: Chip) -> str:
    """The comparison as a Markdown table."""
    head = ["workload", "model", "mesh-aware (us)", "all-to-all assumed (us)", "ratio",
            "tokens/s", "longest shift (hops)", "busiest link (bytes)", "checked"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for r in rows:
        sides = (r.aware, r.assumed)
        ok = [x for x in sides if isinstance(x, Side)]
        errs = [x.max_rel_err for x in ok if x.max_rel_err is not None]
        checked = f"onnxruntime {max(errs):.1e}" if errs else "timing only"

        for name, x in zip(("mesh-aware", "all-to-all assumed"), sides):
            if isinstance(x, Failed):
                notes.append(f"{r.label}, {name}: {x.reason}")
        lines.append("| " + " | ".join([
            r.label, r.workload,
            *(f"{x.timeline.latency_s * 1e6:.1f}" if isinstance(x, Side) else "failed"
              for x in sides),
            f"{r.ratio:.2f}x" if r.ratio is not None else "-",
            _cell(sides, lambda x: f"{1 / x.timeline.latency_s:,.0f}") if r.decode else "-",
            _cell(sides, lambda x: str(x.longest_shift)),
            _cell(sides, lambda x: str(x.busiest_link)),
            checked]) + " |")
    return "\n".join(lines + [""] * bool(notes) + [f"- failed: {n}" for n in notes])
