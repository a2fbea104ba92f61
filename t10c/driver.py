"""The driver: the whole pipeline as one readable list of stages, and the reference check.

    frontend.to_graph -> partition.plan_graph -> partition.verify_plan -> codegen.generate
    -> emulator.emulate (with --run), checked against onnxruntime on the same inputs
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from t10c import forked, frontend, heap, models
from t10c.chips import Chip
from t10c.codegen import (
    Buffer,
    CodegenError,
    Program,
    StreamedOverflow,
    generate,
    stream,
    streamed_layout,
)
from t10c.codegen.epilogue import program_exprs
from t10c.codegen.memory import Layout
from t10c.codegen.verify import verify_program
from t10c.emulator import EmulatorError, Prepared, Timeline, TimingMachine, emulate
from t10c.fusion import BEST_OF, FUSIONS
from t10c.graphcheck import verify_graph
from t10c.ir import Graph
from t10c.partition import (
    Constraint,
    Plan,
    PlanError,
    Replay,
    SearchOptions,
    SolverOptions,
    check_constraints,
    gather_by_dma,
    grow_in_place,
    plan_graph,
    replay_plan,
    verify_plan,
    with_dram_issue,
    with_preload_margin,
)
from t10c.rundir import draw_inputs, input_specs

#: ``progress(stage, done, total)``: how far a stage ("frontend", "search", "solve",
#: "codegen", "emulate", "write") has come; a stage starts at its first call
Progress = Callable[[str, int, int], None]

#: error bounds against onnxruntime per storage dtype (max abs error over max abs reference)
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}


@dataclass(frozen=True)
class CompileOptions:
    dtype: str = "fp16"
    #: ``--quantize``: store the model's matmul weights as this type (``"int8"``,
    #: `t10c.models.quantize`); None keeps them in ``dtype``
    quantize: str | None = None
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
    #: a fusion mode (`t10c.fusion.FUSIONS`), or "best": whichever of `t10c.fusion.BEST_OF`
    #: the planner predicts faster
    fuse: str = "all"
    #: run the verifiers between stages: the graph's (`t10c.graphcheck`) after the frontend and
    #: the program's (`codegen.verify_program`, against the chip) after codegen; the plan's
    #: runs before every codegen regardless
    check: bool = False
    #: ``--plan FILE``: a whole plan to replay instead of searching and solving (checked
    #: against the model and chip first), or constraints on named ops for the planner
    replay: Replay | None = None
    constraints: tuple[Constraint, ...] = ()


@dataclass(frozen=True)
class Compiled:
    """Everything one compile produced, with the wall time of each stage."""

    name: str
    #: the model compiled; a zoo model with weights holds them shape-only (see ``weights``)
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
    #: the values of ``model``'s shape-only initializers, by name: a zoo model with weights is
    #: built apart (`t10c.models.build_apart`), its weights held once, as the graph's
    #: constants; `full_model` puts them back
    weights: Mapping[str, np.ndarray] = field(default_factory=dict)

    def full_model(self) -> onnx.ModelProto:
        """The model with all its weights (``model`` itself unless it was built apart)."""
        return models.with_weights(self.model, self.weights) if self.weights else self.model


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    max_rel_err: float
    timeline: Timeline
    emulate_wall_s: float
    reference_wall_s: float
    tolerance: float
    #: the run timed the program without data (`Compiled.timeline`): nothing was checked
    timing_only: bool = False
    #: the seconds before the clocks: the emulator's working out of the program's tables
    #: (`prepare_run`), onnxruntime's making of its session
    emulate_prepare_s: float = 0.0
    reference_session_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Nothing failed: the outputs match onnxruntime's, or (timing only) none were made."""
        return self.timing_only or self.max_rel_err <= self.tolerance

    @staticmethod
    def timed(c: Compiled) -> RunResult:
        """The result of a timing-only compile: its timeline, no outputs, no check."""
        assert c.timeline is not None, "only a timing-only compile carries a timeline"
        return RunResult({}, {}, float("nan"), c.timeline, float(c.timings["codegen_s"]), 0.0,
                         TOLERANCE[c.plan.dtype], timing_only=True)


def load_source(source: str | Path | onnx.ModelProto, *, seq_len: int | None = None,
                batch: int | None = None, weights: bool = True,
                apart: dict[str, np.ndarray] | None = None,
                quantize: str | None = None) -> onnx.ModelProto:
    """The model a user named: a zoo name is built (``weights=False``: shape-only, see
    `t10c.frontend.SHAPE_ONLY_LOCATION`; given ``apart``, its large weights go there, the
    model holding them shape-only: `t10c.models.build_apart`), anything else is loaded by the
    frontend as ONNX. ``quantize`` (``"int8"``): its matmul weights are then stored so
    (`t10c.models.quantize.quantize_weights`; a model it cannot quantize raises
    `frontend.FrontendError`).

    Raises `t10c.models.UnknownModelError` (with "did you mean") for a name that is neither a
    file nor a zoo model and does not look like a path, `frontend.ModelNotFoundError` for a
    missing path, `frontend.FrontendError` for a model that cannot be read.
    """
    model = _loaded(source, seq_len, batch, weights, apart)
    if quantize is None:
        return model
    from t10c.models.quantize import QuantizeError, quantize_weights

    try:
        return quantize_weights(model, quantize, apart)
    except QuantizeError as exc:
        raise frontend.FrontendError(str(exc)) from None


def _loaded(source: str | Path | onnx.ModelProto, seq_len: int | None, batch: int | None,
            weights: bool, apart: dict[str, np.ndarray] | None) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return frontend.load_model(source)
    name = str(source)
    if models.is_zoo_name(name):
        kwargs: dict = {"batch": batch, "weights": weights}
        if seq_len is not None:
            kwargs["seq_len"] = seq_len
        if apart is not None and weights:
            model, values = models.build_apart(name, **kwargs)
            apart.update(values)
            return model
        return models.build(name, **kwargs)
    path = Path(name)
    if not path.exists() and not path.is_symlink() and len(path.parts) == 1 and (
            path.suffix == "" or models.suggest(name)):
        raise models.UnknownModelError(name)  # a bare word: a misspelt zoo name, not a path
    return frontend.load_model(path)


def chip_graph(model: onnx.ModelProto, chip: Chip, pinned: dict[str, tuple[int, ...]],
               name: str | None = None, fuse: str = "all",
               weights: dict[str, np.ndarray] | None = None, dtype: str = "fp16") -> Graph:
    """The device graph ``model`` is planned as on ``chip`` (`frontend.to_graph` with the
    fusion ``fuse`` names). A decode step's key/value cache is read where it lives: on a mesh
    (where re-laying the whole cache out costs its distance) and on a chip with DRAM (where
    the cache lives off chip and every read of it is a load), attention reads the cache input
    itself (`rewrite.split_cache_concat`), and the new cache is the old one grown in place by
    the step's new entries, which are all the program writes back (`partition.grow_in_place`:
    to DRAM, or to the host, which holds the old cache as the step's input). On a chip with
    DRAM an embedding's rows are read from the table there by DMA (`partition.gather_by_dma`),
    and a matmul whose weights (in ``dtype``, or int8) would take more than half the chip's
    SRAM is split over blocks of their columns (`rewrite.split_large_matmuls`)."""
    split = (chip.cores * chip.sram_bytes_per_core // 2, dtype) if chip.has_dram else None
    mode = FUSIONS[fuse]
    graph = frontend.to_graph(model, pinned=pinned, name=name, fuse=mode.inline,
                              epilogues=mode.epilogues, prologues=mode.prologues,
                              siblings=mode.siblings, weights=weights or {},
                              split_cache=chip.is_mesh or chip.has_dram, split_weights=split)
    if chip.has_dram:
        graph = gather_by_dma(graph)
    return grow_in_place(graph) if chip.is_mesh or chip.has_dram else graph


def compile_model(source: str | onnx.ModelProto, chip: Chip,
                  options: CompileOptions = CompileOptions(),
                  progress: Progress | None = None) -> Compiled:
    """Compile a zoo name, ONNX path or ModelProto for ``chip``, telling ``progress`` how far
    each stage has come."""
    heap.tune_for(chip)  # a wafer's planner arrays reuse the heap (`t10c.heap`)
    if options.fuse == "best":
        return _best_fusion(source, chip, options, progress)
    start = time.perf_counter()
    if progress:
        progress("frontend", 0, 1)
    # a zoo model's weights once, as the graph's constants, not also as the ModelProto's
    # bytes (bert-large: 1.3 GB less)
    weights: dict[str, np.ndarray] = {}
    model = load_source(source, seq_len=options.seq_len, batch=options.batch,
                        weights=options.weights, apart=weights, quantize=options.quantize)
    name = source if isinstance(source, str) else (model.graph.name or "model")
    graph = chip_graph(model, chip, options.pinned, _short(name), options.fuse, weights,
                       options.dtype)
    if options.check:
        verify_graph(graph)
    if options.constraints:  # what is wrong with them is said before any search
        check_constraints(graph, chip, options.constraints, options.search)
    if progress:
        progress("frontend", 1, 1)
    t_front = time.perf_counter()
    if options.replay is not None:
        plan = replay_plan(graph, options.replay, chip, options.dtype, options.quantize)
    else:
        with _sigint_kept():
            plan = plan_graph(graph, chip, options.dtype, options.search, options.solver,
                              options.front_limit, progress and _solve_follows_search(progress),
                              options.constraints)
    t_plan = time.perf_counter()
    if progress:  # the verification is codegen's first step (seconds on bert-large)
        progress("codegen", 0, 1)
    try:
        verify_plan(graph, plan, chip)
    except PlanError as exc:
        if options.replay is None:
            raise
        # a replayed plan that does not hold (a hand-edited file, a chip file of the same
        # name): the user's mistake, said in one line
        problems = str(exc).splitlines()[1:] or [str(exc)]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PlanError(f"the plan given with --plan does not hold on {chip.name}: "
                        f"{problems[0].strip()}{more}") from exc
    timeline = None
    if options.timing_only:
        plan, program, timeline = time_only(graph, plan, chip, progress, options.solver)
    else:
        program = generate(graph, plan, chip, progress)
        if options.check:
            verify_program(program, chip)
    t_code = time.perf_counter()
    # the planner's work besides its search and its last solve (edge pricing, the baselines'
    # solves, realignment, shared copies): its own clock, so that the clocks add up
    passes = t_plan - t_front - (0.0 if options.replay else plan.search_wall_s
                                 + plan.solver.wall_s)
    timings = {"frontend_s": t_front - start, "search_s": plan.search_wall_s,
               "solve_s": plan.solver.wall_s, "passes_s": max(passes, 0.0),
               "plan_s": t_plan - t_front, "codegen_s": t_code - t_plan,
               "total_s": t_code - start}
    return Compiled(_short(name), model, graph, chip, plan, program, timings, options, timeline,
                    weights)


def _best_fusion(source: str | onnx.ModelProto, chip: Chip, options: CompileOptions,
                 progress: Progress | None) -> Compiled:
    """``--fuse best``: compile under ``all``, ``epilogues`` (sibling matmuls apart) and
    ``prologues`` and keep the compile whose plan the planner predicts faster (the first of
    equals, in that order). Whether prologues, or one matmul for q, k and v, pay depends on
    the whole-graph plan (`frontend/fuse.py`; on wse2 the fused q, k and v made bert-large
    slower and LLaMA-3-8B's decode step faster), so only the whole-graph solve can tell."""
    import dataclasses

    tried = [compile_model(source, chip, dataclasses.replace(options, fuse=fuse), progress)
             for fuse in BEST_OF]
    best = min(tried, key=lambda c: c.plan.total_cycles)  # min keeps the first on a tie
    timings = dict(best.timings, total_s=sum(c.timings["total_s"] for c in tried))
    return dataclasses.replace(best, timings=timings)


@contextlib.contextmanager
def _sigint_kept() -> Iterator[None]:
    """Put Ctrl-C's handler back as it was: OR-Tools' solver installs its own and leaves
    SIGINT at the default action when it is done, after which Ctrl-C would kill the process
    without a word (instead of raising KeyboardInterrupt in every later stage)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


def _solve_follows_search(progress: Progress) -> Progress:
    """``progress``, also told that the solve starts as soon as the search ends (the planner
    may report the solve only once it is over; the clock must start with the solve)."""
    def report(stage: str, done: int, total: int) -> None:
        progress(stage, done, total)
        if stage == "search" and done >= total:
            progress("solve", 0, 1)
    return report


def time_only(graph: Graph, plan: Plan, chip: Chip, progress: Progress | None = None,
              solver: SolverOptions = SolverOptions()) -> tuple[Plan, Program, Timeline]:
    """Generate the program op by op straight into a data-less emulator: the same instructions
    and routes as a functional run, without values and without keeping the program.

    Buffers take the online first-fit's addresses. A DRAM preload that cannot be placed at
    its issue point is issued at a later op (codegen's ``issued``; the plan returned says
    where, its stalls timed again, `with_dram_issue`). If a buffer still lands past the SRAM,
    the plan's DRAM preloads are scheduled again with a wider margin (`with_preload_margin`,
    up to `PRELOAD_MARGINS` times the solve's reserve), and failing that the program is laid
    out offline (`codegen.streamed_layout`: one more pass of codegen, and no replay of
    repeated layers).

    Where the kept whole-graph choice runs slower than predicted (its preloads issued later
    than planned), the other candidates (`Plan.alternatives`, best judged first) that could
    still beat it are run too, and the fastest as run is kept: on LLaMA-2-70B's decode step
    on elk-pod4 the kept choice issued 311 ops' preloads late and ran 14.13 M cycles against
    its 12.40 M predicted."""
    run = _time_one(graph, plan, chip, progress, solver)
    if run[2].cycles <= plan.total_cycles:
        return run
    judged = run[2].cycles
    for other in plan.alternatives:
        if other.total_cycles >= run[2].cycles:
            continue  # run as planned at best, it would not be faster
        tried = _time_one(graph, other, chip, progress, solver)
        if tried[2].cycles < run[2].cycles:
            run = tried
    if run[0].solver.choices == plan.solver.choices:
        return run
    said = (f"{run[1].sram_layout}; kept over the judged choice "
            f"({plan.solver.choices[0][0]}), which ran in {judged} cycles")
    return run[0], dataclasses.replace(run[1], sram_layout=said), run[2]


def _time_one(graph: Graph, plan: Plan, chip: Chip, progress: Progress | None,
              solver: SolverOptions) -> tuple[Plan, Program, Timeline]:
    """`time_only` of one plan: online, at wider preload margins, or laid out offline."""
    try:
        return _time_streamed(graph, plan, chip, progress, None)
    except StreamedOverflow:
        pass
    tried = plan
    for margin in range(2, PRELOAD_MARGINS + 1):
        wider = with_preload_margin(graph, tried, chip, solver, margin)
        if wider is None:
            break
        if (wider.dram_issue, wider.dram_store_wait) == (tried.dram_issue,
                                                          tried.dram_store_wait):
            continue  # the same schedule overflows the same way
        tried = wider
        try:
            wider, program, timeline = _time_streamed(graph, wider, chip, progress, None)
        except StreamedOverflow:
            continue
        said = f"{program.sram_layout}; preloads within {margin}x the solve's SRAM reserve"
        return wider, dataclasses.replace(program, sram_layout=said), timeline
    fixed = streamed_layout(graph, plan, chip, progress)
    return _time_streamed(graph, plan, chip, progress, fixed)


def _time_streamed(graph: Graph, plan: Plan, chip: Chip, progress: Progress | None,
                   fixed: Layout | None) -> tuple[Plan, Program, Timeline]:
    """The plan as run (its preloads where codegen issued them), its program's header and
    its timeline."""
    buffers: list[Buffer] = []
    header = Program(graph.name, chip.name, plan.dtype, chip.cores, buffers,  # type: ignore
                     program_exprs(graph), (), {}, graph.outputs, 0)
    machine = TimingMachine(header, chip)
    issued: list[int] = []
    # timed on a thread beside codegen where a compile's work is shared among processes too
    # (a wafer's; `T10C_JOBS=1` keeps it in line)
    piped = forked.jobs_for(chip.cores * len(graph.ops)) > 1
    sink = _PipedSink(machine) if piped else _TimingSink(machine)
    try:
        program = stream(graph, plan, chip, buffers, sink, progress, fixed, issued)
    except BaseException as exc:
        sink.close(exc)
        raise
    sink.close()
    machine.finish()
    later = sum(a != b for a, b in zip(issued, plan.dram_issue))
    if later:
        plan = with_dram_issue(graph, plan, chip, issued)
        program = dataclasses.replace(program, sram_layout=f"{program.sram_layout}; "
                                      f"{later} of its ops' preloads issued later than "
                                      "planned, where it had no gap for them")
    return plan, program, machine.timeline


#: the widest preload margin a streamed run tries, in solve reserves (`time_only`): each one
#: costs a pass of codegen only where the narrower overflowed (LLaMA-2-13B's decode step on
#: elk-pod4, its streamed weights chosen for three margins, fitted at four and failed at three)
PRELOAD_MARGINS = 8


class _TimingSink:
    """Feeds streamed instructions to a data-less machine; repeated layers replay the records
    of their first occurrence (`codegen.lower` finds them by op key)."""

    def __init__(self, machine: TimingMachine) -> None:
        self.machine = machine
        self.mark, self.since, self.replay = machine.mark, machine.since, machine.replay
        self.written = machine.mark_written

    def __call__(self, ins: object) -> None:
        self.machine.step(ins)  # type: ignore[arg-type]

    def close(self, failed: BaseException | None = None) -> None:
        """Nothing to wait for: every instruction was stepped as it came."""


class _PipedSink:
    """`_TimingSink`'s work on a thread of its own: codegen goes on generating the next
    instructions while the machine times those before, in the order they came (a wafer's
    codegen and its timing are each about half of that stage, and one core idled).

    The machine is a pure function of the stream, so the timeline is the same as
    `_TimingSink`'s. Codegen never reads the machine: `mark` gives a box that the machine
    fills when it gets there, which codegen hands back to `since` as it would the mark;
    `since` fills ``cached`` later, and `replay`, which reads it, comes after. Instructions
    and their arrays are not written once emitted. At most `PIPED` wait, so that the queue
    holds a few instructions' tables, not a wafer's program.

    A failure of the machine stops it (what follows is not timed) and is raised by `close`
    as codegen's (`CodegenError`: the machine refused the program it made), or by the next
    call, before codegen goes further. Where codegen fails, `close` lets the machine finish
    what came before and raises the machine's failure if it had one: the one that comes
    first in the stream, as it would with `_TimingSink`."""

    def __init__(self, machine: TimingMachine) -> None:
        self.machine = machine
        self.queue: queue.Queue[tuple[Callable[..., object], tuple] | None] = queue.Queue(
            PIPED)
        self.failed: BaseException | None = None
        self.stop = False
        self.thread = threading.Thread(target=self._work, name="t10c-timing", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.failed is not None or self.stop:
                continue
            fn, args = item
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                self.failed = exc

    def _put(self, fn: Callable[..., object], *args: object) -> None:
        if self.failed is not None:
            self.close()  # (raises it)
        self.queue.put((fn, args))

    def __call__(self, ins: object) -> None:
        self._put(self.machine.step, ins)

    def mark(self) -> list:
        box: list = []
        self._put(lambda: box.append(self.machine.mark()))
        return box

    def since(self, box: list, cached: Any) -> Any:
        self._put(lambda: self.machine.since(box[0], cached))
        return cached

    def replay(self, op: str, cached: Any) -> None:
        self._put(self.machine.replay, op, cached)

    def written(self, buf: int, cores: np.ndarray) -> None:
        self._put(self.machine.mark_written, buf, cores)

    def close(self, failed: BaseException | None = None) -> None:
        """Wait until the machine has taken every instruction (at once where ``failed`` is an
        interrupt: the rest is dropped), then raise its failure, if any."""
        if self.thread.is_alive():
            if failed is not None and not isinstance(failed, Exception):
                self.stop = True
            self.queue.put(None)
            self.thread.join()
        if self.failed is not None and not self.stop:
            exc, self.failed = self.failed, None  # (raised once)
            if isinstance(exc, EmulatorError):
                raise CodegenError(str(exc)) from exc
            raise exc


#: instructions that may wait for the timing thread (`_PipedSink`)
PIPED = 64


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1].removesuffix(".onnx")


def make_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs: normal floats; integer indices within the table they index
    (`t10c.rundir`, which ``t10c run DIR`` draws them with too)."""
    return draw_inputs(input_specs(graph), seed)


def reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray],
              path: Path | None = None) -> tuple[dict[str, np.ndarray], float, float]:
    """onnxruntime's outputs on ``inputs``, its wall time (the session's run only), and the
    time it took to make the session before it (reading, optimising and planning the
    model). ``path``: the file ``model`` was read from, which onnxruntime then reads itself
    (a model with its weights is not serialised again: for bert-base that took seconds)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    # the model's own arithmetic: onnxruntime would otherwise fuse a DequantizeLinear and the
    # MatMul reading it into an integer matmul that quantizes the activations too (0.6% off
    # the float result on a 64-deep product)
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    made = time.perf_counter()
    session = ort.InferenceSession(str(path) if path is not None else model.SerializeToString(),
                                   opts, providers=["CPUExecutionProvider"])
    made = time.perf_counter() - made
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
    return dict(zip(names, values)), wall, made


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


def run_compiled(c: Compiled, seed: int = 0, progress: Progress | None = None) -> RunResult:
    """Emulate the program on seeded inputs and check it against onnxruntime; ``progress``
    hears about the "emulate" stage."""
    if not frontend.has_weights(c.graph):
        raise ValueError("this compile has shape-only weights (built without weights); "
                         "compile with CompileOptions(weights=True) to run it")
    inputs = make_inputs(c.graph, seed)
    prepared, prepare_s = prepare_run(c.program, c.chip)
    outputs, timeline, wall = emulate(c.program, c.chip, inputs, c.graph.constants, progress,
                                      prepared)
    ref, ref_wall, session_s = reference(c.full_model(), inputs)
    err = max_rel_err(outputs, ref)
    return RunResult(outputs, ref, err, timeline, wall, ref_wall, TOLERANCE[c.plan.dtype],
                     emulate_prepare_s=prepare_s, reference_session_s=session_s)


def prepare_run(program: Program, chip: Chip) -> tuple[Prepared, float]:
    """What an emulated run of ``program`` works out from the program alone (`Prepared`),
    made before the run as onnxruntime makes its session before its run, and the seconds
    that took (reported beside the run's wall time, as the session's are beside
    onnxruntime's)."""
    from t10c.emulator.kernels import prepare

    prepare()  # (the kernels' sessions: outside both clocks)
    start = time.perf_counter()
    prepared = Prepared.of(program, chip)
    return prepared, time.perf_counter() - start
