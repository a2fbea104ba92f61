"""The whole-graph choice over repeated blocks: the reduced model (tie classes split into
groups of consecutive copies, `tie.grouped`) on tiny chains of identical blocks whose optimum
is found by brute force, its detection, the full model's LP bound, and the greedy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from ortools.sat.python import cp_model
from test_solver import EXACT, brute_force, chain_graph, plan

from t10c.partition import cpsat
from t10c.partition import solve as solving
from t10c.partition.solve import (
    Edge,
    SolverOptions,
    _Arrays,
    build_model,
    choose_plans,
    greedy,
    live_matrix,
    liveness,
    memory_use,
    objective,
    solve_model,
)
from t10c.partition.tie import copies, group_sizes, grouped, tie_classes

BLOCKS = 6


def blocks(n: int = BLOCKS, odd: int | None = None):
    """A chain of ``n`` blocks, each a weighted op A (fast plan: 100 cycles, 40 B resident;
    small plan: 160 cycles, 10 B) and an op B (one plan, 5 B resident); A's small plan costs
    B a 5-cycle re-layout. Block ``odd``'s A has other figures (as a layer of another shape
    would). Memory decides how many A ops may run fast: a mix of identical blocks."""
    graph = chain_graph(2 * n)
    fronts, edges = [], []
    for b in range(n):
        fast = 90 if b == odd else 100
        fronts.append([plan(f"op{2 * b}", fast, 50, 40), plan(f"op{2 * b}", 160, 20, 10)])
        fronts.append([plan(f"op{2 * b + 1}", 50, 10, 5)])
        edges.append(Edge(2 * b, 2 * b + 1, 0, ((0,), (5,))))
        if b + 1 < n:
            edges.append(Edge(2 * b + 1, 2 * b + 2, 0, ((0, 0),)))
    return graph, fronts, edges


def _tie(fronts, edges):
    cycles = [[p.cycles.total for p in f] for f in fronts]
    return tie_classes(fronts, cycles, [(e.src, e.dst, e.slot, e.cost) for e in edges])


def test_group_sizes_make_every_count() -> None:
    """Groups of 1, 2, 4, ... copies and the remainder: any number of copies is some groups."""
    for n in range(1, 40):
        sizes = group_sizes(n)
        assert sum(sizes) == n and len(sizes) <= n.bit_length() + 1
        sums = {0}
        for s in sizes:
            sums |= {a + s for a in sums}
        assert sums >= set(range(n + 1))


def test_blocks_are_detected_by_structure() -> None:
    """The middle blocks' A ops share a class (the first and last differ: no producer, no
    consumer), each of them starts a copy of its own, and the groups split the classes."""
    graph, fronts, edges = blocks()
    tie = _tie(fronts, edges)
    a_ops = [tie[2 * b] for b in range(BLOCKS)]
    assert len(set(a_ops[1:-1])) == 1 and a_ops[0] != a_ops[1]
    copy = copies(tie)
    assert copy == sorted(copy) and len({copy[2 * b] for b in range(1, BLOCKS - 1)}) == 4
    g = grouped(tie)
    assert len(set(g)) > len(set(tie))
    # ops of one group class always share a tie class
    assert all(tie[i] == tie[j] for i in range(len(g)) for j in range(len(g)) if g[i] == g[j])


def test_a_differing_block_is_not_merged() -> None:
    """A block whose A op has other figures (another shape) gets a class of its own, and so
    do its neighbours (their neighbourhood differs)."""
    graph, fronts, edges = blocks(odd=2)
    tie = _tie(fronts, edges)
    odd = tie[4]
    assert tie.count(odd) == 1
    assert tie[3] != tie[7] and tie[5] != tie[9]  # B before and after it, against block 3's


@pytest.mark.parametrize("cap", [110, 140, 170, 200, 230, 260, 290])
def test_reduced_model_equals_brute_force(cap: int) -> None:
    """For every memory size (0 to 6 fast A ops fit), the reduced model's optimum is the full
    problem's, found by brute force; so is `choose_plans`'s, and its bound is the full one."""
    graph, fronts, edges = blocks()
    best = brute_force(graph, fronts, edges, cap)
    assert best is not None
    arrays = _Arrays(fronts, [[0] * len(f) for f in fronts])
    terms = liveness(graph)
    model, x = build_model(terms, fronts, arrays, edges, cap, None, grouped(_tie(fronts, edges)))
    solver, status = solve_model(model, EXACT)
    assert status == cp_model.OPTIMAL
    assert objective(arrays, edges, x.decode(solver)) == best
    solving._SOLVED.clear()
    result, status = choose_plans(graph, fronts, [[0] * len(f) for f in fronts], edges, cap,
                                  EXACT)
    assert status == "OPTIMAL" and result.objective_cycles == best
    assert result.bound_cycles == best and result.method


def test_identical_blocks_alone_cannot_mix() -> None:
    """Where memory admits 3 fast A ops of 6, one choice per class (the plain tie classes:
    the four middle A ops tied, the first and last free) gets 2 of them; the grouped classes
    find the optimum."""
    graph, fronts, edges = blocks()
    cap = 200
    best = brute_force(graph, fronts, edges, cap)
    arrays = _Arrays(fronts, [[0] * len(f) for f in fronts])
    terms = liveness(graph)
    tie = _tie(fronts, edges)
    values = []
    for classes in (tie, grouped(tie)):
        model, x = build_model(terms, fronts, arrays, edges, cap, None, classes)
        solver, _ = solve_model(model, EXACT)
        values.append(objective(arrays, edges, x.decode(solver)))
    assert values[0] > best == values[1]


def test_choice_is_deterministic() -> None:
    graph, fronts, edges = blocks(n=9)
    results = []
    for _ in range(2):
        solving._SOLVED.clear()
        results.append(choose_plans(graph, fronts, [[0] * len(f) for f in fronts], edges, 260,
                                    SolverOptions(reserve_fraction=0.0)))
    assert results[0][0].choice == results[1][0].choice
    assert results[0][1] == results[1][1]


def test_lp_bound_by_hand() -> None:
    """min 3a + 2b + 2c with a + b + c = 1 and 2b + 2c <= 1: the LP takes b + c = 1/2 and
    a = 1/2 (2.5), the integer optimum is a (3); negated literals count as 1 - x."""
    model = cp_model.CpModel()
    a, b, c = (model.new_bool_var(n) for n in "abc")
    model.add_exactly_one([a, b, c])
    model.add(2 * b + 2 * c <= 1)
    model.minimize(3 * a + 2 * b + 2 * c)
    assert cpsat.lp_bound(model) == 3  # 2.5, rounded up: the costs are integers
    model = cp_model.CpModel()
    a, b = model.new_bool_var("a"), model.new_bool_var("b")
    model.add(a + ~b >= 1)  # a >= b
    model.minimize(5 * ~a + b)  # a = 1, b = 0: 0
    assert cpsat.lp_bound(model) == 0
    model.add(b == 1)
    assert cpsat.lp_bound(model) == 1
    # a literal and its negation in one exactly-one: b + (1 - b) + c = 1 forces c = 0 (a
    # variable listed twice is one term of the LP, as the constraint means)
    model = cp_model.CpModel()
    b, c = model.new_bool_var("b"), model.new_bool_var("c")
    model.add_exactly_one([b, ~b, c])
    model.minimize(4 - 4 * c)
    assert cpsat.lp_bound(model) == 4


@pytest.mark.parametrize("cap", [130, 160, 190, 220, 250, 290])
def test_lp_start_is_repaired_where_its_rounding_overflows(cap: int) -> None:
    """The start rounded from the full model's LP (`solve._lp_start`): where memory admits
    k fast A ops and two thirds of another, the LP runs that one two-thirds fast, its
    rounding runs it fast and overflows, and the repair (the fractional and overflowing ops
    re-chosen, the rest fixed) finds a choice that fits, here the optimum. Where every A op
    fits fast the LP is integral and its rounding is the optimum, with no search."""
    graph, fronts, edges = blocks()
    best = brute_force(graph, fronts, edges, cap)
    arrays = _Arrays(fronts, [[0] * len(f) for f in fronts])
    terms = liveness(graph)
    model, x = build_model(terms, fronts, arrays, edges, cap, None)
    relaxed = cpsat.relax(model)
    assert relaxed is not None and relaxed.bound <= best
    values = [[relaxed.values[v.index] for v in x.x[x.tie[i]]] for i in range(len(fronts))]
    fractional = [i for i, v in enumerate(values) if max(v) < 1 - 1e-6]
    start, spent = solving._lp_start(relaxed, model, x, terms, arrays, edges, cap, EXACT)
    assert start is not None and (memory_use(terms, arrays, start) <= cap).all()
    assert objective(arrays, edges, start) == best
    if cap < 290:
        assert fractional and relaxed.bound < best and spent > 0
    else:
        assert not fractional and spent == 0.0


def _greedy_reference(terms, arrays, cap, base):
    """The greedy as first written: every op's moves scored afresh at every step."""
    n = len(arrays.cold)
    choice, end = [0] * n, base
    live = live_matrix(terms)
    while True:
        use = memory_use(terms, arrays, choice, live)
        over = np.flatnonzero(use > cap)
        if not len(over):
            return choice
        i = int(over[np.argmax(use[over])])
        best = None
        around = set(np.flatnonzero(live[i]))
        for j in range(n):
            k = choice[j]
            if k >= end[j] - 1:
                continue
            saved = arrays.cold[j][k] - arrays.cold[j][k + 1:end[j]]
            if j == i:
                saved = saved + arrays.extra[j][k] - arrays.extra[j][k + 1:end[j]]
            if j in around:
                saved = saved + arrays.out[j][k] - arrays.out[j][k + 1:end[j]]
            added = np.maximum(arrays.cycles[j][k + 1:end[j]] - arrays.cycles[j][k], 0)
            if not (saved > 0).any():
                continue
            score = np.where(saved > 0, added / np.maximum(saved, 1), np.inf)
            m = int(np.argmin(score))
            if best is None or score[m] < best[0]:
                best = (float(score[m]), j, k + 1 + m)
        if best is None:
            return None
        choice[best[1]] = best[2]


def test_greedy_moves_as_scored_afresh() -> None:
    """The greedy keeps each op's best moves and rescores only the moved op: the same moves
    as scoring every op at every step, on random fronts and memory sizes."""
    rng = np.random.default_rng(0)
    for _ in range(60):
        n = int(rng.integers(2, 9))
        graph = chain_graph(n)
        fronts = []
        for i in range(n):
            fronts.append([])
            for _ in range(int(rng.integers(1, 5))):
                cold = int(rng.integers(0, 40))
                fronts[-1].append(plan(f"op{i}", int(rng.integers(1, 300)),
                                       cold + int(rng.integers(8, 60)), cold,
                                       int(rng.integers(1, 20))))
        arrays = _Arrays(fronts, [[0] * len(f) for f in fronts])
        terms = liveness(graph)
        base = [len(f) - int(rng.integers(0, 2)) if len(f) > 1 else 1 for f in fronts]
        cap = int(rng.integers(30, 250))
        assert greedy(terms, arrays, cap, base) == _greedy_reference(terms, arrays, cap, base)


def _blocks_model(n: int, cap: int):
    graph, fronts, edges = blocks(n=n)
    arrays = _Arrays(fronts, [[0] * len(f) for f in fronts])
    terms = liveness(graph)

    def build(hint):
        return build_model(terms, fronts, arrays, edges, cap, hint)
    return graph, fronts, edges, arrays, build


def test_a_solve_in_chunks_that_ends_within_its_first_chunk_is_the_plain_solve() -> None:
    """Proven optimal within the first chunk: the same choice as one solve under the whole
    limit, and its bound is that optimum."""
    graph, fronts, edges, arrays, build = _blocks_model(BLOCKS, 200)
    model, x = build(None)
    solver, status = solve_model(model, EXACT)
    assert status == cp_model.OPTIMAL
    run = solving.solve_in_chunks(build, None, EXACT, lambda c: objective(arrays, edges, c),
                                  None, 0, 1000, True)
    assert run.status == "OPTIMAL" and run.choice == x.decode(solver)
    assert run.bound == objective(arrays, edges, run.choice) == brute_force(graph, fronts,
                                                                              edges, 200)
    assert run.used <= solving.CHUNK_S


def _random_chain(n: int, k: int, seed: int = 0):
    """``n`` ops in a chain, ``k`` plans each trading cycles for resident bytes, random
    re-layout costs, and an SRAM of half what every op's largest plan needs: a model CP-SAT
    cannot prove optimal in a fraction of a second."""
    rng = np.random.default_rng(seed)
    graph = chain_graph(n)
    fronts, edges = [], []
    for i in range(n):
        front = []
        for _ in range(k):
            cold = int(rng.integers(5, 60))
            front.append(plan(f"op{i}", int(200 - 2 * cold + rng.integers(0, 40)), cold + 10,
                              cold))
        fronts.append(front)
        if i:
            edges.append(Edge(i - 1, i, 0, tuple(tuple(int(c) for c in rng.integers(0, 30, k))
                                                 for _ in range(k))))
    arrays = _Arrays(fronts, [[0] * k for _ in fronts])
    terms = liveness(graph)
    cap = sum(max(p.cold_bytes_per_core for p in f) for f in fronts) // 2
    hint = greedy(terms, arrays, cap, [len(f) for f in fronts])
    assert hint is not None

    def build(h):
        return build_model(terms, fronts, arrays, edges, cap, h)
    return build, (lambda c: objective(arrays, edges, c)), tuple(hint)


def test_a_stalled_solve_ends_after_its_chunk(monkeypatch) -> None:
    """A search whose chunk's second half finds nothing better stops there, far inside its
    limit, never with a worse choice than its hint, the same on every run; without early
    stops it searches the whole limit."""
    build, value, hint = _random_chain(60, 4)
    monkeypatch.setattr(solving, "CHUNK_S", 0.05)
    runs = [solving.solve_in_chunks(build, hint, EXACT, value, None, 0, 1000, True)
            for _ in range(2)]
    assert runs[0] == runs[1]
    run = runs[0]
    assert run.stalled and run.status == "FEASIBLE" and run.used < 0.1 * EXACT.time_limit_s
    assert run.choice is not None and run.bound <= value(run.choice) <= value(hint)
    whole = dataclasses.replace(EXACT, time_limit_s=0.2, early_stop=False)
    run = solving.solve_in_chunks(build, hint, whole, value, None, 0, 1000, True)
    assert not run.stalled and run.used >= 0.2 and run.choice is not None


def test_a_solve_without_a_start_is_not_cut_into_chunks(monkeypatch) -> None:
    """Where no choice is known to start from (the greedy found none), the first solution
    may take most of the limit: the solve is one chunk, and finds it (llama-135m-decode on
    wormhole-n150 found no plan when its first chunk was cut short)."""
    build, value, _ = _random_chain(60, 4)
    monkeypatch.setattr(solving, "CHUNK_S", 1e-6)  # too short to find anything
    short = dataclasses.replace(EXACT, time_limit_s=0.5)
    run = solving.solve_in_chunks(build, None, short, value, None, 0, 1000, True)
    assert run.choice is not None and not run.stalled and run.used >= 0.5
    # with a start, a chunk too short to find even it leaves the rest of the limit to one
    with_hint = solving.solve_in_chunks(build, run.choice, short, value, None, 0, 1000, True)
    assert with_hint.choice is not None and value(with_hint.choice) <= value(run.choice)


@pytest.mark.parametrize("cap", [160, 220, 290])
def test_a_solve_stops_at_an_lp_bound_above_its_cutoff(cap: int) -> None:
    """Given a ``cutoff`` below its full model's LP bound, a solve stops after the LP (no
    choice, status `CUT_OFF`, nothing remembered); at the bound it is the plain solve."""
    graph, fronts, edges = blocks()
    zeros = [[0] * len(f) for f in fronts]
    arrays = _Arrays(fronts, zeros)
    model, _ = build_model(liveness(graph), fronts, arrays, edges, cap, None)
    bound = cpsat.lp_bound(model)
    assert bound is not None
    solving._SOLVED.clear()
    got, status = choose_plans(graph, fronts, zeros, edges, cap, EXACT, cutoff=bound - 1)
    assert got is None and status == solving.CUT_OFF and not solving._SOLVED
    at, _ = choose_plans(graph, fronts, zeros, edges, cap, EXACT, cutoff=bound)
    solving._SOLVED.clear()
    plain, _ = choose_plans(graph, fronts, zeros, edges, cap, EXACT)
    assert at is not None and plain is not None
    assert (at.choice, at.objective_cycles) == (plain.choice, plain.objective_cycles)
    assert plain.objective_cycles == brute_force(graph, fronts, edges, cap)


@pytest.mark.parametrize("cap", [160, 220, 290])
def test_a_prepared_relaxation_is_the_one_the_solve_makes(cap: int) -> None:
    """`solve.relaxed_model` builds and relaxes the full model `choose_plans` would; handed
    back as ``prepared`` it gives the same choice (and the same cut-off) as the solve that
    builds its own. A solve with late starts calls ``prepare`` once, while its own LP runs,
    and a model whose answer is remembered is not prepared again."""
    graph, fronts, edges = blocks()
    zeros = [[0] * len(f) for f in fronts]
    solving._SOLVED.clear()
    prepared = solving.relaxed_model(graph, fronts, zeros, edges, cap, EXACT)
    assert prepared is not None and prepared[2] is not None
    model, _ = build_model(liveness(graph), fronts, _Arrays(fronts, zeros), edges, cap, None)
    bound = prepared[2].bound
    assert bound == cpsat.lp_bound(model)
    got, status = choose_plans(graph, fronts, zeros, edges, cap, EXACT, cutoff=bound - 1,
                               prepared=prepared)
    assert got is None and status == solving.CUT_OFF
    ready, _ = choose_plans(graph, fronts, zeros, edges, cap, EXACT,
                            prepared=solving.relaxed_model(graph, fronts, zeros, edges, cap,
                                                           EXACT))
    assert solving.relaxed_model(graph, fronts, zeros, edges, cap, EXACT) is None, \
        "remembered: nothing to prepare"
    solving._SOLVED.clear()
    plain, _ = choose_plans(graph, fronts, zeros, edges, cap, EXACT)
    assert ready is not None and plain is not None
    assert (ready.choice, ready.objective_cycles) == (plain.choice, plain.objective_cycles)
    calls: list[str] = []
    solving._SOLVED.clear()
    late, _ = choose_plans(graph, fronts, zeros, edges, cap, EXACT,
                           more_starts=lambda best: calls.append("starts") or [],
                           prepare=lambda: calls.append("prepare"))
    assert calls == ["prepare", "starts"]
    assert late is not None and late.choice == plain.choice


@pytest.mark.parametrize("cap", [160, 220, 290])
@pytest.mark.parametrize("odd", [None, 3])
def test_late_starts_give_the_choice_of_starts_given_first(cap: int, odd: int | None) -> None:
    """Starts given late (``more_starts``), only those at or below the best objective known
    when it asks, give the choice that all of them given up front give. The starts run the
    first ``fast`` A ops fast and the rest small (those that overflow are left out by both);
    one of them is the optimum, and the solve's own rounding may tie with it (the first of
    equals is kept either way)."""
    graph, fronts, edges = blocks(odd=odd)
    zeros = [[0] * len(f) for f in fronts]
    arrays = _Arrays(fronts, zeros)
    starts = [tuple(0 if k % 2 or k < 2 * fast else 1 for k in range(len(fronts)))
              for fast in range(BLOCKS + 1)]
    asked: list[int | None] = []

    def late(best: int | None) -> list[tuple[int, ...]]:
        asked.append(best)
        return [s for s in starts if best is None or objective(arrays, edges, s) <= best]

    solving._SOLVED.clear()
    first, _ = choose_plans(graph, fronts, zeros, edges, cap, EXACT, starts=starts)
    solving._SOLVED.clear()
    then, _ = choose_plans(graph, fronts, zeros, edges, cap, EXACT, more_starts=late)
    assert first is not None and then is not None and asked and asked[0] is not None
    assert (then.choice, then.objective_cycles, then.status) == \
        (first.choice, first.objective_cycles, first.status)
    assert then.objective_cycles == brute_force(graph, fronts, edges, cap)
