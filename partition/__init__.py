"""Partition: `Graph` + `Chip` -> `Plan` (per-op rTensor search, then whole-graph CP-SAT choice).

This stage sees only tensor expressions; it never looks at ONNX op types.
"""

from __future__ import annotations

import dataclasses
import time

from t10c.chips import Chip
from t10c.ir import Graph, TensorExpr

from .align import aligned_variants
from .bounds import Bounds, bounds
from .chosen import DoesNotFitError, Plan, PlanError, SolverReport
from .constrain import (
    WEIGHTS,
    Constraint,
    ConstraintError,
    Replay,
    apply_constraints,
    check_constraint,
    check_replay,
    constrained_front,
    match_ops,
)
from .cost import plan_cost
from .cpsat import Progress
from .diagnose import check_fit, diagnose
from .dram import (
    Schedule,
    dram_bytes_needed,
    dram_twins,
    extra_cycles,
    schedule,
    with_dram_inputs,
)
from .epilogue import extra_edge_cost
from .plan import Cycles, Geometry, OpPlan, geometry, operand_shapes
from .search import SearchOptions, SearchResult, enumerate_plans, search_front
from .solve import Edge, SolverOptions, _Arrays, choose_plans, liveness, memory_use
from .transitions import Views, edge_cost, relayout_cycles
from .verify import verify_plan

__all__ = ["Bounds", "Plan", "OpPlan", "Cycles", "Geometry", "SearchOptions", "SolverOptions",
           "PlanError", "DoesNotFitError", "SolverReport", "plan_graph", "verify_plan", "geometry",
           "search_op", "search_op_front", "plan_cost", "Constraint", "ConstraintError",
           "WEIGHTS", "Replay", "replay_plan", "check_constraints",
           "search_op_constrained", "match_ops"]


def _tensor_sets(graph: Graph) -> tuple[frozenset[str], frozenset[str]]:
    ints = frozenset(n for n, t in graph.tensors.items() if t.dtype != "float32")
    consts = frozenset(n for n in graph.tensors if graph.root(n) in graph.constants)
    return ints, consts


def search_op(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
              opts: SearchOptions = SearchOptions()) -> list[OpPlan]:
    """Every plan of one op of ``graph`` that survives pruning (not yet reduced to a front)."""
    ints, consts = _tensor_sets(graph)
    shapes = operand_shapes(graph, op)
    return enumerate_plans(op, chip, dtype, shapes, ints, consts, opts)


def search_op_front(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
                    opts: SearchOptions = SearchOptions(), limit: int | None = None
                    ) -> SearchResult:
    """One op's Pareto front (and smallest plan), computed without materialising every plan."""
    ints, consts = _tensor_sets(graph)
    shapes = operand_shapes(graph, op)
    return search_front(op, chip, dtype, shapes, ints, consts, opts, limit)


def _rename(plan: OpPlan, name: str) -> OpPlan:
    return dataclasses.replace(plan, op=name)


def plan_graph(graph: Graph, chip: Chip, dtype: str = "fp16",
               search: SearchOptions = SearchOptions(), solver: SolverOptions = SolverOptions(),
               front_limit: int = 16, progress: Progress | None = None,
               constraints: tuple[Constraint, ...] = ()) -> Plan:
    """Search every op's plans (once per distinct op), then choose one per op with CP-SAT;
    the ops ``constraints`` name choose among the plans that obey them (`constrain.py`)."""
    start = time.perf_counter()
    if chip.has_dram:  # before any search: the model must fit the DRAM
        check_dram_capacity(graph, chip, dtype)
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
    if chip.has_dram:  # graph inputs stream from DRAM; weights may live there
        fronts = [with_dram_inputs(graph, op, f, chip, dtype, ints) for op, f in
                  zip(graph.ops, fronts)]
        fronts = [f + dram_twins(graph, op, f, chip, dtype, ints)
                  for op, f in zip(graph.ops, fronts)]
        least_cold = [min([c, *(p.cold_bytes_per_core for p in f)])
                      for c, f in zip(least_cold, fronts)]
    if constraints:  # `--plan FILE`: the named ops' fronts become the plans obeying it
        apply_constraints(graph, chip, dtype, search, front_limit, constraints, fronts,
                          smallest, least_cold, keys, ints, consts)
    check_fit(graph, chip, fronts, smallest)
    plan_bounds = bounds(graph, chip, dtype, fronts)
    if sum(least_cold) > chip.sram_bytes_per_core * (1 - solver.reserve_fraction):
        # the weights alone cannot be resident: no need to ask the solver
        raise DoesNotFitError(diagnose(graph, chip, fronts, least_cold, "RESIDENT", solver,
                                       dtype))
    views = Views(graph)
    edges = _edges(graph, _front_ids(fronts), fronts, chip, dtype, ints, views)
    # DRAM loads add what they cannot hide to an op's cycles (none on chips without DRAM)
    extra = [extra_cycles(f, search.dram_schedule) for f in fronts]
    result, status = choose_plans(graph, fronts, extra, edges, chip.sram_bytes_per_core,
                                  solver, progress)
    if result is None:
        raise DoesNotFitError(diagnose(graph, chip, fronts, least_cold, status, solver, dtype))
    chosen = tuple(front[k] for front, k in zip(fronts, result.choice))
    # the solver priced each input's move on its own; the chosen plans' inputs move together
    relayout = relayout_cycles(graph, chosen, chip, dtype, ints, views)
    # (the second solve re-derives plans with their weights resident: not on DRAM chips)
    if search.align and not chip.is_mesh and solver.planner != "greedy" and not chip.has_dram:
        fixed = frozenset(i for i, c in enumerate(match_ops(graph, constraints)) if c)
        chosen, relayout = _realign(graph, keys, chosen, relayout, chip, dtype, ints, consts,
                                    search, solver, views, fixed)
    gap = result.objective_cycles - result.bound_cycles
    dram = (_dram_schedule(graph, chosen, relayout, chip, solver, search.dram_schedule)
            if any(p.dram_cycles for p in chosen) else None)
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
        dram_schedule=dram.mode if dram else "",
        dram_issue=dram.issue if dram else (),
        dram_stall_cycles=dram.stall if dram else (),
    )


def check_dram_capacity(graph: Graph, chip: Chip, dtype: str) -> None:
    """Refuse a graph whose weights and inputs exceed the chip's DRAM."""
    need = dram_bytes_needed(graph, dtype)
    if need > chip.dram_bytes:
        raise DoesNotFitError(
            f"{graph.name} needs {need / 1e9:.2f} GB of DRAM for its weights and inputs in "
            f"{dtype}; {chip.name} has {chip.dram_bytes / 1e9:.2f} GB. Use a chip with more "
            "DRAM (see `t10c chips`) or a smaller model")


def _dram_schedule(graph: Graph, chosen: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
                   solver: SolverOptions, mode: str) -> Schedule:
    """When the chosen plans' DRAM loads are issued, within the SRAM the plans leave."""
    arrays = _Arrays([[p] for p in chosen], [[0] for _ in chosen])
    memory = memory_use(liveness(graph), arrays, [0] * len(chosen))
    on_chip = [p.cycles.total + r for p, r in zip(chosen, relayout)]
    cap = int(chip.sram_bytes_per_core * (1 - solver.reserve_fraction))
    return schedule(chosen, on_chip, [int(m) for m in memory], cap, mode)


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


def _realign(graph: Graph, keys: list[tuple], chosen: tuple[OpPlan, ...], relayout: list[int],
             chip: Chip, dtype: str, ints: frozenset[str], consts: frozenset[str],
             search: SearchOptions, solver: SolverOptions, views: Views,
             fixed: frozenset[int] = frozenset()) -> tuple[tuple[OpPlan, ...], list[int]]:
    """The second solve: every op chooses between its chosen plan and the plans aligned to
    what its producers' choices (or their aligned alternatives) leave (`align.py`), under the
    same memory constraints. Offering the aligned plans in the first solve, beside whole
    fronts, stalled CP-SAT on bert-large at the greedy's objective; this small model solves
    at once, starts from the first choice (its greedy hint) and keeps the better of the two.
    The ops in ``fixed`` (named by `--plan` constraints) keep their chosen plan."""
    fronts = _with_aligned(graph, keys, [[p] for p in chosen], chip, dtype, ints, consts,
                           search)
    # ops a `--plan` constraint names keep the plan that obeys it
    fronts = [[chosen[i]] if i in fixed else f for i, f in enumerate(fronts)]
    if all(len(f) == 1 for f in fronts):
        return chosen, relayout
    edges = _edges(graph, _front_ids(fronts), fronts, chip, dtype, ints, views)
    result, _ = choose_plans(graph, fronts, [[0] * len(f) for f in fronts], edges,
                             chip.sram_bytes_per_core, solver)
    if result is None:
        return chosen, relayout
    picked = tuple(f[k] for f, k in zip(fronts, result.choice))
    again = relayout_cycles(graph, picked, chip, dtype, ints, views)
    before = sum(p.cycles.total for p in chosen) + sum(relayout)
    if sum(p.cycles.total for p in picked) + sum(again) < before:
        return picked, again
    return chosen, relayout


def _front_ids(fronts: list[list[OpPlan]]) -> list[int]:
    """Equal numbers for ops whose fronts hold the same plans (repeated layers)."""
    ids: dict[tuple, int] = {}
    return [ids.setdefault(tuple(_rename(p, "") for p in f), len(ids)) for f in fronts]


def _with_aligned(graph: Graph, keys: list[tuple], fronts: list[list[OpPlan]], chip: Chip,
                  dtype: str, ints: frozenset[str], consts: frozenset[str],
                  search: SearchOptions) -> list[list[OpPlan]]:
    """Every op's front plus the plans aligned to its producers' (`align.py`), in
    topological order so that alignment carries along chains; repeated layers share them."""
    if not search.align or chip.is_mesh:
        return fronts
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    fronts = list(fronts)
    table: dict[tuple, int] = {}

    def front_id(f: list[OpPlan]) -> int:
        return table.setdefault(tuple(_rename(p, "") for p in f), len(table))

    ids = [front_id(f) for f in fronts]
    cache: dict[tuple, list[OpPlan]] = {}
    for i, op in enumerate(graph.ops):
        feeds = tuple((slot, ids[producer[o.tensor]]) for slot, o in enumerate(op.inputs)
                      if o.tensor in producer)
        if not feeds:
            continue
        key = (keys[i], feeds, ids[i])
        if key not in cache:
            cache[key] = aligned_variants(graph, i, fronts, chip, dtype, ints, consts,
                                          search.align, search.weights_home)
        fronts[i] = fronts[i] + [_rename(p, op.name) for p in cache[key]]
        ids[i] = front_id(fronts[i])
    return fronts


def _edges(graph: Graph, keys: list[int], fronts: list[list[OpPlan]], chip: Chip,
           dtype: str, ints: frozenset[str], views: Views) -> list[Edge]:
    """Every producer -> consumer edge with its re-layout costs; ops with equal fronts
    (``keys``, repeated layers) share them."""
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    cache: dict[tuple, tuple[tuple[int | None, ...], ...]] = {}
    edges = []
    for i, op in enumerate(graph.ops):
        for slot, operand in enumerate(op.inputs):
            j = producer.get(graph.root(operand.tensor))
            if j is None:
                continue
            direct = operand.tensor == graph.ops[j].output.tensor
            key = (keys[j], keys[i], slot, direct, graph.tensors[operand.tensor].shape,
                   views.chain(operand.tensor))
            if key not in cache:
                cache[key] = edge_cost(graph, j, i, slot, fronts[j], fronts[i], chip, dtype,
                                       ints, views)
            edges.append(Edge(j, i, slot, cache[key]))
        for k, operand in enumerate(op.extra):  # epilogue operands: slots past the output's
            j = producer.get(graph.root(operand.tensor))
            if j is None:
                continue
            slot = len(op.inputs) + 1 + k
            direct = operand.tensor == graph.ops[j].output.tensor
            key = (keys[j], keys[i], slot, direct, graph.tensors[operand.tensor].shape,
                   views.chain(operand.tensor))
            if key not in cache:
                cache[key] = extra_edge_cost(graph, j, i, k, fronts[j], fronts[i], chip, dtype,
                                             ints)
            edges.append(Edge(j, i, slot, cache[key]))
    return edges


def replay_plan(graph: Graph, replay: Replay, chip: Chip, dtype: str) -> Plan:
    """The plan read back from plan.json, for ``graph`` on ``chip``, once every op's costs and
    re-layouts are re-derived and agree (`constrain.check_replay`); raises `PlanError`."""
    ints, consts = _tensor_sets(graph)
    check_replay(graph, replay, chip, dtype, ints, consts)
    return replay.plan


def check_constraints(graph: Graph, chip: Chip, constraints: tuple[Constraint, ...],
                      search: SearchOptions = SearchOptions()) -> None:
    """Refuse, before any search, constraints that name no op or ask what no plan can be
    (`constrain.check_constraint`); `plan_graph` finds the rest (no legal or fitting plan)."""
    _, consts = _tensor_sets(graph)
    for op, c in zip(graph.ops, match_ops(graph, constraints)):
        if c is not None:
            check_constraint(op, c, chip, any(o.tensor in consts for o in op.inputs),
                             search.weights_home)


def search_op_constrained(graph: Graph, op: TensorExpr, chip: Chip, dtype: str, c: Constraint,
                          opts: SearchOptions = SearchOptions(), limit: int = 16
                          ) -> list[OpPlan]:
    """The front of the plans of one op of ``graph`` that obey ``c`` (as `plan_graph` puts
    it before the solver), for `t10c explain --plan`."""
    ints, consts = _tensor_sets(graph)
    return constrained_front(graph, op, c, chip, dtype, opts, limit, ints, consts).front
