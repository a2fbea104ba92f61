"""Multicast on meshes (`t10c/multicast.py`): route trees' link loads by hand on a tiny mesh and
a ring, the colours' waves and the fall-back to unicast, the emulator's and the reference
executor's multicast exchange, the planner's routed re-layouts equal to the emulated ones op
by op, and multicast programs against onnxruntime on a 64 x 64 and a 24 x 40 mesh."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import onnx
import pytest

from t10c import multicast
from t10c.chips import chip_from_dict
from t10c.codegen.pattern import from_table
from t10c.codegen.program import Alloc, Buffer, Exchange, Fill, Program, Shift, Sync
from t10c.codegen.program import exchange as make_exchange
from t10c.driver import compile_model, run_compiled
from t10c.dtypes import ceil_div
from t10c.emulator.machine import Machine
from t10c.emulator.reference import Reference
from t10c.emulator.routing import hops, route
from t10c.emulator.timing import TimingMachine
from t10c.multicast import (
    by_source,
    count_distinct,
    distinct,
    exchange_digest,
    exchange_trees,
    phase_cycles,
    prefer_multicast,
    relay_cycles,
    route_trees,
    route_unicasts,
    tree_cycles,
    waves,
)
from t10c.partition.plan import geometry

M3 = chip_from_dict({"base": "wse2", "name": "tiny3x3", "grid": [3, 3], "cores": 9})
TINY = chip_from_dict({"base": "wse2", "name": "tiny2x4", "grid": [2, 4], "cores": 8})
MESH64 = chip_from_dict({"base": "wse2", "name": "mesh64", "grid": [64, 64], "cores": 4096})
RECT = chip_from_dict({"base": "wse2", "name": "mesh24x40", "grid": [24, 40], "cores": 960})
MESH8 = chip_from_dict({"base": "wse2", "name": "mesh8", "grid": [8, 8], "cores": 64,
                        "sram_bytes_per_core": 1024 * 1024})

#: core 4 (the middle of 3 x 3) sends 10 bytes to cores 0, 2, 7 and 8
DESTS = [0, 2, 7, 8]


def _links(loads: np.ndarray) -> dict[tuple[str, int, int], int]:
    names = ("east", "west", "south", "north")
    return {(names[d], int(a), int(b)): int(loads[d, a, b])
            for d, a, b in zip(*np.nonzero(loads))}


@pytest.mark.parametrize("sort", [True, False])
def test_distinct_is_numpys_unique(sort: bool) -> None:
    """`distinct` skips the sort of a sorted array and gives what `np.unique` gives either
    way: values, first indices and inverse; `count_distinct` counts them."""
    rng = np.random.default_rng(3)
    for x in (rng.integers(0, 50, 400), rng.integers(-5, 3, 9), np.zeros(0, np.int64),
              np.array([7]), rng.integers(0, 1 << 40, 300)):
        x = np.sort(x) if sort else x
        want = np.unique(x, return_index=True, return_inverse=True)
        got = distinct(x, first=True, inverse=True)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(distinct(x), want[0])
        assert count_distinct(x) == len(want[0])


def test_tree_link_loads_by_hand_on_a_3x3_mesh() -> None:
    t = route_trees(M3, np.zeros(4), np.full(4, 4), np.array(DESTS), np.full(4, 10))
    assert t is not None
    # Y first takes 5 links, X first 6 (along row 1 both ways, then up column 0, up and down
    # column 2, down column 1): up and down column 1, then along row 0 both ways and along
    # row 2 east; every tree link carries the 10 bytes once
    assert _links(t.loads) == {("north", 0, 1): 10, ("south", 1, 1): 10, ("east", 0, 1): 10,
                               ("west", 0, 0): 10, ("east", 2, 1): 10}
    assert t.hops == 2 and int(t.counts.max()) == 1
    # as unicasts (X first), the copies to 2 and 8 share the eastward link of row 1
    u = route(M3, np.full(4, 4), np.array(DESTS), np.full(4, 10))
    assert u.loads is not None and _links(u.loads)[("east", 1, 1)] == 20
    assert int(u.loads.sum()) == 70 and int(t.loads.sum()) == 50
    # hops + ceil(busiest / 4 bytes per cycle): 2 + 3 against 2 + 5
    assert phase_cycles(M3, int(t.loads.max()), t.hops, 1) == 5 and u.cycles == 7
    assert prefer_multicast(M3, np.zeros(4), np.full(4, 4), np.array(DESTS), np.full(4, 10))
    # a chunk broadcast into row 0 from core 3: up column 0, then along row 0 (3 links), not
    # along row 1 and up every column (5)
    row = route_trees(M3, np.zeros(3), np.full(3, 3), np.array([0, 1, 2]), np.full(3, 2))
    assert row is not None and _links(row.loads) == {("north", 0, 0): 2, ("east", 0, 0): 2,
                                                     ("east", 0, 1): 2}
    assert row.hops == 3


def test_a_tree_of_one_destination_is_its_unicast_route() -> None:
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, RECT.cores, 300), rng.integers(0, RECT.cores, 300)
    nbytes = rng.integers(1, 99, 300)
    t = route_trees(RECT, np.arange(300), src, dst, nbytes)
    u = route(RECT, src, dst, nbytes)
    assert t is not None and u.loads is not None
    assert (t.loads == u.loads).all() and t.hops == u.max_hops
    # unicasts routed without counting trees per link: the same loads and hops
    fast = route_unicasts(RECT, src, dst, nbytes)
    assert fast is not None and (fast.loads == t.loads).all() and fast.hops == t.hops
    assert not fast.counts.any()


def test_unicasts_routed_in_chunks_load_the_links_as_routed_whole(monkeypatch) -> None:
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, RECT.cores, 1000), rng.integers(0, RECT.cores, 1000)
    nbytes = rng.integers(0, 99, 1000)
    dst[:200] = src[:200]  # a chunk's first transfers that stay home
    whole = route_unicasts(RECT, src, dst, nbytes)
    monkeypatch.setattr(multicast, "ROUTE_CHUNK", 128)
    chunked = route_unicasts(RECT, src, dst, nbytes)
    u = route(RECT, src, dst, nbytes)
    assert whole is not None and chunked is not None and u.loads is not None
    assert (chunked.loads == whole.loads).all() and (whole.loads == u.loads).all()
    assert chunked.hops == whole.hops == u.max_hops
    # a chunk that moves nothing, and a phase that moves nothing
    assert route_unicasts(RECT, src[:150], src[:150], nbytes[:150]) is None


def test_torus_trees_go_the_shorter_way() -> None:
    ring = chip_from_dict({"base": "wse2", "name": "ring5", "grid": [1, 5], "cores": 5,
                           "topology": "torus2d"})
    t = route_trees(ring, np.zeros(2), np.zeros(2), np.array([3, 4]), np.full(2, 8))
    assert t is not None
    # 0 -> 4 -> 3 westward over the wrap-around: links 4 (joins 4 and 0) and 3
    assert _links(t.loads) == {("west", 0, 3): 8, ("west", 0, 4): 8} and t.hops == 2


def test_colours_cap_the_trees_on_a_link() -> None:
    line = chip_from_dict({"base": "wse2", "name": "line4", "grid": [1, 4], "cores": 4,
                           "routes_per_core": 2})
    # three trees from core 0 to core 3 share every link: 3 trees on 2 colours, 2 waves
    t = route_trees(line, np.arange(3), np.zeros(3), np.full(3, 3), np.full(3, 4))
    assert t is not None and int(t.counts.max()) == 3 and waves(line, 3) == 2
    assert phase_cycles(line, int(t.loads.max()), t.hops, 3) == 3 * 2 + 12 // 4
    # one tree each, so no byte is saved: the waves make multicast slower, unicast it is
    assert not prefer_multicast(line, np.arange(3), np.zeros(3), np.full(3, 3), np.full(3, 4))
    assert waves(dataclasses.replace(line, routes_per_core=0), 3) == 1


def test_a_source_feeding_many_groups_sends_one_tree() -> None:
    """Core 4 of a 3 x 3 mesh with one colour per router: cores 0 and 8 read its element a,
    cores 2 and 6 its element b (2 bytes each). Each tree takes 4 links either way, so goes X
    first, and both cross row 1's links: two waves, 2 x 2 hops + 1 cycle of bytes. Merged
    into one tree of both elements per source (`by_source`, Y first): one wave, 2 hops + 1
    cycle; so the exchange sends that (`exchange_trees`).
    Where the groups lie apart (core 3 reads a, core 5 reads b, no colour limit) the merged
    tree would carry both elements both ways: the two trees are kept."""
    one = dataclasses.replace(M3, routes_per_core=1)
    tree, src, dst, nbytes = (np.array([0, 0, 1, 1]), np.full(4, 4), np.array([0, 8, 2, 6]),
                              np.full(4, 2))
    merged = by_source(tree, src, dst, nbytes)
    assert [m.tolist() for m in merged] == [[4] * 4, [4] * 4, [0, 2, 6, 8], [4] * 4]
    assert tree_cycles(one, tree, src, dst, nbytes) == 2 * 2 + 1
    assert tree_cycles(one, *merged) == 2 + 1
    assert all((a == b).all() for a, b in zip(exchange_trees(one, tree, src, dst, nbytes),
                                              merged))
    apart = (np.array([0, 1]), np.full(2, 4), np.array([3, 5]), np.full(2, 40))
    assert tree_cycles(M3, *apart) == 1 + 10 < tree_cycles(M3, *by_source(*apart)) == 1 + 20
    assert all((a == b).all() for a, b in zip(exchange_trees(M3, *apart), apart))


def _broadcast_program(multicast: bool) -> Program:
    """Cores 0, 2, 7 and 8 read both fp16 elements of core 4's buffer; the others keep
    their own."""
    core = np.tile(np.arange(9)[:, None], (1, 2))
    core[DESTS] = 4
    off = np.tile(np.arange(2)[None, :], (9, 1))
    bufs = (Buffer(0, "a", 2, "fp16", 0), Buffer(1, "b", 2, "fp16", 64))
    p = from_table(core, off)
    instrs = (Alloc("x", "compute", 0), Fill("x", "compute", 0, 1.0, 9),
              Alloc("x", "relayout", 1), Sync("x", "relayout"),
              make_exchange("x", "relayout", 1, 0, p, 2, None, multicast))
    return Program("bcast", M3.name, "fp16", 9, bufs, (), instrs, {}, (), 128)


def test_emulator_and_reference_run_a_multicast_exchange() -> None:
    prog = _broadcast_program(True)
    ex = prog.instrs[-1]
    assert isinstance(ex, Exchange) and ex.multicast
    tm = TimingMachine(prog, M3)
    timeline = tm.execute({}, {})
    # 2 fp16 elements = 4 bytes per tree link (5 links, Y first); 2 hops + 1 cycle
    rec = [r for r in timeline.records if r.phase == "relayout"]
    assert [(r.cycles, r.bytes_per_core, r.hops) for r in rec] == [(3, 4, 2)]
    assert timeline.link_bytes is not None and int(timeline.link_bytes.sum()) == 20
    uni = TimingMachine(_broadcast_program(False), M3).execute({}, {})
    assert uni.link_bytes is not None and int(uni.link_bytes.sum()) == 28
    # the values: the emulator's (a gather) and the reference's (one packet per tree)
    ref = Reference(prog, {})
    rng = np.random.default_rng(1)
    values = rng.standard_normal((9, 2)).astype(np.float16)
    for step, ins in enumerate(prog.instrs):
        if step == 2:  # the source buffer holds distinct values on every core
            for c in range(9):
                ref.mem[c][0][:] = values[c]
        ref.step(ins)
    machine = Machine(prog, M3)
    for step, ins in enumerate(prog.instrs):
        if step == 2:
            machine.mem[0][:] = values
        machine.step(ins)
    got = np.stack([ref.mem[c][1] for c in range(9)])
    want = values.copy()
    want[DESTS] = values[4]
    assert (got == want).all()
    assert (np.asarray(machine.mem[1]).astype(np.float16) == want).all()


def _emulated_relayout(c, r) -> list[int]:
    """Per op: the emulated re-layout phases (its weights' fetch from their idle layout
    included, as the plan counts it) and the barrier before them."""
    out = {op.name: 0 for op in c.graph.ops}
    for rec in r.timeline.records:
        if rec.phase in ("relayout", "fetch"):
            out[rec.op] += rec.cycles
    for ins in c.program.instrs:
        if isinstance(ins, Sync) and ins.phase == "relayout":
            out[ins.op] += c.chip.sync_cycles
    return [out[op.name] for op in c.graph.ops]


@pytest.mark.parametrize("chip, model", [
    (TINY, "matmul-4x64x64"), (MESH8, "llama-tiny-decode"),
    (MESH64, "llama-tiny-decode"), (RECT, "llama-tiny-decode"), (RECT, "matmul-1x256x256")],
    ids=["2x4-matmul", "8x8-llama", "64x64-llama", "24x40-llama", "24x40-gemv"])
def test_multicast_matches_onnxruntime_and_the_planner_op_by_op(chip, model) -> None:
    c = compile_model(model, chip)
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    exchanges = [i for i in c.program.instrs if isinstance(i, Exchange)]
    if model == "llama-tiny-decode":  # replicated activations go as trees
        assert any(e.multicast for e in exchanges)
    # the planner routes the chosen plans' re-layouts as codegen emits them: within 10% of
    # the emulated phase per op (and here exactly)
    emulated = _emulated_relayout(c, r)
    for op, predicted, got in zip(c.graph.ops, c.plan.relayout_cycles, emulated):
        assert abs(predicted - got) <= 0.1 * got, (op.name, predicted, got)
    assert list(c.plan.relayout_cycles) == emulated
    # every shift of the embedded plans is still at most 2 hops
    shifts = [i for i in c.program.instrs if isinstance(i, Shift)]
    assert all(hops(chip, s.src_core, s.cores).max() <= 2 for s in shifts)


def test_aligned_plans_on_a_mesh_are_routed_and_exact() -> None:
    """On a mesh the second solve offers plans aligned to the cores a producer leaves
    (`partition/align.py`): bert-tiny on 64 x 64 takes some, none reduces, each runs on its
    producer's cores, and their re-layouts are routed like every mesh plan's, so the predicted
    re-layout still equals the emulated one op by op, and the result matches onnxruntime."""
    c = compile_model("bert-tiny", MESH64)
    aligned = [(i, p) for i, p in enumerate(c.plan.ops) if p.aligned >= 0]
    assert aligned
    producer = {op.output.tensor: j for j, op in enumerate(c.graph.ops)}
    for i, p in aligned:
        op = c.graph.ops[i]
        assert p.embed is None  # its producer's cores (a list, or the row-major first ones)
        geo = geometry(c.graph, op, p)
        assert geo.reduce_group == 1
        j = producer[op.inputs[p.aligned].tensor]
        left = geometry(c.graph, c.graph.ops[j], c.plan.ops[j]).phys
        assert set(geo.phys.tolist()) <= set(left.tolist())
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    assert list(c.plan.relayout_cycles) == _emulated_relayout(c, r)


def _squared_gemv() -> onnx.ModelProto:
    """A vector squared, then a 4096 x 4096 GEMV (x * x: a scale by a weight would fold into
    the GEMV's, `fold_scale_into_matmuls`)."""
    from ophelpers import make_model

    def build(g, xs):
        return g.node("MatMul", g.node("Mul", xs[0], xs[0]), g.weight(4096, 4096))

    return make_model("scaled-gemv", build, ((1, 4096),))


def _count_relays(monkeypatch) -> list[bool]:
    """Per exchange routed from now on (by codegen, the emulator or the planner:
    `multicast.multicast_routes`), whether it went relayed."""
    from t10c import multicast

    used: list[bool] = []
    relayed = multicast.relayed

    def counted(*args):
        got = relayed(*args)
        used.append(got is not None)
        return got

    monkeypatch.setattr(multicast, "relayed", counted)
    monkeypatch.setattr(multicast, "_ROUTES", OrderedDict())  # (routes kept from before)
    monkeypatch.setattr(multicast, "_WAYS", {})  # (and the ways decided)
    return used


def test_the_solver_prices_the_colours_waves_of_a_broadcast(monkeypatch) -> None:
    """A vector squared on 4096 cores (64 x 64 on wse2) and broadcast into a 4096 x 4096
    GEMV's tiles: every squaring core's tree spans the GEMV's region, the trees of one side of
    the 64 x 64 share links, and 24 colours would run them in waves. The solver's edge
    estimate counts them (`transitions.broadcast_trees`: one tree per core of the longer
    side, at most one per copy of an element); routed, the exchange is relayed (one tree per
    group of cores that read alike, after a gather), as emulated, and faster than the same
    step without relays."""
    from t10c import multicast
    from t10c.chips import PRESETS
    from t10c.driver import CompileOptions
    from t10c.partition import SolverOptions, meshmove, transitions
    from t10c.partition.place import exchange_estimate

    wse2 = PRESETS["wse2"]
    assert transitions.broadcast_trees(64, 64, 4096, 2, 262144, 8) == 64
    assert transitions.broadcast_trees(64, 64, 4096, 2, 8192, 2) == 2  # two copies each
    # 64 trees on 24 colours: three waves of the 64 hops of a 64 x 64 region
    assert exchange_estimate(wse2, 8, 2, (64, 64), 64) == 3 * 64 + ceil_div(8 * 16, 4)
    assert exchange_estimate(wse2, 8, 2, (64, 64), 24) == exchange_estimate(wse2, 8, 2,
                                                                             (64, 64))

    model = _squared_gemv()
    # (the solve's plans, not moved by the routed search after it: the same in both compiles)
    options = CompileOptions(timing_only=True, solver=SolverOptions(refine=0))
    used = _count_relays(monkeypatch)
    relayed = compile_model(model, wse2, options)
    assert any(used)
    assert relayed.timeline is not None
    assert relayed.plan.total_cycles == relayed.timeline.cycles  # routed, as emulated
    # without relays the same plans' broadcast goes in waves (or as unicasts): slower
    # (the one rule codegen, the emulator and the planner follow)
    monkeypatch.setattr(multicast, "relayed", lambda *args: None)
    monkeypatch.setattr(meshmove, "_PHASES", {})  # (the phases priced with relays)
    monkeypatch.setattr(multicast, "_ROUTES", OrderedDict())  # (and the routes kept,
    monkeypatch.setattr(multicast, "_WAYS", {})  # and the ways decided)
    direct = compile_model(model, wse2, options)
    assert [p.F for p in relayed.plan.ops] == [p.F for p in direct.plan.ops]
    assert direct.timeline is not None
    assert relayed.timeline.cycles < direct.timeline.cycles
    assert direct.plan.total_cycles == direct.timeline.cycles


def test_a_relay_by_hand_on_a_4x4_mesh() -> None:
    """Cores 0 and 1 (row 0) send 2 bytes each to cores 14 and 15 (row 3), one group: the
    relay is the destination nearest the sources' mean (0, 0.5), which rounds to (0, 0):
    core 14, 5 hops away (15 is 6). It gathers both trees' bytes, then sends them to 15 as
    one tree of 4 bytes."""
    from t10c.multicast import relay_stages, unicast_cycles

    mesh = chip_from_dict({"base": "wse2", "name": "m4", "grid": [4, 4], "cores": 16})
    tree = np.array([0, 0, 1, 1])
    src = np.array([0, 0, 1, 1])
    dst = np.array([14, 15, 14, 15])
    r = relay_stages(mesh, tree, src, dst, np.full(4, 2), np.zeros(4, dtype=int))
    assert [a.tolist() for a in r.gather] == [[0, 1], [14, 14], [2, 2]]
    assert [a.tolist() for a in r.spread] == [[0], [14], [15], [4]]
    # the gather: routes of 5 and 4 hops sharing the link east of core 1 (4 bytes), then
    # the spread: one hop with 4 bytes
    assert unicast_cycles(mesh, *r.gather) == 5 + 1
    assert relay_cycles(mesh, r) == (5 + 1) + (1 + 1)


def test_routes_asked_again_are_the_kept_read_only_answer(monkeypatch) -> None:
    """The planner, codegen and the emulator ask `multicast_routes` the same: the answer is
    kept (by chip and arrays), read-only so that no caller can change it for the next."""
    from t10c import multicast

    monkeypatch.setattr(multicast, "_ROUTES", OrderedDict())
    monkeypatch.setattr(multicast, "_WAYS", {})
    mesh = chip_from_dict({"base": "wse2", "name": "m4", "grid": [4, 4], "cores": 16})
    tree, src = np.array([0, 0, 1, 1]), np.array([0, 0, 1, 1])
    dst, nbytes, group = np.array([14, 15, 14, 15]), np.full(4, 2), np.zeros(4, dtype=int)
    first = multicast.multicast_routes(mesh, tree, src, dst, nbytes, group)
    assert isinstance(first, tuple)  # two trees (the test above: faster than its relay)
    assert multicast.multicast_routes(mesh, tree.copy(), src, dst, nbytes, group) is first
    with pytest.raises(ValueError, match="read-only"):
        first[0][0] = 3
    same = chip_from_dict({"base": "wse2", "name": "m4", "grid": [4, 4], "cores": 16})
    again = multicast.multicast_routes(same, tree, src, dst, nbytes, group)
    assert again is not first and all(np.array_equal(a, b) for a, b in zip(again, first))
    assert multicast.multicast_routes(mesh, tree, src, dst, nbytes + 1, group) is not first


def test_a_relayed_broadcast_matches_onnxruntime(monkeypatch) -> None:
    """On wse2 the squared vector's broadcast into the GEMV's tiles is relayed (the test
    above); the program still computes onnxruntime's numbers, and every op's re-layout is
    predicted as emulated (the reference executor runs the same table)."""
    from t10c.chips import PRESETS
    from t10c.driver import CompileOptions

    used = _count_relays(monkeypatch)
    c = compile_model(_squared_gemv(), PRESETS["wse2"], CompileOptions())
    r = run_compiled(c)
    assert any(used)
    assert r.ok, r.max_rel_err
    assert list(c.plan.relayout_cycles) == _emulated_relayout(c, r)


def test_the_region_estimate_of_a_broadcast_and_a_gather_on_wse2() -> None:
    """`place.relayout_estimate`, which `--refine` ranks its moves by, against phases routed
    on wse2 (a LLaMA-3-8B decode layer's): a 4096-vector left on 128 cores (16 x 8) and
    broadcast into the 64 x 1536 tiles of the q, k and v projection (320 x 312 cores, 128 B
    each) routed in 572 cycles (316 hops, 16 trees of 64 B on the busiest link); the
    solver's estimate, across the chip's width for the aligned producer, puts it at 44,760.
    A reduction's 4096 partial sums per core gathered from 672 x 704 cores into 2 routed in
    1,712 cycles (688 hops, 4096 B on the busiest link)."""
    from t10c.chips import PRESETS
    from t10c.partition.place import exchange_estimate, relayout_estimate

    wse2 = PRESETS["wse2"]
    broadcast = relayout_estimate(wse2, 128, (16, 8, 128, 64), (320, 312, 98304, 0), 8192)
    assert broadcast == 316 + 16 * 64 // 4 == 572
    # the solver's: the producer's region the whole chip, so a tree per core of its 996 columns
    assert exchange_estimate(wse2, 128, 64, (757, 996), 996) > 70 * broadcast
    gather = relayout_estimate(wse2, 4096, (672, 704, 458752, 4), (1, 2, 2, 0), 8192)
    assert gather == 688 + 4096 // 4 == 1712
    # a tile from many producer cores (8 each here) goes relayed: gathered, then spread in
    # sqrt(256) = 16 trees across both regions (o_proj's input: routed 670 to 1,445)
    relay = relayout_estimate(wse2, 32, (256, 256, 65536, 4), (376, 352, 131072, 0), 8192)
    assert relay == (128 + 64 // 4) + (620 + 16 * 32 // 4)


def test_an_exchange_digests_alike_in_any_order_and_numbering() -> None:
    # four groups of destinations, each fed by trees from two or three sources
    rng = np.random.default_rng(2)
    entries = []
    for g, dsts in enumerate(np.array_split(rng.permutation(MESH64.cores)[:40], 4)):
        for s in rng.choice(MESH64.cores, 2 + g % 2, replace=False):
            nbytes = int(rng.integers(1, 64))
            entries += [(g, int(s), int(d), nbytes) for d in dsts]
    group, src, dst, nbytes = (np.array(c) for c in zip(*entries))
    tree = np.unique(group * MESH64.cores + src, return_inverse=True)[1].ravel()
    digest = exchange_digest(tree, src, dst, nbytes, group)
    # listed core by core, trees and groups numbered otherwise: the same exchange
    order = rng.permutation(len(src))
    assert exchange_digest(tree[order] * 7 + 3, src[order], dst[order], nbytes[order],
                           100 - group[order]) == digest
    # another byte count, another destination, or a tree split in two: another exchange
    more = nbytes.copy()
    more[5] += 1
    moved = dst.copy()
    moved[0] = int(np.setdiff1d(np.arange(MESH64.cores), dst)[0])
    split = tree.copy()
    split[0] = tree.max() + 1
    for other in (exchange_digest(tree, src, dst, more, group),
                  exchange_digest(tree, src, moved, nbytes, group),
                  exchange_digest(split, src, dst, nbytes, group)):
        assert other != digest
    # without groups, the arrays as they are
    assert exchange_digest(tree, src, dst, nbytes, None) != \
        exchange_digest(tree[order], src[order], dst[order], nbytes[order], None)


def test_an_exchange_decided_before_is_not_routed_again(monkeypatch) -> None:
    """Once the routes are dropped (`ROUTES_KEPT`), the way an exchange went is still kept:
    the same exchange, its entries in another order and numbered otherwise (as codegen lists
    what the planner priced), goes the same way without being routed again."""
    from t10c import multicast

    monkeypatch.setattr(multicast, "_ROUTES", OrderedDict())
    monkeypatch.setattr(multicast, "_WAYS", {})
    worked = []
    work = multicast._routes
    monkeypatch.setattr(multicast, "_routes", lambda *a: worked.append(1) or work(*a))
    # on 64 x 64: four groups of 16 cores, each fed by its own source (trees), and then a
    # vector on 64 cores read whole by 2048 (relayed or trees, as `_routes` decides)
    src = np.repeat([0, 100, 2000, 4095], 16)
    dst = np.arange(64) * 61 % 4096
    group = np.repeat(np.arange(4), 16)
    for tree, s, d, g in ((group, src, dst, group),
                          (np.repeat(np.arange(64), 2048), np.repeat(np.arange(64) * 64, 2048),
                           np.tile(np.arange(2048) * 2 + 1, 64), np.zeros(64 * 2048, int))):
        nbytes = np.full(len(s), 8)
        first = multicast.multicast_routes(MESH64, tree, s, d, nbytes, g)
        monkeypatch.setattr(multicast, "_ROUTES", OrderedDict())  # (dropped)
        order = np.random.default_rng(3).permutation(len(s))
        again = multicast.multicast_routes(MESH64, tree[order] + 5, s[order], d[order],
                                           nbytes[order], g[order] * 3 + 1)
        assert len(worked) == 1
        worked.clear()
        assert type(again) is type(first)
        if isinstance(first, multicast.Relay):
            assert isinstance(again, multicast.Relay)
            assert relay_cycles(MESH64, again) == relay_cycles(MESH64, first)
        elif first is not None:
            assert again is not None and tree_cycles(MESH64, *again) == tree_cycles(MESH64, *first)


def test_a_relay_finds_each_groups_destinations_from_its_first_tree() -> None:
    """`relay_stages` takes each group's destinations from its first tree (a group's trees go
    to the same cores): the pairs are every entry's (group, destination) pairs, whatever the
    entries' order and numbering; where the entries do not add up to that (a tree of a group
    going where its first does not), it counts every entry's."""
    rng = np.random.default_rng(5)
    for broken in (False, True):
        entries = []
        for g in range(6):
            cores = rng.choice(MESH64.cores, size=int(rng.integers(2, 40)), replace=False)
            for t, s in enumerate(rng.choice(MESH64.cores, size=int(rng.integers(1, 6)),
                                             replace=False)):
                mine = rng.permutation(cores)
                if broken and g == 2 and t == 1:  # one more core than the group's first
                    mine = np.append(mine, np.setdiff1d(np.arange(MESH64.cores), cores)[0])
                entries += [(g * 10 + t + 7, s, d, 4, 3 * g + 1) for d in mine]
        e = np.array(entries)[rng.permutation(len(entries))]
        tree, src, dst, nbytes, group = e.T
        _, first = multicast.distinct(tree, first=True)
        g_ids, t_g = np.unique(group[first], return_inverse=True)
        got = multicast._group_destinations(tree, dst, group, g_ids, t_g.reshape(-1), first,
                                            MESH64.cores)
        every = multicast.distinct(np.searchsorted(g_ids, group) * MESH64.cores + dst)
        assert np.array_equal(got[0], every // MESH64.cores)
        assert np.array_equal(got[1], every % MESH64.cores)
        relay = multicast.relay_stages(MESH64, tree, src, dst, nbytes, group)
        assert len(relay.spread[0]) == len(every) - len(g_ids)  # (the relays keep theirs)



@pytest.mark.parametrize("torus", [False, True], ids=["mesh", "torus"])
def test_a_groups_relay_is_its_destination_nearest_its_sources(torus) -> None:
    """Each group's relay is, of its destinations, the one the fewest hops (each leg the
    shorter way round a torus) from its sources' mean core, the least core number among
    those: by definition, destination by destination, on random groups."""
    chip = chip_from_dict({"base": "wse2", "name": "t24x40", "grid": [24, 40], "cores": 960,
                           **({"topology": "torus2d"} if torus else {})})
    rows, cols = chip.grid
    rng = np.random.default_rng(3)
    t_group, t_src, p_group, p_dst = [], [], [], []
    for g in range(40):
        for s in rng.choice(chip.cores, size=int(rng.integers(1, 5)), replace=False):
            t_group.append(g)
            t_src.append(int(s))
        for d in rng.choice(chip.cores, size=int(rng.integers(1, 30)), replace=False):
            p_group.append(g)
            p_dst.append(int(d))
    t_group, t_src, p_group, p_dst = map(np.array, (t_group, t_src, p_group, p_dst))
    got = multicast.grouped_relay(chip, t_group, t_src, np.ones_like(t_src), p_group, p_dst)
    want = []
    for g in range(40):
        src = t_src[t_group == g]
        mr, mc = (int(np.rint(np.mean(x))) for x in np.divmod(src, cols))

        def far(d: int, mr: int = mr, mc: int = mc) -> int:
            legs = [abs(b - a) if not torus else min((b - a) % n, (a - b) % n)
                    for a, b, n in ((mc, d % cols, cols), (mr, d // cols, rows))]
            return sum(legs)

        want += [min(p_dst[p_group == g].tolist(), key=lambda d: (far(d), d))] * len(src)
    assert got.gather[1].tolist() == want

def test_a_grouped_relay_is_the_relay_of_its_spelt_out_trees() -> None:
    """`grouped_relay` from the trees and each group's destinations gives the stages
    `relay_stages` gives from every (tree, destination) entry: the same gather, the same
    spread (as sets of transfers: their order and the trees' numbers do not route), the
    same cycles; destinations of a group without trees are left out."""
    rng = np.random.default_rng(11)
    trees, pairs, entries = [], [], []
    for g in range(7):
        cores = rng.choice(MESH64.cores, size=int(rng.integers(2, 60)), replace=False)
        pairs += [(g, d) for d in cores]
        if g == 4:
            continue  # a group no tree goes to
        for s in rng.choice(MESH64.cores, size=int(rng.integers(1, 9)), replace=False):
            nbytes = int(rng.integers(1, 64))
            trees.append((g, s, nbytes))
            entries += [(len(trees), s, d, nbytes, g) for d in cores]
    tree, src, dst, nbytes, group = np.array(entries).T
    spelt = multicast.relay_stages(MESH64, tree, src, dst, nbytes, group)
    t_group, t_src, t_bytes = np.array(trees).T
    p_group, p_dst = np.array(pairs)[rng.permutation(len(pairs))].T
    got = multicast.grouped_relay(MESH64, t_group, t_src, t_bytes, p_group, p_dst)

    def transfers(stage: tuple[np.ndarray, ...], skip: int) -> list[tuple[int, ...]]:
        return sorted(zip(*(a.tolist() for a in stage[skip:])))

    assert transfers(got.gather, 0) == transfers(spelt.gather, 0)
    assert transfers(got.spread, 1) == transfers(spelt.spread, 1)
    assert relay_cycles(MESH64, got) == relay_cycles(MESH64, spelt)


@pytest.mark.parametrize("chip", [MESH64, RECT], ids=["64x64", "24x40"])
def test_exchanges_too_large_to_spell_out_go_relayed_and_exact(monkeypatch, chip) -> None:
    """With `EXPANDED_ENTRIES` lowered so that every multicast exchange is above it, the
    planner, codegen and the emulator all relay them from their groups (`grouped_relay`),
    never multiplying trees by destinations: llama-tiny-decode still computes onnxruntime's
    numbers, and every op's re-layout is predicted as emulated."""
    from t10c.codegen import pattern
    from t10c.emulator import timing
    from t10c.partition import meshmove

    spelt: list[int] = []
    real = multicast.relay_stages

    def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
        spelt.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(multicast, "relay_stages", watched)
    grouped: list[int] = []
    real_grouped = multicast.grouped_relay

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        grouped.append(1)
        return real_grouped(*args, **kwargs)

    for module in (meshmove, pattern):  # (the planner's rule, and codegen's and the emulator's)
        monkeypatch.setattr(module, "EXPANDED_ENTRIES", 0)
    for module in (meshmove, timing):
        monkeypatch.setattr(module, "grouped_relay", counted)
    monkeypatch.setattr(meshmove, "_PHASES", {})
    c = compile_model("llama-tiny-decode", chip)
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    exchanges = [i for i in c.program.instrs if isinstance(i, Exchange)]
    assert any(e.multicast for e in exchanges)
    assert grouped and not spelt
    assert list(c.plan.relayout_cycles) == _emulated_relayout(c, r)


def _walk(start: int, end: int, size: int, torus: bool) -> list[tuple[int, int]]:
    """The links of a leg from ``start`` to ``end``, walked hop by hop: (0, x) for the
    positive way's link x (joining x and x + 1), (1, x) for the negative way's; on a torus
    the shorter way round, a tie the way that does not wrap."""
    delta = end - start
    if torus and abs(delta) * 2 > size:
        delta -= size if delta > 0 else -size
    out, x = [], start
    for _ in range(abs(delta)):
        if delta > 0:
            out.append((0, x % size))
            x += 1
        else:
            out.append((1, (x - 1) % size))
            x -= 1
    return out


def _walked(chip, tree, src, dst, nbytes, choose: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Link loads, trees per link and the longest route of trees walked hop by hop: each the
    union of its destinations' routes, X first or (with ``choose``, where that takes fewer
    links) Y first; the definition `route_trees` and `route_unicasts` are checked against."""
    rows, cols = chip.grid
    torus = chip.topology == "torus2d"
    loads, counts = np.zeros((4, rows, cols), dtype=np.int64), np.zeros((4, rows, cols),
                                                                       dtype=np.int64)
    hops = -1
    for t in dict.fromkeys(tree.tolist()):
        moving = [k for k in np.flatnonzero(tree == t) if src[k] != dst[k] and nbytes[k] > 0]
        if not moving:
            continue
        ways = []
        for x_first in (True, False):
            links = set()
            for k in moving:
                (sr, sc), (dr, dc) = divmod(int(src[k]), cols), divmod(int(dst[k]), cols)
                row = [(w, sr if x_first else dr, x) for w, x in _walk(sc, dc, cols, torus)]
                col = [(2 + w, y, dc if x_first else sc) for w, y in _walk(sr, dr, rows, torus)]
                links |= set(row) | set(col)
                hops = max(hops, len(row) + len(col))
            ways.append(links)
        links = ways[1] if choose and len(ways[1]) < len(ways[0]) else ways[0]
        for d, a, b in links:
            loads[d, a, b] += int(nbytes[moving[0]])
            counts[d, a, b] += 1
    return loads, counts, hops


@pytest.mark.parametrize("seed", range(8))
def test_routes_load_the_links_a_hop_by_hop_walk_does(seed: int) -> None:
    """The compiled kernels (`t10c.meshkernels`) against the routes walked hop by hop, on
    small meshes and tori: trees of several destinations (some their own source, some of no
    bytes), each X first or Y first whichever takes fewer links; unicasts, X first, as
    `route_unicasts` and the emulator's `route` load them."""
    rng = np.random.default_rng(seed)
    rows, cols = int(rng.integers(1, 7)), int(rng.integers(2, 9))
    topology = "torus2d" if seed % 2 else "mesh2d"
    chip = chip_from_dict({"base": "wse2", "name": f"walk{seed}", "grid": [rows, cols],
                           "cores": rows * cols, "topology": topology})
    ntrees = int(rng.integers(1, 12))
    sizes = rng.integers(1, 6, ntrees)
    tree = np.repeat(rng.permutation(100)[:ntrees] * 3, sizes)  # any numbers, in runs
    src = np.repeat(rng.integers(0, rows * cols, ntrees), sizes)
    nbytes = np.repeat(rng.integers(0, 50, ntrees), sizes)
    dst = rng.integers(0, rows * cols, len(tree))
    want_loads, want_counts, want_hops = _walked(chip, tree, src, dst, nbytes, choose=True)
    got = route_trees(chip, tree, src, dst, nbytes)
    if want_hops < 0:
        assert got is None
    else:
        assert got is not None and got.hops == want_hops
        assert (got.loads == want_loads).all() and (got.counts == want_counts).all()
    # every entry a tree of its own, X first
    uni_loads, _, uni_hops = _walked(chip, np.arange(len(dst)), src, dst, nbytes, choose=False)
    uni = route_unicasts(chip, src, dst, nbytes)
    emulated = route(chip, src, dst, nbytes)
    if uni_hops < 0:
        assert uni is None and emulated.loads is None
    else:
        assert uni is not None and uni.hops == uni_hops and (uni.loads == uni_loads).all()
        assert emulated.max_hops == uni_hops and (emulated.loads == uni_loads).all()


def test_the_kernels_leg_is_the_leg_rule() -> None:
    """The compiled kernels' one leg (`meshkernels._leg`) is `multicast.leg`'s, on lines and
    rings of every size up to 9, from every start to every end."""
    from t10c import meshkernels

    for size in range(1, 10):
        ends = np.arange(size)
        for torus in (False, True):
            for start in range(size):
                delta, _ = multicast.leg(np.full(size, start), ends, size, torus)
                assert [meshkernels._leg.py_func(start, e, size, torus)
                        for e in range(size)] == delta.tolist()
