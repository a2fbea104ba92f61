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
runs otherwise.
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
class Row:
    workload: str
    label: str
    aware: Side
    assumed: Side

    @property
    def decode(self) -> bool:
        """A decode step (one token per run): its row reads in tokens per second."""
        return self.label.startswith("decode step")

    @property
    def ratio(self) -> float:
        """How many times longer the all-to-all-assumption plan runs on the mesh."""
        return self.assumed.timeline.cycles / max(self.aware.timeline.cycles, 1)


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
        sides = {}
        for strategy in ("t10", "all-to-all"):
            if log:
                log(f"[{label}: {model} on {chip.name}, {strategy}"
                    f"{', timing only' if timing_only else ''}]")
            with progress() if progress else contextlib.nullcontext() as report:
                sides[strategy] = run_side(model, chip, strategy, options, timing_only,
                                           report)
        rows.append(Row(model, label, sides["t10"], sides["all-to-all"]))
        if log:  # each row as it is done (a long run's later rows may take hours)
            r = rows[-1]
            log(f"{label}: mesh-aware {r.aware.timeline.latency_s * 1e6:.1f} us, all-to-all "
                f"assumed {r.assumed.timeline.latency_s * 1e6:.1f} us: {r.ratio:.2f}x")
    return rows


def table(rows: list[Row], chip: Chip) -> str:
    """The comparison as a Markdown table."""
    head = ["workload", "model", "mesh-aware (us)", "all-to-all assumed (us)", "ratio",
            "tokens/s", "longest shift (hops)", "busiest link (bytes)", "checked"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        a, b = r.aware, r.assumed
        checked = "timing only" if a.max_rel_err is None else \
            f"onnxruntime {max(a.max_rel_err, b.max_rel_err or 0):.1e}"
        lines.append("| " + " | ".join([
            r.label, r.workload, f"{a.timeline.latency_s * 1e6:.1f}",
            f"{b.timeline.latency_s * 1e6:.1f}", f"{r.ratio:.2f}x",
            (f"{1 / a.timeline.latency_s:,.0f} / {1 / b.timeline.latency_s:,.0f}"
             if r.decode else "-"),
            f"{a.longest_shift} / {b.longest_shift}",
            f"{a.busiest_link} / {b.busiest_link}", checked]) + " |")
    return "\n".join(lines)
