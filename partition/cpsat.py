"""Running a CP-SAT solve so that it is reproducible, interruptible and visible.

Shared by the whole-graph plan choice (`solve.py`) and codegen's SRAM layout repair
(`codegen/memory.py`):

- reproducible: the only limit is CP-SAT's *deterministic* time (a count of work, about a
  second per unit on an idle machine), with one worker and a fixed seed, so a solve cut short
  stops at the same point on an idle or a loaded machine. There is deliberately no wall-clock
  limit: on a busy machine one deterministic second measured up to 14 s of wall time, so any
  wall-clock backstop would decide the result exactly when the machine is loaded. Ctrl-C is
  the user's wall-clock limit.
- interruptible: CP-SAT would otherwise install its own SIGINT handler, swallow the signal
  and return its best solution as if nothing happened. Here it does not (the
  ``catch_sigint_signal`` parameter), the solve runs in a helper thread (the native solver
  releases the GIL), and the main thread, which is where Python delivers ``KeyboardInterrupt``,
  stops the search, waits for the solver to return, and re-raises.
- visible: every improving solution reports ``progress(stage, done, total)`` in thousandths of
  a deterministic second.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ortools.linear_solver import pywraplp  # type: ignore[import-untyped]
from ortools.sat.python import cp_model

Progress = Callable[[str, int, int], None]
T = TypeVar("T")

#: GLOP's answer is exact only to its tolerances: the bound is lowered by this share of it
_LP_MARGIN = 1e-6

#: how often the main thread wakes up to report progress (seconds of wall time). It only
#: paces the display: the solve itself never reads the clock.
_POLL_S = 0.05


class Watch(cp_model.CpSolverSolutionCallback):
    """Records the deterministic time of the latest improving solution (read by the main
    thread for progress, and by a solve in chunks to see whether the search still improves;
    a callback does not change the search)."""

    def __init__(self) -> None:
        super().__init__()
        self.det_time = 0.0
        self.solutions = 0

    def on_solution_callback(self) -> None:
        self.det_time = float(self.deterministic_time)
        self.solutions += 1


def configure(solver: cp_model.CpSolver, deterministic_limit: float, workers: int = 1,
              seed: int = 0) -> None:
    """Set the parameters that make a solve reproducible and leave SIGINT to Python."""
    solver.parameters.max_deterministic_time = deterministic_limit
    solver.parameters.num_workers = workers
    # several workers race by default (whoever finds a solution first shares it): interleaved,
    # they run in deterministic batches, so --workers N gives the same plan every run too
    solver.parameters.interleave_search = workers > 1
    solver.parameters.random_seed = seed
    solver.parameters.catch_sigint_signal = False


def run(solver: cp_model.CpSolver, model: cp_model.CpModel, progress: Progress | None = None,
        stage: str = "solve", watch: Watch | None = None) -> cp_model.CpSolverStatus:
    """Solve ``model`` with ``solver`` (already `configure`d) and return CP-SAT's status;
    ``watch``, if given, records the solutions.

    Raises ``KeyboardInterrupt`` promptly (within ``_POLL_S``) when the user presses Ctrl-C,
    after stopping the search."""
    limit = float(solver.parameters.max_deterministic_time)
    total = max(int(limit * 1000), 1)
    watch = watch if watch is not None else Watch()
    if progress:
        progress(stage, 0, total)
    shown = [0]

    def tick() -> None:
        done = min(int(watch.det_time * 1000), total - 1)
        if progress and done > shown[0]:
            progress(stage, done, total)
            shown[0] = done

    status = _in_thread(lambda: solver.solve(model, watch), solver.stop_search, tick)
    if progress:
        progress(stage, total, total)
    return status


def _in_thread(solve: Callable[[], T], stop: Callable[[], object],
               tick: Callable[[], None] | None = None) -> T:
    """``solve()`` in a helper thread (native solvers release the GIL), the main thread
    calling ``tick`` every ``_POLL_S``; on Ctrl-C, ``stop()`` ends the solve, which is waited
    for, and ``KeyboardInterrupt`` is re-raised."""
    outcome: list[T] = []
    failure: list[BaseException] = []
    # the worker signals its end through an Event: Thread.join interrupted by Ctrl-C can
    # report a thread finished while it still runs (CPython 3.11), and the native solver must
    # have returned before the interpreter exits
    finished = threading.Event()

    def work() -> None:
        try:
            outcome.append(solve())
        except BaseException as exc:  # pragma: no cover - re-raised in the main thread
            failure.append(exc)
        finally:
            finished.set()

    thread = threading.Thread(target=work, name="solver", daemon=True)
    try:
        thread.start()
        while not finished.wait(_POLL_S):
            if tick:
                tick()
    except KeyboardInterrupt:
        stop()
        _wait_out(finished)
        raise
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _wait_out(finished: threading.Event) -> None:
    """Wait for a stopped solve to return (it does within milliseconds), through any further
    Ctrl-C: the interrupt that stopped it is already on its way."""
    while True:
        try:
            if finished.wait(_POLL_S):
                return
        except KeyboardInterrupt:
            continue


def _ends(domain: list[int]) -> tuple[float, float]:
    """A CP-SAT domain's hull, its open ends (written as the int64 extremes) infinite."""
    return tuple(v if abs(v) < 2 ** 62 else math.copysign(math.inf, v)  # type: ignore
                 for v in (domain[0], domain[-1]))


@dataclass(frozen=True)
class Relaxation:
    """A minimising model's LP relaxation, solved (`relax`)."""

    bound: int  # no integer solution's objective is lower
    values: tuple[float, ...]  # the LP's value of every variable, by its index


def lp_bound(model: cp_model.CpModel) -> int | None:
    """A lower bound on the objective of a minimising ``model`` from its LP relaxation
    (`relax`); None when the LP is not solved."""
    relaxed = relax(model)
    return relaxed.bound if relaxed is not None else None


def relax(model: cp_model.CpModel) -> Relaxation | None:
    """The LP relaxation of a minimising ``model`` (every variable continuous within its
    domain), solved by GLOP: exact (simplex, no time limit), deterministic, and far cheaper
    than CP-SAT's own search for a bound on a large model; its values round to a start where
    the relaxation is nearly integral. Constraints other than linear ones and exactly-one, and
    those with enforcement literals, are dropped (a weaker relaxation is still a bound). None
    when the LP is not solved."""
    proto = model.proto
    lp = pywraplp.Solver.CreateSolver("GLOP")
    # (the proto's repeated fields do not index from the end: read them as lists)
    xs = [lp.NumVar(*_ends(list(v.domain)), "") for v in proto.variables]

    def add(refs: list[int], coeffs: list[int], low: float, high: float) -> None:
        # a negative reference is a literal's negation: 1 - x
        row = lp.Constraint(low, high)
        for ref, coeff in zip(refs, coeffs):
            if ref < 0:
                row.SetCoefficient(xs[-ref - 1], -coeff)
                row.SetBounds(row.lb() - coeff, row.ub() - coeff)
            else:
                row.SetCoefficient(xs[ref], coeff)

    for ct in proto.constraints:
        if ct.enforcement_literal:
            continue
        if ct.has_exactly_one():
            add(list(ct.exactly_one.literals), [1] * len(ct.exactly_one.literals), 1, 1)
        elif ct.has_linear():
            add(list(ct.linear.vars), list(ct.linear.coeffs), *_ends(list(ct.linear.domain)))
    goal = proto.objective
    cost = lp.Objective()
    for ref, coeff in zip(goal.vars, goal.coeffs):
        cost.SetCoefficient(xs[ref], float(coeff))  # the python API states no negated refs here
    cost.SetMinimization()
    # (in a helper thread, as CP-SAT's solves: Ctrl-C interrupts it)
    if _in_thread(lp.Solve, lp.InterruptSolve) != pywraplp.Solver.OPTIMAL:
        return None
    scale = goal.scaling_factor or 1.0
    value = scale * (cost.Value() + goal.offset)
    # the optimum of integer costs is an integer at least the LP's true value
    return Relaxation(math.ceil(value - _LP_MARGIN * abs(value)),
                      tuple(x.solution_value() for x in xs))
