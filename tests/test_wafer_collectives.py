"""The mesh reduce-scatter in levels (K-tree, `partition/collectives.py`): placement of groups as
rectangles, the levels codegen emits, their link loads by hand on a tiny mesh, the same numbers
as onnxruntime on a 64 x 64 and a rectangular mesh, and the planner's price equal to the
emulated time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from t10c.chips import chip_from_dict
from t10c.codegen.program import Reduce
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.emulator.routing import route
from t10c.partition.collectives import _line_busiest, choose_levels
from t10c.partition.place import group_tile

TINY = chip_from_dict({"base": "wse2", "name": "tiny2x4", "grid": [2, 4], "cores": 8})
MESH64 = chip_from_dict({"base": "wse2", "name": "mesh64", "grid": [64, 64], "cores": 4096})
RECT = chip_from_dict({"base": "wse2", "name": "mesh24x40", "grid": [24, 40], "cores": 960})


def test_line_loads_by_hand() -> None:
    # 4 cores on a line, each gathering 2 elements from the 3 others: the middle link carries
    # 2 receivers x 2 senders x 2 elements each way
    assert _line_busiest(np.array([2, 2, 2, 2])) == 8
    line = chip_from_dict({"base": "wse2", "name": "line", "grid": [1, 4], "cores": 4})
    src, dst = np.array([s for d in range(4) for s in range(4) if s != d]), \
        np.array([d for d in range(4) for s in range(4) if s != d])
    r = route(line, src, dst, np.full(len(src), 2))
    assert r.max_link_bytes == 8 and r.loads[0, 0].tolist() == [6, 8, 6, 0]
    # only core 0 (2 elements) and core 1 (1) receive: link 0-1 westward carries 2 x 3
    assert _line_busiest(np.array([2, 1, 0, 0])) == 6


def test_groups_tile_the_mesh() -> None:
    assert group_tile(996, 757, 2048, 8) == (2, 4)  # the squarest: 2 x 4, 249 to a band
    assert group_tile(40, 24, 960, 15) == (3, 5)
    assert group_tile(4, 2, 8, 8) == (2, 4)  # the only one that fits
    assert group_tile(996, 757, 4096 * 128, 4096) == (64, 64)
    assert group_tile(996, 757, 700000 // 4096 * 4096, 4096) is None  # too full to tile
    # a line of 32 goes contiguous runs first, then every run's k-th core (a 2-level tree)
    assert [d.size for d in choose_levels(1, 32, 1, 1, 2)] == [8, 4]


def test_levels_link_loads_by_hand_on_a_tiny_mesh() -> None:
    """matmul 1x1024x4 on 2 x 4 cores: k split 8 ways, the group is the whole 2 x 4 mesh; the
    4 fp32 partial sums go up the columns first (one hop, only row 0 keeps data), then along
    row 0 (one element each)."""
    c = compile_model("matmul-1x1024x4", TINY, CompileOptions())
    levels = [i for i in c.program.instrs if isinstance(i, Reduce)]
    assert [lv.group.shape[1] for lv in levels] == [2, 4]
    assert [c.program.buffers[lv.dst].elems for lv in levels] == [4, 1]
    # level 1: each core with its column neighbour; level 2: along its row
    assert all(len({int(g) % 4 for g in row}) == 1 for row in levels[0].group)
    assert all(len({int(g) // 4 for g in row}) == 1 for row in levels[1].group)
    # the first level's chunk is 4 elements: the block's 4 on one core of each pair, padding
    # (nothing sent) on the other
    assert sorted(levels[0].sizes.tolist()) == [0, 0, 0, 0, 4, 4, 4, 4]
    r = run_compiled(c)
    assert r.ok
    red = [x for x in r.timeline.records if x.phase == "reduce"]
    # level 1: 4 elements x 4 bytes over one hop: 1 + 16/4 + add (8 + 4/4)
    assert (red[0].bytes_per_core, red[0].hops, red[0].cycles) == (16, 1, 14)
    # level 2: 2 receivers x 2 senders x 4 bytes on row 0's middle link, 3 hops: 3 + 4 + 9
    assert (red[1].bytes_per_core, red[1].hops, red[1].cycles) == (16, 3, 16)
    assert c.plan.ops[0].cycles.reduce == c.chip.sync_cycles + 14 + 16


@pytest.mark.parametrize("chip", [MESH64, RECT], ids=["64x64", "24x40"])
@pytest.mark.parametrize("model", ["matmul-1x4096x256", "matmul-4x2048x512"])
def test_levels_match_onnxruntime_and_the_planner(chip, model) -> None:
    c = compile_model(model, chip, CompileOptions())
    levels = [i for i in c.program.instrs if isinstance(i, Reduce)]
    assert len(levels) >= 2  # a tree, not one gather
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    emulated = r.timeline.by_op()["matmul"]
    predicted = c.plan.ops[0].cycles
    assert predicted.reduce == emulated["reduce"] + emulated["sync"]
    assert c.plan.total_cycles == r.timeline.cycles



def _levels_by_walk(h: int, w: int, rs: int, cs: int, elems: int, eb: int
                    ) -> tuple[tuple[int, int, int], ...]:
    """`routed_levels` by definition: every sender sends every receiver of its level group
    the receiver's chunk, link by link along their line, one way or the other."""
    digits = choose_levels(h, w, rs, cs, elems)
    unit = math.ceil(elems / (h * w))
    weights = [math.prod(d.size for d in digits[k + 1:]) for k in range(len(digits))]
    coord = {m: divmod(m, w) for m in range(h * w)}  # (row, column)
    value = {m: [((c if d.axis == 0 else r) // d.unit) % d.size for d in digits]
             for m, (r, c) in coord.items()}
    start = dict.fromkeys(coord, 0)
    out = []
    for k, d in enumerate(digits):
        chunk = unit * weights[k]
        for m in coord:
            start[m] += value[m][k] * chunk
        real = {m: min(max(elems - start[m], 0), chunk) * eb for m in coord}
        groups: dict[tuple, list[int]] = {}  # the members that differ in digit k alone
        for m in coord:
            groups.setdefault(tuple(v for i, v in enumerate(value[m]) if i != k), []).append(m)
        # each member's (line, position along it)
        where = {m: (r, c * cs) if d.axis == 0 else (c, r * rs) for m, (r, c) in coord.items()}
        load: dict[tuple, int] = {}
        hops = 0
        for members in groups.values():
            members.sort(key=lambda m: value[m][k])
            if sum(real[m] for m in members) > 0:
                hops = max(hops, where[members[-1]][1] - where[members[0]][1])
            for s in members:
                for r in members:
                    (line, a), (_, b) = where[s], where[r]
                    for x in range(min(a, b), max(a, b)):
                        key = (line, x, a < b)
                        load[key] = load.get(key, 0) + real[r]
        share = cs if d.axis == 0 else rs
        out.append((hops, max(load.values(), default=0) * share, (d.size - 1) * chunk))
    return tuple(out)


def test_routed_levels_are_the_link_by_link_walk() -> None:
    """The compiled level loads against every transfer walked link by link, on random
    rectangles, strides and block sizes."""
    from t10c.partition.collectives import routed_levels

    rng = np.random.default_rng(11)
    for _ in range(150):
        h, w = int(rng.integers(1, 9)), int(rng.integers(1, 17))
        if h * w < 2:
            continue
        rs, cs = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        elems, eb = int(rng.integers(1, 3000)), int(rng.choice([2, 4]))
        assert routed_levels(h, w, rs, cs, elems, eb) == _levels_by_walk(h, w, rs, cs, elems, eb), \
            (h, w, rs, cs, elems, eb)

def test_closed_form_line_load_equals_the_exact_one() -> None:
    from t10c.partition.collectives import _line_busiest_prefix

    rng = np.random.default_rng(7)
    for _ in range(3000):
        g, c = int(rng.integers(2, 70)), int(rng.integers(1, 9))
        left = int(rng.integers(0, g * c + 1))
        sizes = np.clip(left - c * np.arange(g), 0, c)
        assert _line_busiest(sizes) == _line_busiest_prefix(g, c, left), (g, c, left)


def test_mesh_front_keeps_the_plans_fed_least() -> None:
    """On a mesh the search's front is the Pareto front in (hot bytes, bytes fed, cycles), fed
    being the activation's first tiles over all cores: every enumerated plan is matched or
    beaten in all three by a front plan, and the front holds plans fed less than the fastest
    (which replicates the activation over every core of its weight split)."""
    from t10c import frontend
    from t10c.driver import load_source
    from t10c.partition import search_op, search_op_front
    from t10c.partition.cost import element_bytes
    from t10c.partition.plan import geometry

    graph = frontend.to_graph(load_source("matmul-1x576x1536"), name="gemv")
    op = graph.ops[0]

    def key(p) -> tuple[int, int, int]:
        geo = geometry(graph, op, p)
        fed = geo.ncores * math.prod(geo.tile_shape(0)) * element_bytes(op, 0, "fp16",
                                                                      frozenset())
        return p.hot_bytes_per_core, fed, p.cycles.total

    front = [key(p) for p in search_op_front(graph, op, RECT, "fp16").front]
    every = [key(p) for p in search_op(graph, op, RECT, "fp16")
             if p.hot_bytes_per_core <= RECT.sram_bytes_per_core]
    assert all(any(all(f <= e for f, e in zip(k, q)) for k in front) for q in every)
    fastest = min(front, key=lambda k: k[2])
    assert min(k[1] for k in front) < fastest[1]


def test_routes_in_slices_equal_the_whole_phase(monkeypatch) -> None:
    # a wafer-wide reduce is routed a few rows at a time: the link loads, busiest link and
    # longest route must be those of routing every transfer at once
    import t10c.emulator.routing as routing

    rng = np.random.default_rng(3)
    group = rng.integers(0, RECT.cores, size=(200, 7))
    here = rng.integers(0, RECT.cores, size=200)
    sent = rng.integers(0, 50, size=200)
    dst = np.broadcast_to(here[:, None], group.shape)
    nbytes = np.broadcast_to(sent[:, None], group.shape)
    whole = route(RECT, group.ravel(), dst.ravel(), nbytes.ravel())
    monkeypatch.setattr(routing, "_SLICE", 10)  # 1 row of 7 transfers per slice
    sliced = routing.route(RECT, group, dst, nbytes)
    assert (sliced.cycles, sliced.max_link_bytes, sliced.max_hops) == \
        (whole.cycles, whole.max_link_bytes, whole.max_hops)
    assert whole.loads is not None and sliced.loads is not None
    assert (sliced.loads == whole.loads).all()


def test_chunks_are_the_whole_tile_table_at_their_columns() -> None:
    from t10c.ir import tile_elements
    from t10c.partition.collectives import chunk_elements

    rng = np.random.default_rng(0)
    for _ in range(200):
        nd = int(rng.integers(1, 4))
        shape = tuple(int(x) for x in rng.integers(1, 9, size=nd))
        tile = tuple(int(x) for x in rng.integers(1, 6, size=nd))
        origin = rng.integers(-3, 9, size=(int(rng.integers(1, 20)), nd))
        elems = math.prod(tile)
        group = int(rng.integers(1, 8))
        chunk = -(-elems // group)
        pos = rng.integers(0, group, size=len(origin))
        flat, valid = tile_elements(origin, tile, shape)
        local = pos[:, None] * chunk + np.arange(chunk)[None, :]
        rows = np.arange(len(origin))[:, None]
        want_valid = valid[rows, np.minimum(local, elems - 1)] & (local < elems)
        got_flat, got_valid = chunk_elements(origin, tile, shape, pos, chunk)
        assert (got_valid == want_valid).all()
        assert (got_flat == flat[rows, np.minimum(local, elems - 1)]).all()


def test_block_keys_order_rows_as_unique_does() -> None:
    from t10c.partition.collectives import _row_keys

    rng = np.random.default_rng(1)
    rows = rng.integers(-4, 40, size=(500, 3)) * 8
    rank = np.unique(rows, axis=0, return_inverse=True)[1].ravel()
    order = np.lexsort((np.arange(len(rows)), rank))
    assert (np.argsort(_row_keys(rows), kind="stable") == order).all()


def test_replayed_link_loads_sparse_and_dense() -> None:
    from t10c.emulator.timing import _LinkDelta

    delta = np.zeros((4, 3, 5), dtype=np.int64)
    delta[1, 2, 3], delta[0, 0, 0] = 7, 2
    sparse = _LinkDelta.of(delta)
    assert sparse.index is not None and len(sparse.index) == 2
    dense = _LinkDelta.of(delta + 1)
    assert dense.index is None
    loads = np.ones_like(delta)
    sparse.add_to(loads)
    dense.add_to(loads)
    assert (loads == 2 * delta + 2).all()


def test_reduce_groups_by_the_grid_are_the_sorted_ones() -> None:
    """`_members` takes a plan's reduce groups from its core grid's axes where the output does
    not rotate: the same groups, in the same order, as sorting the cores by their output
    tiles' origins; a rotating output's are sorted."""
    from t10c.ir import Operand, TensorExpr
    from t10c.partition.collectives import _members, _sorted_members
    from t10c.partition.plan import Geometry

    rng = np.random.default_rng(5)
    for _ in range(150):
        # C[b, n, m] += A[b, m, k] * B[k, n]: the output's dimensions in another order than
        # the axes', two of them split
        sizes = {a: int(rng.integers(1, 9)) for a in "bmkn"}
        expr = TensorExpr("bmm", tuple(sizes.items()), Operand("C", ("b", "n", "m")),
                          (Operand("A", ("b", "m", "k")), Operand("B", ("k", "n"))), "sum",
                          ("mul", ("in", 0), ("in", 1)))
        F = tuple(int(rng.integers(1, min(e, 4) + 1)) for e in sizes.values())
        rotate = bool(rng.integers(0, 2)) and F[1] > 1
        T = (1, 2 if rotate else 1, 1, 1)
        rot = ((), (), (), ("m",) if rotate else ())
        geo = Geometry(expr, F, T, rot, ((), (), (), ()), {})
        if geo.reduce_group < 1:
            continue
        members, pos = _members(geo)
        want = _sorted_members(geo)
        assert np.array_equal(members, want), (F, rotate)
        assert np.array_equal(members[np.arange(len(members))[:, None], pos[members]],
                              members)
