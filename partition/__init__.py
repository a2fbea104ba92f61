"""Partition: `Graph` + `Chip` -> `Plan` (per-op rTensor search, then whole-graph CP-SAT choice).

This stage sees only tensor expressions; it never looks at ONNX op types.
"""

from __future__ import annotations

import time

from t10c.chips import Chip
from t10c.ir import Graph, TensorExpr

from .bounds import Bounds, bounds
from .chosen import DoesNotFitError, Plan, PlanError, SolverReport
from .cost import plan_cost
from .cpsat import Progress
from .diagnose import check_fit, diagnose
from .plan import Cycles, Geometry, OpPlan, geometry
from .search import SearchOptions, SearchResult, enumerate_plans, search_front
from .solve import Edge, SolverOptions, choose_plans
from .space import Space, baseline_options, op_keys, space_of, tensor_sets, union
from .transitions import edge_cost
from .verify import verify_plan

__all__ = ["Bounds", "Plan", "OpPlan", "Cycles", "Geometry", "SearchOptions", "SolverOptions",
           "PlanError", "DoesNotFitError", "SolverReport", "plan_graph", "verify_plan", "geometry",
           "search_op", "search_op_front", "plan_cost"]


def search_op(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
              opts: SearchOptions = SearchOptions()) -> list[OpPlan]:
    """Every plan of one op of ``graph`` that survives pruning (not yet reduced to a front)."""
    ints, consts = tensor_sets(graph)
    shapes = {o.tensor: graph.tensors[o.tensor].shape for o in op.operands}
    return enumerate_plans(op, chip, dtype, shapes, ints, consts, opts)


def search_op_front(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
                    opts: SearchOptions = SearchOptions(), limit: int | None = None
                    ) -> SearchResult:
    """One op's Pareto front (and smallest plan), computed without materialising every plan."""
    ints, consts = tensor_sets(graph)
    shapes = {o.tensor: graph.tensors[o.tensor].shape for o in op.operands}
    return search_front(op, chip, dtype, shapes, ints, consts, opts, limit)


def plan_graph(graph: Graph, chip: Chip, dtype: str = "fp16",
               search: SearchOptions = SearchOptions(), solver: SolverOptions = SolverOptions(),
               front_limit: int = 16, progress: Progress | None = None) -> Plan:
    """Search every op's plans (once per distinct op), then choose one per op with CP-SAT.

    A strategy that rotates (t10) chooses from its own plans united with the no-rotation and
    vgm baselines' (`space.py` says why its plan is then never slower than theirs): each
    baseline's own choice is solved first and given to the solve as a start."""
    start = time.perf_counter()
    ints, _ = tensor_sets(graph)
    keys = op_keys(graph)
    baselines = baseline_options(search)
    # a rotating strategy: its own plans and the no-rotation plans with every twin, then each
    # baseline's space as that baseline's compile builds it (so that its choice can be
    # reproduced and mapped in); a baseline: its own space
    wide = [search, *baselines[:1]] if baselines else []
    searched, searches = [0], (len(wide) + len(baselines)) or 1

    def tick() -> None:
        searched[0] += 1
        if progress:
            progress("search", searched[0], searches * len(graph.ops))

    spaces = [space_of(graph, chip, dtype, s, front_limit, tick, every_twin=True) for s in wide]
    spaces += [space_of(graph, chip, dtype, s, front_limit, tick)
               for s in (baselines or (search,))]
    if wide:
        space, maps = union(spaces)
        spaces, maps = spaces[len(wide):], maps[len(wide):]  # the baselines' own
    else:
        space, spaces, maps = spaces[0], [], []
    search_wall = time.perf_counter() - start
    fronts = [list(f) for f in space.fronts]
    check_fit(graph, chip, fronts, list(space.smallest))
    plan_bounds = bounds(graph, chip, dtype, fronts)
    if sum(space.least_cold) > chip.sram_bytes_per_core * (1 - solver.reserve_fraction):
        # the weights alone cannot be resident: no need to ask the solver
        raise DoesNotFitError(diagnose(graph, chip, fronts, list(space.least_cold), "RESIDENT",
                                       solver, dtype))
    edges = _edges(graph, keys, fronts, chip, dtype, ints)
    solves = len(spaces) + 1  # the baselines' solves, then the solve itself, share a display
    starts = []
    for n, (own, where) in enumerate(zip(spaces, maps)):
        choice = _baseline_choice(graph, chip, own, where, edges, solver,
                                  _share(progress, n, solves))
        if choice is not None:
            starts.append(tuple(where[i][k] for i, k in enumerate(choice)))
    no_extra = [[0] * len(f) for f in fronts]
    result, status = choose_plans(graph, fronts, no_extra, edges, chip.sram_bytes_per_core,
                                  solver, _share(progress, solves - 1, solves), starts)
    if result is None:
        raise DoesNotFitError(diagnose(graph, chip, fronts, list(space.least_cold), status,
                                       solver, dtype))
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


def _share(progress: Progress | None, n: int, solves: int) -> Progress | None:
    """Solve ``n`` of ``solves`` reported as its share of one "solve" display."""
    if progress is None or solves == 1:
        return progress
    shown = progress

    def report(stage: str, done: int, total: int) -> None:
        shown(stage, n * total + done, solves * total)
    return report


def _baseline_choice(graph: Graph, chip: Chip, own: Space, where: list[list[int]],
                     edges: list[Edge], solver: SolverOptions, progress: Progress | None
                     ) -> tuple[int, ...] | None:
    """The choice a baseline's own compile makes (the same fronts, edges, options and seed,
    so the same model and the same answer), or None where it does not fit."""
    fronts = [list(f) for f in own.fronts]
    cap = chip.sram_bytes_per_core * (1 - solver.reserve_fraction)
    if not all(fronts) or sum(own.least_cold) > cap:
        return None
    # its edges are the united edges' sub-matrices: edge costs are priced pair by pair
    sub = [Edge(e.src, e.dst, e.slot,
                tuple(tuple(e.cost[p][q] for q in where[e.dst]) for p in where[e.src]))
           for e in edges]
    result, _ = choose_plans(graph, fronts, [[0] * len(f) for f in fronts], sub,
                             chip.sram_bytes_per_core, solver, progress)
    return None if result is None else result.choice


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
    return edges
