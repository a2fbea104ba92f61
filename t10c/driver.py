"""The driver: the whole pipeline as one readable list of stages, and the reference check.

    frontend.to_graph -> partition.plan_graph -> partition.verify_plan -> codegen.generate
    -> emulator.emulate (with --run), checked against onnxruntime on the same inputs
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from t10c import frontend
from t10c.chips import Chip
from t10c.codegen import Buffer, Program, generate, stream
from t10c.emulator import Machine, Timeline, emulate
from t10c.ir import Graph
from t10c.partition import Plan, SearchOptions, SolverOptions, plan_graph, verify_plan

#: error bounds against onnxruntime per storage dtype (max abs error over max abs reference)
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}


@dataclass(frozen=True)
class CompileOptions:
    dtype: str = "fp16"
    seq_len: int | None = None
    batch: int | None = None
    pinned: dict[str, tuple[int, ...]] = field(default_factory=dict)
    search: SearchOptions = SearchOptions()
    solver: SolverOptions = SolverOptions()
    front_limit: int = 16
    #: draw zoo models' weights; planning and codegen need only their shapes, so a compile
    #: that will not run skips them (and so can take models past ONNX's 2 GB limit)
    weights: bool = True
    #: timing only: no data, for chips too large to emulate functionally; the program is
    #: streamed op by op into a data-less emulator instead of being kept
    timing_only: bool = False


@dataclass(frozen=True)
class Compiled:
    """Everything one compile produced, with the wall time of each stage."""

    name: str
    model: onnx.ModelProto
    graph: Graph
    chip: Chip
    plan: Plan
    program: Program
    timings: dict[str, float]
    options: CompileOptions = CompileOptions()
    #: the timing-only emulation's timeline (its program is not kept: ``program`` holds only
    #: the buffers)
    timeline: Timeline | None = None


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    max_rel_err: float
    timeline: Timeline
    emulate_wall_s: float
    reference_wall_s: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_rel_err <= self.tolerance


def compile_model(source: str | onnx.ModelProto, chip: Chip,
                  options: CompileOptions = CompileOptions(),
                  progress: Callable[[str, int, int], None] | None = None) -> Compiled:
    """Compile a zoo name, ONNX path or ModelProto for ``chip``."""
    start = time.perf_counter()
    model = frontend.load_model(source, seq_len=options.seq_len, batch=options.batch,
                                weights=options.weights)
    name = source if isinstance(source, str) else (model.graph.name or "model")
    graph = frontend.to_graph(model, pinned=options.pinned, name=_short(name))
    t_front = time.perf_counter()
    plan = plan_graph(graph, chip, options.dtype, options.search, options.solver,
                      options.front_limit, progress)
    t_plan = time.perf_counter()
    verify_plan(graph, plan, chip)
    timeline = None
    if options.timing_only:
        program, timeline = time_only(graph, plan, chip)
    else:
        program = generate(graph, plan, chip)
    t_code = time.perf_counter()
    timings = {"frontend_s": t_front - start, "search_s": plan.search_wall_s,
               "solve_s": float(plan.solver["wall_s"]),  # type: ignore[arg-type]
               "plan_s": t_plan - t_front, "codegen_s": t_code - t_plan,
               "total_s": t_code - start}
    return Compiled(_short(name), model, graph, chip, plan, program, timings, options, timeline)


def time_only(graph: Graph, plan: Plan, chip: Chip) -> tuple[Program, Timeline]:
    """Generate the program op by op straight into a data-less emulator: the same instructions
    and routes as a functional run, without values and without keeping the program."""
    buffers: list[Buffer] = []
    header = Program(graph.name, chip.name, plan.dtype, chip.cores, buffers,  # type: ignore
                     graph.ops, (), {}, graph.outputs, 0)
    machine = Machine(header, chip, data=False)
    program = stream(graph, plan, chip, buffers, _TimingSink(machine))
    machine.flush()
    return program, machine.timeline


class _TimingSink:
    """Feeds streamed instructions to a data-less machine; repeated layers replay the records
    of their first occurrence (`codegen.lower` finds them by op key)."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.mark, self.since, self.replay = machine.mark, machine.since, machine.replay
        self.written = machine.mark_written

    def __call__(self, ins: object) -> None:
        self.machine.step(ins, {})  # type: ignore[arg-type]


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1].removesuffix(".onnx")


def make_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs: normal floats; integer indices within the table they index."""
    rng = np.random.default_rng(seed)
    limits: dict[str, int] = {}
    for op in graph.ops:
        if op.body and op.body[0] == "take":
            table, index = op.inputs[op.body[1]], op.inputs[op.body[2]]
            rows = graph.tensors[table.tensor].shape[op.take_dim()]
            root = graph.root(index.tensor)
            limits[root] = min(limits.get(root, rows), rows)
    inputs = {}
    for name in graph.inputs:
        info = graph.tensors[name]
        if info.dtype == "float32":
            inputs[name] = rng.standard_normal(info.shape).astype(np.float32)
        else:
            inputs[name] = rng.integers(0, limits.get(name, 2), info.shape).astype(np.int64)
    return inputs


def reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]
              ) -> tuple[dict[str, np.ndarray], float]:
    """onnxruntime's outputs on ``inputs``, and its wall time (the session run only)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    inputs = dict(inputs)
    elem = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    for inp in session.get_inputs():  # a zero-size input is a constant the frontend folded
        if inp.name not in inputs and 0 in inp.shape:
            inputs[inp.name] = np.zeros(inp.shape,
                                        onnx.helper.tensor_dtype_to_np_dtype(elem[inp.name]))
    start = time.perf_counter()
    values = session.run(names, inputs)
    wall = time.perf_counter() - start
    return dict(zip(names, values)), wall


def max_rel_err(outputs: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    """Max |got - want| over max |want|, across outputs; infinite if anything is not finite."""
    worst = 0.0
    for name, want in ref.items():
        got = outputs[name].astype(np.float64)
        if not (np.isfinite(got).all() and np.isfinite(want).all()):
            return float("inf")
        scale = max(float(np.abs(want).max()), 1e-30)
        worst = max(worst, float(np.abs(got - want).max()) / scale)
    return worst


def run_compiled(c: Compiled, seed: int = 0) -> RunResult:
    """Emulate the program on seeded inputs and check it against onnxruntime."""
    if not frontend.has_weights(c.graph):
        raise ValueError("this compile has shape-only weights (built without weights); "
                         "compile with CompileOptions(weights=True) to run it")
    inputs = make_inputs(c.graph, seed)
    outputs, timeline, wall = emulate(c.program, c.chip, inputs, c.graph.constants)
    ref, ref_wall = reference(c.model, inputs)
    err = max_rel_err(outputs, ref)
    return RunResult(outputs, ref, err, timeline, wall, ref_wall, TOLERANCE[c.plan.dtype])
