"""Partition: `Graph` + `Chip` -> `Plan` (per-op rTensor search, then whole-graph CP-SAT choice).

This stage sees only tensor expressions; it never looks at ONNX op types.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from t10c import forked
from t10c.chips import Chip
from t10c.dtypes import IntTensors
from t10c.ir import Graph, TensorExpr

from .align import aligned_variants, plan_on_boxes
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
    gather_by_dma,
    grow_in_place,
    schedule,
    stalls,
    store_cycles,
    store_waits,
    with_dram_inputs,
)
from .epilogue import extra_edge_cost
from .inductive import inductive_choice
from .plan import KERNEL_CORES, Cycles, Geometry, OpPlan, geometry, operand_shapes
from .refine import refine_choice, trials_for
from .refine import total_cycles as _total
from .search import SearchOptions, SearchResult, enumerate_plans, search_front
from .solve import (
    Edge,
    Relaxed,
    SolverOptions,
    choose_plans,
    chosen_memory,
    liveness,
    relaxed_model,
)
from .space import (
    Space,
    baseline_options,
    op_keys,
    prefetch,
    space_of,
    tensor_sets,
    union,
)
from .transitions import (
    Views,
    edge_cost,
    kept_restores,
    pod_fetches,
    relayout_cycles,
    route_fetches,
)
from .verify import verify_plan

__all__ = ["Bounds", "Plan", "OpPlan", "Cycles", "Geometry", "SearchOptions", "SolverOptions",
           "PlanError", "DoesNotFitError", "SolverReport", "plan_graph", "verify_plan", "geometry",
           "search_op", "search_op_front", "plan_cost", "Constraint", "ConstraintError",
           "WEIGHTS", "Replay", "replay_plan", "check_constraints",
           "search_op_constrained", "match_ops", "with_preload_margin", "with_dram_issue",
           "grow_in_place", "gather_by_dma"]


def search_op(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
              opts: SearchOptions = SearchOptions()) -> list[OpPlan]:
    """Every plan of one op of ``graph`` that survives pruning (not yet reduced to a front)."""
    ints, consts = tensor_sets(graph)
    shapes = operand_shapes(graph, op)
    return enumerate_plans(op, chip, dtype, shapes, ints, consts, opts)


def search_op_front(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
                    opts: SearchOptions = SearchOptions(), limit: int | None = None
                    ) -> SearchResult:
    """One op's Pareto front (and smallest plan), computed without materialising every plan."""
    ints, consts = tensor_sets(graph)
    shapes = operand_shapes(graph, op)
    return search_front(op, chip, dtype, shapes, ints, consts, opts, limit)


def _load_kernels(graph: Graph, chip: Chip) -> None:
    """On a mesh whose compile shares its work among forked processes (`forked.jobs_for`),
    load the compiled kernels those processes use (`t10c.meshkernels`, and from
    `KERNEL_CORES` cores `kernels`) before the first fork: each process then inherits them,
    where it would otherwise import numba and load them itself, in every stage that forks
    (about half a second a process on bert-large on wse2)."""
    if not chip.is_mesh or forked.jobs_for(chip.cores * len(graph.ops)) < 2:
        return
    from t10c import meshkernels  # (numba)

    meshkernels.load()
    if chip.cores >= KERNEL_CORES:
        from . import kernels

        kernels.load()


def plan_graph(graph: Graph, chip: Chip, dtype: str = "fp16",
               search: SearchOptions = SearchOptions(), solver: SolverOptions = SolverOptions(),
               front_limit: int = 16, progress: Progress | None = None,
               constraints: tuple[Constraint, ...] = ()) -> Plan:
    """Search every op's plans (once per distinct op), then choose one per op with CP-SAT;
    the ops ``constraints`` name choose among the plans that obey them (`constrain.py`).

    A strategy that rotates (t10) chooses from its own plans united with the no-rotation and
    vgm baselines' (`space.py` says why its plan is then never slower than theirs): each
    baseline's own choice is solved first and given to the solve as a start. With
    ``constraints`` the named ops' fronts are replaced, the baselines' choices no longer map,
    and the solve starts from the greedy alone."""
    start = time.perf_counter()
    if chip.has_dram:  # before any search: the model must fit the DRAM
        check_dram_capacity(graph, chip, dtype)
    ints, consts = tensor_sets(graph)
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

    _load_kernels(graph, chip)
    prefetch(graph, chip, dtype, [*wide, *(baselines or (search,))], front_limit)
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
    smallest = list(space.smallest)
    least_cold = list(space.least_cold)
    if chip.has_dram:  # graph inputs stream from DRAM; weights may live there (appended:
        # the baselines' choices still map)
        fronts = [with_dram_inputs(graph, op, f, chip, dtype, ints) for op, f in
                  zip(graph.ops, fronts)]
        fronts = [f + dram_twins(graph, op, f, chip, dtype, ints)
                  for op, f in zip(graph.ops, fronts)]
        least_cold = [min([c, *(p.cold_bytes_per_core for p in f)])
                      for c, f in zip(least_cold, fronts)]
    if constraints:  # `--plan FILE`: the named ops' fronts become the plans obeying it
        apply_constraints(graph, chip, dtype, search, front_limit, constraints, fronts,
                          smallest, least_cold, keys, ints, consts)
        spaces, maps = [], []
    check_fit(graph, chip, fronts, smallest)
    plan_bounds = bounds(graph, chip, dtype, fronts)
    if sum(least_cold) > solver.sram_cap(chip.sram_bytes_per_core):
        # the weights alone cannot be resident: no need to ask the solver
        raise DoesNotFitError(diagnose(graph, chip, fronts, least_cold, "RESIDENT", solver,
                                       dtype))
    views = Views(graph)
    edges = _edges(graph, _front_ids(fronts), fronts, chip, dtype, ints, views)
    solves = len(spaces) + 1  # the baselines' solves, then the solve itself, share a display
    spent: list[float] = []  # every solve's deterministic time

    prepared: dict[int, _Prepared] = {}

    def prepare_baselines() -> None:
        """Each baseline's full model built and relaxed, for `baseline_starts`."""
        for n, (own, where) in enumerate(zip(spaces, maps)):
            prepared[n] = _baseline_relaxed(graph, chip, own, where, edges, solver)

    def baseline_starts(cutoff: int | None) -> list[tuple[int, ...]]:
        """Each baseline's own choice that may cost ``cutoff`` or less, in t10's fronts."""
        starts = []
        for n, (own, where) in enumerate(zip(spaces, maps)):
            choice = _baseline_choice(graph, chip, own, where, edges, solver,
                                      _share(progress, n, solves), spent, cutoff,
                                      prepared.pop(n, None))
            if choice is not None:
                starts.append(tuple(where[i][k] for i, k in enumerate(choice)))
        return starts

    # where the baselines' choices are only the solve's starts (on a mesh without DRAM; on
    # all-to-all chips t10 also finishes each and takes it where faster), the solve asks for
    # them once it knows its best, and a baseline whose LP bound is above that stops there:
    # bert-large's no-rotation solve on wse2 searched for 6.6 of a compile's 68 s for a
    # choice 1.86x t10's (the same plans as asking for every one first). Their models are
    # built and relaxed while GLOP solves the full model's LP (`prepare`): 2 s of a wafer
    # compile on the core it leaves idle
    late = bool(spaces) and chip.is_mesh and not chip.has_dram and solver.planner != "greedy"
    starts = [] if late else baseline_starts(None)
    # DRAM loads add what they cannot hide to an op's cycles (none on chips without DRAM)
    extra = [extra_cycles(f, search.dram_schedule) for f in fronts]
    result, status = choose_plans(graph, fronts, extra, edges, chip.sram_bytes_per_core,
                                  solver, _share(progress, solves - 1, solves), starts,
                                  write_back=chip.has_dram,
                                  more_starts=baseline_starts if late else None,
                                  prepare=prepare_baselines if late else None)
    prepared.clear()  # (any the solve did not ask for)
    if result is None:
        raise DoesNotFitError(diagnose(graph, chip, fronts, least_cold, status, solver, dtype))
    spent.append(result.deterministic_s)
    chosen = tuple(front[k] for front, k in zip(fronts, result.choice))
    # the solver priced each input's move on its own; the chosen plans' inputs move together
    relayout = relayout_cycles(graph, chosen, chip, dtype, ints, views)
    chosen, relayout = _recalibrated(graph, fronts, extra, edges, result.choice, chosen,
                                     relayout, chip, dtype, ints, solver, views, spent)
    # (the second solve re-derives plans with their weights resident: not on DRAM chips)
    fixed = frozenset(i for i, c in enumerate(match_ops(graph, constraints)) if c)
    if _aligns(chip, search) and solver.planner != "greedy" and not chip.has_dram:
        chosen, relayout = _realign(graph, keys, chosen, relayout, chip, dtype, ints, consts,
                                    search, solver, views, fixed, spent)
    if solver.planner != "greedy" and not chip.is_mesh and not chip.has_dram:
        chosen, relayout = _share_copies(graph, keys, chosen, relayout, chip, dtype, ints,
                                         solver, views, fixed)
        # the solver priced no shared copies: a baseline's choice, finished as its own
        # compile finishes it, may gain more from them; t10 then takes it (never slower)
        for given in starts:
            other = tuple(front[k] for front, k in zip(fronts, given))
            again = relayout_cycles(graph, other, chip, dtype, ints, views)
            if _aligns(chip, search):
                other, again = _realign(graph, keys, other, again, chip, dtype, ints, consts,
                                        search, solver, views, fixed)
            other, again = _share_copies(graph, keys, other, again, chip, dtype, ints, solver,
                                         views, fixed)
            if (_total(graph, other, again, chip, dtype, ints, views)
                    < _total(graph, chosen, relayout, chip, dtype, ints, views)):
                chosen, relayout = other, again
    refined: tuple[int, int] | tuple[()] = ()
    if solver.planner != "greedy" and chip.is_mesh and not chip.has_dram:
        chosen, relayout = _share_layouts(graph, chosen, relayout, chip, dtype, ints, solver,
                                          views, fronts, fixed)
        chosen, relayout = _match_reads(graph, chosen, relayout, chip, dtype, ints, solver,
                                        views, fronts, fixed)
    trials = trials_for(solver, chip)
    if trials:
        chosen, relayout, refined = refine_choice(graph, chosen, relayout, chip, dtype, ints,
                                                  search, solver, views, _front_ids(fronts),
                                                  fixed, trials, front_limit, progress)
    chosen, relayout = _finished(graph, chosen, relayout, chip, dtype, ints, solver, views,
                                 fixed)
    choices: tuple[tuple[str, int, int], ...] = ()
    others: list[tuple[int, tuple[OpPlan, ...], list[int]]] = []
    if chip.has_dram and solver.planner != "greedy" and not fixed:
        chosen, relayout, choices, others = _best_streamed(
            graph, fronts, edges, result.choice, result.greedy_choice, chosen, relayout, chip,
            dtype, ints, solver, views)
    gap = result.objective_cycles - result.bound_cycles
    report = SolverReport(
        name=solver.planner, status=result.status,
        objective_cycles=result.objective_cycles, bound_cycles=result.bound_cycles,
        gap=round(gap / max(result.objective_cycles, 1), 6),
        greedy_objective_cycles=result.greedy_objective_cycles,
        wall_s=round(result.wall_s, 3), workers=solver.workers, seed=solver.seed,
        time_limit_s=solver.time_limit_s, deterministic_s=round(sum(spent), 3),
        method=result.method, choices=choices, refined=refined)

    def made(plans: tuple[OpPlan, ...], relayout: list[int], first: int) -> Plan:
        """The plan of one candidate, its entry of ``choices`` first."""
        dram = (_dram_schedule(graph, plans, relayout, chip, dtype, ints, solver,
                               search.dram_schedule) if chip.has_dram else None)
        order = (choices[first],) + choices[:first] + choices[first + 1:] if choices else ()
        return Plan(
            model=graph.name, chip=chip.name, dtype=dtype, ops=plans,
            relayout_cycles=tuple(relayout), front_sizes=tuple(len(f) for f in fronts),
            solver=dataclasses.replace(report, choices=order),
            search_wall_s=search_wall, bounds=plan_bounds,
            dram_schedule=dram.mode if dram else "",
            dram_issue=dram.issue if dram else (),
            dram_stall_cycles=dram.stall if dram else (),
            dram_store_wait=dram.store_wait if dram else ())

    alternatives = tuple(made(p, r, n) for n, p, r in others)
    return dataclasses.replace(made(chosen, relayout, 0), alternatives=alternatives)


def check_dram_capacity(graph: Graph, chip: Chip, dtype: str) -> None:
    """Refuse a graph whose weights and inputs exceed the chip's DRAM."""
    need = dram_bytes_needed(graph, dtype)
    if need > chip.dram_bytes:
        raise DoesNotFitError(
            f"{graph.name} needs {need / 1e9:.2f} GB of DRAM for its weights and inputs in "
            f"{dtype}; {chip.name} has {chip.dram_bytes / 1e9:.2f} GB. Use a chip with more "
            "DRAM (see `t10c chips`) or a smaller model")


def _dram_schedule(graph: Graph, chosen: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
                   dtype: str, ints: IntTensors, solver: SolverOptions, mode: str,
                   margin: int = 1) -> Schedule:
    """When the chosen plans' DRAM loads are issued, within the SRAM the plans leave and
    ``margin`` times the solve's SRAM reserve, and what the graph outputs' write-backs make
    the cores wait."""
    memory = chosen_memory(liveness(graph, write_back=True), chosen)
    stores = _timed_stores(graph, chosen, store_waits(graph, mode == "basic"), chip, dtype,
                           ints)
    on_chip = [p.cycles.total + r for p, r in zip(chosen, relayout)]
    cap = solver.sram_cap(chip.sram_bytes_per_core, margin)
    return schedule(chosen, on_chip, [int(m) for m in memory], cap, mode, stores)


def _finished(graph: Graph, chosen: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
              dtype: str, ints: IntTensors, solver: SolverOptions, views: Views,
              fixed: frozenset[int], stream: bool = True
              ) -> tuple[tuple[OpPlan, ...], list[int]]:
    """The last passes over a choice: weight fetches routed (`route_fetches`), kept copies'
    returns priced (`kept_restores`), on a chip with DRAM (unless ``stream`` is False: the
    choice has decided which weights stream) weights streamed where the preloads then hide
    more (`_stream_weights`), and on a pod the fetches' crossings counted (`pod_fetches`)."""
    fetched = route_fetches(graph, chosen, chip, dtype, ints, views)
    if fetched is not None:
        chosen, relayout = fetched
    chosen = kept_restores(graph, chosen, chip, dtype, ints, views)
    if chip.has_dram and solver.planner != "greedy" and stream:
        chosen = _stream_weights(graph, chosen, relayout, chip, dtype, ints, solver, fixed)
    return pod_fetches(graph, chosen, chip, dtype, ints, views), relayout


def _best_streamed(graph: Graph, fronts: list[list[OpPlan]], edges: list[Edge],
                   solved: Sequence[int], greedy: Sequence[int] | None,
                   chosen: tuple[OpPlan, ...], relayout: list[int], chip: Chip, dtype: str,
                   ints: IntTensors, solver: SolverOptions, views: Views
                   ) -> tuple[tuple[OpPlan, ...], list[int], tuple[tuple[str, int, int], ...],
                              list[tuple[int, tuple[OpPlan, ...], list[int]]]]:
    """On a chip with DRAM: the solver's choice (``chosen``, finished), the greedy's and ELK's
    inductive ones (`inductive.inductive_choice`: every weight streamed; and the solver's
    finished residency scheduled around the loads, built within the solve's SRAM reserve
    and within twice it, as `_streamed_step` judges both), each finished the same way (the
    inductive ones have decided which weights stream: `_stream_weights` is not run again),
    judged by the step the preload schedule runs (`_streamed_step`); the fastest is kept
    (the first of equals, in that order). The solve charges every DMA load whole, so its
    objective ranks choices by what the schedule then hides only roughly; the greedy (T10's
    memory reconciliation) and the inductive choices (built back from the last op around
    the loads) see it differently. Returns the kept choice, each candidate's predicted steps
    (`_steps`), the kept one first, and the others (their place there, plans and re-layouts)
    ranked as the judge ranks them, for a timing-only run to try where the kept one runs
    slower than predicted (`Plan.alternatives`). With ``solver.choice`` naming one (a
    baseline), that one is kept, fastest or not (`DoesNotFitError` if it found no plans),
    and no other is offered."""
    candidates = [("solver", solved, chosen, relayout)]
    same: dict[str, str] = {}  # a choice equal to an earlier one: that one's name

    sram = chip.sram_bytes_per_core
    resident = [p.cold_bytes_per_core for p in chosen]
    built = {"inductive": inductive_choice(graph, fronts, edges, solver.sram_cap(sram)),
             "inductive-resident": inductive_choice(graph, fronts, edges,
                                                    solver.sram_cap(sram), resident),
             "inductive-resident-2": inductive_choice(graph, fronts, edges,
                                                      solver.sram_cap(sram, 2), resident)}
    for name, pick in (("greedy", greedy), *((n, b.choice if b else None)
                                             for n, b in built.items())):
        if pick is None:
            continue
        earlier = next((c[0] for c in candidates if tuple(pick) == tuple(c[1])), None)
        if earlier is not None:
            same[name] = earlier
            continue
        plans = tuple(front[k] for front, k in zip(fronts, pick))
        plans, again = _finished(graph, plans, relayout_cycles(graph, plans, chip, dtype, ints,
                                                                views),
                                 chip, dtype, ints, solver, views, frozenset(),
                                 stream=name == "greedy")
        candidates.append((name, pick, plans, again))
    steps = [_steps(graph, c[2], c[3], chip, dtype, ints, solver) for c in candidates]
    best = min(range(len(candidates)), key=lambda k: (sum(steps[k]), k))  # `_streamed_step`
    if solver.choice != "best":  # a baseline asked for by name
        name = same.get(solver.choice, solver.choice)
        found = [k for k, c in enumerate(candidates) if c[0] == name]
        if not found:
            raise DoesNotFitError(
                f"the {solver.choice} whole-graph choice found no plans that fit the "
                "SRAM; choose another (--choice best keeps the fastest that does)")
        best = found[0]
    order = [best] + [k for k in range(len(candidates)) if k != best]
    ranked = sorted(range(1, len(order)), key=lambda n: (sum(steps[order[n]]), n))
    others = [(n, candidates[order[n]][2], candidates[order[n]][3]) for n in ranked] \
        if solver.choice == "best" else []
    return (candidates[best][2], candidates[best][3],
            tuple((candidates[k][0], *steps[k]) for k in order), others)


def _steps(graph: Graph, plans: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
           dtype: str, ints: IntTensors, solver: SolverOptions) -> tuple[int, int]:
    """A choice's predicted steps under ELK's preload schedule within the solve's SRAM
    reserve and within twice it (`_streamed_step` judges by their sum)."""
    spent = sum(p.cycles.total for p in plans) + sum(relayout)
    a, b = (spent + sum(_dram_schedule(graph, plans, relayout, chip, dtype, ints, solver, "elk",
                                       m).stall) for m in (1, 2))
    return a, b


def _streamed_step(graph: Graph, plans: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
                   dtype: str, ints: IntTensors, solver: SolverOptions) -> int:
    """A choice's step on a chip with DRAM under ELK's preload schedule within the solve's
    SRAM reserve and under the one within twice it, together (`_stream_weights`)."""
    return sum(_steps(graph, plans, relayout, chip, dtype, ints, solver))


def _stream_weights(graph: Graph, chosen: tuple[OpPlan, ...], relayout: list[int],
                    chip: Chip, dtype: str, ints: IntTensors, solver: SolverOptions,
                    fixed: frozenset[int] = frozenset()) -> tuple[OpPlan, ...]:
    """On a chip with DRAM, after the solve: weights the solve kept resident are loaded
    from DRAM instead (each op's plan for its twin, `dram_twins`: the same layout) wherever
    the step's time under ELK's preload schedule drops.

    The solve charges every op its whole DMA time (`dram.extra_cycles`), as if no load hid
    behind the ops before it, so it keeps weights resident wherever SRAM allows. Resident
    weights leave no SRAM to preload into, though: LLaMA-2-13B's decode step at batch 32
    with 2,048 tokens on elk-pod4 kept 484 KB of its 624 KB per core for weights, and each
    layer's attention then waited for its 115 KB per core of key and of value cache to load
    after the ops before it had run (88 k cycles a layer). Streaming a weight costs its
    load on the DMA queue; it pays where the loads it lets the schedule issue earlier hide
    more than that. Ops alike (repeated layers: the same front and the same plan) try as
    one, the most resident bytes first, in passes until none gains (a group streamed in one
    pass may come back in the next, once others stream); ops named by `--plan`
    constraints keep theirs. The strategies' schedules (`static`, `basic`) run these same
    plans.

    A choice is judged by its step under two schedules together: within the solve's SRAM
    reserve, and within twice it, which a streamed (timing-only) run whose online layout
    overflows falls back to (`with_preload_margin`). Judged by the first alone, a choice
    could lose its preloads in the second (LLaMA-2-70B's decode step, batch 16, 2,048
    tokens, elk-pod4: 12.6 M cycles as chosen, 16.2 M as laid out; judged by both, 12.6 M
    either way)."""
    def total(plans: tuple[OpPlan, ...]) -> int:
        return _streamed_step(graph, plans, relayout, chip, dtype, ints, solver)

    twin: dict[int, OpPlan] = {}
    for i, (op, p) in enumerate(zip(graph.ops, chosen)):
        if i in fixed or p.dram_weights or p.home or not p.cold_bytes_per_core:
            continue
        made = dram_twins(graph, op, [p], chip, dtype, ints)
        if made:
            twin[i] = made[0]
    groups: dict[tuple, list[int]] = {}
    keys = op_keys(graph)
    for i in twin:
        groups.setdefault((keys[i], chosen[i].unnamed), []).append(i)
    order = sorted(groups.values(), key=lambda g: -sum(chosen[i].cold_bytes_per_core
                                                        - twin[i].cold_bytes_per_core
                                                        for i in g))
    best, cost = chosen, total(chosen)
    for _ in range(STREAM_PASSES):
        changed = False
        for members in order:  # a group streamed already may come back
            trial = list(best)
            for i in members:
                trial[i] = chosen[i] if best[i] is twin[i] else twin[i]
            spent = total(tuple(trial))
            if spent < cost:
                best, cost, changed = tuple(trial), spent, True
        if not changed:
            break
    # a resident byte saves the same load wherever it is: as many of the streamed ops as
    # gain take their resident plans back, in op order (the count found coarse to fine)
    back = [i for i in sorted(twin) if best[i] is twin[i]]

    def restored(k: int) -> tuple[OpPlan, ...]:
        trial = list(best)
        for i in back[:k]:
            trial[i] = chosen[i]
        return tuple(trial)

    tried = {0: cost}
    lo, hi, step = 0, len(back), max(1, len(back) // 16)
    while True:
        for k in range(lo, hi + 1, step):
            if k not in tried:
                tried[k] = total(restored(k))
        k = min(tried, key=lambda x: (tried[x], x))
        if step == 1:
            break
        lo, hi, step = max(0, k - step), min(len(back), k + step), max(1, step // 4)
    return restored(k) if k else best


#: the most passes `_stream_weights` makes over the groups of ops (each flips a group between
#: resident and streamed weights where that gains)
STREAM_PASSES = 4


def with_preload_margin(graph: Graph, plan: Plan, chip: Chip, solver: SolverOptions,
                        margin: int) -> Plan | None:
    """``plan`` with its DRAM loads and write-backs scheduled again to leave ``margin`` times
    the solve's SRAM reserve free (the same schedule where nothing is held across ops), or
    None if it has no DRAM schedule.

    Preloads and results waiting for their write-back are held across ops and placed high;
    the ops' own buffers come and go below. A streamed (timing-only) run lays them out online,
    first-fit, and at the reserve's edge that layout can fragment past the SRAM
    (llama2-13b-decode on elk-pod4, by 384 bytes): the driver then asks for a wider margin,
    which holds less ahead."""
    if not plan.dram_schedule:
        return None
    dram = _dram_schedule(graph, plan.ops, list(plan.relayout_cycles), chip, plan.dtype,
                          tensor_sets(graph)[0], solver, plan.dram_schedule, margin)
    return dataclasses.replace(plan, dram_issue=dram.issue, dram_stall_cycles=dram.stall,
                               dram_store_wait=dram.store_wait)


def with_dram_issue(graph: Graph, plan: Plan, chip: Chip, issue: Sequence[int]) -> Plan:
    """``plan`` with its DRAM loads issued at ``issue`` (per op, as `Plan.dram_issue`) and
    its stalls timed again (the write-backs waited for where the plan says): what a streamed
    run did where its online layout issued preloads later than planned
    (`codegen.stream`'s ``issued``)."""
    assert len(issue) == len(graph.ops)
    waits = dict(enumerate(plan.dram_store_wait)) if plan.dram_store_wait else \
        store_waits(graph, plan.dram_schedule == "basic")
    stores = _timed_stores(graph, plan.ops, waits, chip, plan.dtype, tensor_sets(graph)[0])
    on_chip = [p.cycles.total + r for p, r in zip(plan.ops, plan.relayout_cycles)]
    return dataclasses.replace(plan, dram_issue=tuple(issue),
                               dram_stall_cycles=stalls(plan.ops, on_chip, issue, stores))


def _timed_stores(graph: Graph, plans: Sequence[OpPlan], waits: dict[int, int], chip: Chip,
                  dtype: str, ints: IntTensors) -> list[tuple[int, int, int]]:
    """(op, the op at whose start its write-backs are waited for, their cycles) of every op
    that writes back (``waits``: -1 for none)."""
    return [(k, w, store_cycles(graph, k, plans[k], chip, dtype, ints))
            for k, w in sorted(waits.items()) if w >= 0]


def _share(progress: Progress | None, n: int, solves: int) -> Progress | None:
    """Solve ``n`` of ``solves`` reported as its share of one "solve" display."""
    if progress is None or solves == 1:
        return progress
    shown = progress

    def report(stage: str, done: int, total: int) -> None:
        shown(stage, n * total + done, solves * total)
    return report


def _baseline_model(chip: Chip, own: Space, where: list[list[int]], edges: list[Edge],
                    solver: SolverOptions) -> tuple[list[list[OpPlan]], list[Edge]] | None:
    """A baseline's own fronts and edges, or None where its weights cannot fit."""
    fronts = [list(f) for f in own.fronts]
    cap = solver.sram_cap(chip.sram_bytes_per_core)
    if not all(fronts) or sum(own.least_cold) > cap:
        return None
    # its edges are the united edges' sub-matrices: edge costs are priced pair by pair
    return fronts, [Edge(e.src, e.dst, e.slot,
                         tuple(tuple(e.cost[p][q] for q in where[e.dst]) for p in where[e.src]))
                    for e in edges]


#: a baseline's own fronts and edges (`_baseline_model`), and its full model relaxed
_Prepared = tuple[tuple[list[list[OpPlan]], list[Edge]] | None, Relaxed | None]


def _baseline_relaxed(graph: Graph, chip: Chip, own: Space, where: list[list[int]],
                      edges: list[Edge], solver: SolverOptions) -> _Prepared:
    """A baseline's fronts and edges, and the full model its solve builds and relaxes first
    (`solve.relaxed_model`), for `_baseline_choice`'s ``prepared``."""
    inputs = _baseline_model(chip, own, where, edges, solver)
    if inputs is None:
        return None, None
    fronts, sub = inputs
    return inputs, relaxed_model(graph, fronts, [[0] * len(f) for f in fronts], sub,
                                 chip.sram_bytes_per_core, solver, write_back=chip.has_dram)


def _baseline_choice(graph: Graph, chip: Chip, own: Space, where: list[list[int]],
                     edges: list[Edge], solver: SolverOptions, progress: Progress | None,
                     spent: list[float], cutoff: int | None = None,
                     prepared: _Prepared | None = None) -> tuple[int, ...] | None:
    """The choice a baseline's own compile makes (the same fronts, edges, options and seed,
    so the same model and the same answer), or None where it does not fit or its full
    model's LP bound is above ``cutoff`` (`solve.choose_plans`; ``prepared`` by
    `_baseline_relaxed`)."""
    inputs, relaxed = prepared if prepared is not None else \
        (_baseline_model(chip, own, where, edges, solver), None)
    if inputs is None:
        return None
    fronts, sub = inputs
    result, _ = choose_plans(graph, fronts, [[0] * len(f) for f in fronts], sub,
                             chip.sram_bytes_per_core, solver, progress,
                             write_back=chip.has_dram, cutoff=cutoff, prepared=relaxed)
    if result is None:
        return None
    spent.append(result.deterministic_s)
    return result.choice


def _aligns(chip: Chip, search: SearchOptions) -> bool:
    """Whether the second solve offers aligned plans (`align.py`): on a mesh only to a
    mesh-aware search (the all-to-all assumption's plans are T10's, as published)."""
    return bool(search.align) and (search.mesh_aware or not chip.is_mesh)


def _realign(graph: Graph, keys: list[tuple], chosen: tuple[OpPlan, ...], relayout: list[int],
             chip: Chip, dtype: str, ints: IntTensors, consts: frozenset[str],
             search: SearchOptions, solver: SolverOptions, views: Views,
             fixed: frozenset[int] = frozenset(), spent: list[float] | None = None
             ) -> tuple[tuple[OpPlan, ...], list[int]]:
    """The second solve: every op chooses between its chosen plan and the plans aligned to
    what its producers' choices (or their aligned alternatives) leave (`align.py`), under the
    same memory constraints. Offering the aligned plans in the first solve, beside whole
    fronts, stalled CP-SAT on bert-large at the greedy's objective; this small model solves
    at once, starts from the first choice (its greedy hint) and keeps the better of the two.
    The ops in ``fixed`` (named by `--plan` constraints) keep their chosen plan; the solve's
    deterministic time is appended to ``spent``."""
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
    if spent is not None:
        spent.append(result.deterministic_s)
    picked = tuple(f[k] for f, k in zip(fronts, result.choice))
    again = relayout_cycles(graph, picked, chip, dtype, ints, views)
    if _total(graph, picked, again, chip, dtype, ints, views) < \
            _total(graph, chosen, relayout, chip, dtype, ints, views):
        return picked, again
    return chosen, relayout


#: the most cores a mesh may have for its edges to be recalibrated (`_recalibrated`): it
#: gains on 64 x 64 and cost the wafer minutes for no gain (the README's Meshes section)
RECALIBRATE_CORES = 1 << 16


def _recalibrated(graph: Graph, fronts: list[list[OpPlan]], extra: list[list[int]],
                  edges: list[Edge], choice: tuple[int, ...], chosen: tuple[OpPlan, ...],
                  relayout: list[int], chip: Chip, dtype: str, ints: IntTensors,
                  solver: SolverOptions, views: Views, spent: list[float]
                  ) -> tuple[tuple[OpPlan, ...], list[int]]:
    """A mesh's second look at the edges: the solver priced each re-layout by the closed-form
    estimate (`place.exchange_estimate`), off from the routed phase by different factors on
    different edges, so it weighs re-layouts against the plans' own cycles roughly. Each
    consumer op's edges are scaled by what routing the first choice found (its
    phase's routed cycles over the estimates of its chosen pairs), the model is solved again
    from the first choice, and the choice whose routed cycles (fetches routed too,
    `route_fetches`) are fewer is kept: never slower than the first. Decides for itself
    where it applies: meshes of at most `RECALIBRATE_CORES` cores without DRAM, under CP-SAT."""
    if (not chip.is_mesh or chip.has_dram or solver.planner == "greedy"
            or chip.cores > RECALIBRATE_CORES):
        return chosen, relayout
    estimated = [0] * len(graph.ops)
    for e in edges:
        estimated[e.dst] += e.cost[choice[e.src]][choice[e.dst]] or 0
    if not any(estimated):
        return chosen, relayout

    def scaled(cost: int | None, i: int) -> int | None:
        if cost is None or not estimated[i]:
            return cost
        return -(-cost * relayout[i] // estimated[i])

    again = [Edge(e.src, e.dst, e.slot,
                  tuple(tuple(scaled(c, e.dst) for c in row) for row in e.cost))
             for e in edges]
    result, _ = choose_plans(graph, fronts, extra, again, chip.sram_bytes_per_core, solver,
                             starts=[choice])
    if result is None or result.choice == choice:
        return chosen, relayout
    spent.append(result.deterministic_s)
    picked = tuple(front[k] for front, k in zip(fronts, result.choice))
    picked_relayout = relayout_cycles(graph, picked, chip, dtype, ints, views)
    if _routed_total(graph, picked, picked_relayout, chip, dtype, ints, views) < \
            _routed_total(graph, chosen, relayout, chip, dtype, ints, views):
        return picked, picked_relayout
    return chosen, relayout


def _routed_total(graph: Graph, plans: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
                  dtype: str, ints: IntTensors, views: Views) -> int:
    """A mesh choice's cycles with its weight fetches routed (`route_fetches`)."""
    fetched = route_fetches(graph, plans, chip, dtype, ints, views)
    plans, relayout = fetched if fetched is not None else (plans, relayout)
    return _total(graph, plans, relayout, chip, dtype, ints, views)


def _share_copies(graph: Graph, keys: list[tuple], chosen: tuple[OpPlan, ...],
                  relayout: list[int], chip: Chip, dtype: str, ints: IntTensors,
                  solver: SolverOptions, views: Views, fixed: frozenset[int] = frozenset()
                  ) -> tuple[tuple[OpPlan, ...], list[int]]:
    """After the solve: two consecutive ops alike (same expression, same activations read, the
    weights aside; bert-base's q, k and v) that chose different plans try each other's, so
    that the second can read the first one's re-laid copy (`transitions.shared_inputs`),
    which the solver's per-edge prices cannot see. A swap is kept when the plans' cycles and
    the exact re-layouts together drop and every op's memory stays within the solver's
    limit; ops named by `--plan` constraints keep theirs."""
    cap = solver.sram_cap(chip.sram_bytes_per_core)
    best = list(chosen)
    cost = _total(graph, best, relayout, chip, dtype, ints, views)
    for i in range(1, len(graph.ops)):
        a, b = graph.ops[i - 1], graph.ops[i]
        if keys[i] != keys[i - 1] or not _alike_reads(graph, a, b) or \
                best[i].unnamed == best[i - 1].unnamed:
            continue
        for k, src in ((i, i - 1), (i - 1, i)):
            if k in fixed:
                continue
            trial = list(best)
            trial[k] = best[src].named(graph.ops[k].name)
            better = _faster(graph, trial, cost, cap, chip, dtype, ints, views)
            if better is not None:
                best, relayout, cost = trial, *better
                break
    return tuple(best), relayout


def _share_layouts(graph: Graph, chosen: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
                   dtype: str, ints: IntTensors, solver: SolverOptions, views: Views,
                   fronts: list[list[OpPlan]], fixed: frozenset[int] = frozenset()
                   ) -> tuple[tuple[OpPlan, ...], list[int]]:
    """On a mesh, after the solve: two consecutive ops over the same axes that read the same
    activation in different layouts try the other's plan, costed for themselves, so that the
    second reads the first's re-laid copy (`transitions.shared_inputs`), which the solver's
    per-edge prices cannot see. LLaMA's gate and up projections: the gate rotates the
    normalised vector, the up plan does not; with the up plan the gate keeps its received
    copy for the up projection, whose re-layout then moves nothing (its epilogue reads the
    gate's result, now in its own layout, in place). (A copied plan that rotates the input
    returns it home for the next op: `transitions.kept_restores`.) Repeated layers try as
    one: the pairs of equal fronts and equal chosen plans take
    the same swap. A swap is kept when the plans' cycles and the routed re-layouts together
    drop and every op's memory stays within the solver's limit, the faster of the two where
    both do (the first that did, once, gave LLaMA-3-8B's up projection the gate's plan on
    wse3, where with relayed broadcasts the gate taking the up projection's is 6% faster);
    ops named by `--plan`
    constraints keep theirs. Two reductions trade plans although their operands differ
    (`_copied`): a decode step's Softmax sum over the past scores, which also reads their
    max, then reads the max's copy (LLaMA-3-8B on wse2: 442,890 -> 426,352 cycles; bert-large,
    its LayerNorms' and Softmaxes', 549,067 -> 489,717). (Off meshes `_share_copies` swaps
    the plans of alike ops.)"""
    cap = solver.sram_cap(chip.sram_bytes_per_core)
    ids = _front_ids(fronts)
    consts = views.const_tensors()
    best = list(chosen)
    cost = _total(graph, best, relayout, chip, dtype, ints, views)
    for members in _alike_pairs(ids, best):
        i = members[0]
        a, b = graph.ops[i - 1], graph.ops[i]
        if a.axes != b.axes:
            continue
        if not any(views.same_read(x.tensor, y.tensor)
                   and views.want_digest(i - 1, s, best[i - 1]) != views.want_digest(i, s, best[i])
                   for s, (x, y) in enumerate(zip(a.inputs, b.inputs))):
            continue
        # back = 0: op i takes op i - 1's plan; back = 1: the other way round; the faster
        # of the two where both gain (the first on a tie)
        kept = None
        for back in (0, 1):
            trial = _copied(graph, best, members, back, chip, dtype, ints, consts, cap, fixed)
            if trial is None:
                continue
            better = _faster(graph, trial, cost, cap, chip, dtype, ints, views)
            if better is not None and (kept is None or better[1] < kept[2]):
                kept = (trial, *better)
        if kept is not None:
            best, relayout, cost = kept
    return tuple(best), relayout


def _alike_pairs(ids: list[int], plans: list[OpPlan], by_next: bool = False
                 ) -> list[list[int]]:
    """The consecutive pairs (i - 1, i), by i, grouped where repeated layers repeat them:
    equal fronts (``ids``, `_front_ids`) and equal chosen plans, and with ``by_next`` equal
    fronts of the op after them too; groups in the order of their first pair."""
    groups: dict[tuple, list[int]] = {}
    for i in range(1, len(plans)):
        after = (ids[i + 1] if i + 1 < len(ids) else -1) if by_next else None
        key = (ids[i - 1], ids[i], after, plans[i - 1].unnamed, plans[i].unnamed)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _match_reads(graph: Graph, chosen: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
                 dtype: str, ints: IntTensors, solver: SolverOptions, views: Views,
                 fronts: list[list[OpPlan]], fixed: frozenset[int] = frozenset()
                 ) -> tuple[tuple[OpPlan, ...], list[int]]:
    """On a mesh, after the solve: where two consecutive ops read one activation in two
    layouts, the second tries the plan that computes on exactly the tiles the first reads,
    on the same cores (`align.plan_on_boxes`: one step, nothing rotating, no reduction), so
    that it reads the first one's received copy (`transitions.shared_inputs`) instead of
    receiving its own. RMSNorm's scaling then reads the residual stream where its mean did:
    on a wafer that stream lies wherever the last GEMV's reduce-scatter left it, across the
    whole wafer, and each of the two reads crossed it. Repeated layers try as one (the
    pairs of equal fronts and equal chosen plans, followed by equal fronts); a trial is
    kept where the plans' cycles and the routed re-layouts together drop and every op's
    memory stays within the solver's limit; ops named by `--plan` constraints keep
    theirs."""
    cap = solver.sram_cap(chip.sram_bytes_per_core)
    ids = _front_ids(fronts)
    consts = views.const_tensors()
    best = list(chosen)
    cost = _total(graph, best, relayout, chip, dtype, ints, views)
    # (the op after each pair too: plans on a reader's tiles crowd its cores, and the
    # weights of alike pairs in two places of a layer, RMSNorm's before attention and before
    # the MLP, may fit there for one place and not for both)
    for members in _alike_pairs(ids, best, by_next=True):
        if any(i in fixed for i in members):
            continue
        i = members[0]
        a, b = graph.ops[i - 1], graph.ops[i]
        for slot, y in enumerate(b.inputs):
            s = next((s for s, x in enumerate(a.inputs) if views.same_read(x.tensor, y.tensor)),
                     None)
            if s is None or graph.root(y.tensor) in consts or \
                    views.want_digest(i - 1, s, best[i - 1]) == views.want_digest(i, slot,
                                                                                 best[i]):
                continue
            trial = _on_read_tiles(graph, best, members, s, slot, chip, dtype, ints, views,
                                   cap)
            better = None if trial is None else _faster(graph, trial, cost, cap, chip, dtype,
                                                        ints, views)
            if trial is not None and better is not None:
                best, relayout, cost = trial, *better
                break
    return tuple(best), relayout


def _on_read_tiles(graph: Graph, plans: list[OpPlan], members: list[int], s: int, slot: int,
                   chip: Chip, dtype: str, ints: IntTensors, views: Views, cap: int
                   ) -> list[OpPlan] | None:
    """``plans`` with every op i of ``members`` computing on the tiles op i - 1 reads of its
    input ``s``, as its input ``slot`` (`_match_reads`); None where one has no such plan
    within ``cap``."""
    trial = list(plans)
    for i in members:
        want = views.want(i - 1, s, plans[i - 1])
        plan = plan_on_boxes(graph, i, slot, want.origin, want.shape, want.phys, chip, dtype,
                             ints, views.const_tensors())
        if plan is None or plan.hot_bytes_per_core > cap:
            return None
        trial[i] = plan
    return trial


def _copied(graph: Graph, plans: list[OpPlan], members: list[int], back: int, chip: Chip,
            dtype: str, ints: IntTensors, consts: frozenset[str], cap: int,
            fixed: frozenset[int]) -> list[OpPlan] | None:
    """``plans`` with, for every op i of ``members``, op i - ``back`` taking the plan of op
    i - 1 + ``back`` (its neighbour), costed for itself (`cost.plan_cost`); None where a copy
    needs more SRAM than ``cap``. Two ops whose operands differ trade plans only where both
    reduce (Softmax's max and its sum, which reads the max too; a LayerNorm's mean and
    variance) and the plan rotates nothing (it is then its factors alone, which mean the
    same over the same axes): a reduction's plan on an elementwise op would take the tiles
    `_match_reads` finds for it, and an elementwise op's may be aligned to a producer's
    layout (`align.py`), whose cores lie where no reduction group would."""
    trial = list(plans)
    for i in members:
        k, src = i - back, i - 1 + back
        if k in fixed:
            continue
        plan = plans[src].named(graph.ops[k].name)
        operands = graph.ops[k].operands
        if [o.axes for o in operands] != [o.axes for o in graph.ops[src].operands]:
            if any(plan.rot) or graph.ops[k].combine is None \
                    or graph.ops[src].combine is None:
                return None
            plan = dataclasses.replace(plan, rot=((),) * len(operands),
                                       chain=(1,) * len(operands))
        cycles, hot, cold, out = plan_cost(geometry(graph, graph.ops[k], plan), chip, dtype,
                                           ints, consts, plan.home)
        if hot > cap:
            return None
        trial[k] = dataclasses.replace(plan, cycles=cycles, hot_bytes_per_core=hot,
                                       cold_bytes_per_core=cold, out_bytes_per_core=out)
    return trial


def _faster(graph: Graph, trial: list[OpPlan], cost: int, cap: int, chip: Chip, dtype: str,
            ints: IntTensors, views: Views) -> tuple[list[int], int] | None:
    """A trial choice's exact re-layouts and total where every op's memory stays within
    ``cap`` and the total is below ``cost``; None otherwise (the shared-copy passes)."""
    if int(chosen_memory(views.terms(), trial).max(initial=0)) > cap:
        return None
    again = relayout_cycles(graph, trial, chip, dtype, ints, views)
    total = _total(graph, trial, again, chip, dtype, ints, views)
    return (again, total) if total < cost else None


def _alike_reads(graph: Graph, a: TensorExpr, b: TensorExpr) -> bool:
    """Whether ``a`` and ``b`` read the same activations in the same places (weights may
    differ), at least one of them."""
    if len(a.reads) != len(b.reads):
        return False
    same = False
    for x, y in zip(a.reads, b.reads):
        weights = (graph.root(x.tensor) in graph.constants, graph.root(y.tensor) in graph.constants)
        if weights == (True, True):
            continue
        if x.tensor != y.tensor:
            return False
        same = True
    return same


def _front_ids(fronts: list[list[OpPlan]]) -> list[int]:
    """Equal numbers for ops whose fronts hold the same plans (repeated layers)."""
    ids: dict[tuple, int] = {}
    return [ids.setdefault(tuple(p.unnamed for p in f), len(ids)) for f in fronts]


def _with_aligned(graph: Graph, keys: list[tuple], fronts: list[list[OpPlan]], chip: Chip,
                  dtype: str, ints: IntTensors, consts: frozenset[str],
                  search: SearchOptions) -> list[list[OpPlan]]:
    """Every op's front plus the plans aligned to its producers' (`align.py`), in
    topological order so that alignment carries along chains; repeated layers share them."""
    if not _aligns(chip, search):
        return fronts
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    fronts = list(fronts)
    table: dict[tuple, int] = {}

    def front_id(f: list[OpPlan]) -> int:
        return table.setdefault(tuple(p.unnamed for p in f), len(table))

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
        fronts[i] = fronts[i] + [p.named(op.name) for p in cache[key]]
        ids[i] = front_id(fronts[i])
    return fronts


def _edges(graph: Graph, keys: list[int], fronts: list[list[OpPlan]], chip: Chip,
           dtype: str, ints: IntTensors, views: Views) -> list[Edge]:
    """Every producer -> consumer edge with its re-layout costs; ops with equal fronts
    (``keys``, repeated layers) share them. On a chip large enough that they take long
    (`t10c.forked.jobs_for`), the distinct edges are priced in forked processes too (the
    same costs wherever they are computed), each process pricing whole producers' edges,
    whose layouts it then builds once."""
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    found: list[tuple[int, int, int, int | None]] = []  # (j, i, slot, epilogue operand)
    index: dict[tuple, int] = {}
    where = []  # (j, i, slot, distinct edge)
    for i, op in enumerate(graph.ops):
        # (slot, operand, epilogue operand): an epilogue's operands take slots past the output
        reads = [(slot, o, None) for slot, o in enumerate(op.inputs)] + \
            [(len(op.inputs) + 1 + k, o, k) for k, o in enumerate(op.extra)]
        for slot, operand, k in reads:
            j = producer.get(graph.root(operand.tensor))
            if j is None:
                continue
            direct = operand.tensor == graph.ops[j].output.tensor
            key = (keys[j], keys[i], slot, direct, graph.tensors[operand.tensor].shape,
                   views.chain(operand.tensor))
            if key not in index:
                index[key] = len(found)
                found.append((j, i, slot, k))
            where.append((j, i, slot, index[key]))

    def price(edge: tuple[int, int, int, int | None]) -> tuple[tuple[int | None, ...], ...]:
        j, i, slot, k = edge
        if k is None:
            return edge_cost(graph, j, i, slot, fronts[j], fronts[i], chip, dtype, ints, views)
        return extra_edge_cost(graph, j, i, k, fronts[j], fronts[i], chip, dtype, ints)

    jobs = forked.jobs_for(chip.cores * len(found))
    # a process prices whole producers (their layouts are built once there): the work of
    # a producer's edges, by the cores its and its consumers' plans span
    work = [sum(math.prod(p.F) for p in fronts[j]) + sum(math.prod(p.F) for p in fronts[i])
            for j, i, _, _ in found]
    by_producer: dict[int, list[int]] = {}
    for n, (j, _, _, _) in enumerate(found):
        by_producer.setdefault(keys[j], []).append(n)
    groups = list(by_producer.values())
    priced = forked.map_forked(lambda group: [price(found[n]) for n in group], groups,
                               [sum(work[n] for n in g) for g in groups], jobs)
    cost: list[tuple[tuple[int | None, ...], ...]] = [()] * len(found)
    for group, costs in zip(groups, priced):
        for n, c in zip(group, costs):
            cost[n] = c
    return [Edge(j, i, slot, cost[n]) for j, i, slot, n in where]


def replay_plan(graph: Graph, replay: Replay, chip: Chip, dtype: str,
                quantize: str | None = None) -> Plan:
    """The plan read back from plan.json, for ``graph`` (its matmul weights stored as
    ``quantize``) on ``chip``, once every op's costs and re-layouts are re-derived and agree
    (`constrain.check_replay`); raises `PlanError`."""
    ints, consts = tensor_sets(graph)
    check_replay(graph, replay, chip, dtype, ints, consts, quantize)
    return replay.plan


def check_constraints(graph: Graph, chip: Chip, constraints: tuple[Constraint, ...],
                      search: SearchOptions = SearchOptions()) -> None:
    """Refuse, before any search, constraints that name no op or ask what no plan can be
    (`constrain.check_constraint`); `plan_graph` finds the rest (no legal or fitting plan)."""
    _, consts = tensor_sets(graph)
    for op, c in zip(graph.ops, match_ops(graph, constraints)):
        if c is not None:
            check_constraint(op, c, chip, any(o.tensor in consts for o in op.inputs),
                             search.weights_home)


def search_op_constrained(graph: Graph, op: TensorExpr, chip: Chip, dtype: str, c: Constraint,
                          opts: SearchOptions = SearchOptions(), limit: int = 16
                          ) -> list[OpPlan]:
    """The front of the plans of one op of ``graph`` that obey ``c`` (as `plan_graph` puts
    it before the solver), for `t10c explain --plan`."""
    ints, consts = tensor_sets(graph)
    return constrained_front(graph, op, c, chip, dtype, opts, limit, ints, consts).front
