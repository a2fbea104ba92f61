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
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf import text_format  # type: ignore[import-untyped]
from ortools.linear_solver import linear_solver_pb2, pywraplp  # type: ignore[import-untyped]
from ortools.sat import cp_model_pb2
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
    return _Running(solve, stop).wait(tick)


class _Running(Generic[T]):
    """``solve()`` running in a helper thread from now on, while this one goes on
    (`_in_thread` waits at once); ``stop()`` ends it early."""

    def __init__(self, solve: Callable[[], T], stop: Callable[[], object]) -> None:
        self._outcome: list[T] = []
        self._failure: list[BaseException] = []
        self._stop = stop
        # the worker signals its end through an Event: Thread.join interrupted by Ctrl-C can
        # report a thread finished while it still runs (CPython 3.11), and the native solver
        # must have returned before the interpreter exits
        self._finished = threading.Event()

        def work() -> None:
            try:
                self._outcome.append(solve())
            except BaseException as exc:  # pragma: no cover - re-raised in the main thread
                self._failure.append(exc)
            finally:
                self._finished.set()

        self._thread = threading.Thread(target=work, name="solver", daemon=True)
        self._thread.start()

    def wait(self, tick: Callable[[], None] | None = None) -> T:
        """The solve's result, calling ``tick`` every ``_POLL_S`` until it is there; on
        Ctrl-C the solve is stopped (`cancel`) and ``KeyboardInterrupt`` re-raised."""
        try:
            while not self._finished.wait(_POLL_S):
                if tick:
                    tick()
        except KeyboardInterrupt:
            self.cancel()
            raise
        self._thread.join()
        if self._failure:
            raise self._failure[0]
        return self._outcome[0]

    def cancel(self) -> None:
        """Stop the solve and wait for it to return (its result is dropped)."""
        self._stop()
        _wait_out(self._finished)


def _wait_out(finished: threading.Event) -> None:
    """Wait for a stopped solve to return (it does within milliseconds), through any further
    Ctrl-C: the interrupt that stopped it is already on its way."""
    while True:
        try:
            if finished.wait(_POLL_S):
                return
        except KeyboardInterrupt:
            continue


def _ends(domain: Sequence[int]) -> tuple[float, float]:
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
    """`Relaxing`'s result, waited for at once."""
    return Relaxing(model).result()


class Relaxing:
    """The LP relaxation of a minimising ``model`` (every variable continuous within its
    domain), solved by GLOP: exact (simplex, no time limit), deterministic, and far cheaper
    than CP-SAT's own search for a bound on a large model; its values round to a start where
    the relaxation is nearly integral. Constraints other than linear ones and exactly-one, and
    those with enforcement literals, are dropped (a weaker relaxation is still a bound); the
    `result` is None when the LP is not solved. The LP is handed to GLOP as one
    `MPModelProto` (row by row through the solver's own calls took a quarter of a wafer
    compile's LP time).

    GLOP solves in a helper thread from construction on (it releases the GIL), so that this
    thread can go on until it asks for the `result`; `cancel` stops it."""

    def __init__(self, model: cp_model.CpModel) -> None:
        goal = model.proto.objective
        self._scale, self._offset = goal.scaling_factor or 1.0, goal.offset
        self._lp = pywraplp.Solver.CreateSolver("GLOP")
        self._running: _Running[int] | None = None
        if not self._lp.LoadModelFromProto(_lp_model(model)):  # (else an error message)
            self._running = _Running(self._lp.Solve, self._lp.InterruptSolve)

    def result(self) -> Relaxation | None:
        """The relaxation solved, waited for (Ctrl-C stops it); None if not solved."""
        if self._running is None or self._running.wait() != pywraplp.Solver.OPTIMAL:
            return None
        lp = self._lp
        value = self._scale * (lp.Objective().Value() + self._offset)
        solution = linear_solver_pb2.MPSolutionResponse()
        lp.FillSolutionResponseProto(solution)
        # the optimum of integer costs is an integer at least the LP's true value
        return Relaxation(math.ceil(value - _LP_MARGIN * abs(value)),
                          tuple(solution.variable_value))

    def cancel(self) -> None:
        """Stop the solve, if it runs, and wait for it to return."""
        if self._running is not None:
            self._running.cancel()


def _model_message(model: cp_model.CpModel) -> Any:
    """``model``'s proto as a protobuf message. ortools hands its proto out as a wrapper whose
    fields cross into C++ one element at a time: reading a wafer model's 125,000 variables'
    domains so took half a second, where writing the model out whole and parsing it back
    takes 20 to 40 ms, and reading the domains from the message 35 ms. Where no temporary
    file can be written, through its text."""
    message = cp_model_pb2.CpModelProto()
    try:
        with tempfile.TemporaryDirectory(prefix="t10c-lp-") as tmp:
            path = os.path.join(tmp, "model.pb")
            if model.export_to_file(path):
                with open(path, "rb") as fh:
                    message.ParseFromString(fh.read())
                return message
    except OSError:
        pass
    return text_format.Parse(str(model.proto), message)


def _lp_model(model: cp_model.CpModel) -> Any:
    """``model`` relaxed (`Relaxing`) as an `MPModelProto`."""
    proto = _model_message(model)
    lp_model = linear_solver_pb2.MPModelProto()
    columns = lp_model.variable
    for v in proto.variables:
        column = columns.add()
        column.lower_bound, column.upper_bound = _ends(v.domain)
    rows = lp_model.constraint
    for ct in proto.constraints:
        if ct.enforcement_literal:
            continue
        kind = ct.WhichOneof("constraint")
        if kind == "exactly_one":
            refs = list(ct.exactly_one.literals)
            coeffs, (low, high) = [1] * len(refs), (1.0, 1.0)
        elif kind == "linear":
            refs, coeffs = list(ct.linear.vars), list(ct.linear.coeffs)
            low, high = _ends(ct.linear.domain)
        else:
            continue
        if refs and min(refs) < 0:  # a negative reference is a literal's negation: 1 - x
            low -= sum(c for r, c in zip(refs, coeffs) if r < 0)
            high -= sum(c for r, c in zip(refs, coeffs) if r < 0)
            coeffs = [-c if r < 0 else c for r, c in zip(refs, coeffs)]
            refs = [-r - 1 if r < 0 else r for r in refs]
        if len(set(refs)) < len(refs):  # a variable twice: one term (GLOP refuses a repeat)
            merged: dict[int, int] = {}
            for r, c in zip(refs, coeffs):
                merged[r] = merged.get(r, 0) + c
            refs, coeffs = list(merged), list(merged.values())
        row = rows.add()
        row.var_index.extend(refs)
        row.coefficient.extend(coeffs)
        row.lower_bound, row.upper_bound = low, high
    goal = proto.objective
    for ref, coeff in zip(goal.vars, goal.coeffs):  # (the API states no negated refs here)
        columns[ref].objective_coefficient = float(coeff)
    return lp_model
