"""The on-disk formats: ``plan.json`` (format "t10c-plan/1") and ``run.json``.

``plan.json`` is meant for other tools; its fields are documented in the README ("Files").
Keys are sorted and numbers are integers except where a field says seconds, so the same compile
gives the same file apart from the solver's wall time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from t10c.driver import Compiled, RunResult
from t10c.ir import INDIRECT
from t10c.partition import OpPlan, place

PLAN_FORMAT = "t10c-plan/1"
RUN_FORMAT = "t10c-run/1"


def _placement(p: OpPlan) -> str:
    if p.aligned < 0:
        return place.describe(p.embed, _prod(p.F))
    cores = "its cores permuted to" if p.cores is not None else "row-major cores, matching"
    return f"aligned to input {p.aligned}: {cores} the layout its producer leaves"


def _runs(cores: tuple[int, ...]) -> list[list[int]]:
    """Consecutive physical cores as [first, count] runs (an aligned plan's map is a few
    hundred runs where the whole list would be thousands of numbers)."""
    runs: list[list[int]] = []
    for c in cores:
        if runs and runs[-1][0] + runs[-1][1] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return runs


def plan_document(c: Compiled) -> dict[str, Any]:
    graph, plan = c.graph, c.plan
    ops = []
    for op, p, relayout, front in zip(graph.ops, plan.ops, plan.relayout_cycles,
                                      plan.front_sizes):
        operands = []
        for i, o in enumerate(op.operands):
            operands.append({
                "tensor": o.tensor,
                "role": "output" if i == len(op.inputs) else "input",
                "axes": [str(d) for d in o.axes],
                "f_t": p.f_t(op, i),
            })
        ops.append({
            "name": op.name, "kind": op.kind, "source": op.source,
            "axes": dict(op.axes), "F_op": dict(zip(op.axis_names, p.F)),
            "T": dict(zip(op.axis_names, p.T)), "operands": operands, "steps": p.steps,
            "cycles": p.cycles.as_dict(), "relayout_cycles": relayout,
            "hot_bytes_per_core": p.hot_bytes_per_core,
            "weights": "warmed-up" if p.home else "resident",
            "cold_bytes_per_core": p.cold_bytes_per_core,
            "cores": _prod(p.F), "front_size": front,
            # on a mesh: [rows, cols, column driver, its ring, row driver, its ring]; null
            # where logical core c is physical core c
            "embedding": p.embed.as_list() if p.embed is not None else None,
            "placement": _placement(p),
            # an aligned plan's cores (`partition/align.py`): [[first physical core, count],
            # ...] runs of consecutive cores, logical core order; null: core c is core c
            "core_map": _runs(p.cores) if p.cores is not None else None,
        })
    return {
        "format": PLAN_FORMAT, "model": c.name, "chip": c.chip.name, "dtype": plan.dtype,
        "cores": c.chip.cores, "sram_bytes_per_core": c.chip.sram_bytes_per_core,
        "indirect_axis": INDIRECT,
        "ops": ops, "total_cycles": plan.total_cycles,
        "peak_sram_bytes_per_core": c.program.peak_sram_bytes_per_core,
        "sram": {"peak_bytes_per_core": c.program.peak_sram_bytes_per_core,
                 "live_bytes_per_core": c.program.live_sram_bytes_per_core,
                 "fragmentation": round(max(c.program.peak_sram_bytes_per_core
                                            / max(c.program.live_sram_bytes_per_core, 1) - 1,
                                            0.0), 6),
                 "layout": c.program.sram_layout},
        # wall-clock times vary run to run: they go to compile.json, so that the same compile
        # gives the same plan.json byte for byte
        "solver": {k: v for k, v in plan.solver.items() if k != "wall_s"},
    }


def run_document(c: Compiled, r: RunResult, seed: int) -> dict[str, Any]:
    tl = r.timeline
    return {
        "format": RUN_FORMAT, "model": c.name, "chip": c.chip.name, "dtype": c.plan.dtype,
        "seed": seed, "cycles": tl.cycles, "latency_s": tl.latency_s,
        "predicted_cycles": c.plan.total_cycles,
        "max_rel_err": r.max_rel_err, "tolerance": r.tolerance, "ok": r.ok,
        "peak_sram_bytes_per_core": tl.peak_sram_bytes_per_core,
        "host_bytes": tl.host_bytes,
        "emulate_wall_s": r.emulate_wall_s, "reference_wall_s": r.reference_wall_s,
        "ops": tl.by_op(),
    }


COMPILE_FORMAT = "t10c-compile/1"


def compile_document(c: Compiled, source: str, seq_len: int | None, batch: int | None,
                     pinned: dict[str, tuple[int, ...]], model_file: str | None
                     ) -> dict[str, Any]:
    """What `t10c run DIR` needs to run the saved program again: where the model comes from,
    the chip (every field), and the options; plus the stage wall times of this compile."""
    import dataclasses

    return {
        "format": COMPILE_FORMAT, "model": c.name, "source": source,
        "model_file": model_file, "seq_len": seq_len, "batch": batch,
        "pinned": {k: list(v) for k, v in pinned.items()},
        "chip": {k: (list(v) if isinstance(v, tuple) else v)
                 for k, v in dataclasses.asdict(c.chip).items()},
        "dtype": c.plan.dtype, "timings_s": {k: round(v, 4) for k, v in c.timings.items()},
        "solver_wall_s": c.plan.solver["wall_s"],
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
