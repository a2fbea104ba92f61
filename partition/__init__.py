"""Partition: `Graph` + `Chip` -> `Plan` (per-op rTensor search, then whole-graph CP-SAT choice).

This stage sees only tensor expressions; it never looks at ONNX op types.
"""

from __future__ import annotations

import dataclasses
import time

from t10c.chips import Chip
from t10c.ir import Graph, TensorExpr

from .bounds import Bounds, bounds
from .chosen import DoesNotFitError, Plan, PlanError, SolverReport
from .cost import plan_cost
from .cpsat import Progress
from .diagnose import check_fit, diagnose
from .epilogue import extra_edge_cost
from .plan import Cycles, Geometry, OpPlan, geometry
from .search import SearchOptions, SearchResult, enumerate_plans, search_front
from .solve import Edge, SolverOptions, choose_plans
from .transitions import edge_cost
from .verify import verify_plan

__all__ = ["Bounds", "Plan", "OpPlan", "Cycles", "Geometry", "SearchOptions", "SolverOptions",
           "PlanError", "DoesNotFitError", "SolverReport", "plan_graph", "verify_plan", "geometry",
           "search_op", "search_op_front", "plan_cost"]


def _tensor_sets(graph: Graph) -> tuple[frozenset[str], frozenset[str]]:
    ints = frozenset(n for n, t in graph.tensors.items() if t.dtype != "float32")
    consts = frozenset(n for n in graph.tensors if graph.root(n) in graph.constants)
    return ints, consts


def search_op(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
              opts: SearchOptions = SearchOptions()) -> list[OpPlan]:
    """Every plan of one op of ``graph`` that survives pruning (not yet reduced to a front)."""
    ints, consts = _tensor_sets(graph)
    shapes = {o.tensor: graph.tensors[o.tensor].shape for o in op.operands}
    return enumerate_plans(op, chip, dtype, shapes, ints, consts, opts)


def search_op_front(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
                    opts: SearchOptions = SearchOptions(), limit: int | None = None
                    ) -> SearchResult:
    """One op's Pareto front (and smallest plan), computed without materialising every plan."""
    ints, consts = _tensor_sets(graph)
    shapes = {o.tensor: graph.tensors[o.tensor].shape for o in op.operands}
    return search_front(op, chip, dtype, shapes, ints, consts, opts, limit)


def _rename(plan: OpPlan, name: str) -> OpPlan:
    return dataclasses.replace(plan, op=name)


def plan_graph(graph: Graph, chip: Chip, dtype: str = "fp16",
               search: SearchOptions = SearchOptions(), solver: SolverOptions = SolverOptions(),
               front_limit: int = 16, progress: Progress | None = None) -> Plan:
    """Search every op's plans (once per distinct op), then choose one per op with CP-SAT."""
    start = time.perf_counter()
    ints, consts = _tensor_sets(graph)
    keys = [(op.signature(), tuple(o.tensor in consts for o in op.reads),
             tuple(o.tensor in ints for o in op.reads)) for op in graph.ops]
    cache: dict[tuple, SearchResult] = {}
    fronts: list[list[OpPlan]] = []
    smallest: list[OpPlan | None] = []
    least_cold: list[int] = []
    for n, (op, key) in enumerate(zip(graph.ops, keys)):
        if key not in cache:
            cache[key] = search_op_front(graph, op, chip, dtype, search, front_limit)
        found = cache[key]
        fronts.append([_rename(p, op.name) for p in found.front])
        smallest.append(found.smallest)
        least_cold.append(found.least_cold)
        if progress:
            progress("search", n + 1, len(graph.ops))
    search_wall = time.perf_counter() - start

    if search.weights_home:  # vgm: every op warms its weights up from the idle layout
        fronts = [[dataclasses.replace(p, home=True) for p in f] for f in fronts]
    else:  # t10: an op may keep its weights idle and warm them up, where SRAM is short
        fronts = [f + _warm_up_twins(graph, op, f, chip, dtype, ints, consts)
                  for op, f in zip(graph.ops, fronts)]
        least_cold = [min([c, *(p.cold_bytes_per_core for p in f)])
                      for c, f in zip(least_cold, fronts)]
    check_fit(graph, chip, fronts, smallest)
    plan_bounds = bounds(graph, chip, dtype, fronts)
    if sum(least_cold) > chip.sram_bytes_per_core * (1 - solver.reserve_fraction):
        # the weights alone cannot be resident: no need to ask the solver
        raise DoesNotFitError(diagnose(graph, chip, fronts, least_cold, "RESIDENT", solver,
                                       dtype))
    edges = _edges(graph, keys, fronts, chip, dtype, ints)
    no_extra = [[0] * len(f) for f in fronts]
    result, status = choose_plans(graph, fronts, no_extra, edges, chip.sram_bytes_per_core,
                                  solver, progress)
    if result is None:
        raise DoesNotFitError(diagnose(graph, chip, fronts, least_cold, status, solver, dtype))
    chosen = tuple(front[k] for front, k in zip(fronts, result.choice))
    relayout = [0] * len(graph.ops)
    for e in edges:
        relayout[e.dst] += e.cost[result.choice[e.src]][result.choice[e.dst]]
    gap = result.objective_cycles - result.bound_cycles
    return Plan(
        model=graph.name, chip=chip.name, dtype=dtype, ops=chosen,
        relayout_cycles=tuple(relayout),
        front_sizes=tuple(len(f) for f in fronts),
        solver=SolverReport(
            name=solver.planner, status=result.status,
            objective_cycles=result.objective_cycles, bound_cycles=result.bound_cycles,
            gap=round(gap / max(result.objective_cycles, 1), 6),
            greedy_objective_cycles=result.greedy_objective_cycles,
            wall_s=round(result.wall_s, 3), workers=solver.workers, seed=solver.seed,
            time_limit_s=solver.time_limit_s),
        search_wall_s=search_wall,
        bounds=plan_bounds,
    )


def _warm_up_twins(graph: Graph, op: TensorExpr, front: list[OpPlan], chip: Chip, dtype: str,
                   ints: frozenset[str], consts: frozenset[str]) -> list[OpPlan]:
    """For an op with weights, its fastest plan again with the weights kept in the compact
    idle layout (spread over all cores) and warmed up before each run: fewer resident bytes
    for some shift time. The solver chooses; the greedy walks the front only."""
    if not front or not any(o.tensor in consts for o in op.inputs):
        return []
    p = front[0]
    cycles, hot, cold, out = plan_cost(geometry(graph, op, p), chip, dtype, ints, consts,
                                       weights_home=True)
    if cold >= p.cold_bytes_per_core:
        return []
    return [dataclasses.replace(p, cycles=cycles, hot_bytes_per_core=hot,
                                cold_bytes_per_core=cold, out_bytes_per_core=out, home=True)]


def _edges(graph: Graph, keys: list[tuple], fronts: list[list[OpPlan]], chip: Chip,
           dtype: str, ints: frozenset[str]) -> list[Edge]:
    """Every producer -> consumer edge with its re-layout costs; repeated layers share them."""
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    cache: dict[tuple, tuple[tuple[int, ...], ...]] = {}
    edges = []
    for i, op in enumerate(graph.ops):
        for slot, operand in enumerate(op.inputs):
            j = producer.get(graph.root(operand.tensor))
            if j is None:
                continue
            direct = operand.tensor == graph.ops[j].output.tensor
            key = (keys[j], keys[i], slot, direct, graph.tensors[operand.tensor].shape)
            if key not in cache:
                cache[key] = edge_cost(graph, j, i, slot, fronts[j], fronts[i], chip, dtype,
                                       ints)
            edges.append(Edge(j, i, slot, cache[key]))
        for k, operand in enumerate(op.extra):  # epilogue operands: slots past the output's
            j = producer.get(graph.root(operand.tensor))
            if j is None:
                continue
            slot = len(op.inputs) + 1 + k
            direct = operand.tensor == graph.ops[j].output.tensor
            key = (keys[j], keys[i], slot, direct, graph.tensors[operand.tensor].shape)
            if key not in cache:
                cache[key] = extra_edge_cost(graph, j, i, k, fronts[j], fronts[i], chip, dtype,
                                             ints)
            edges.append(Edge(j, i, slot, cache[key]))
    return edges
