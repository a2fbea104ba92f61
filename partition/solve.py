"""Whole-graph plan choice with OR-Tools CP-SAT.

The model (built by `build_model`, solved by `solve_model`, decoded by `decode`):

- variables: ``x[i, p]`` is 1 when op ``i`` runs plan ``p`` of its Pareto front.
- (C1) exactly one plan per op: ``sum_p x[i, p] = 1``.
- (C2) memory while op ``i`` computes, for every core:
  ``sum_j cold_j(x_j) + (hot_i(x_i) - cold_i(x_i)) + sum_{t live across i} out_t(x_prod(t))
  <= SRAM - reserve``: the weights of every op stay resident (no off-chip memory), the running
  op needs its hot buffers, and activations produced earlier and still awaited stay where their
  producer left them.
- (C3) memory while op ``i`` re-lays out its inputs: as (C2), but with the producers' outputs
  of i's inputs still live next to i's input buffers instead of i's hot buffers.
- objective: ``sum_i sum_p x[i, p] * (cycles_ip + relayout_ip)`` where ``relayout_ip`` prices
  bringing each activation input into plan p's layout (`cost.relayout_cycles`).

The solve is deterministic: one worker and a fixed seed unless asked otherwise, and a time limit.
The hint is the fastest plan per op when that fits, which the solver then improves or repairs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from t10c.ir import Graph

from .plan import OpPlan


@dataclass(frozen=True)
class SolverOptions:
    time_limit_s: float = 30.0
    workers: int = 1
    seed: int = 0
    reserve_fraction: float = 0.05  # SRAM kept free for allocator fragmentation


@dataclass(frozen=True)
class SolverResult:
    choice: tuple[int, ...]  # index into each op's front
    status: str
    objective_cycles: int
    bound_cycles: int
    wall_s: float


@dataclass(frozen=True)
class MemoryTerms:
    """Per-op byte terms of (C2)/(C3), precomputed from the graph's liveness."""

    live_across: tuple[tuple[int, ...], ...]  # producers of activations live across op i
    act_inputs: tuple[tuple[int, ...], ...]  # producers of op i's activation inputs


def liveness(graph: Graph) -> MemoryTerms:
    producer = {op.output.tensor: i for i, op in enumerate(graph.ops)}
    last_use: dict[int, int] = {}
    inputs_of: list[tuple[int, ...]] = []
    for i, op in enumerate(graph.ops):
        prods = sorted({producer[graph.root(o.tensor)] for o in op.inputs
                        if graph.root(o.tensor) in producer})
        inputs_of.append(tuple(prods))
        for p in prods:
            last_use[p] = i
    for t in graph.outputs:
        if graph.root(t) in producer:
            last_use[producer[graph.root(t)]] = len(graph.ops)
    live = []
    for i in range(len(graph.ops)):
        live.append(tuple(p for p, last in last_use.items() if p < i and last > i
                          and p not in inputs_of[i]))
    return MemoryTerms(tuple(live), tuple(inputs_of))


def build_model(graph: Graph, fronts: list[list[OpPlan]], relayout: list[list[int]],
                sram_bytes: int, opts: SolverOptions, hint: list[int] | None):
    model = cp_model.CpModel()
    x = [[model.NewBoolVar(f"x[{i},{p}]") for p in range(len(front))]
         for i, front in enumerate(fronts)]
    # (C1) exactly one plan per op
    for xs in x:
        model.AddExactlyOne(xs)
    cap = int(sram_bytes * (1 - opts.reserve_fraction))
    terms = liveness(graph)

    def term(i: int, attr: str):
        return sum(getattr(p, attr) * x[i][k] for k, p in enumerate(fronts[i]))

    resident = sum(term(i, "cold_bytes_per_core") for i in range(len(fronts)))
    for i in range(len(fronts)):
        live = sum(term(j, "out_bytes_per_core") for j in terms.live_across[i])
        hot_extra = sum((p.hot_bytes_per_core - p.cold_bytes_per_core) * x[i][k]
                        for k, p in enumerate(fronts[i]))
        # (C2) weights resident + running op + live activations fit the SRAM
        model.Add(resident + hot_extra + live <= cap)
        # (C3) during re-layout, producers' outputs and i's input buffers coexist
        feeding = sum(term(j, "out_bytes_per_core") for j in terms.act_inputs[i])
        model.Add(resident + live + feeding + hot_extra <= cap)
    objective = sum((p.cycles.total + relayout[i][k]) * x[i][k]
                    for i, front in enumerate(fronts) for k, p in enumerate(front))
    model.Minimize(objective)
    if hint is not None:
        for i, k in enumerate(hint):
            for kk, var in enumerate(x[i]):
                model.AddHint(var, kk == k)
    return model, x


def solve_model(model: cp_model.CpModel, opts: SolverOptions) -> tuple[cp_model.CpSolver, int]:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = opts.time_limit_s
    solver.parameters.num_workers = opts.workers
    solver.parameters.random_seed = opts.seed
    status = solver.Solve(model)
    return solver, status


def decode(solver: cp_model.CpSolver, status: int, x, wall_s: float) -> SolverResult | None:
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    choice = tuple(next(k for k, v in enumerate(xs) if solver.Value(v)) for xs in x)
    return SolverResult(choice, solver.StatusName(status), int(round(solver.ObjectiveValue())),
                        int(round(solver.BestObjectiveBound())), wall_s)


def choose_plans(graph: Graph, fronts: list[list[OpPlan]], relayout: list[list[int]],
                 sram_bytes: int, opts: SolverOptions) -> tuple[SolverResult | None, str]:
    """Solve the whole-graph choice; returns the result (None when infeasible) and the status."""
    hint = [0] * len(fronts)
    start = time.perf_counter()
    model, x = build_model(graph, fronts, relayout, sram_bytes, opts, hint)
    solver, status = solve_model(model, opts)
    result = decode(solver, status, x, time.perf_counter() - start)
    return result, solver.StatusName(status)
