"""A local search over plans the fronts leave out, each move priced exactly
(`t10c compile --refine TRIALS`).

The whole-graph solve chooses among each op's Pareto front in (hot bytes, cycles) and prices
each re-layout edge on its own: on a mesh by a closed-form estimate
(`place.exchange_estimate`), on an all-to-all chip exactly per edge but not as the joint phase
of an op's inputs. Both hide plans that are faster in the end: a plan dominated in bytes and
cycles may span fewer cores, so that what it receives and what it sends travel less far; and
where the estimate is off by a different factor on different edges, the solve trades real
cycles for estimated ones. LLaMA-3-8B's decode step on wse2 shows both: the scores' matmul
over the past cache split the head dimension 128 ways (a 478-cycle reduction) to save a
broadcast the estimate put at 904 cycles and the routes at 318.

So after the solve and the passes that share copies, the chosen plans are improved op by
op, each move priced as the emulator times it:

- ops with equal fronts and equal chosen plans (repeated layers) move together, in the
  order of their cycles (own and re-layout), the costliest first;
- an op's candidates are its plans that are Pareto-optimal in hot bytes, cycles and cores
  spanned (the third measure is what the front lacks: a plan's region), within the solve's
  SRAM limit and, moved in, keeping every op's memory within it; ranked by their own
  cycles plus the estimated re-layouts from the chosen producers and to the chosen
  consumers, on a mesh from the two ops' regions as they lie (`transitions.edge_cost` with
  ``extents``, `place.relayout_estimate`): the solver's estimate put a GEMV's vector
  input 30 to 80 times above its routes where the GEMV spans many columns, so that those
  plans came last and were priced only sweeps later;
- the best `PER_GROUP` are priced exactly (`transitions.relayout_cycles`: on a mesh the
  phases routed) and the fastest move that lowers the total is kept;
- sweeps repeat until one moves nothing; a move already priced beside the same plans around
  it is not priced again.

``trials`` bounds the exact pricings of the whole pass, so the result never depends on the
machine's speed or load. (A move whose routing would need more than half of the machine's
memory, `t10c.multicast.check_pairs`, is passed over: on one machine always the same.)

By default (`trials_for`, `adaptive`) a mesh prices the costliest op's moves only, at most
`MESH_TRIALS`: there the solve's edge prices are closed-form estimates, off by 1.5x on
average and far more on some edges, and the first move priced is where most of the gain is;
the next is priced only while its estimated saving stands more than `ESTIMATE_SLACK` times
above the best saving priced (`worth_pricing`), for the ranking's own estimate can put the
faster move second. An all-to-all chip's edges are priced element by element and its moves
gain less for their cost, so it prices none unless asked. A search of tens of moves takes
minutes on the wafer (README: Meshes and tori has the figures of both)."""

from __future__ import annotations

import math

from t10c import forked
from t10c.chips import Chip
from t10c.dtypes import IntTensors
from t10c.ir import Graph

from .cpsat import Progress
from .plan import OpPlan, operand_shapes
from .search import SearchOptions, region_front
from .solve import SolverOptions, chosen_memory
from .space import op_keys, searched
from .transitions import Views, edge_cost, kept_restores, relayout_cycles

#: the exact pricings per group of ops and sweep (its best-ranked candidates)
PER_GROUP = 3
#: the most exact pricings on a mesh chip unless told (`trials_for`): the costliest group's
#: candidates, each after the first only while it may still gain (`worth_pricing`)
MESH_TRIALS = PER_GROUP
#: how far a move's estimated saving may stand above its exact one: the next candidate is
#: priced by default only where its estimate is more than this times the best saving priced
#: (`worth_pricing`)
ESTIMATE_SLACK = 2


def trials_for(solver: SolverOptions, chip: Chip) -> int:
    """The most exact pricings the search spends after ``solver``'s solve on ``chip``: as
    asked, or by default `MESH_TRIALS` on a mesh (`adaptive`), none elsewhere; none beside
    the greedy planner or on a chip with DRAM (its preload schedule is chosen after the
    plans)."""
    if solver.planner == "greedy" or chip.has_dram:
        return 0
    if not adaptive(solver):
        return solver.refine or 0
    return MESH_TRIALS if chip.is_mesh else 0


def adaptive(solver: SolverOptions) -> bool:
    """Whether the search spends its pricings as by default: the costliest group's
    candidates only, the next one while it may still gain (`worth_pricing`); an explicit
    ``--refine N`` prices N moves, sweep after sweep."""
    return solver.refine is None


def worth_pricing(estimated: int, priced: int) -> bool:
    """Whether a further candidate, ``estimated`` to save that many cycles an op, is priced
    by default when the best move priced so far saves ``priced`` cycles an op: where its
    estimate stands more than `ESTIMATE_SLACK` times above that. The ranking estimate can
    put the faster move second: on LLaMA-3-8B's decode step on wse3, down_proj's input from
    a 120 x 120 region into its plan of F = (448, 1024) was estimated at 1,252 cycles and
    routes in 2,722, into F = (224, 2048) at 1,411 and 1,909 (the first-ranked move saved
    119 cycles an op, the second 700); on wse2 the first-ranked saved 723 and the second
    was estimated to save 462, so nothing more is priced there."""
    return estimated > ESTIMATE_SLACK * max(priced, 0)


def total_cycles(graph: Graph, plans: tuple[OpPlan, ...] | list[OpPlan], relayout: list[int],
                 chip: Chip, dtype: str, ints: IntTensors, views: Views) -> int:
    """A choice's exact cycles: its plans' own, the return of the rotated copies they keep
    (`transitions.kept_restores`) and the re-layouts before the ops."""
    kept = kept_restores(graph, tuple(plans), chip, dtype, ints, views)
    return sum(p.cycles.total for p in kept) + sum(relayout)


def refine_choice(graph: Graph, chosen: tuple[OpPlan, ...], relayout: list[int], chip: Chip,
                  dtype: str, ints: IntTensors, search: SearchOptions, solver: SolverOptions,
                  views: Views, ids: list[int], fixed: frozenset[int], trials: int,
                  front_limit: int, progress: Progress | None = None
                  ) -> tuple[tuple[OpPlan, ...], list[int], tuple[int, int]]:
    """The module's search over ``chosen`` (``ids``: equal for ops with equal fronts), at most
    ``trials`` exact pricings (by default the costliest group's only: `adaptive`); ops in
    ``fixed`` (named by `--plan` constraints) keep their plans; ``progress`` hears of
    every trial ("refine"); ``front_limit`` is the search's (`space.searched`, whose results
    it reads). Returns the plans, their re-layouts, and the trials spent with the cycles
    they saved."""
    cap = solver.sram_cap(chip.sram_bytes_per_core)
    auto = adaptive(solver)
    consts = views.const_tensors()
    best = list(chosen)
    cost = start = total_cycles(graph, best, relayout, chip, dtype, ints, views)
    pools: dict[int, list[OpPlan]] = {}
    around = _around(graph)
    tried: set[tuple] = set()  # the moves routed, each with the plans around it then
    spent = 0
    moved = True
    while moved and spent < trials:  # sweeps, until one moves nothing
        moved = False
        for members in _groups(graph, best, relayout, ids, fixed):
            if spent >= trials:
                break
            i = members[0]
            if ids[i] not in pools:
                pools[ids[i]] = _candidates(graph, i, chip, dtype, ints, consts, search, cap,
                                            front_limit)
            current = best[i].unnamed
            near = tuple(best[n].unnamed for k in members for n in around[k])
            moves = []  # the candidates as moves of the whole group, within the memory limit
            for plan in pools[ids[i]]:
                if plan.unnamed == current or (tuple(members), plan, near) in tried:
                    continue
                trial = list(best)
                for k in members:
                    trial[k] = plan.named(graph.ops[k].name)
                if int(chosen_memory(views.terms(), trial).max(initial=0)) <= cap:
                    moves.append((plan, trial))
            kept = None
            ranked, here = _ranked(graph, i, moves, best, chip, dtype, ints, views)
            saved = 0  # the most a move priced in this group saves, an op
            for n, (plan, trial, estimate) in enumerate(ranked):
                if spent >= trials or (auto and n and not worth_pricing(here - estimate,
                                                                        saved)):
                    break
                tried.add((tuple(members), plan, near))
                spent += 1
                if progress:
                    progress("refine", spent, trials)
                try:  # (the move's memory was checked above)
                    again = relayout_cycles(graph, trial, chip, dtype, ints, views)
                except MemoryError:  # too many pairs to route in this machine's memory
                    continue
                total = total_cycles(graph, trial, again, chip, dtype, ints, views)
                saved = max(saved, (cost - total) // len(members))
                if total < (cost if kept is None else kept[2]):
                    kept = (trial, again, total)
            if kept is not None:
                best, relayout, cost = kept
                moved = True
            if auto and ranked:  # the costliest group with a move only
                moved = False
                break
    if progress:
        progress("refine", trials, trials)
    return tuple(best), relayout, (spent, start - cost)


def _around(graph: Graph) -> list[list[int]]:
    """Per op, the ops whose choice its move is priced beside: its producers, its consumers
    and its neighbours in the order (which may read its received copies)."""
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}
    around: list[set[int]] = [{k for k in (i - 1, i + 1) if 0 <= k < len(graph.ops)}
                              for i in range(len(graph.ops))]
    for i, op in enumerate(graph.ops):
        for operand in (*op.inputs, *op.extra):
            j = producer.get(graph.root(operand.tensor))
            if j is not None:
                around[i].add(j)
                around[j].add(i)
    return [sorted(a) for a in around]


def _groups(graph: Graph, plans: list[OpPlan], relayout: list[int], ids: list[int],
            fixed: frozenset[int]) -> list[list[int]]:
    """The ops that move together (equal fronts, equal chosen plans; none in ``fixed``), the
    costliest group first (its members' own and re-layout cycles; the earlier on a tie)."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(plans):
        if i not in fixed:
            groups.setdefault((ids[i], p.unnamed), []).append(i)
    cost = {g[0]: sum(plans[k].cycles.total + relayout[k] for k in g) for g in groups.values()}
    return sorted(groups.values(), key=lambda g: (-cost[g[0]], g[0]))


def _candidates(graph: Graph, i: int, chip: Chip, dtype: str, ints: IntTensors,
                consts: frozenset[str], search: SearchOptions, cap: int, limit: int
                ) -> list[OpPlan]:
    """Op ``i``'s plans within ``cap`` that are Pareto-optimal in hot bytes, cycles and cores
    spanned, fastest first (`search.region_front`). On a mesh they are the search's own
    (`SearchResult.region`), looked up under the first op alike, which the search was
    asked for (`space.op_keys`); on a wafer the search ran in forked processes, and working
    them out again here took 1.5 s."""
    op = graph.ops[i]
    if chip.is_mesh:
        keys = op_keys(graph)
        first = graph.ops[keys.index(keys[i])]
        found = searched(first, chip, dtype, operand_shapes(graph, first), ints, consts, search,
                         limit)
        return [p for p in found.region if p.hot_bytes_per_core <= cap]
    return region_front(op, chip, dtype, operand_shapes(graph, op), ints, consts, search, cap)


def _ranked(graph: Graph, i: int, moves: list[tuple[OpPlan, list[OpPlan]]],
            plans: list[OpPlan], chip: Chip, dtype: str, ints: IntTensors, views: Views
            ) -> tuple[list[tuple[OpPlan, list[OpPlan], int]], int]:
    """The best `PER_GROUP` of ``moves`` (an op's plan, and the choice that differs from
    ``plans`` in op ``i``'s group by it), each with its estimate, and the estimate of op
    ``i``'s plan in ``plans``: op ``i``'s own cycles plus the estimated re-layouts of its
    inputs from their producers and of its result to its consumers (an edge the solver
    would refuse, an aligned consumer's, counts nothing: the routes decide). Each move's
    estimate is its own: on a chip of wafer size they are worked out in forked processes
    (`t10c.forked`), a move a piece."""
    if not moves:
        return [], 0
    pool = [trial[i] for _, trial in moves] + [plans[i]]
    producer = {op.output.tensor: j for j, op in enumerate(graph.ops)}

    def estimated(some: list[OpPlan]) -> list[int]:
        estimate = [p.cycles.total for p in some]
        for slot, operand in enumerate(graph.ops[i].inputs):
            j = producer.get(graph.root(operand.tensor))
            if j is not None:
                row = edge_cost(graph, j, i, slot, [plans[j]], some, chip, dtype, ints, views,
                                extents=True)[0]
                estimate = [e + (c or 0) for e, c in zip(estimate, row)]
        for k, op in enumerate(graph.ops):
            for slot, operand in enumerate(op.inputs):
                if producer.get(graph.root(operand.tensor)) == i:
                    col = edge_cost(graph, i, k, slot, some, [plans[k]], chip, dtype, ints,
                                    views, extents=True)
                    estimate = [e + (c[0] or 0) for e, c in zip(estimate, col)]
        return estimate

    jobs = forked.jobs_for(chip.cores * len(pool))
    if jobs > 1:
        estimate = [e for got in forked.map_forked(lambda p: estimated([p]), pool,
                                                   [math.prod(p.F) for p in pool], jobs)
                    for e in got]
    else:
        estimate = estimated(pool)
    order = sorted(range(len(moves)), key=lambda n: (estimate[n], n))
    return [(*moves[n], estimate[n]) for n in order[:PER_GROUP]], estimate[-1]
