"""The whole-graph choice on tiny graphs whose optimum is known: by hand, and by brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t10c.ir import Graph, Operand, TensorExpr, TensorInfo
from t10c.partition.plan import Cycles, OpPlan
from t10c.partition.solve import (
    Edge,
    SolverOptions,
    _Arrays,
    choose_plans,
    liveness,
    memory_use,
    objective,
)


def chain_graph(n: int) -> Graph:
    """x -> op0 -> t0 -> op1 -> t1 ... (elementwise ops on 8 elements)."""
    ops, tensors = [], {"x": TensorInfo("x", (8,), "float32")}
    src = "x"
    for i in range(n):
        out = f"t{i}"
        tensors[out] = TensorInfo(out, (8,), "float32")
        ops.append(TensorExpr(f"op{i}", (("d", 8),), Operand(out, ("d",)),
                              (Operand(src, ("d",)),), None, ("relu", ("in", 0))))
        src = out
    return Graph("chain", tensors, tuple(ops), {}, {}, ("x",), (src,))


def plan(name: str, cycles: int, hot: int, cold: int, out: int = 8) -> OpPlan:
    return OpPlan(name, (1,), (1,), ((), ()), ((),), (1, 1), Cycles(cycles, 0, 0, 0), hot, cold,
                  out)


def brute_force(graph: Graph, fronts, edges, cap: int) -> int | None:
    """The least objective of any choice that fits ``cap`` (None: none fits), by trying all."""
    arrays = _Arrays(fronts, [[0] * len(f) for f in fronts])
    terms = liveness(graph)
    best = None
    for choice in itertools.product(*(range(len(f)) for f in fronts)):
        if (memory_use(terms, arrays, choice) <= cap).all():
            value = objective(arrays, edges, choice)
            best = value if best is None else min(best, value)
    return best


EXACT = SolverOptions(reserve_fraction=0.0, relative_gap=0.0, time_limit_s=10)


def two_ops(edge_cost):
    graph = chain_graph(2)
    fronts = [[plan("op0", 100, 50, 40), plan("op0", 160, 20, 10)],
              [plan("op1", 100, 50, 40), plan("op1", 150, 20, 10)]]
    return graph, fronts, [Edge(0, 1, 0, edge_cost)]


def test_hand_checked_memory_trade() -> None:
    """SRAM 95 bytes per core. Both fast plans need 40 + 40 resident, + 10 hot beyond the
    weights + 8 of op0's result at op1 = 98: too much. Shrinking op1 (280 = 100 + 150 + 30
    re-layout) beats shrinking op0 (290 = 160 + 100 + 30) and both (310)."""
    graph, fronts, edges = two_ops(((0, 30), (30, 0)))
    result, status = choose_plans(graph, fronts, [[0, 0], [0, 0]], edges, 95, EXACT)
    assert status == "OPTIMAL"
    assert result.choice == (0, 1)
    assert result.objective_cycles == 280
    assert result.greedy_objective_cycles == 280


def test_solver_beats_greedy_when_transitions_matter() -> None:
    """Greedy shrinks op1 (50 cycles for 30 bytes beats op0's 60 for 30), but from op0's fast
    plan op1's small plan costs a 100-cycle re-layout: 350. The optimum shrinks op0: 260."""
    graph, fronts, edges = two_ops(((0, 100), (0, 0)))
    result, _ = choose_plans(graph, fronts, [[0, 0], [0, 0]], edges, 95, EXACT)
    assert result.greedy_objective_cycles == 350
    assert result.choice == (1, 0)
    assert result.objective_cycles == 260
    greedy, _ = choose_plans(graph, fronts, [[0, 0], [0, 0]], edges, 95,
                             SolverOptions(reserve_fraction=0.0, planner="greedy"))
    assert greedy.objective_cycles == 350


def test_infeasible_is_reported() -> None:
    graph, fronts, edges = two_ops(((0, 0), (0, 0)))
    result, status = choose_plans(graph, fronts, [[0, 0], [0, 0]], edges, 25, EXACT)
    assert result is None and status == "INFEASIBLE"


@settings(max_examples=40, deadline=None)
@given(data=st.data(), n=st.integers(2, 4), sram=st.integers(40, 160))
def test_solver_matches_brute_force(data, n: int, sram: int) -> None:
    graph = chain_graph(n)
    fronts = []
    for i in range(n):
        k = data.draw(st.integers(1, 3))
        fronts.append([])
        for _ in range(k):  # a plan's hot bytes include its resident (cold) ones
            cycles, cold = data.draw(st.integers(1, 200)), data.draw(st.integers(0, 30))
            hot = cold + data.draw(st.integers(8, 60))
            fronts[-1].append(plan(f"op{i}", cycles, hot, cold, data.draw(st.integers(1, 20))))
    edges = []
    for i in range(n - 1):
        cost = tuple(tuple(data.draw(st.integers(0, 50)) for _ in fronts[i + 1])
                     for _ in fronts[i])
        edges.append(Edge(i, i + 1, 0, cost))
    relayout = [[0] * len(f) for f in fronts]
    arrays = _Arrays(fronts, relayout)
    terms = liveness(graph)
    best = brute_force(graph, fronts, edges, sram)
    result, status = choose_plans(graph, fronts, relayout, edges, sram, EXACT)
    if best is None:
        assert result is None
        return
    assert status == "OPTIMAL"
    assert result.objective_cycles == best
    if result.greedy_objective_cycles is not None:
        assert result.greedy_objective_cycles >= best
    assert np.all(memory_use(terms, arrays, result.choice) <= sram)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(min_value=1, max_value=12))
def test_liveness_is_its_definition(data, n: int) -> None:
    """Random graphs of ops that each read one or two earlier results: op p's result is live
    at op i exactly when p < i < its last reader (or the end, for a graph output), and dies
    at its last reader; the terms are computed once per graph object."""
    ops, tensors = [], {"x": TensorInfo("x", (8,), "float32")}
    reads: list[tuple[int, ...]] = []
    for i in range(n):
        srcs = sorted(set(data.draw(st.lists(st.integers(-1, i - 1), min_size=1, max_size=2))))
        reads.append(tuple(srcs))
        names = ["x" if s < 0 else f"t{s}" for s in srcs]
        tensors[f"t{i}"] = TensorInfo(f"t{i}", (8,), "float32")
        body = ("add", ("in", 0), ("in", 1)) if len(names) == 2 else ("relu", ("in", 0))
        ops.append(TensorExpr(f"op{i}", (("d", 8),), Operand(f"t{i}", ("d",)),
                              tuple(Operand(t, ("d",)) for t in names), None, body))
    outs = tuple(sorted(set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3)))))
    graph = Graph("dag", tensors, tuple(ops), {}, {}, ("x",), tuple(f"t{k}" for k in outs))
    last = {p: max([i for i in range(n) if p in reads[i]], default=p) for p in range(n)}
    for p in outs:
        last[p] = n
    terms = liveness(graph)
    for i in range(n):
        assert terms.live_after[i] == tuple(p for p in range(n) if p < i < last[p])
        assert terms.dying_inputs[i] == tuple(p for p in reads[i] if p >= 0 and last[p] == i)
    assert liveness(graph) is terms
    again = Graph("dag", dict(tensors), tuple(ops), {}, {}, ("x",), graph.outputs)
    assert liveness(again) == terms


def test_lp_relaxation_reads_the_model_whole_or_by_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LP relaxation's model (`cpsat._lp_model`) is the same whether ortools writes the
    CP model out whole or, where no temporary file can be written, it is read as text: bounds
    with open ends, negated literals, a variable named twice, an exactly-one, an enforced
    constraint left out, and the objective."""
    from ortools.sat.python import cp_model

    from t10c.partition import cpsat

    model = cp_model.CpModel()
    x = model.new_int_var(0, 9, "x")
    y = model.new_int_var(-5, cp_model.INT_MAX, "y")
    a, b = model.new_bool_var("a"), model.new_bool_var("b")
    model.add(x + 2 * y - a >= 1)
    model.add(x + x + ~b <= 7)
    model.add_exactly_one([a, b])
    model.add(y <= 3).only_enforce_if(a)
    model.minimize(3 * x + y + 5 * a)
    whole = cpsat._lp_model(model)
    assert len(whole.variable) == 4 and len(whole.constraint) == 3
    assert whole.variable[1].upper_bound == float("inf")
    assert [c.objective_coefficient for c in whole.variable] == [3.0, 1.0, 5.0, 0.0]
    doubled = whole.constraint[1]
    assert list(doubled.var_index) == [0, 3] and list(doubled.coefficient) == [2.0, -1.0]
    assert doubled.upper_bound == 6.0  # x + x + (1 - b) <= 7

    def refuse(self: cp_model.CpModel, path: str) -> bool:
        raise OSError("read-only file system")

    monkeypatch.setattr(cp_model.CpModel, "export_to_file", refuse)
    assert cpsat._lp_model(model).SerializeToString(deterministic=True) == \
        whole.SerializeToString(deterministic=True)
