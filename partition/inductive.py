"""ELK's inductive schedule: on a chip with DRAM, a whole-graph choice built back from the
last op, as an alternative to the CP-SAT choice.

The solve (`solve.py`) charges every op its whole DMA time and leaves the preloads to the
schedule (`dram.schedule`), which then issues them as early as the SRAM the chosen plans leave
allows. ELK (MICRO 2025, section "inductive operator scheduling"; its artifact's
``search_optimal_exe_load_config_all``) decides the two together, from the end of the step
backwards: once the ops after op ``i`` are placed on a timeline that ends at 0 (each op's
execution window, and each DMA load's window on the one FIFO queue), op ``i`` may end as late
as the next op's start, but then every load that has started by then holds its bytes during
op ``i``; ending earlier, before the start of the ``t+1``-th pending load, holds only the first
``t`` and leaves more SRAM to op ``i``'s plan. Op ``i``'s own load, if any, ends when op
``i`` starts or when the next load starts, whichever is earlier. ELK takes the (plan, ``t``)
that lets op ``i`` start latest; its loads carry each tensor once, in a compact layout, so a
plan does not change them. Here a DMA load fills the plan's own layout (a tile on many cores
is loaded many times), so a plan's load counts too: op ``i`` takes the (plan, ``t``) that
leaves the later frontier for the ops before it, the earlier of where the cores and where the
DMA queue are then taken from (then the later start, then the fastest plan).

What is known when op ``i`` is placed: its consumers' plans (so its outgoing re-layouts are
priced exactly, and charged to it) and the loads after it. What is not: the plans of the ops
before it. Their resident bytes are therefore bounded in advance, per op: by its least (every
op chooses among its plans with the fewest resident bytes, weights streamed, as ELK streams
them) or by what another choice keeps resident there (the solver's: its residency, scheduled
around the loads); the results held at op ``i`` are counted at their producers' largest, so
that no later choice can break a placed op's SRAM budget.

The choice is one candidate among the solver's and the greedy's: `plan_graph` finishes each
the same way and keeps the one whose step the preload schedule runs fastest, so it can only
help (`SolverReport.choices` records each one's predicted step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from t10c.ir import Graph

from .plan import OpPlan
from .solve import Edge, liveness

#: the most pending loads an op may hold during its run (ELK: a layer's ops; the held bytes
#: only grow with more, so the options past the SRAM are pruned anyway)
MAX_HELD = 64


@dataclass(frozen=True)
class Inductive:
    """A choice built back from the last op: per op its plan's index in its front, and the
    step the backward timeline predicts (its own estimate; `plan_graph` times the choice
    under the preload schedule it runs)."""

    choice: tuple[int, ...]
    step_cycles: int


def inductive_choice(graph: Graph, fronts: Sequence[Sequence[OpPlan]], edges: Sequence[Edge],
                     cap: int, resident: Sequence[int] | None = None) -> Inductive | None:
    """ELK's inductive choice of one plan per op within ``cap`` bytes per core (module doc),
    or None when some op has no plan that fits beside what it must hold. Each op keeps at
    most ``resident[i]`` bytes per core resident (another choice's, say the solver's, whose
    residency it then schedules around), by default its least (every weight streamed)."""
    n = len(fronts)
    least = [min(p.cold_bytes_per_core for p in f) for f in fronts]
    budget = list(resident) if resident is not None else least
    resident_total = sum(budget)
    largest_out = [max(p.out_bytes_per_core for p in f) for f in fronts]
    terms = liveness(graph, write_back=True)
    held_results = [sum(largest_out[j] for j in (*terms.live_after[i], *terms.dying_inputs[i]))
                    for i in range(n)]
    outgoing: list[list[Edge]] = [[] for _ in range(n)]
    for e in edges:
        outgoing[e.src].append(e)
    choice = [-1] * n
    pending: list[tuple[int, int, int]] = []  # (bytes, load start, load end), in op order
    start = 0  # where the ops placed so far begin (the step ends at 0)
    for i in range(n - 1, -1, -1):
        front = fronts[i]
        cycles = np.array([p.cycles.total for p in front], dtype=np.float64)
        for e in outgoing[i]:
            column = [row[choice[e.dst]] for row in e.cost]
            cycles += np.array([math.inf if c is None else c for c in column])
        work = np.array([p.hot_bytes_per_core - p.cold_bytes_per_core for p in front])
        loads = np.array([p.dram_cycles for p in front], dtype=np.float64)
        usable = (np.array([p.cold_bytes_per_core for p in front]) <= budget[i]) & \
            np.isfinite(cycles)
        free = cap - resident_total - held_results[i]
        queue = pending[0][1] if pending else 0  # where the loads placed so far begin
        best: tuple[float, float, int] | None = None  # (earlier frontier, op start, plan)
        held = 0
        for t in range(min(len(pending), MAX_HELD) + 1):
            end = start if t == len(pending) else min(start, pending[t][1])
            fits = usable & (work + held <= free)
            if fits.any():
                begin = end - cycles
                frontier = np.minimum(begin, np.where(loads > 0, np.minimum(begin, queue) - loads,
                                                      queue))
                score = np.where(fits, frontier, -math.inf)
                top = np.flatnonzero(score == score.max())
                a = int(top[np.argmax(begin[top])])  # then the latest start, then the first
                if best is None or (frontier[a], begin[a]) > best[:2]:
                    best = (frontier[a], begin[a], a)
            if t == len(pending) or pending[t][1] >= start:
                break  # holding more loads cannot let the op end later
            held += pending[t][0]
        if best is None:
            return None
        start = int(best[1])
        choice[i] = best[2]
        plan = front[best[2]]
        if plan.dram_cycles:
            load_end = min(start, queue) if pending else start
            pending.insert(0, (plan.dram_bytes_per_core, load_end - plan.dram_cycles, load_end))
    first = min([start, *(s for _, s, _ in pending[:1])])
    return Inductive(tuple(choice), -first)


__all__ = ["Inductive", "MAX_HELD", "inductive_choice"]
