"""The planner's contract: every enumerated plan is legal, computes the right thing on the
emulator, and costs what the emulator measures; the whole-graph choice respects SRAM."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t10c.chips import PRESETS
from t10c.codegen import generate
from t10c.dtypes import IntTensors
from t10c.emulator import emulate
from t10c.ir import Graph, Operand, TensorExpr, TensorInfo
from t10c.partition import Plan, SearchOptions, search_op, verify_plan

BASE = PRESETS["test16"]


def matmul_graph(m: int, k: int, n: int, batch: int = 0, seed: int = 0) -> Graph:
    """C = A @ B with B a constant; with ``batch``, A and C carry a leading batch axis."""
    lead = (("b", batch),) if batch else ()
    bl = ("b",) if batch else ()
    op = TensorExpr("mm", (*lead, ("m", m), ("k", k), ("n", n)),
                    Operand("C", (*bl, "m", "n")),
                    (Operand("A", (*bl, "m", "k")), Operand("B", ("k", "n"))), "sum",
                    ("mul", ("in", 0), ("in", 1)))
    bshape = (batch,) if batch else ()
    rng = np.random.default_rng(seed)
    tensors = {"A": TensorInfo("A", (*bshape, m, k), "float32"),
               "B": TensorInfo("B", (k, n), "float32"),
               "C": TensorInfo("C", (*bshape, m, n), "float32")}
    return Graph("mm", tensors, (op,), {}, {"B": rng.standard_normal((k, n)).astype(np.float32)},
                 ("A",), ("C",))


def one_op_plan(graph: Graph, p) -> Plan:
    return Plan(graph.name, "test", "fp32", (p,), (0,), (1,))


def check_all_plans(graph: Graph, chip, dtype: str = "fp32", limit: int = 60) -> int:
    """Emulate every enumerated plan (an evenly spaced sample past ``limit``)."""
    op = graph.ops[0]
    plans = search_op(graph, op, chip, dtype, SearchOptions(chains=True))
    assert plans, "no plan enumerated"
    if len(plans) > limit:
        plans = [plans[i] for i in np.linspace(0, len(plans) - 1, limit).astype(int)]
    a = np.random.default_rng(1).standard_normal(graph.tensors["A"].shape).astype(np.float32)
    want = np.matmul(a, graph.constants["B"])
    for p in plans:
        plan = dataclasses.replace(one_op_plan(graph, p), dtype=dtype)
        verify_plan(graph, plan, chip)
        prog = generate(graph, plan, chip)
        out, timeline, _ = emulate(prog, chip, {"A": a}, graph.constants)
        err = np.abs(out["C"] - want).max() / np.abs(want).max()
        assert err < (1e-5 if dtype == "fp32" else 2e-2), (p, err)
        # a one-op program's measured cycles equal the prediction within 5%
        assert abs(timeline.cycles - p.cycles.total) <= 0.05 * p.cycles.total, (p, timeline.cycles)
    return len(plans)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 24), k=st.integers(1, 40), n=st.integers(1, 24),
       cores=st.sampled_from([1, 2, 3, 5, 7, 8, 12, 13, 16]))
def test_every_matmul_plan_matches_numpy(m: int, k: int, n: int, cores: int) -> None:
    check_all_plans(matmul_graph(m, k, n), dataclasses.replace(BASE, cores=cores), limit=25)


def test_batched_matmul_plans_fp16() -> None:
    chip = dataclasses.replace(BASE, cores=12)
    assert check_all_plans(matmul_graph(6, 20, 10, batch=3), chip, "fp16", limit=40) > 10


def test_rotation_plans_are_enumerated_and_correct() -> None:
    graph = matmul_graph(16, 32, 16)
    plans = search_op(graph, graph.ops[0], BASE, "fp32")
    kinds = {tuple(bool(r) for r in p.rot) for p in plans}
    assert (True, True, False) in kinds  # A and B rotate together (Cannon-like)
    assert (False, False, True) in kinds  # partial sums travel the ring
    rotating = [p for p in plans if any(p.rot)]
    graph_plans = [p for p in rotating if p.steps > 1][:30]
    a = np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32)
    for p in graph_plans:
        prog = generate(graph, one_op_plan(graph, p), BASE)
        out, _, _ = emulate(prog, BASE, {"A": a}, graph.constants)
        np.testing.assert_allclose(out["C"], a @ graph.constants["B"], rtol=1e-4, atol=1e-4)


def test_verifier_rejects_a_broken_plan() -> None:
    from t10c.partition import PlanError

    graph = matmul_graph(16, 32, 16)
    plans = search_op(graph, graph.ops[0], BASE, "fp32")
    rot = next(p for p in plans if p.rot[0])
    # drop the driver: the rotating operand has no ring any more
    broken = dataclasses.replace(rot, drivers=((),) * len(rot.drivers))
    with pytest.raises(PlanError):
        verify_plan(graph, one_op_plan(graph, broken), BASE)
    too_big = dataclasses.replace(rot, hot_bytes_per_core=BASE.sram_bytes_per_core + 1)
    with pytest.raises(PlanError, match="SRAM"):
        verify_plan(graph, one_op_plan(graph, too_big), BASE)


def test_divisibility_chains_are_legal_and_dominated() -> None:
    """An input rotating at a slower pace than its axis' steps computes the right thing, and
    costs as much time as the full rotation while holding more (so fronts never keep it)."""
    graph = matmul_graph(8, 48, 8)
    chip = dataclasses.replace(BASE, cores=16)
    plans = search_op(graph, graph.ops[0], chip, "fp32", SearchOptions(chains=True))
    chains = [p for p in plans if any(1 < f < t for f, t in
                                      zip(p.chain, (max(p.T),) * len(p.chain)))]
    assert chains
    full = {(p.F, p.T, p.rot, p.drivers): p for p in plans
            if p.chain == tuple(p.T[graph.ops[0].axis_names.index(r[0])] if r else 1
                                for r in p.rot)}
    for p in chains:
        twin = full[(p.F, p.T, p.rot, p.drivers)]
        assert p.cycles.total >= twin.cycles.total
        assert p.hot_bytes_per_core >= twin.hot_bytes_per_core
    a = np.random.default_rng(3).standard_normal((8, 48)).astype(np.float32)
    for p in chains[:40]:
        out, timeline, _ = emulate(generate(graph, one_op_plan(graph, p), chip), chip, {"A": a},
                                   graph.constants)
        np.testing.assert_allclose(out["C"], a @ graph.constants["B"], rtol=1e-4, atol=1e-4)
        assert abs(timeline.cycles - p.cycles.total) <= 0.05 * p.cycles.total


def test_vectorised_costs_equal_the_scalar_definition() -> None:
    """`vcost.costs_for` (numpy over factor rows) prices every plan exactly as `plan_cost`."""
    from t10c.partition import geometry, plan_cost

    graph = matmul_graph(12, 40, 20, batch=2)
    chip = dataclasses.replace(BASE, cores=12)
    consts = frozenset(graph.constants)
    for home in (False, True):
        opts = SearchOptions(chains=True, weights_home=home)
        for p in search_op(graph, graph.ops[0], chip, "fp16", opts):
            cycles, hot, cold, out = plan_cost(geometry(graph, graph.ops[0], p), chip, "fp16",
                                               IntTensors(), consts, home)
            assert (cycles, hot, cold, out) == (p.cycles, p.hot_bytes_per_core,
                                                p.cold_bytes_per_core, p.out_bytes_per_core), p


def test_front_search_agrees_with_full_enumeration() -> None:
    from t10c.partition import search_op_front
    from t10c.partition.search import pareto_front

    graph = matmul_graph(16, 64, 24)
    op = graph.ops[0]
    every = search_op(graph, op, BASE, "fp16")
    found = search_op_front(graph, op, BASE, "fp16")
    assert found.enumerated == len(every)
    slow = pareto_front(every, BASE.sram_bytes_per_core, len(every))
    assert [(p.cycles.total, p.hot_bytes_per_core) for p in found.front] == \
        [(p.cycles.total, p.hot_bytes_per_core) for p in slow]


def test_rotated_weights_return_home() -> None:
    """A program leaves resident weights where it loaded them, so it can run again."""
    from t10c.codegen.program import Load
    from t10c.emulator import Machine

    graph = matmul_graph(16, 32, 16)
    plans = [p for p in search_op(graph, graph.ops[0], BASE, "fp32") if p.rot[1]]
    assert plans
    a = np.random.default_rng(4).standard_normal((16, 32)).astype(np.float32)
    for p in plans[:10]:
        prog = generate(graph, one_op_plan(graph, p), BASE)
        machine = Machine(prog, BASE)
        loads = [i for i in prog.instrs if isinstance(i, Load) and i.phase == "resident"]
        machine.run({"A": a}, graph.constants)
        for ld in loads:
            flat, valid = ld.elements()
            want = np.where(valid, graph.constants[ld.tensor].reshape(-1)[flat], 0)
            np.testing.assert_array_equal(machine.mem[ld.buf][:ld.ncores], want)


def test_restore_shift_and_reduce_share_one_barrier() -> None:
    """Rotated weights going home and the reduce-scatter of the partial sums are one
    superstep: no barrier between them, and the planner charges the one barrier codegen
    emits (predicted = emulated)."""
    from t10c.codegen.program import Reduce, Shift, Sync
    from t10c.partition import geometry

    graph = matmul_graph(16, 64, 16)
    plans = [p for p in search_op(graph, graph.ops[0], BASE, "fp32")
             if p.rot[1] and geometry(graph, graph.ops[0], p).reduce_group > 1]
    assert plans
    a = np.random.default_rng(5).standard_normal((16, 64)).astype(np.float32)
    for p in plans[:: max(1, len(plans) // 8)]:
        prog = generate(graph, one_op_plan(graph, p), BASE)
        comm = [i for i in prog.instrs if isinstance(i, (Sync, Shift, Reduce))]
        red = next(k for k, i in enumerate(comm) if isinstance(i, Reduce))
        assert isinstance(comm[red - 1], Shift) and isinstance(comm[red - 2], Sync), p
        out, timeline, _ = emulate(prog, BASE, {"A": a}, graph.constants)
        np.testing.assert_allclose(out["C"], a @ graph.constants["B"], rtol=1e-5, atol=1e-4)
        assert timeline.cycles == p.cycles.total, p


def test_solve_and_codegen_report_progress() -> None:
    """The solve reports its start and end (in thousandths of a deterministic second, with
    improving solutions between); codegen reports every op."""
    from t10c.chips import load_chip
    from t10c.codegen import generate
    from t10c.driver import load_source
    from t10c.frontend import to_graph
    from t10c.partition import plan_graph

    graph = to_graph(load_source("bert-tiny", seq_len=16, weights=False))
    chip = load_chip("test16")
    calls: list[tuple[str, int, int]] = []
    plan = plan_graph(graph, chip, progress=lambda *c: calls.append(c))
    solve = [c for c in calls if c[0] == "solve"]
    total = solve[0][2]
    # the default limit, 30 deterministic seconds, for each of the three solves of a t10
    # compile (the no-rotation and vgm baselines' own, then t10's), shown as one display
    assert total == 3 * 30_000
    assert solve[0] == ("solve", 0, total) and solve[-1] == ("solve", total, total)
    assert [d for _, d, _ in solve] == sorted(d for _, d, _ in solve)
    calls.clear()
    generate(graph, plan, chip, progress=lambda *c: calls.append(c))
    n = len(graph.ops)
    assert calls == [("codegen", i, n) for i in range(n + 1)]


@pytest.mark.parametrize("name,chip", [("llama-tiny-decode", "test64-dram"),
                                       ("resnet-tiny", "ipu-mk2")])
def test_slice_offsets_are_origin_less_tile_origin(name: str, chip: str) -> None:
    """`Geometry.slice_offsets` maps only the sub-block's place within the core's block
    (the block cancels); it equals its definition, the step's origin less the buffer's, on
    every operand of every searched plan (windows of convolutions and RoPE's shifted reads,
    rotating operands' partitions)."""
    from t10c.driver import chip_graph, load_source
    from t10c.partition import geometry, search_op_front

    graph = chip_graph(load_source(name, weights=False), PRESETS[chip], {})
    checked = 0
    for op in graph.ops:
        for p in search_op_front(graph, op, PRESETS[chip], "fp16").front[:6]:
            geo = geometry(graph, op, p)
            for i in range(len(op.operands)):
                for s in range(min(geo.steps, 8)):
                    assert np.array_equal(geo.slice_offsets(i, s),
                                          geo._dims(i, geo.origin(s)) - geo.tile_origin(i, s))
                    checked += 1
    assert checked > 500


def test_geometries_are_kept_shared_and_read_only() -> None:
    """`partition.geometry` hands back the geometry it made for the same op and plan while
    it is among the last few (the planner asks for one plan's several times in a row), a new
    one for another plan or for another op object alike, and the per-core arrays it shares
    are read-only: no caller can change what the others read."""
    from t10c.partition import geometry, search_op_front
    from t10c.partition import plan as plan_module

    graph = matmul_graph(12, 16, 8)
    op = graph.ops[0]
    front = search_op_front(graph, op, BASE, "fp32").front
    first = front[0]
    geo = geometry(graph, op, first)
    assert geometry(graph, op, first) is geo
    assert geometry(graph, op, dataclasses.replace(first, op="renamed")) is geo  # (layout)
    assert geometry(graph, op, front[1]) is not geo
    assert geometry(graph, dataclasses.replace(op), first) is not geo  # an equal op, not it
    for values in (geo.phys, geo.coords, geo.skew, geo.block_origin):
        with pytest.raises(ValueError, match="read-only"):
            values[...] = 0
    kept = plan_module._GEOMETRIES_KEPT
    others = [dataclasses.replace(first, F=tuple(f + k for f in first.F))
              for k in range(1, kept + 1)]
    for p in others:  # as many other plans as are kept: the first is no longer among them
        geometry(graph, op, p)
    again = geometry(graph, op, first)
    assert again is not geo and np.array_equal(again.tile_origin(0, 0), geo.tile_origin(0, 0))
