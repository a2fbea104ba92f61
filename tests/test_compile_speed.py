"""The planner's fast paths against their plain definitions: the element-wise re-layout counts
(`transitions.remote_counts`) against counting each core's box by hand, and the per-compile
memo of re-layout prices (`transitions.Views`) against pricing afresh; codegen's spread
weights' pattern (`codegen.pattern.spread_pattern`) against encoding their table, and the
elements each row receives (`codegen.pattern.received`) against its pairs counted; the
array helpers (`ir.ranges`, `ir.last_product`, `ir.row_keys`, `place.grid_coords`) and a
plan's per-core index arithmetic (`plan.Geometry`) against numpy's whole-array forms; and
the plans' layout keys, one per layout while it is held (`plan.HashedKey`)."""

from __future__ import annotations

import dataclasses
import gc
import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from t10c.ir import Operand, TensorExpr, last_product, ranges, row_keys
from t10c.partition.place import grid_coords
from t10c.partition.plan import Cycles, Geometry, HashedKey, OpPlan
from t10c.partition.transitions import Have, Want, _bounds, _wanted, remote_counts


def _by_hand(owner: np.ndarray, want: Want, shape: tuple[int, ...]) -> np.ndarray:
    """Per consumer core: the elements of its box inside the tensor not already on its
    physical core (the last logical core listed on a physical core is the one there)."""
    there = {int(p): c for c, p in enumerate(want.phys)}
    out = np.zeros(len(want.phys), dtype=np.int64)
    grid = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), int)
    for c in range(len(want.phys)):
        lo, hi = want.origin[c], want.origin[c] + want.shape
        inside = np.all((grid >= lo[:, None]) & (grid < hi[:, None]), axis=0)
        local = inside & (owner >= 0)
        local &= np.array([there.get(int(o)) == c for o in owner], dtype=bool)
        out[c] = int(inside.sum()) - int(local.sum())
    return out


@st.composite
def _layouts(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    numel = int(np.prod(shape, dtype=np.int64))
    physical = draw(st.integers(1, 6))
    ncores = draw(st.integers(1, 6))
    phys = np.array(draw(st.lists(st.integers(0, physical - 1), min_size=ncores,
                                  max_size=ncores)), dtype=np.int64)
    box = np.array([draw(st.integers(1, s + 1)) for s in shape], dtype=np.int64)
    origin = np.array([[draw(st.integers(-2, s)) for s in shape] for _ in range(ncores)],
                      dtype=np.int64).reshape(ncores, ndim)
    owners = [np.array(draw(st.lists(st.integers(-1, physical + 1), min_size=numel,
                                     max_size=numel)), dtype=np.int32)
              for _ in range(draw(st.integers(1, 3)))]
    return shape, Want(origin, box, phys), owners


@settings(max_examples=150, deadline=None)
@given(_layouts())
def test_element_wise_counts_are_each_box_counted_by_hand(layout) -> None:
    shape, want, owners = layout
    coords = (np.stack(np.unravel_index(np.arange(int(np.prod(shape))), shape)).astype(np.int32)
              if shape else np.zeros((0, 1), dtype=np.int32))
    got = remote_counts([Have(owner=o) for o in owners], want, np.asarray(shape, dtype=np.int64),
                        coords)
    for row, owner in zip(got, owners):
        assert (row == _by_hand(owner, want, shape)).all()


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.data())
def test_spread_weights_pattern_is_the_encoded_table(numel, rows, data) -> None:
    """A weight spread over cores (`codegen.lower`'s ``load_home``) is given the pattern
    `encode` makes of its table, array for array, without the table."""
    from t10c.codegen.pattern import encode, spread_pattern

    a = data.draw(st.integers(0, rows - 1))
    over = range(a, data.draw(st.integers(a + 1, rows)))
    chunk = -(-numel // len(over))
    flat = np.full((rows, chunk), -1, dtype=np.int64)
    flat[over.start:over.stop] = np.arange(len(over) * chunk).reshape(len(over), chunk)
    table = np.where(flat < numel, flat, -1)
    want = encode(np.where(table >= 0, 0, -1), table)
    got, width = spread_pattern(numel, rows, over)
    assert width == chunk
    for field in ("pat", "start", "runs"):
        w, g = getattr(want, field), getattr(got, field)
        assert (w.dtype, w.shape) == (g.dtype, g.shape) and (w == g).all(), field


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.integers(1, 12), st.integers(1, 8), st.data())
def test_received_elements_are_the_rows_pairs_counted(rows, width, cores, data) -> None:
    """`codegen.pattern.received` looks each row's own core up in its pattern's sources
    (never listing every (row, source core) pair): the same counts as summing those pairs,
    padding and local copies left out; and `grouped_trees` counts the pairs `tree_pairs`
    lists."""
    from t10c.codegen.pattern import _row_pairs, from_table, grouped_trees, received, tree_pairs

    core = np.array(data.draw(st.lists(st.integers(-1, cores - 1), min_size=rows * width,
                                       max_size=rows * width)), dtype=np.int32)
    core = core.reshape(rows, width)
    off = np.array(data.draw(st.lists(st.integers(0, 40), min_size=rows * width,
                                      max_size=rows * width)), dtype=np.int32)
    off = np.where(core >= 0, off.reshape(rows, width), -1).astype(np.int32)
    here = np.array(data.draw(st.lists(st.integers(0, cores + 1), min_size=rows,
                                       max_size=rows)), dtype=np.int64)
    p = from_table(core, off)
    src, row, count = _row_pairs(p)
    remote = src != here[row]
    want = np.bincount(row[remote], weights=count[remote], minlength=rows).astype(np.int64)
    assert np.array_equal(received(p, here), want)
    assert grouped_trees(p, here)[0] == len(tree_pairs(p, here)[0])


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.integers(1, 6), st.integers(1, 7), st.data())
def test_rows_deduplicated_in_chunks_are_deduplicated_whole(n, e, chunk, data) -> None:
    """`dedup_rows` weighs and compares a large table a chunk of rows at a time (its
    temporaries stay small): the distinct rows, in order of first appearance, and each
    row's number among them, whatever the chunk; `encode` gives one pattern for int32 and
    int64 tables."""
    from unittest import mock

    from t10c.codegen import pattern

    values = data.draw(st.lists(st.integers(-1, 3), min_size=n * e, max_size=n * e))
    table = np.asarray(values, dtype=np.int64).reshape(n, e)
    rows = [tuple(r) for r in table.tolist()]
    firsts: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        firsts.setdefault(r, i)
    number = {r: k for k, r in enumerate(firsts)}
    with mock.patch.object(pattern, "_chunk_rows", lambda _: chunk):
        first, inverse = pattern.dedup_rows(table)
        assert first.tolist() == list(firsts.values())
        assert inverse.tolist() == [number[r] for r in rows]
        core = np.where(table >= 0, table % 2, -1)
        wide, narrow = (pattern.encode(core.astype(t), table.astype(t))
                        for t in (np.int64, np.int32))
    for field in ("pat", "start", "runs"):
        w, g = getattr(wide, field), getattr(narrow, field)
        assert (w.dtype, w.shape) == (g.dtype, g.shape) and (w == g).all(), field


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.integers(0, 4),
       st.sampled_from(["int64", "int32", "int16", "uint8", "bool"]), st.integers(0, 2 ** 32))
def test_last_product_is_numpys(lead, width, dtype, seed) -> None:
    a = np.random.default_rng(seed).integers(-9, 10, (*lead, width)).astype(dtype)
    got, want = last_product(a), np.prod(a, axis=-1)
    assert got.dtype == want.dtype and np.array_equal(got, want)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.integers(1, 4), st.integers(1, 1000), st.integers(0, 2 ** 32))
def test_row_keys_order_rows_as_records(n, width, span, seed) -> None:
    """Equal rows have equal keys and the keys sort as the rows do; too wide a radix gives
    None."""
    rows = np.random.default_rng(seed).integers(-span, span, (n, width))
    key = row_keys(rows)
    assert key is not None
    _, want = np.unique(rows, axis=0, return_inverse=True)
    _, got = np.unique(key, return_inverse=True)
    assert np.array_equal(got.ravel(), want.ravel())
    assert row_keys(np.array([[0, 0], [2 ** 40, 2 ** 40]])) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_grid_coords_scaled_are_the_coords_times_the_scales(F, data) -> None:
    scale = tuple(data.draw(st.integers(0, 9)) for _ in F)
    coords = np.stack(np.unravel_index(np.arange(int(np.prod(F))), F), axis=1)
    assert np.array_equal(grid_coords(tuple(F)), coords)
    assert np.array_equal(grid_coords(tuple(F), scale), coords * np.asarray(scale))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_geometry_indices_are_the_formulas(data) -> None:
    """A rotating matmul plan's sub-task indices and origins, column by column, against
    T10's formulas over whole arrays: t = (digits + skew) mod T, origin = block + t u."""
    expr = TensorExpr("mm", (("m", 8), ("k", 12), ("n", 6)), Operand("C", ("m", "n")),
                      (Operand("A", ("m", "k")), Operand("B", ("k", "n"))), "sum",
                      ("mul", ("in", 0), ("in", 1)))
    F = tuple(data.draw(st.sampled_from([1, 2, 3])) for _ in range(3))
    T = tuple(data.draw(st.sampled_from([1, 2, 4])) for _ in range(3))
    drivers = tuple(tuple(a for a in ("m", "k", "n") if a != axis and T[i] > 1
                          and data.draw(st.booleans()))
                    for i, axis in enumerate(("m", "k", "n")))
    geo = Geometry(expr, F, T, ((), (), ()), drivers, {})
    skew = np.zeros((geo.ncores, 3), dtype=np.int64)
    for j, drv in enumerate(drivers):
        for d in drv:
            skew[:, j] += geo.coords[:, geo.axes.index(d)]
    skew %= np.asarray(T)
    assert np.array_equal(geo.skew, skew)
    for step in range(geo.steps):
        sub = (np.asarray(geo.digits(step)) + skew) % np.asarray(T)
        assert np.array_equal(geo.sub_index(step), sub)
        assert np.array_equal(geo.origin(step), geo.coords * np.asarray(geo.b)
                              + sub * np.asarray(geo.u))
    # A rotating along k (its driver n, an axis it lacks): its buffer moves with the
    # partition that holds the step's sub-block, T_k / f_t consecutive sub-blocks of k
    if T[1] > 1 and "n" in drivers[1]:
        chain = data.draw(st.sampled_from([c for c in (1, 2, 4) if T[1] % c == 0]))
        geo = Geometry(expr, F, T, (("k",), (), ()), drivers, {}, (chain, 1, 1))
        per = T[1] // chain
        for step in range(geo.steps):
            sub = geo.sub_index(step)
            want = np.stack([geo.coords[:, 0] * geo.b[0],
                             geo.coords[:, 1] * geo.b[1] + sub[:, 1] // per * per * geo.u[1]],
                            axis=1)
            assert np.array_equal(geo.tile_origin(0, step), want)
            assert np.array_equal(geo.tile_origin(1, step),
                                  (geo.coords * np.asarray(geo.b))[:, [1, 2]])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 50), st.integers(0, 6)), max_size=12))
def test_ranges_are_the_aranges_one_after_another(pairs) -> None:
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    lengths = np.array([n for _, n in pairs], dtype=np.int64)
    want = np.concatenate([np.arange(s, s + n) for s, n in pairs] + [np.zeros(0, np.int64)])
    got = ranges(starts, lengths)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert np.array_equal(ranges(0, lengths), ranges(np.zeros_like(starts), lengths))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2 ** 40), 2 ** 40), min_size=0, max_size=40),
       st.integers(1, 4), st.integers(1, 9))
def test_timing_digest_is_of_values_and_shape(values, cols, rows_per_block) -> None:
    """The timing-only emulator's route keys (`emulator.timing._digest`): equal for equal
    values whatever the dtype or the memory layout (a broadcast view, hashed a block of rows
    at a time, against its copy), different when a value, the length or the shape differs."""
    import t10c.emulator.timing as timing

    a = np.asarray(values, dtype=np.int64)
    digest = timing._digest(a)
    assert digest == timing._digest(a.copy())
    small = a[(a >= -(2 ** 31)) & (a < 2 ** 31)]
    assert timing._digest(small) == timing._digest(small.astype(np.int32))
    if len(a):
        assert timing._digest(a[:-1]) != digest
        changed = a.copy()
        changed[-1] += 1
        assert timing._digest(changed) != digest
    wide = np.broadcast_to(a[:, None], (len(a), cols))
    old = timing._DIGEST_SLICE
    try:  # blocks smaller than the array: the same bytes, in the same order
        timing._DIGEST_SLICE = rows_per_block * cols
        assert timing._digest(wide) == timing._digest(np.ascontiguousarray(wide))
    finally:
        timing._DIGEST_SLICE = old
    assert timing._digest(wide) == timing._digest(np.ascontiguousarray(wide))
    if cols != len(a):  # the same values in another shape
        assert timing._digest(wide) != timing._digest(wide.reshape(cols, len(a)))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_wanted_elements_are_the_wanted_boxes(data) -> None:
    """A consumer core's wanted elements (`_wanted`) and bounds (`_bounds`) are those of its
    box cut to the tensor: boxes starting in the padding before the tensor and running past
    its end."""
    nd = data.draw(st.integers(1, 3))
    extent = np.array(data.draw(st.lists(st.integers(1, 12), min_size=nd, max_size=nd)))
    shape = np.array(data.draw(st.lists(st.integers(1, 6), min_size=nd, max_size=nd)))
    n = data.draw(st.integers(1, 30))
    origin = np.array(data.draw(st.lists(st.lists(st.integers(-6, 14), min_size=nd,
                                                  max_size=nd), min_size=n, max_size=n)))
    want = Want(origin, shape, np.arange(n))
    lo, hi = _bounds(want, extent)
    assert lo.tolist() == [[max(o, 0) for o in row] for row in origin.tolist()]
    assert hi.tolist() == [[min(o + s, e) for o, s, e in zip(row, shape, extent)]
                           for row in origin.tolist()]
    boxes = [np.prod([max(min(o + s, e) - max(o, 0), 0) for o, s, e in zip(row, shape, extent)])
             for row in origin.tolist()]
    assert _wanted(want, extent).tolist() == boxes


def _plan(cores: tuple[int, ...] | None, F: tuple[int, ...] = (2, 2)) -> OpPlan:
    return OpPlan("op", F, (1, 1), ((), (), ()), (("m",), ("n",)), (1, 1, 1),
                  Cycles(5, 0, 0, 0), 64, 32, 16, cores=cores)


def test_plans_of_one_layout_share_one_key_while_it_is_held() -> None:
    """Plans that place their tiles alike (a copy with other costs, a plan built apart)
    give the one key object, which compares by identity; another layout gives another;
    a pickled key comes back as that one; a key no plan holds any more is dropped."""
    cores = tuple(range(1000, 1004))
    plan = _plan(cores)
    twin = dataclasses.replace(plan, cycles=Cycles(9, 1, 0, 0), home=True)
    apart = _plan(tuple(list(cores)))  # an equal core map in another tuple
    assert plan.layout is twin.layout is apart.layout
    assert pickle.loads(pickle.dumps(plan.layout)) is plan.layout
    other = _plan(cores, F=(4, 1))
    assert other.layout is not plan.layout and other.layout != plan.layout
    assert hash(plan.layout) == hash(plan.layout.value)
    value = plan.layout.value
    del plan, twin, apart
    gc.collect()
    assert HashedKey._made.get(value) is None


def test_a_renamed_plan_is_the_plan_replace_makes() -> None:
    """`OpPlan.named` and `unnamed` make the plans `dataclasses.replace` makes (equal, of
    equal hashes, the hash taken before the rename not carried over), keeping the layout
    key; a plan's hash survives pickling as the fields' hash."""
    plan = _plan(tuple(range(7, 11)))
    before = hash(plan)  # (taken, and kept on the plan)
    for name in ("other", "", "op"):
        want = dataclasses.replace(plan, op=name)
        got = plan.named(name)
        assert got == want and hash(got) == hash(want) and got.op == name
        assert got.layout is plan.layout
    assert plan.named("op") is plan and hash(plan) == before
    assert plan.unnamed == dataclasses.replace(plan, op="") and plan.unnamed is plan.unnamed
    assert plan.named("x").unnamed is plan.unnamed  # (made once for every name)
    back = pickle.loads(pickle.dumps(plan.named("x")))
    assert back == plan.named("x") and "_hash" not in back.__dict__
    assert hash(back) == hash(dataclasses.replace(plan, op="x"))
