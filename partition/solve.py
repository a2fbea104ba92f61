"""Whole-graph plan choice: T10's greedy memory reconciliation, and an exact CP-SAT model.

Both choose one plan per op from its Pareto front so that the SRAM of every core suffices at
every point of the schedule, minimising the total predicted cycles. The formulation (the CP-SAT
model is built by `build_model`, solved by `solve_model` and decoded by `decode`):

- variables: ``x[i, p]`` is 1 when op ``i`` runs plan ``p`` of its front.
- (C1) one plan per op: ``sum_p x[i, p] = 1``.
- (C2) memory at op ``i``, for every core (the SPMD program has one layout for all cores):
  ``sum_j cold_j + (hot_i - cold_i) + sum_{j live after i} out_j + sum_{j feeds i last} out_j
  <= SRAM - reserve``, where each term is ``sum_p bytes_jp * x[j, p]``: the weights of every
  op stay resident (no off-chip memory); the running op needs its hot buffers beyond its
  weights; activations produced before ``i`` and read after it stay where their producer left
  them; and while ``i`` re-lays out its inputs, the producers whose last reader is ``i`` are
  still there. (This bounds both the exchange phase and, with fewer terms, the compute phase.)
- (C3) transitions: for every edge ``e`` from producer ``j`` to consumer ``i`` whose re-layout
  cost depends on the pair of plans, booleans ``y[e, p, q]`` mark the pair in use:
  ``sum_q y[e, p, q] = x[j, p]`` and ``sum_p y[e, p, q] = x[i, q]`` (the tight, "marginal"
  linearisation of ``x[j, p] * x[i, q]``, whose relaxation already prices most edges right).
  A pair the edge does not allow (a plan aligned to one producer layout beside another, cost
  None) gets no variable, so the marginals forbid it: ``x[i, q] <= sum of x[j, p]`` over the
  producer plans it allows.
- objective: ``sum_{i, p} cycles_ip * x[i, p] + sum_{e, p, q} r_epq * y[e, p, q]``.

Repeated layers: ops of one tie class (`tie.py`) within one group of consecutive copies of
the layer (`tie.grouped`) first share their choice variables, in a reduced model solved within
`TIED_SHARE` of the limit. Its choice is one of the full model (every op untied); the full
model's LP relaxation (`cpsat.lp_bound`) bounds it, and where that does not prove it within the
gap, the full model is polished from it (docs/planner.md, "Repeated layers").

The greedy starts from every op's fastest plan and, while some op's memory (C2) is exceeded,
moves one op contributing there to its next smaller plan, the one that adds the fewest cycles
per byte saved. Its choice is the solver's hint, and a solver result worse than it (possible
only when the time limit stops the search early) is replaced by it, so CP-SAT never returns a
worse plan. Solves are deterministic: one worker and a fixed seed unless asked otherwise, and
a time limit; on timeout the best plan so far is used (status FEASIBLE, with the gap to the
bound).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from t10c.ir import Graph

from . import cpsat
from .cpsat import Progress
from .dram import store_waits
from .plan import OpPlan
from .tie import grouped, tie_classes

#: the objective of a choice that uses a pair of plans an edge does not allow
FORBIDDEN = 2 ** 62
#: the share of the deterministic limit the reduced model (`tie.grouped`) may use before the
#: full one
TIED_SHARE = 0.25
#: the reduced model is solved to this share of the relative gap: it is small, and the full
#: model's search is skipped when its choice is proven (bert-base: 435,826 cycles at a tenth
#: of the gap, 436,060 at the gap, against the full model's 436,008 at the gap)
REDUCED_GAP = 0.1
#: the full model is searched after the reduced one only when its LP bound is further than
#: this many times the relative gap below the reduced optimum (docs/planner.md, "Repeated
#: layers")
POLISH_ABOVE = 10


@dataclass(frozen=True)
class SolverOptions:
    """How the whole-graph choice is made (`choose_plans`)."""

    #: CP-SAT's deterministic time limit (work units, about seconds on an idle machine); the
    #: only limit of the solve, so the plan does not depend on the machine's load
    time_limit_s: float = 30.0
    workers: int = 1
    seed: int = 0
    reserve_fraction: float = 0.05  # SRAM kept free for the allocator's fragmentation
    #: stop once the objective is proven within this fraction of the optimum (CP-SAT then
    #: reports OPTIMAL; the plan records the remaining gap)
    relative_gap: float = 0.001
    planner: str = "cp-sat"  # or "greedy"
    #: on a chip with DRAM, which whole-graph choice to keep (`partition._best_streamed`):
    #: "best" (the fastest under the preload schedule), or one of `CHOICES` by name, to
    #: compile and time it as a baseline
    choice: str = "best"

    def sram_cap(self, sram_bytes: int, margin: int = 1) -> int:
        """The bytes per core a choice may use of ``sram_bytes``: all but ``margin`` times
        the reserve."""
        return int(sram_bytes * (1 - margin * self.reserve_fraction))
    #: end a solve once its search stalls (`solve_in_chunks`), before the limit; False
    #: searches the whole limit
    early_stop: bool = True
    #: exact pricings of the local search after the solve (`refine.py`); 0 for none, None
    #: for the chip's default (`refine.trials_for`: one on a mesh, none elsewhere)
    refine: int | None = None


#: the whole-graph choices compared on a chip with DRAM (`partition._best_streamed`), by
#: name, and what each is: the solver's, the greedy's and ELK's inductive ones
#: (`inductive.inductive_choice`)
CHOICES = {
    "solver": "the solver's",
    "greedy": "the greedy's (T10's reconciliation)",
    "inductive": "ELK's inductive (built back from the last op, weights streamed)",
    "inductive-resident": "ELK's inductive with the solver's resident weights",
    "inductive-resident-2": "the same built within twice the SRAM reserve",
}


@dataclass(frozen=True)
class SolverResult:
    choice: tuple[int, ...]  # index into each op's front
    status: str
    objective_cycles: int
    bound_cycles: int
    wall_s: float
    greedy_objective_cycles: int | None
    #: CP-SAT's deterministic time spent on this choice (0 for the greedy and a look-up)
    deterministic_s: float = 0.0
    #: which models made the choice (`_choose`): "full model", "grouped layers, ..."
    method: str = ""
    #: the greedy's choice (T10's memory reconciliation), None where it found none
    greedy_choice: tuple[int, ...] | None = None


@dataclass(frozen=True)
class MemoryTerms:
    """Which producers' outputs are in SRAM at each op, from the graph's liveness."""

    live_after: tuple[tuple[int, ...], ...]  # produced before op i, read after it
    dying_inputs: tuple[tuple[int, ...], ...]  # producers whose last reader is op i


@dataclass(frozen=True)
class Edge:
    """Producer op ``src`` feeds input ``slot`` of consumer op ``dst``; ``cost[p][q]`` is the
    re-layout cycles from producer plan p to consumer plan q (None: the pair is not allowed)."""

    src: int
    dst: int
    slot: int
    cost: tuple[tuple[int | None, ...], ...]


def liveness(graph: Graph, write_back: bool = False) -> MemoryTerms:
    """Which results are in SRAM at each op: a result from its producer to its last reader,
    a graph output to the end, or with ``write_back`` (chips with DRAM) until its DMA
    store is waited for (`dram.store_waits`). Once per graph (the last few kept: the passes
    after the solve time hundreds of trial choices of one graph)."""
    key = (id(graph), write_back)
    known = _LIVENESS.get(key)
    if known is not None and known[0] is graph:
        return known[1]
    terms = _liveness(graph, write_back)
    if len(_LIVENESS) >= 8:
        _LIVENESS.clear()
    _LIVENESS[key] = (graph, terms)  # the graph held, so that its id is not reused
    return terms


#: `liveness` of the graphs planned last, by (id, write_back)
_LIVENESS: dict[tuple[int, bool], tuple[Graph, MemoryTerms]] = {}


def _liveness(graph: Graph, write_back: bool) -> MemoryTerms:
    producer = {op.output.tensor: i for i, op in enumerate(graph.ops)}
    last_use: dict[int, int] = {}
    inputs_of: list[tuple[int, ...]] = []
    for i, op in enumerate(graph.ops):
        prods = sorted({producer[graph.root(o.tensor)] for o in op.reads
                        if graph.root(o.tensor) in producer})
        inputs_of.append(tuple(prods))
        for p in prods:
            last_use[p] = i
    if write_back:
        last_use.update(store_waits(graph))
    else:
        for t in graph.outputs:
            root = graph.root(graph.written(t))
            if root in producer:
                last_use[producer[root]] = len(graph.ops)
    n = len(graph.ops)
    live: list[list[int]] = [[] for _ in range(n)]
    for p, last in sorted(last_use.items()):  # each op's producers in ascending order
        for i in range(p + 1, min(last, n)):
            live[i].append(p)
    dying = [tuple(p for p in inputs_of[i] if last_use.get(p) == i) for i in range(n)]
    return MemoryTerms(tuple(map(tuple, live)), tuple(dying))


class _Arrays:
    """Per-op front figures as arrays, for the greedy and for checking a choice."""

    def __init__(self, fronts: list[list[OpPlan]], relayout_in: list[list[int]]) -> None:
        self.cold = [np.array([p.cold_bytes_per_core for p in f], dtype=np.int64) for f in fronts]
        self.extra = [np.array([p.hot_bytes_per_core - p.cold_bytes_per_core for p in f],
                               dtype=np.int64) for f in fronts]
        self.out = [np.array([p.out_bytes_per_core for p in f], dtype=np.int64) for f in fronts]
        self.cycles = [np.array([p.cycles.total for p in f], dtype=np.int64) + np.array(r)
                       for f, r in zip(fronts, relayout_in)]


def live_matrix(terms: MemoryTerms) -> np.ndarray:
    """``L[i, j] = 1`` when op j's output is in SRAM while op i runs (C2's activation terms)."""
    n = len(terms.live_after)
    live = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        live[i, list(terms.live_after[i]) + list(terms.dying_inputs[i])] = 1
    return live


def chosen_memory(terms: MemoryTerms, plans: tuple[OpPlan, ...] | list[OpPlan]) -> np.ndarray:
    """`memory_use` at every op for a choice made: one plan per op."""
    return memory_use(terms, _Arrays([[p] for p in plans], [[0] for _ in plans]),
                      [0] * len(plans))


def memory_use(terms: MemoryTerms, arrays: _Arrays, choice: list[int] | tuple[int, ...],
               live: np.ndarray | None = None) -> np.ndarray:
    """(C2)'s left-hand side at every op for one choice of plans (``live``: `live_matrix`
    of ``terms``, when the caller already has it)."""
    cold = np.array([a[k] for a, k in zip(arrays.cold, choice)], dtype=np.int64)
    extra = np.array([a[k] for a, k in zip(arrays.extra, choice)], dtype=np.int64)
    out = np.array([a[k] for a, k in zip(arrays.out, choice)], dtype=np.int64)
    if live is None:
        live = live_matrix(terms)
    return cold.sum() + extra + live @ out


def greedy(terms: MemoryTerms, arrays: _Arrays, cap: int, base: list[int] | None = None,
           start: Sequence[int] | None = None) -> list[int] | None:
    """T10-style memory reconciliation: fastest plans first (or the plans of ``start``), then
    shrink where memory runs out, always taking the move (any later plan of any op that holds
    bytes there) that costs the fewest cycles per byte saved (ties: the first op, then its
    first such plan)."""
    n = len(arrays.cold)
    choice = list(start) if start is not None else [0] * n
    # the greedy walks each op's front (the first ``base[i]`` plans, fastest first); variants
    # appended after it (weights warmed up) are left to the solver
    end = base if base is not None else [len(c) for c in arrays.cold]
    live = live_matrix(terms)
    # an op's best move depends on the over-full op only through which of its byte kinds
    # count there (its weights always; its working bytes when it is the op; its output when
    # that is live there): the three best moves of every op are kept, and only the moved
    # op's are recomputed, so a step costs one pass over the ops in numpy
    moves = np.full((3, n), np.inf)
    target = np.zeros((3, n), dtype=np.int64)

    def rescore(j: int) -> None:
        k, stop = choice[j], end[j]
        moves[:, j] = np.inf
        if k >= stop - 1:
            return
        cold = arrays.cold[j][k] - arrays.cold[j][k + 1:stop]
        added = np.maximum(arrays.cycles[j][k + 1:stop] - arrays.cycles[j][k], 0)
        for case, saved in enumerate((cold, cold + arrays.extra[j][k] - arrays.extra[j][k + 1:stop],
                                      cold + arrays.out[j][k] - arrays.out[j][k + 1:stop])):
            useful = saved > 0
            if useful.any():
                score = np.where(useful, added / np.maximum(saved, 1), np.inf)
                m = int(np.argmin(score))
                moves[case, j], target[case, j] = score[m], k + 1 + m

    for j in range(n):
        rescore(j)
    use = memory_use(terms, arrays, choice, live)
    every = np.arange(n)
    while True:
        over = np.flatnonzero(use > cap)
        if not len(over):
            return choice
        i = int(over[np.argmax(use[over])])
        case = np.where(live[i] > 0, 2, 0)
        case[i] = 1
        scores = moves[case, every]
        j = int(np.argmin(scores))
        if not np.isfinite(scores[j]):
            return None
        k, choice[j] = choice[j], int(target[case[j], j])
        # (C2)'s left-hand side moves by the op's own bytes: exact integers, as recomputed
        use += arrays.cold[j][choice[j]] - arrays.cold[j][k]
        use[j] += arrays.extra[j][choice[j]] - arrays.extra[j][k]
        use += live[:, j] * (arrays.out[j][choice[j]] - arrays.out[j][k])
        rescore(j)


def objective(arrays: _Arrays, edges: list[Edge], choice: list[int] | tuple[int, ...]) -> int:
    total = sum(int(a[k]) for a, k in zip(arrays.cycles, choice))
    pairs = [e.cost[choice[e.src]][choice[e.dst]] for e in edges]
    if any(r is None for r in pairs):
        return FORBIDDEN
    return total + sum(r for r in pairs if r is not None)


def _classes(vectors: list[tuple[int | None, ...]]) -> list[list[int]]:
    """Indices grouped by equal vectors, in order of first appearance."""
    groups: dict[tuple[int | None, ...], list[int]] = {}
    for k, v in enumerate(vectors):
        groups.setdefault(tuple(v), []).append(k)
    return list(groups.values())


class _Choice:
    """The choice variables of a model: ``x[c][p]`` is 1 when the ops of tie class ``c``
    (`tie.py`; one op per class in the full model) run plan ``p`` of their front, and linear
    terms over them gathered as coefficients (so that a class's many ops make one term)."""

    def __init__(self, model: cp_model.CpModel, fronts: list[list[OpPlan]],
                 tie: Sequence[int]) -> None:
        self.tie = list(tie)
        first: dict[int, int] = {}
        for i, c in enumerate(self.tie):
            first.setdefault(c, i)
        self.x = {c: [model.new_bool_var(f"x[{c},{p}]") for p in range(len(fronts[i]))]
                  for c, i in first.items()}
        # (C1) one plan per op
        for xs in self.x.values():
            model.add_exactly_one(xs)

    def add(self, into: dict[tuple[int, int], int], values: np.ndarray, i: int,
            times: int = 1) -> None:
        """Add ``times * sum_p values[p] * x[i, p]`` to the coefficients ``into``."""
        c = self.tie[i]
        for k, v in enumerate(values):
            if v:
                into[c, k] = into.get((c, k), 0) + times * int(v)

    def expr(self, coeffs: dict[tuple[int, int], int]) -> Any:
        """The linear expression of gathered coefficients."""
        keys = sorted(coeffs)
        return cp_model.LinearExpr.weighted_sum([self.x[c][k] for c, k in keys],
                                                [coeffs[key] for key in keys])

    def term(self, values: np.ndarray, i: int) -> Any:
        """``sum_p values[p] * x[i, p]``."""
        coeffs: dict[tuple[int, int], int] = {}
        self.add(coeffs, values, i)
        return self.expr(coeffs)

    def picked(self, choice: Sequence[int]) -> dict[int, int]:
        """A per-op choice as one plan per class (each class takes its first op's plan)."""
        plans: dict[int, int] = {}
        for i, k in enumerate(choice):
            plans.setdefault(self.tie[i], k)
        return plans

    def hint(self, model: cp_model.CpModel, choice: Sequence[int]) -> None:
        """Hint a per-op choice (each class takes its first op's plan)."""
        for c, k in self.picked(choice).items():
            for kk, var in enumerate(self.x[c]):
                model.add_hint(var, kk == k)

    def decode(self, solver: cp_model.CpSolver) -> tuple[int, ...]:
        picked = {c: next(k for k, v in enumerate(xs) if solver.value(v))
                  for c, xs in self.x.items()}
        return tuple(picked[c] for c in self.tie)


def _memory(model: cp_model.CpModel, x: _Choice, terms: MemoryTerms, arrays: _Arrays,
            top: int) -> tuple[Any, list[Any]]:
    """(C2)'s two parts: the resident bytes of every op, as one variable (so that each op's
    constraint stays short), and per distinct op the running op's working bytes plus the
    live activations (tied layers repeat the same expression: it is given once)."""
    resident = model.new_int_var(0, top, "resident")
    cold: dict[tuple[int, int], int] = {}
    for i in range(len(arrays.cold)):
        x.add(cold, arrays.cold[i], i)
    model.add(resident == x.expr(cold))
    working, stated = [], set()
    for i in range(len(arrays.cold)):
        at: dict[tuple[int, int], int] = {}
        x.add(at, arrays.extra[i], i)
        for j in (*terms.live_after[i], *terms.dying_inputs[i]):
            x.add(at, arrays.out[j], j)
        key = frozenset(at.items())
        if key not in stated:
            stated.add(key)
            working.append(x.expr(at))
    return resident, working


def build_model(terms: MemoryTerms, fronts: list[list[OpPlan]], arrays: _Arrays,
                edges: list[Edge], cap: int, hint: Sequence[int] | None,
                tie: Sequence[int] | None = None) -> tuple[cp_model.CpModel, _Choice]:
    """The CP-SAT model of (C1)-(C3) and the objective; with ``tie`` (a class per op,
    `tie.py`) the ops of a class share their choice, their equal edges share their pair
    variables and equal memory constraints are stated once."""
    model = cp_model.CpModel()
    x = _Choice(model, fronts, tie if tie is not None else range(len(fronts)))
    # (C2) resident weights + the running op + live activations fit the SRAM at every op
    resident, working = _memory(model, x, terms, arrays, cap)
    for w in working:
        model.add(resident + w <= cap)
    hinted = x.picked(hint) if hint is not None else None
    # (C3) re-layout between a producer's plan and its consumer's, over classes of plans
    # with the same costs on this edge (a plan and its warm-up twin have the same layout):
    # the same marginal linearisation, with fewer pairs; edges between the same tie classes
    # with the same costs share their pair variables, their cost counted once per edge
    objective: dict[tuple[int, int], int] = {}
    for i in range(len(fronts)):
        x.add(objective, arrays.cycles[i], i)
    shared: dict[tuple, int] = {}
    alike: list[Edge] = []
    for e in edges:
        if all(r == 0 for row in e.cost for r in row):
            continue
        key = (x.tie[e.src], x.tie[e.dst], e.cost)
        if key not in shared:
            shared[key] = 0
            alike.append(e)
        shared[key] += 1
    pair_vars: list[Any] = []
    pair_costs: list[int] = []
    for n, e in enumerate(alike):
        rows = _classes(list(e.cost))
        cols = _classes(list(zip(*e.cost)))
        # cost[p][q] is the same for every p of a row class and q of a column class; no
        # variable for a pair that is not allowed (None): the marginals then forbid it
        pair = [[e.cost[r[0]][c[0]] for c in cols] for r in rows]
        y: list[list[Any]] = [[model.new_bool_var(f"y[{n},{a},{b}]") if r is not None else None
                               for b, r in enumerate(row)] for a, row in enumerate(pair)]
        src, dst = x.x[x.tie[e.src]], x.x[x.tie[e.dst]]
        for a, members in enumerate(rows):
            model.add(sum(v for v in y[a] if v is not None) == sum(src[p] for p in members))
        for b, members in enumerate(cols):
            model.add(sum(y[a][b] for a in range(len(rows)) if y[a][b] is not None)
                      == sum(dst[q] for q in members))
        if hinted is not None:  # the pair the hint uses: a complete hint is a solution
            a_h = next(a for a, m in enumerate(rows) if hinted[x.tie[e.src]] in m)
            b_h = next(b for b, m in enumerate(cols) if hinted[x.tie[e.dst]] in m)
            for a, row_vars in enumerate(y):
                for b, v in enumerate(row_vars):
                    if v is not None:
                        model.add_hint(v, a == a_h and b == b_h)
        times = shared[x.tie[e.src], x.tie[e.dst], e.cost]
        for a, row in enumerate(pair):
            for b, r in enumerate(row):
                if r:
                    pair_vars.append(y[a][b])
                    pair_costs.append(times * r)
    model.minimize(x.expr(objective) + cp_model.LinearExpr.weighted_sum(pair_vars, pair_costs))
    if hint is not None and hinted is not None:
        x.hint(model, hint)
        model.add_hint(resident, sum(int(arrays.cold[i][hinted[c]]) for i, c in enumerate(x.tie)))
    return model, x


def solve_model(model: cp_model.CpModel, opts: SolverOptions,
                progress: Progress | None = None
                ) -> tuple[cp_model.CpSolver, cp_model.CpSolverStatus]:
    """Solve under CP-SAT's deterministic time limit alone (`cpsat.py` says why), reporting
    progress as ``"solve"``; Ctrl-C raises ``KeyboardInterrupt``."""
    solver = cp_model.CpSolver()
    cpsat.configure(solver, opts.time_limit_s, opts.workers, opts.seed)
    solver.parameters.relative_gap_limit = opts.relative_gap
    status = cpsat.run(solver, model, progress, "solve")
    return solver, status


#: a solve runs in chunks of deterministic time, the first this long and each next one twice
#: the last, within the limit: a chunk whose second half found no better choice has stalled,
#: and the solve ends after it. The chunk after the first starts from the best choice so far
#: (hinted; it is found at once). On the tight-SRAM points of a bert-base sweep (448 KiB per
#: core, 1 B/cycle links) the reduced model's last gain came 0.73 of its 7.5 deterministic
#: seconds in; it then searched for 20 s of CPU time more without one.
CHUNK_S = 2.0


#: how a solve that ended early says so in its method (deterministic seconds used, limit)
_STALLED = " (stalled after {:.1f} of {:.1f} deterministic s)"


@dataclass(frozen=True)
class Chunked:
    """What `solve_in_chunks` found: the best choice (None if none), CP-SAT's status of the
    whole (``OPTIMAL`` if a chunk proved one), the deterministic seconds used and the best
    bound any chunk proved."""

    choice: tuple[int, ...] | None
    status: str
    used: float
    bound: int
    #: ended because the search stalled, before the limit
    stalled: bool = False


def solve_in_chunks(build: Callable[[Sequence[int] | None], tuple[cp_model.CpModel, Any]],
                    hint: Sequence[int] | None, opts: SolverOptions,
                    value: Callable[[tuple[int, ...]], int], progress: Progress | None,
                    offset: int, whole: int, last: bool) -> Chunked:
    """Solve the model ``build(hint)`` makes within ``opts``' deterministic limit, in chunks
    (`CHUNK_S`) that stop once the search stalls; each chunk after the first is built hinted
    with the best choice so far (``value`` ranks choices). Progress is shown from ``offset``
    of ``whole`` (thousandths of a deterministic second), the display's end only if ``last``.
    Deterministic: the chunks' limits and the stall test read deterministic time alone."""
    limit, used = opts.time_limit_s, 0.0
    best: tuple[int, ...] | None = None
    # cycles are never negative. Without early stops, or without a choice to start from
    # (the greedy found none: the first solution may take most of the limit, and a chunk
    # that ends before it would throw that search away), the limit is one chunk
    bound = 0
    chunk = min(CHUNK_S, limit) if opts.early_stop and hint is not None else limit
    status, stalled = "UNKNOWN", False
    while True:
        model, x = build(hint)
        solver = cp_model.CpSolver()
        cpsat.configure(solver, chunk, opts.workers, opts.seed)
        solver.parameters.relative_gap_limit = opts.relative_gap
        watch = cpsat.Watch()
        got = cpsat.run(solver, model, _window(progress, offset + int(used * 1000), whole,
                                               False), "solve", watch)
        spent = float(solver.deterministic_time)
        used += spent
        if got in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
            bound = max(bound, int(round(solver.best_objective_bound)))
        if got not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if best is None:  # nothing found (or proven infeasible) in the first chunk
                status = solver.status_name(got)
                if got == cp_model.UNKNOWN and limit - used >= CHUNK_S / 2:
                    chunk = limit - used  # not even the hint within a chunk: the rest
                    continue
            break
        found = x.decode(solver)
        if best is None or value(found) < value(best):
            best = found
        if got == cp_model.OPTIMAL:
            status = "OPTIMAL"
            break
        status = "FEASIBLE"
        if limit - used < CHUNK_S / 2:
            break  # the limit is spent
        if watch.det_time < spent / 2:
            stalled = True
            break
        hint = best
        chunk = min(2 * chunk, limit - used)
    if progress and last:
        progress("solve", whole, whole)
    return Chunked(best, status, used, bound, stalled)


def _window(progress: Progress | None, offset: int, whole: int, last: bool
            ) -> Progress | None:
    """A solve's progress shown as the part of one display that starts at ``offset`` of
    ``whole`` (thousandths of a deterministic second): the tied solve, then the full one.
    Only the ``last`` solve's end is the display's end; the tied solve's end (at its limit,
    past the time it used) is not shown, so the display never goes back."""
    if progress is None:
        return None
    shown = progress

    def report(stage: str, done: int, total: int) -> None:
        if done >= total:
            if last:
                shown(stage, whole, whole)
            return
        shown(stage, min(offset + done, whole - 1), whole)
    return report


def choose_plans(graph: Graph, fronts: list[list[OpPlan]], relayout_in: list[list[int]],
                 edges: list[Edge], sram_bytes: int, opts: SolverOptions,
                 progress: Progress | None = None,
                 starts: Sequence[tuple[int, ...]] = (), write_back: bool = False,
                 cutoff: int | None = None, more_starts: MoreStarts | None = None,
                 prepare: Callable[[], None] | None = None,
                 prepared: Relaxed | None = None) -> tuple[SolverResult | None, str]:
    """Choose one plan per op; returns the result (None when nothing fits) and the status
    (``write_back``: graph outputs leave SRAM when stored to DRAM, `liveness`).

    ``starts`` are known choices (the baselines' own, mapped into these fronts): the best of
    them and the greedy's is CP-SAT's hint, and the result is never worse than any of them.
    Where ops tie (repeated layers, `tie.py`), the reduced model (`tie.grouped`) is solved
    first, within a share of the deterministic limit; the full model's LP bounds its choice,
    and the full model is searched, with the rest of the limit, only where that bound is not
    close (`POLISH_ABOVE`).

    ``more_starts`` gives starts late, as a function of the best objective known once the
    LP's rounding is (None before any: every start is then wanted). Starts whose objective
    is above that can neither be the result nor a hint (a hint is the best known choice), so
    it need not find them: it passes the bound on as ``cutoff`` to the solves that make them,
    and a solve whose full model's LP bound is above its ``cutoff`` stops there, as if
    nothing fitted (status `CUT_OFF`). The late starts take the place the same ``starts``
    would have taken, so the choice is the same as with them given up front.

    ``prepare`` is called while GLOP solves the full model's LP in its own thread: the late
    starts' solves build and relax their models then (`relaxed_model`), each handed back as
    ``prepared`` (the full model, its variables and its relaxation), which the solve then
    does not build again. The same models, the same LPs: only the wall time differs."""
    start = time.perf_counter()
    terms = liveness(graph, write_back)
    if more_starts is not None:  # (late starts are not part of a look-up key)
        return _choose(terms, fronts, relayout_in, edges, sram_bytes, opts, progress, starts,
                       start, more_starts=more_starts, prepare=prepare, prepared=prepared)
    key = _solved_key(terms, fronts, relayout_in, edges, sram_bytes, opts, starts)
    if key in _SOLVED:  # the same model again (a baseline's, solved inside t10's compile)
        if progress:  # shown as a solve that ends at once
            whole = 1 if opts.planner == "greedy" else max(int(opts.time_limit_s * 1000), 1)
            progress("solve", 0, whole)
            progress("solve", whole, whole)
        result, name = _SOLVED[key]
        wall = time.perf_counter() - start
        if result is None:
            return None, name
        return dataclasses.replace(result, wall_s=wall, deterministic_s=0.0), name
    got = _choose(terms, fronts, relayout_in, edges, sram_bytes, opts, progress, starts, start,
                  cutoff, prepare=prepare, prepared=prepared)
    if got[1] != CUT_OFF:  # (a cut-off solve is not this model's answer)
        if len(_SOLVED) >= _SOLVED_LIMIT:
            _SOLVED.clear()
        _SOLVED[key] = got
    return got


#: `choose_plans`' status where the full model's LP bound is above the ``cutoff`` it was given
CUT_OFF = "CUT_OFF"
#: late starts (`choose_plans`' ``more_starts``): given the best objective known (or None),
#: the known choices that may be below it
MoreStarts = Callable[[int | None], Sequence[tuple[int, ...]]]


def _solved_key(terms: MemoryTerms, fronts: list[list[OpPlan]], relayout_in: list[list[int]],
                edges: list[Edge], sram_bytes: int, opts: SolverOptions,
                starts: Sequence[tuple[int, ...]]) -> tuple:
    """Everything a solve's choice depends on (`_SOLVED`'s key)."""
    return (terms, tuple(map(tuple, fronts)), tuple(map(tuple, relayout_in)), tuple(edges),
            sram_bytes, opts, tuple(map(tuple, starts)))


def _tie(fronts: list[list[OpPlan]], arrays: _Arrays, edges: list[Edge]) -> list[int]:
    """The ops' tie classes (`tie.tie_classes`): repeated layers share one."""
    return tie_classes(fronts, [a.tolist() for a in arrays.cycles],
                       [(e.src, e.dst, e.slot, e.cost) for e in edges])


#: a full model built, its variables, and its LP relaxation solved (`relaxed_model`)
Relaxed = tuple[cp_model.CpModel, "_Choice", "cpsat.Relaxation | None"]


def relaxed_model(graph: Graph, fronts: list[list[OpPlan]], relayout_in: list[list[int]],
                  edges: list[Edge], sram_bytes: int, opts: SolverOptions,
                  write_back: bool = False) -> Relaxed | None:
    """The full model that `choose_plans` with these arguments (and no starts) builds and
    relaxes first, built and relaxed now, to be handed to it as ``prepared``; None where it
    would build none (no repeated layers, the greedy planner) or would look its answer up."""
    if opts.planner == "greedy":
        return None
    terms = liveness(graph, write_back)
    if _solved_key(terms, fronts, relayout_in, edges, sram_bytes, opts, ()) in _SOLVED:
        return None
    arrays = _Arrays(fronts, relayout_in)
    tie = _tie(fronts, arrays, edges)
    if len(set(tie)) == len(tie):
        return None
    model, x = build_model(terms, fronts, arrays, edges, opts.sram_cap(sram_bytes), None)
    return model, x, cpsat.relax(model)


#: whole-graph choices made in this process, by everything the choice depends on: a t10
#: compile solves each baseline's own model (`partition.plan_graph`), and `t10c bench`,
#: `compare` and `sweep` then compile those baselines; a solve is deterministic (its only
#: limit is deterministic time), so a repeat is a look-up that gives the same choice
_SOLVED: dict[tuple, tuple[SolverResult | None, str]] = {}
_SOLVED_LIMIT = 16


def _choose(terms: MemoryTerms, fronts: list[list[OpPlan]], relayout_in: list[list[int]],
            edges: list[Edge], sram_bytes: int, opts: SolverOptions, progress: Progress | None,
            starts: Sequence[tuple[int, ...]], start: float, cutoff: int | None = None,
            more_starts: MoreStarts | None = None, prepare: Callable[[], None] | None = None,
            prepared: Relaxed | None = None) -> tuple[SolverResult | None, str]:
    """`choose_plans` without its memory of earlier solves."""
    arrays = _Arrays(fronts, relayout_in)
    cap = opts.sram_cap(sram_bytes)
    # the greedy walks each op's own front: neither warm-up twins nor aligned plans
    base = [sum(p.aligned < 0 and (not p.home or all(r.home for r in f)) for p in f)
            for f in fronts]
    warm = greedy(terms, arrays, cap, base)
    if warm is None and any(len(f) > b for f, b in zip(fronts, base)) \
            and all(p.aligned < 0 for f in fronts for p in f):
        # the fronts alone do not fit: every variant too (the twins whose weights stream
        # from DRAM come after the front; without a start CP-SAT's first solution took more
        # than 10 deterministic seconds on llama-135m-decode on wormhole-n150)
        warm = greedy(terms, arrays, cap)
    warm_obj = objective(arrays, edges, warm) if warm is not None else None
    greedy_choice = tuple(warm) if warm is not None else None
    known = [greedy_choice] if greedy_choice is not None else []

    def add_starts(given: Sequence[tuple[int, ...]]) -> None:
        # after the greedy's choice, before any other (the first of equal ones is kept)
        at = 1 if greedy_choice is not None else 0
        # a start chosen under the same memory terms fits here too; checked, not assumed
        known[at:at] = [tuple(s) for s in given if (memory_use(terms, arrays, s) <= cap).all()]

    def best_known() -> tuple[tuple[int, ...] | None, int | None]:
        if not known:
            return None, None
        c = min(known, key=lambda c: objective(arrays, edges, c))
        return c, objective(arrays, edges, c)

    add_starts(starts)
    if more_starts is not None and opts.planner == "greedy":
        add_starts(more_starts(None))
    best, best_obj = best_known()
    if opts.planner == "greedy":
        if progress:  # the greedy is the whole choice: it starts and ends at once
            progress("solve", 1, 1)
        if best is None or best_obj is None:
            return None, "INFEASIBLE"
        return SolverResult(best, "FEASIBLE", best_obj, 0, time.perf_counter() - start,
                            warm_obj, greedy_choice=greedy_choice), "FEASIBLE"
    whole = max(int(opts.time_limit_s * 1000), 1)
    used = 0.0
    tie = _tie(fronts, arrays, edges)
    repeats = len(set(tie)) < len(tie)
    # the full model's LP bounds every choice (a reduced model's bound does not): a known
    # choice it proves within the gap needs no solve at all (bert-base: a baseline's)
    lp: int | None = None
    rounded: tuple[int, ...] | None = None
    if repeats:
        if prepared is not None:
            model, x, relaxed = prepared
        else:
            model, x = build_model(terms, fronts, arrays, edges, cap, None)
            relaxing = cpsat.Relaxing(model)
            if prepare is not None:
                try:  # (while GLOP solves this LP)
                    prepare()
                except BaseException:
                    relaxing.cancel()
                    raise
            relaxed = relaxing.result()
        del prepared
        if relaxed is not None:
            lp = relaxed.bound
            if cutoff is not None and lp > cutoff:
                return None, CUT_OFF
            rounded, spent = _lp_start(relaxed, model, x, terms, arrays, edges, cap, opts)
            used += spent
            if rounded is not None:
                known.append(rounded)
                best, best_obj = best_known()
        del model, x, relaxed  # (not held while the late starts' solves build theirs)
    if more_starts is not None:
        asked = time.perf_counter()
        add_starts(more_starts(best_obj))
        best, best_obj = best_known()
        start += time.perf_counter() - asked  # (their solves' wall time is theirs)

    def close(times: float) -> bool:
        return best_obj is not None and lp is not None \
            and best_obj - lp <= times * opts.relative_gap * best_obj

    method = "full model"
    if repeats and not close(1):
        share = dataclasses.replace(opts, time_limit_s=opts.time_limit_s * TIED_SHARE,
                                    relative_gap=opts.relative_gap * REDUCED_GAP)
        run = solve_in_chunks(
            lambda hint: build_model(terms, fronts, arrays, edges, cap, hint, grouped(tie)),
            best, share, lambda c: objective(arrays, edges, c), progress, 0, whole, False)
        used += run.used
        if run.choice is not None:
            known.append(run.choice)  # fits: it is checked against every op's (C2)
            best, best_obj = best_known()
        method = "grouped layers" + (_STALLED.format(run.used, share.time_limit_s)
                                     if run.stalled else "")
    if best is not None and best_obj is not None and lp is not None and close(POLISH_ABOVE):
        # the full model's LP bounds the choice closely: proven within the gap, or close
        # enough that the full search (which rarely closes such a gap: bert-large's stays at
        # 0.20% after 30 s) is not worth its time
        if progress:  # (a solve that ends at once, as the LP's rounded choice can)
            progress("solve", 0, whole)
            progress("solve", whole, whole)
        name = "OPTIMAL" if close(1) else "FEASIBLE"
        how = method if method != "full model" else \
            "the LP's rounded choice" if best == rounded else "a known choice"
        return SolverResult(best, name, best_obj, min(lp, best_obj), time.perf_counter() - start,
                            warm_obj, used, f"{how}, bounded by the full model's LP",
                            greedy_choice), name
    # the path without a reduced model: the full model, hinted, with the rest of the limit
    rest_opts = dataclasses.replace(opts, time_limit_s=max(opts.time_limit_s - used, 0.001))
    run = solve_in_chunks(lambda hint: build_model(terms, fronts, arrays, edges, cap, hint),
                          best, rest_opts, lambda c: objective(arrays, edges, c), progress,
                          int(used * 1000), whole, True)
    used += run.used
    name, choice = run.status, run.choice
    wall = time.perf_counter() - start
    method = "full model" if method == "full model" else f"{method}, then the full model"
    if run.stalled:
        method += _STALLED.format(run.used, rest_opts.time_limit_s)
    # CP-SAT's bound and the LP's are both bounds of the full model: the better one is kept
    bound = max(run.bound, lp if lp is not None else 0)
    if choice is None:
        if best is None or best_obj is None:
            return None, name
        return SolverResult(best, "FEASIBLE", best_obj, min(bound, best_obj), wall, warm_obj,
                            used, method, greedy_choice), name
    value = objective(arrays, edges, choice)
    if best is not None and best_obj is not None and best_obj < value:
        choice, value = best, best_obj
    bound = min(bound, value)
    if name != "OPTIMAL" and value - bound <= opts.relative_gap * value:
        name = "OPTIMAL"  # proven within the gap by the LP's bound
    return SolverResult(tuple(choice), name, value, bound, wall, warm_obj, used, method,
                        greedy_choice), name


#: the deterministic seconds the repair of the LP's rounded choice may take (`_lp_start`)
REPAIR_S = 1.0


def _lp_start(relaxed: cpsat.Relaxation, model: cp_model.CpModel, x: _Choice,
              terms: MemoryTerms, arrays: _Arrays, edges: list[Edge], cap: int,
              opts: SolverOptions) -> tuple[tuple[int, ...] | None, float]:
    """A start from the full model's LP relaxation, and the deterministic seconds it took:
    every op's plan of largest LP value (the first of equals). Where that choice breaks (C2)
    or pairs plans an edge forbids, the greedy's moves to smaller plans (`greedy`, started
    from it) make it fit, and the full ``model`` (whose relaxation it is; changed here) is
    solved for at most `REPAIR_S` with every op fixed to its rounded plan but those the LP
    left fractional, those where memory overflows, both ends of forbidden pairs and those the
    greedy moved (relaxation-induced neighbourhood search, after RINS), hinted with the
    greedy's choice. The better of the two; None if neither fits.

    Where the relaxation is nearly integral this finds what one CP-SAT worker may not: on
    LLaMA-3-8B decode on wse3 (seq-len 4096) the LP bound is 1,175,529 cycles and leaves 5 of
    740 ops fractional; the rounding overflows five ops by up to 34 bytes, and its repair
    (0.03 deterministic s) is 1,175,723 cycles, proven within the gap, where the full
    model's search, hinted with the baselines' choices, had stopped at 1,379,331."""
    ops = len(arrays.cycles)
    values = [[relaxed.values[v.index] for v in x.x[x.tie[i]]] for i in range(ops)]
    rounded = tuple(int(np.argmax(v)) for v in values)
    over = memory_use(terms, arrays, rounded) > cap
    broken = [e for e in edges if e.cost[rounded[e.src]][rounded[e.dst]] is None]
    if not over.any() and not broken:
        return rounded, 0.0
    # the greedy's moves to smaller plans, from the rounding, make it fit (edges aside)
    shrunk = greedy(terms, arrays, cap, start=rounded)
    mended = tuple(shrunk) if shrunk is not None \
        and objective(arrays, edges, shrunk) < FORBIDDEN else None
    loose = {i for i, v in enumerate(values) if max(v) < 1 - 1e-6}
    loose |= {int(i) for i in np.flatnonzero(over)}
    loose |= {i for e in broken for i in (e.src, e.dst)}
    if mended is not None:  # the hint is then a solution of the repair
        loose |= {i for i in range(ops) if mended[i] != rounded[i]}
    for i in range(ops):
        if i not in loose:
            model.add(x.x[x.tie[i]][rounded[i]] == 1)
    x.hint(model, mended if mended is not None else rounded)
    solver = cp_model.CpSolver()
    cpsat.configure(solver, min(REPAIR_S, opts.time_limit_s), opts.workers, opts.seed)
    status = cpsat.run(solver, model)
    spent = float(solver.deterministic_time)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return mended, spent
    found = x.decode(solver)
    if mended is not None and objective(arrays, edges, mended) <= objective(arrays, edges, found):
        return mended, spent
    return found, spent


@dataclass(frozen=True)
class Peak:
    """The least SRAM per core any choice of plans needs, found by minimising (C2)'s largest
    left-hand side: where that peak is and what it is made of. For diagnoses."""

    proven: bool  # CP-SAT proved ``peak`` the least (else: the best found within the limit)
    peak: int  # bytes per core at op ``at`` under the best choice found
    bound: int  # no choice needs less than this
    at: int  # the op where the peak is reached
    resident: int  # every op's resident bytes (weights), under that choice
    working: int  # op ``at``'s hot bytes beyond its resident ones
    live: int  # activations alive while ``at`` runs and re-lays out its inputs
    live_tensors: int


def least_peak(graph: Graph, fronts: list[list[OpPlan]], opts: SolverOptions,
               progress: Progress | None = None, write_back: bool = False) -> Peak | None:
    """Minimise the peak of (C2) over every choice of plans (None if the solve found no
    choice at all within its deterministic limit; ``write_back`` as `liveness`)."""
    terms = liveness(graph, write_back)
    arrays = _Arrays(fronts, [[0] * len(f) for f in fronts])
    model = cp_model.CpModel()
    x = _Choice(model, fronts, range(len(fronts)))
    top = int(sum(int(a.max()) for a in arrays.cold) + max(int(a.max()) for a in arrays.extra)
              + sum(int(a.max()) for a in arrays.out))
    peak = model.new_int_var(0, top, "peak")
    resident, working = _memory(model, x, terms, arrays, top)
    for w in working:
        model.add(resident + w <= peak)
    model.minimize(peak)
    # hint: every op's least resident plan
    x.hint(model, [int(np.argmin(a)) for a in arrays.cold])
    solver = cp_model.CpSolver()
    cpsat.configure(solver, opts.time_limit_s, opts.workers, opts.seed)
    status = cpsat.run(solver, model, progress, "solve")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    choice = x.decode(solver)
    use = memory_use(terms, arrays, choice)
    at = int(np.argmax(use))
    around = (*terms.live_after[at], *terms.dying_inputs[at])
    return Peak(
        proven=status == cp_model.OPTIMAL, peak=int(use[at]),
        bound=int(round(solver.best_objective_bound)), at=at,
        resident=int(sum(int(a[k]) for a, k in zip(arrays.cold, choice))),
        working=int(arrays.extra[at][choice[at]]),
        live=int(sum(int(arrays.out[j][choice[j]]) for j in around)),
        live_tensors=len(around))
