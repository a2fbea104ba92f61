"""The on-disk formats: ``plan.json`` (format "t10c-plan/2"; "t10c-plan/1" is read too),
``run.json``, and the plans a user gives back with ``t10c compile --plan FILE``
(`load_plan_arg`: a plan.json to replay, or a constraints file, TOML or JSON).

``plan.json`` is meant for other tools; its fields are documented in the README ("Files").
Keys are sorted and numbers are integers except where a field says seconds, and wall times are
left out, so the same compile gives the same file byte for byte. `load_plan` reads it back
into the `Plan` it was written from (wall times zero).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from t10c.driver import Compiled, RunResult
from t10c.ir import INDIRECT
from t10c.outputs import write_text
from t10c.partition import (
    WEIGHTS,
    Bounds,
    Constraint,
    Cycles,
    OpPlan,
    Plan,
    Replay,
    SolverReport,
    place,
)
from t10c.partition.place import Embedding

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PLAN_FORMAT = "t10c-plan/2"
#: the plan formats read: /1 had only runs of consecutive cores in its core maps (`_runs`)
PLAN_FORMATS = ("t10c-plan/1", PLAN_FORMAT)
RUN_FORMAT = "t10c-run/1"


def _placement(p: OpPlan) -> str:
    if p.aligned < 0:
        return place.describe(p.embed, math.prod(p.F))
    cores = "its cores permuted to" if p.cores is not None else "row-major cores, matching"
    return (f"aligned to input {p.aligned}: {cores} the layout its producer leaves or the "
            "previous op reads")


def _runs(cores: tuple[int, ...]) -> list[list[int]]:
    """Physical cores in runs of one step, each ``[first, count]`` (a step of 1: consecutive
    cores) or ``[first, count, step]``, longest first from the start: an aligned plan's map
    on an IPU is a few hundred runs of consecutive cores, and on a wafer runs of one core a
    row apart (LLaMA-3-8B's 64-token prefill: 55,551 runs for 458,752 cores)."""
    runs: list[list[int]] = []
    last = 0
    for c in map(int, cores):
        if runs and runs[-1][1] == 1:  # a run of one takes any step
            runs[-1][1:] = [2, c - last]
        elif runs and c - last == runs[-1][2]:
            runs[-1][1] += 1
        else:
            runs.append([c, 1, 1])
        last = c
    return [r if r[2] != 1 and r[1] > 1 else r[:2] for r in runs]


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
            "weights": "warmed-up" if p.home else "dram" if p.dram_weights else "resident",
            "cold_bytes_per_core": p.cold_bytes_per_core,
            "cores": math.prod(p.F), "front_size": front,
            # exactly what the planner chose, for `load_plan`: per op axis the axes that skew
            # it, per operand its rotation axes and its f_t along them, and the bytes the
            # result occupies until its readers are done
            # (keys are sorted on disk: ``axis_order`` is the op's own order of its axes)
            "axis_order": list(op.axis_names),
            "drivers": {a: list(d) for a, d in zip(op.axis_names, p.drivers)},
            "rot": [list(r) for r in p.rot], "chain": list(p.chain),
            "out_bytes_per_core": p.out_bytes_per_core,
            # on a mesh: [rows, cols, column driver, its ring, row driver, its ring]; null
            # where logical core c is physical core c
            "embedding": p.embed.as_list() if p.embed is not None else None,
            "placement": _placement(p),
            # an aligned plan's cores (`partition/align.py`): [[first physical core, count],
            # ...] runs of consecutive cores, logical core order; null: core c is core c
            "core_map": _runs(p.cores) if p.cores is not None else None,
            "aligned_input": p.aligned,
            # chips with DRAM (`partition/dram.py`): what the op loads before it runs
            **({"dram_bytes_per_core": p.dram_bytes_per_core, "dram_cycles": p.dram_cycles}
               if p.dram_cycles else {}),
        })
    # int8 weights (--quantize) make another graph: said only where set, so that the plans of
    # float models read as they did
    quantized = {"quantize": c.options.quantize} if c.options.quantize else {}
    return {
        "format": PLAN_FORMAT, "model": c.name, "chip": c.chip.name, "dtype": plan.dtype,
        **quantized,
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
        "solver": plan.solver.document(),
        # lower bounds on the latency (`partition.bounds`): FLOPs at the chip's peak, and
        # every op at its fastest plan with memory and re-layouts ignored
        "bounds": plan.bounds.as_dict() if plan.bounds is not None else None,
        # chips with DRAM: the preload schedule, per op the op its loads are issued at (-1:
        # none) and the cycles it waits for them
        **({"dram": {"schedule": plan.dram_schedule, "issue": list(plan.dram_issue),
                     "stall_cycles": list(plan.dram_stall_cycles),
                     "store_wait": list(plan.dram_store_wait)}}
           if plan.dram_schedule else {}),
    }


class PlanFileError(ValueError):
    """A ``plan.json`` that cannot be read back (the message names the file and the field)."""


def load_plan(path: str | Path) -> Plan:
    """The `Plan` a ``plan.json`` was written from (its wall times, not stored, are zero)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanFileError(f"cannot read {path}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") not in PLAN_FORMATS:
        raise PlanFileError(f"{path} is not a {PLAN_FORMAT} file")
    try:
        ops = tuple(_op_plan(o) for o in doc["ops"])
        return Plan(
            model=str(doc["model"]), chip=str(doc["chip"]), dtype=str(doc["dtype"]), ops=ops,
            relayout_cycles=tuple(int(o["relayout_cycles"]) for o in doc["ops"]),
            front_sizes=tuple(int(o["front_size"]) for o in doc["ops"]),
            solver=SolverReport.from_document(doc["solver"]), search_wall_s=0.0,
            bounds=_bounds(doc.get("bounds")),
            **_dram(doc.get("dram")))
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanFileError(f"{path}: a malformed or missing field ({exc!r}); write it again "
                            "with `t10c compile ... -o DIR`") from exc


def _dram(doc: dict[str, Any] | None) -> dict[str, Any]:
    if doc is None:
        return {}
    return {"dram_schedule": str(doc["schedule"]),
            "dram_issue": tuple(int(i) for i in doc["issue"]),
            "dram_stall_cycles": tuple(int(c) for c in doc["stall_cycles"]),
            "dram_store_wait": tuple(int(w) for w in doc.get("store_wait", ()))}


def _bounds(doc: dict[str, Any] | None) -> Bounds | None:
    if doc is None:
        return None
    return Bounds(int(doc["roofline_cycles"]), int(doc["ideal_cycles"]),
                  int(doc.get("dram_roofline_cycles", 0)), int(doc.get("exchange_cycles", 0)))


def _op_plan(o: dict[str, Any]) -> OpPlan:
    axes = [str(a) for a in o["axis_order"]]
    c = o["cycles"]
    return OpPlan(
        op=str(o["name"]), F=tuple(int(o["F_op"][a]) for a in axes),
        T=tuple(int(o["T"][a]) for a in axes),
        rot=tuple(tuple(str(a) for a in r) for r in o["rot"]),
        drivers=tuple(tuple(str(d) for d in o["drivers"][a]) for a in axes),
        chain=tuple(int(k) for k in o["chain"]),
        cycles=Cycles(int(c["compute"]), int(c["shift"]), int(c["sync"]), int(c["reduce"])),
        hot_bytes_per_core=int(o["hot_bytes_per_core"]),
        cold_bytes_per_core=int(o["cold_bytes_per_core"]),
        out_bytes_per_core=int(o["out_bytes_per_core"]),
        home=o["weights"] == "warmed-up", embed=Embedding.from_list(o["embedding"]),
        cores=_unruns(o.get("core_map")), aligned=int(o.get("aligned_input", -1)),
        dram_bytes_per_core=int(o.get("dram_bytes_per_core", 0)),
        dram_cycles=int(o.get("dram_cycles", 0)), dram_weights=o["weights"] == "dram")


def _unruns(runs: list[list[int]] | None) -> tuple[int, ...] | None:
    """`_runs` undone: the physical core of every logical core (a ``t10c-plan/1`` file's
    runs are all ``[first, count]``)."""
    if runs is None:
        return None
    return tuple(int(r[0]) + k * (int(r[2]) if len(r) > 2 else 1)
                 for r in runs for k in range(int(r[1])))


def run_document(c: Compiled, r: RunResult, seed: int) -> dict[str, Any]:
    """``run.json`` of a functional run: the timing (`timeline_fields`) and the check."""
    return {
        "format": RUN_FORMAT, "model": c.name, "chip": c.chip.name, "dtype": c.plan.dtype,
        "timing_only": False, "seed": seed, **timeline_fields(c.plan, r.timeline),
        "max_rel_err": r.max_rel_err, "tolerance": r.tolerance, "ok": r.ok,
        "emulate_wall_s": r.emulate_wall_s, "reference_wall_s": r.reference_wall_s,
        "emulate_prepare_s": r.emulate_prepare_s, "reference_session_s": r.reference_session_s,
    }


def timing_run_document(c: Compiled) -> dict[str, Any]:
    """``run.json`` of a timing-only compile: the same timing fields as a functional run's,
    without the check against onnxruntime (no data ran)."""
    assert c.timeline is not None, "a timing-only compile keeps its timeline"
    return {"format": RUN_FORMAT, "model": c.name, "chip": c.chip.name, "dtype": c.plan.dtype,
            "timing_only": True, **timeline_fields(c.plan, c.timeline)}


def timeline_fields(plan: Plan, tl: Any) -> dict[str, Any]:
    """What a run's timeline says, as ``run.json`` stores it: cycles and latency, the
    prediction, the split by phase, barriers, the bounds, and per op cycles by phase."""
    phases: dict[str, int] = {}
    barriers: dict[str, int] = {}
    for rec in tl.records:
        phases[rec.phase] = phases.get(rec.phase, 0) + rec.cycles
        if rec.phase == "sync":
            barriers[rec.op] = barriers.get(rec.op, 0) + 1
    bounds = plan.bounds
    return {
        "cycles": tl.cycles, "latency_s": tl.latency_s, "predicted_cycles": plan.total_cycles,
        "phases": dict(sorted(phases.items())), "barriers": sum(barriers.values()),
        "bounds": None if bounds is None else {
            **bounds.as_dict(), "of_roofline": round(bounds.fractions(tl.cycles)[0], 6),
            "of_ideal": round(bounds.fractions(tl.cycles)[1], 6),
            **({"of_exchange": round(bounds.of_exchange(tl.cycles), 6)}
               if bounds.exchange_cycles else {})},
        "peak_sram_bytes_per_core": tl.peak_sram_bytes_per_core, "host_bytes": tl.host_bytes,
        "ops": tl.by_op(), "barriers_by_op": barriers,
    }


COMPILE_FORMAT = "t10c-compile/1"


def compile_document(c: Compiled, source: str, seq_len: int | None, batch: int | None,
                     pinned: dict[str, tuple[int, ...]], model_file: str | None,
                     write_s: float | None = None) -> dict[str, Any]:
    """What `t10c run DIR` needs to run the saved program again: where the model comes from,
    the chip (every field), and the options; plus the stage wall times of this compile (and
    ``write_s``, that of writing the directory's other files)."""
    import dataclasses

    timings = dict(c.timings) if write_s is None else dict(c.timings, write_s=write_s)
    return {
        "format": COMPILE_FORMAT, "model": c.name, "source": source,
        "model_file": model_file, "seq_len": seq_len, "batch": batch,
        "pinned": {k: list(v) for k, v in pinned.items()},
        "chip": {k: (list(v) if isinstance(v, tuple) else v)
                 for k, v in dataclasses.asdict(c.chip).items()},
        "dtype": c.plan.dtype, "quantize": c.options.quantize,
        "timings_s": {k: round(v, 4) for k, v in sorted(timings.items())},
        "solver_wall_s": c.plan.solver.wall_s,
        # `--plan FILE`: "replayed", or the constraints obeyed, in the file's own format
        "given_plan": ("replayed" if c.options.replay is not None else
                       constraints_document(c.options.constraints) if c.options.constraints
                       else None),
    }


def constraints_document(constraints: tuple[Constraint, ...]) -> dict[str, Any]:
    """The constraints as a constraints file holds them (`constraints_from` reads it back)."""
    ops = []
    for c in constraints:
        entry: dict[str, Any] = {"name": c.pattern}
        if c.F:
            entry["F_op"] = dict(c.F)
        if c.f_t:
            f_t: dict[str, dict[str, int]] = {}
            for operand, axis, v in c.f_t:
                f_t.setdefault(operand, {})[axis] = v
            entry["f_t"] = f_t
        if c.weights:
            entry["weights"] = c.weights
        ops.append(entry)
    return {"op": ops}


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as sorted, indented JSON, atomically (`t10c.outputs`), a list of
    numbers (or of short lists of them) on one line (`dumps`)."""
    write_text(path, dumps(doc) + "\n")


def dumps(value: Any, level: int = 0) -> str:
    """``json.dumps(value, indent=1, sort_keys=True)``, the same document, but a list whose
    items are scalars, or lists of scalars, on one line, by the C encoder: an aligned plan's
    core map on the wafer is hundreds of thousands of runs, and the indenting encoder
    (pure Python) wrote LLaMA-3-8B's 64-token prefill's 494 MB plan.json in 67 s."""
    if isinstance(value, dict) and value:
        pad = "\n" + " " * (level + 1)
        items = [f"{_key(k)}: {dumps(value[k], level + 1)}" for k in sorted(value)]
        return "{" + pad + ("," + pad).join(items) + "\n" + " " * level + "}"
    if isinstance(value, (list, tuple)) and value and not all(map(_flat, value)):
        pad = "\n" + " " * (level + 1)
        items = [dumps(v, level + 1) for v in value]
        return "[" + pad + ("," + pad).join(items) + "\n" + " " * level + "]"
    return json.dumps(value, sort_keys=True)


def _flat(value: Any) -> bool:
    """A scalar, or a list of scalars: written on one line (`dumps`)."""
    if isinstance(value, (list, tuple)):
        return not any(isinstance(v, (dict, list, tuple)) for v in value)
    return not isinstance(value, dict)


def _key(key: Any) -> str:
    """A dict key as JSON writes it: a string, or a number's (or ``true``'s...) text."""
    return json.dumps(key if isinstance(key, str) else json.dumps(key))



def load_plan_arg(path: str | Path) -> Replay | tuple[Constraint, ...]:
    """What ``--plan FILE`` gives: a whole plan.json to replay (a `Replay`), or the constraints
    of a small TOML or JSON file (README, "Giving plans back"). Raises `PlanFileError` (one
    line naming the file and the field) for a file that cannot be read as either."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanFileError(f"cannot read --plan {path}: {exc}") from exc
    doc: Any
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if path.suffix == ".json":
            raise PlanFileError(f"{path} is not valid JSON: {exc}") from exc
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc2:
            raise PlanFileError(f"{path} is neither JSON nor TOML: {exc2}") from exc2
    if isinstance(doc, dict) and doc.get("format") in PLAN_FORMATS:
        plan = load_plan(path)
        try:
            axes = tuple(tuple((str(a), int(o["axes"][a])) for a in o["axis_order"])
                         for o in doc["ops"])
            return Replay(plan, axes, int(doc["cores"]), int(doc["sram_bytes_per_core"]),
                          doc.get("quantize"))
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanFileError(f"{path}: a malformed or missing field ({exc!r})") from exc
    return constraints_from(doc, str(path))


def constraints_from(doc: Any, where: str) -> tuple[Constraint, ...]:
    """The constraints of a parsed constraints file: ``{"op": [{"name": ..., "F_op": {axis:
    factor}, "f_t": {operand: {axis: f_t}}, "weights": "resident" | "warmed-up"}, ...]}``."""
    if not isinstance(doc, dict) or set(doc) - {"op"} or not isinstance(doc.get("op"), list) \
            or not doc["op"]:
        raise PlanFileError(f"{where}: expected a plan.json ({PLAN_FORMAT}) or a constraints "
                            "file whose only key is `op`, a list of tables ([[op]] in TOML)")
    return tuple(_constraint(entry, f"{where}: op entry {n + 1}")
                 for n, entry in enumerate(doc["op"]))


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanFileError(f"{what} must be a whole number, not {value!r}")
    return value


def _constraint(entry: Any, where: str) -> Constraint:
    if not isinstance(entry, dict):
        raise PlanFileError(f"{where} must be a table, not {entry!r}")
    unknown = set(entry) - {"name", "F_op", "f_t", "weights"}
    if unknown:
        raise PlanFileError(f"{where}: unknown key {sorted(unknown)[0]!r} (keys: name, F_op, "
                            "f_t, weights)")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise PlanFileError(f"{where}: `name` (an op name or a glob) is missing")
    where = f"{where} ({name})"
    F = entry.get("F_op", {})
    if not isinstance(F, dict):
        raise PlanFileError(f"{where}: F_op must be a table of axis = factor")
    factors = tuple((str(a), _count(f, f"{where}: F_op.{a}")) for a, f in F.items())
    f_t = entry.get("f_t", {})
    if not isinstance(f_t, dict) or not all(isinstance(v, dict) for v in f_t.values()):
        raise PlanFileError(f"{where}: f_t must be a table of operand = {{axis = f_t}} "
                            "(operands: in0, in1, ..., out)")
    paces = tuple((str(o), str(a), _count(v, f"{where}: f_t.{o}.{a}"))
                  for o, axes in f_t.items() for a, v in axes.items())
    weights = entry.get("weights")
    if weights is not None and weights not in WEIGHTS:
        raise PlanFileError(f"{where}: weights must be \"resident\" or \"warmed-up\", not "
                            f"{weights!r}")
    if not (factors or paces or weights):
        raise PlanFileError(f"{where}: constrains nothing (give F_op, f_t or weights)")
    # sorted: the same constraint whatever order the file lists it in
    return Constraint(name, tuple(sorted(factors)), tuple(sorted(paces)), weights)
