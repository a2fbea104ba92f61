"""The fast emulator equals the per-core reference executor on random small programs.

Hypothesis draws a small graph (a chain of matmuls, elementwise ops, reductions, softmax and
transposes on random shapes), a chip (core count, all-to-all or mesh, storage dtype) and the
planner's strategy; the graph is compiled to a program, which the vectorised emulator
(`emulator/machine.py`: batched contractions, exchanges as one gather, fp16 held in float32)
and the reference (`emulator/reference.py`: one core at a time, real fp16 buffers) both run.
Their outputs must agree, and the data machine's timeline must be the timing machine's, record
for record (the clock lives in one place: values may never change it). Run again with every
buffer placed in memory full of NaNs (what reused memory may hold), or with every loaded tile
copied onto its cores at once (no contraction reading replicated tiles as such), the outputs
are the same bit for bit.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ophelpers import G, Ids, make_model

from t10c.chips import PRESETS, Chip
from t10c.codegen.program import Alloc, Buffer, Free, Program
from t10c.driver import (
    TOLERANCE,
    CompileOptions,
    compile_model,
    make_inputs,
    max_rel_err,
    reference,
)
from t10c.emulator import Machine, TimingMachine, emulate, kernels, machine
from t10c.emulator.kernels import ROUND_BLOCK, round_fp16
from t10c.emulator.machine import (
    HostTiles,
    Memory,
    Pool,
    Prepared,
    dead_tiles,
    edge_tiles,
    load_tiles,
    replicated_at,
    tile_pairs,
)
from t10c.emulator.reference import run_reference
from t10c.emulator.timing import EmulatorError, Spans
from t10c.partition.search import SearchOptions

MIB = 1024 * 1024

#: one layer of the chain: its name and how it changes the last dimension
LAYERS = ("matmul", "bias", "relu", "mul_self", "softmax", "reduce_sum", "transpose", "tanh")


@st.composite
def graphs(draw: st.DrawFn) -> tuple[tuple[int, ...], list[tuple[str, int]]]:
    """An input shape (rank 2 or 3) and a chain of layers (a matmul carries its width), with
    at most one squaring: three in a row raise any 4 to 4^8 = 65,536, past fp16's 65,504, and
    the reference's infinity then reads as an element never written."""
    rank = draw(st.sampled_from((2, 3)))
    shape = tuple(draw(st.integers(2, 12)) for _ in range(rank))
    chain = [(draw(st.sampled_from(LAYERS)), draw(st.integers(2, 24)))
             for _ in range(draw(st.integers(1, 4)))]
    assume(sum(layer == "mul_self" for layer, _ in chain) <= 1)
    return shape, chain


def build(shape: tuple[int, ...], chain: list[tuple[str, int]]):  # type: ignore[no-untyped-def]
    def make(g: G, names: list[str]) -> str:
        x, dims = names[0], list(shape)
        for layer, width in chain:
            if layer == "matmul":
                x = g.node("MatMul", x, g.weight(dims[-1], width))
                dims[-1] = width
            elif layer == "bias":
                x = g.node("Add", x, g.weight(dims[-1]))
            elif layer == "relu":
                x = g.node("Relu", x)
            elif layer == "tanh":
                x = g.node("Tanh", x)
            elif layer == "mul_self":
                x = g.node("Mul", x, x)
            elif layer == "softmax":
                x = g.node("Softmax", x, axis=-1)
            elif layer == "reduce_sum":  # keeps rank 2 (a kept axis of one), drops one above
                keep = len(dims) <= 2
                x = g.node("ReduceSum", x, g.ints(-1), keepdims=int(keep))
                if keep:
                    dims[-1] = 1
                else:
                    dims.pop()
            elif layer == "transpose":
                perm = list(range(len(dims)))
                perm[-1], perm[-2] = perm[-2], perm[-1]
                x = g.node("Transpose", x, perm=perm)
                dims[-1], dims[-2] = dims[-2], dims[-1]
        return x
    return make


@st.composite
def chips(draw: st.DrawFn) -> Chip:
    cores = draw(st.sampled_from((4, 6, 8, 16)))
    mesh = draw(st.booleans())
    grid = (2, cores // 2)
    return dataclasses.replace(PRESETS["test16"], name=f"rand{cores}{'m' if mesh else ''}",
                               cores=cores, grid=grid,
                               topology="mesh2d" if mesh else "all-to-all",
                               sram_bytes_per_core=2 * MIB)


class PoisonPool(Pool):
    """A memory pool that hands every buffer memory full of NaNs (as if an old buffer's
    values were left in it), so that the machine's zeroing of reused memory is tested."""

    def take(self, elems: int) -> np.ndarray:
        return np.full(elems, np.nan, dtype=np.float32)


class DenseMemory(Memory):
    """Buffers whose loaded tiles and shared exchanged rows are copied onto the cores at once
    (never `Replicated`, never `HostTiles`)."""

    def share(self, buf: int, tiles: np.ndarray, index: np.ndarray) -> None:
        super().share(buf, tiles, index)
        self[buf]  # noqa: B018 - reading the buffer copies the tiles onto the cores

    def defer(self, buf: int, tiles: HostTiles) -> None:
        super().defer(buf, tiles)
        self[buf]  # noqa: B018 - reading the buffer cuts the tiles and copies them


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs(), chip=chips(), dtype=st.sampled_from(("fp16", "fp32")),
       rotation=st.booleans(), vgm=st.booleans())
def test_fast_emulator_equals_reference(graph: tuple[tuple[int, ...], list[tuple[str, int]]],
                                        chip: Chip, dtype: str, rotation: bool,
                                        vgm: bool) -> None:
    shape, chain = graph
    model = make_model("rand", build(shape, chain), (shape,))
    # no rotation (one step) or rotating plans; weights at home (vgm: fetched by exchanges)
    search = SearchOptions(max_steps=64 if rotation else 1, weights_home=vgm)
    c = compile_model(model, chip, CompileOptions(dtype=dtype, search=search))
    inputs = make_inputs(c.graph, seed=0)
    got, timeline = Machine(c.program, c.chip).run(inputs, c.graph.constants)
    want = run_reference(c.program, c.chip, inputs, c.graph.constants)
    assert set(got) == set(want) == set(c.program.outputs)
    for name in want:
        assert got[name].shape == want[name].shape
        assert np.isfinite(want[name]).all(), f"{name}: non-finite (an element never written?)"
    # fp32 agrees to rounding; fp16 to about one fp16 ulp (the same values, summed in a
    # different order before the one rounding)
    assert max_rel_err(got, want) <= (1e-5 if dtype == "fp32" else 1e-3)
    # every buffer in reused memory that holds NaNs: no stale value may reach an output;
    # replicated loads copied onto the cores at once: contractions that read the distinct
    # tiles give the same bits; and the program's tables made before the run (`Prepared`)
    # give the run made without them
    for variant in ("poisoned", "dense", "prepared"):
        other = Machine(c.program, c.chip, Prepared.of(c.program, c.chip)
                        if variant == "prepared" else None)
        if variant == "poisoned":
            other.pool, other.tile_pool = PoisonPool(), PoisonPool()
        elif variant == "dense":
            other.mem = DenseMemory()
        again, other_timeline = other.run(inputs, c.graph.constants)
        for name in want:
            assert np.array_equal(again[name].view(np.uint32), got[name].view(np.uint32)), \
                (variant, name)
        assert other_timeline.records == timeline.records, variant
    timing = TimingMachine(c.program, c.chip).execute(inputs, c.graph.constants)
    assert timeline.records == timing.records and timeline.cycles > 0
    assert timeline.sram_samples == timing.sram_samples
    assert timeline.host_bytes > 0


def test_a_run_refuses_another_programs_tables() -> None:
    """A `Prepared` belongs to one program on one chip: a machine given it for another is
    refused, not run on the wrong gather indices."""
    chip = dataclasses.replace(PRESETS["test16"], sram_bytes_per_core=2 * MIB)
    model = make_model("rand", build((4, 8), [("matmul", 8), ("softmax", 0)]), ((4, 8),))
    a = compile_model(model, chip, CompileOptions(dtype="fp32"))
    b = compile_model(model, chip, CompileOptions(dtype="fp16"))
    Machine(a.program, a.chip, Prepared.of(a.program, a.chip))  # its own: accepted
    with pytest.raises(ValueError, match="another program"):
        Machine(b.program, b.chip, Prepared.of(a.program, a.chip))


EDGES = kernels.FP16_EDGES


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(0, 9 * ROUND_BLOCK))
def test_round_fp16_is_numpys_cast(seed: int, n: int) -> None:
    """`round_fp16` equals numpy's float32 -> fp16 -> float32 cast bit for bit: on random bit
    patterns (every exponent, NaNs included), on the edges, across block boundaries (and
    shared among threads, from eight blocks up; in place too)."""
    bits = np.random.default_rng(seed).integers(0, 2 ** 32, n, dtype=np.uint32)
    bits = np.concatenate([bits, EDGES]).view(np.float32)
    with np.errstate(all="ignore"):
        want = bits.astype(np.float16).astype(np.float32)
    got = round_fp16(bits.reshape(-1, 1))
    assert got.shape == (len(bits), 1) and got.dtype == np.float32
    assert np.array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32))
    inplace = bits.copy()  # rounded in place: the same bits
    assert round_fp16(inplace, out=inplace) is inplace
    assert np.array_equal(inplace.view(np.uint32), want.view(np.uint32))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 5 * ROUND_BLOCK),
       big=st.integers(0, 4))
def test_round_fp16_by_the_adder_is_numpys_cast(seed: int, n: int, big: int) -> None:
    """Blocks whose values all lie below 2^15 in magnitude (every such bit pattern, both
    signs, zeros and fp16's subnormals among them) are rounded by the float32 adder: numpy's
    cast bit for bit, next to blocks that hold a large value, an infinity or a NaN (which go
    by bits)."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 0x47000000, n, dtype=np.uint32)
    bits |= rng.integers(0, 2, n, dtype=np.uint32) << np.uint32(31)
    small_edges = EDGES[(EDGES & np.uint32(0x7FFFFFFF)) < 0x47000000]
    bits[:len(small_edges)] = small_edges[:n]
    for at in rng.integers(0, n, big):  # a block that goes by bits
        bits[at] = rng.choice(EDGES[(EDGES & np.uint32(0x7FFFFFFF)) >= 0x47000000])
    assert_rounds_as_numpy(bits.view(np.float32))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(kernels.CAST_MIN, 9 * ROUND_BLOCK))
def test_round_fp16_by_the_cast_is_numpys_cast(seed: int, n: int) -> None:
    """Large arrays without a NaN are rounded by onnxruntime's Cast (a dependency: it is at
    hand, and passed its check on fp16's edges): numpy's cast bit for bit on random bit
    patterns of every exponent (infinities included), in place too, shared among threads."""
    assert kernels.cast_rounding() is not None
    bits = np.random.default_rng(seed).integers(0, 2 ** 32, n, dtype=np.uint32)
    bits[(bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)] &= np.uint32(0xFF800000)
    bits[:len(EDGES)] = np.where(np.isnan(EDGES.view(np.float32)), 0, EDGES)[:n]
    assert not np.isnan(bits.view(np.float32)).any()
    assert_rounds_as_numpy(bits.view(np.float32))


def assert_rounds_as_numpy(values: np.ndarray) -> None:
    """`round_fp16` of ``values``, into a new array and in place, is numpy's cast bit for
    bit."""
    with np.errstate(all="ignore"):
        want = values.astype(np.float16).astype(np.float32)
    assert np.array_equal(round_fp16(values).view(np.uint32), want.view(np.uint32))
    inplace = values.copy()
    assert np.array_equal(round_fp16(inplace, out=inplace).view(np.uint32),
                          want.view(np.uint32))


@pytest.mark.slow
def test_round_fp16_by_the_cast_on_every_float() -> None:
    """Every float32 but the NaNs (4.3 G values, a few minutes), rounded by onnxruntime's
    Cast, is numpy's cast bit for bit."""
    cast = kernels.cast_rounding()
    assert cast is not None
    chunk = 1 << 24
    for lo in range(0, 1 << 32, chunk):
        bits = np.arange(lo, lo + chunk, dtype=np.uint64).astype(np.uint32)
        values = bits.view(np.float32)
        values = values[~np.isnan(values)]
        if not len(values):
            continue
        with np.errstate(all="ignore"):
            want = values.astype(np.float16).astype(np.float32).view(np.uint32)
        got = np.empty_like(values)
        cast(values, got)
        assert np.array_equal(got.view(np.uint32), want), hex(lo)


@pytest.mark.slow
def test_round_fp16_by_the_adder_on_every_small_float() -> None:
    """Every float32 below 2^15 in magnitude (both signs: 2.4 G values, a few minutes),
    rounded by the float32 adder and in place, is numpy's cast bit for bit."""
    chunk = 1 << 24
    for sign in (0, 0x80000000):
        for lo in range(sign, sign + 0x47000000, chunk):
            bits = np.arange(chunk, dtype=np.uint32) + np.uint32(lo)
            values = bits.view(np.float32)
            want = values.astype(np.float16).astype(np.float32).view(np.uint32)
            got = np.empty_like(values)
            kernels._round_fp16_into(values, got)
            assert np.array_equal(got.view(np.uint32), want), hex(lo)
            kernels._round_fp16_into(values, values)  # in place
            assert np.array_equal(bits, want), hex(lo)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       tile=st.lists(st.integers(1, 4), min_size=3, max_size=3), seed=st.integers(0, 99),
       perm=st.permutations(range(3)), chunk=st.sampled_from((1, 5, 1 << 20)))
def test_whole_grid_cut_is_element_by_element(shape: list[int], tile: list[int], seed: int,
                                              perm: list[int], chunk: int) -> None:
    """Every tile of a tensor's grid, in order (a weight cut whole: one strided copy, the
    edge tiles after it), holds what gathering each element gives; so does any other set of
    tiles, of a transposed view of an array too (cut in the array's order, a few tiles at a
    time, then transposed), and so do tiles cut into given memory (full of NaNs)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(machine, "TRANSPOSED_CHUNK", chunk)
        _cuts_are_element_by_element(shape, tile, seed, perm)


def _cuts_are_element_by_element(shape: list[int], tile: list[int], seed: int,
                                 perm: list[int]) -> None:
    t = tuple(tile[:len(shape)])
    order = [d for d in perm if d < len(shape)]
    stored = np.random.default_rng(seed).standard_normal([shape[d] for d in order])
    host = stored.astype(np.float32).transpose(np.argsort(order))  # a view, of ``shape``
    assert host.shape == tuple(shape)
    grid = [-(-s // b) for s, b in zip(shape, t)]
    origin = np.indices(grid).reshape(len(grid), -1).T * np.asarray(t)
    for o in (origin, origin[::-1], origin[: max(1, len(origin) // 2)]):
        want = edge_tiles(host, o, t)
        tiles, counts = load_tiles(host, o, t)
        assert np.array_equal(tiles, want)
        out = np.full(want.shape, np.nan, dtype=np.float32)
        into, _ = load_tiles(host, o, t, out)
        assert np.may_share_memory(into, out) and np.array_equal(out, want)
    assert load_tiles(host, origin, t)[1].sum() == host.size  # every element once


@settings(max_examples=40, deadline=None)
@given(tile=st.lists(st.integers(1, 5), min_size=1, max_size=3), distinct=st.integers(1, 4),
       cores=st.integers(1, 24), seed=st.integers(0, 99))
def test_replicated_tiles_read_at_each_cores_offset(tile: list[int], distinct: int,
                                                    cores: int, seed: int) -> None:
    """A replicated tile read at a different offset by each core (a rotating plan's step)
    comes from the distinct (tile, offset) pairs (`machine.replicated_at`): each core's
    sub-block is what it would read from its own copy of the tile, and the pairs are no
    more than the cores."""
    rng = np.random.default_rng(seed)
    t = tuple(tile)
    sizes = tuple(int(rng.integers(1, b + 1)) for b in t)
    blocks = rng.standard_normal((distinct, int(np.prod(t)))).astype(np.float32)
    index = rng.integers(0, distinct, cores)
    offsets = np.stack([rng.integers(0, b - s + 1, cores) for b, s in zip(t, sizes)], axis=1)
    got = replicated_at(blocks, t, sizes, lambda: blocks[index], *tile_pairs(index, offsets))
    assert len(got.blocks) <= cores and got.index.shape == (cores,)
    for c in range(cores):
        own = blocks[index[c]].reshape(t)
        want = own[tuple(slice(o, o + s) for o, s in zip(offsets[c], sizes))]
        assert np.array_equal(got.blocks[got.index[c]], want)


def test_reused_memory_reads_as_zero_where_written_in_parts() -> None:
    """A buffer placed in a freed buffer's memory: rows written whole keep their values; a
    row first written in parts (a compute step's sub-block) is zeroed first, as fresh memory
    reads; rows never written keep the old values, which no correct program reads."""
    chip = dataclasses.replace(PRESETS["test16"], cores=4, grid=(2, 2))
    bufs = (Buffer(0, "a", 3, "fp32", 0), Buffer(1, "b", 3, "fp32", 0))
    program = Program("reuse", chip.name, "fp32", 4, bufs, (),
                      (Alloc("", "", 0), Free("", "", 0), Alloc("", "", 1)), {}, (), 16)
    m = Machine(program, chip)
    m.pool = PoisonPool()
    for ins in program.instrs[:1]:
        m.step(ins, {})
    assert np.isnan(m.mem[0]).all() and m.dirty[0].all()
    m.mem[0][:2] = 7.0  # rows 0 and 1 written whole (a load, say)
    m.wrote(0, slice(0, 2))
    m.rewrite(0, np.array([1, 2]))  # a compute step writes part of rows 1 and 2
    assert (m.mem[0][:2] == 7.0).all() and (m.mem[0][2] == 0).all()
    assert np.isnan(m.mem[0][3]).all() and m.dirty[0].tolist() == [False, False, False, True]
    m.rewrite(0, slice(0, 4))
    assert 0 not in m.dirty and (m.mem[0][3] == 0).all()
    # freed memory goes back to the pool and comes out again for an equal buffer
    # (not zeroed on the way: a buffer written whole costs one write, not two)
    pool, old = Pool(), m.mem[0].copy()
    m.pool = pool
    m.step(program.instrs[1], {})
    assert pool.bytes == 4 * 3 * 4
    m.step(program.instrs[2], {})
    assert pool.bytes == 0 and m.dirty[1].all() and (m.mem[1] == old).all()


def test_the_wall_time_counts_the_run_not_the_kernels_making(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`emulate`'s wall time is the run's: the kernels' onnxruntime sessions are made before
    its clock starts (`kernels.prepare`), as the reference's time is its session's run."""
    chip = dataclasses.replace(PRESETS["test16"], cores=4, grid=(2, 2))
    program = Program("empty", chip.name, "fp32", 4, (Buffer(0, "a", 3, "fp32", 0),), (),
                      (Alloc("", "", 0), Free("", "", 0)), {}, (), 16)
    made = []
    real = kernels._make_gemms

    def slow():  # type: ignore[no-untyped-def]
        time.sleep(0.5)
        made.append(True)
        return real()

    monkeypatch.setattr(kernels, "_GEMMS", [])
    monkeypatch.setattr(kernels, "_make_gemms", slow)
    _, _, wall = emulate(program, chip, {}, {})
    assert made and wall < 0.5


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_accumulator_fill_is_never_copied(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A split reduction's accumulators are filled with zeros, then written whole by the
    contraction: the fill is kept as one shared row and dropped at the contraction (no
    accumulation into zeros), with the same bits as the fill copied onto the cores and
    accumulated into, and the reference's values."""
    model = make_model("ksplit", build((8, 96), [("matmul", 12), ("relu", 0)]), ((8, 96),))
    chip = dataclasses.replace(PRESETS["test16"], cores=16, sram_bytes_per_core=2 * MIB)
    c = compile_model(model, chip, CompileOptions(dtype=dtype,
                                                  search=SearchOptions(max_steps=1)))
    inputs = make_inputs(c.graph, seed=1)
    skipped: list[int] = []
    real = Machine.filled_with_identity

    def spy(self: Machine, buf: int, n: int, expr):  # type: ignore[no-untyped-def]
        if real(self, buf, n, expr):
            skipped.append(buf)
            return True
        return False

    monkeypatch.setattr(Machine, "filled_with_identity", spy)
    got, _ = Machine(c.program, c.chip).run(inputs, c.graph.constants)
    assert skipped, "no contraction wrote a filled accumulator whole"
    dense = Machine(c.program, c.chip)
    dense.mem = DenseMemory()  # the fill copied onto the cores at once: accumulated into
    again, _ = dense.run(inputs, c.graph.constants)
    assert len(skipped) == 1
    for name in got:
        assert np.array_equal(again[name].view(np.uint32), got[name].view(np.uint32)), name
    want = run_reference(c.program, c.chip, inputs, c.graph.constants)
    assert max_rel_err(got, want) <= (1e-5 if dtype == "fp32" else 1e-3)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab=st.integers(3, 300), width=st.integers(1, 40), ids=st.integers(1, 12),
       cores=st.sampled_from((4, 8, 16)), dtype=st.sampled_from(("fp16", "fp32")),
       sharded=st.booleans())
def test_take_from_uncut_table(vocab: int, width: int, ids: int, cores: int, dtype: str,
                               sharded: bool) -> None:
    """A Gather whose table is a loaded weight reads the rows it picks straight from the
    host tensor (the tiles are never cut): the same bits as with the tiles cut and copied
    onto the cores at once, and onnxruntime's values (also past the table's edge tiles,
    which read as zero, and with the table's rows sharded over cores where SRAM is small)."""
    if sharded:  # 8 KiB per core cannot hold the table whole
        vocab, width, cores = 5000 + vocab, 1 + width % 4, 16
    model = make_model("take", lambda g, x: g.node("Add", g.node(
        "Gather", g.weight(vocab, width), x[0]), g.weight(width)), (Ids((ids,)),))
    chip = dataclasses.replace(PRESETS["test16"], cores=cores, grid=(2, cores // 2),
                               sram_bytes_per_core=8192 if sharded else 2 * MIB)
    c = compile_model(model, chip, CompileOptions(dtype=dtype))
    inputs = make_inputs(c.graph, seed=vocab)
    got, _ = Machine(c.program, c.chip).run(inputs, c.graph.constants)
    dense = Machine(c.program, c.chip)
    dense.mem = DenseMemory()
    again, _ = dense.run(inputs, c.graph.constants)
    for name in got:
        assert np.array_equal(again[name].view(np.uint32), got[name].view(np.uint32))
    # (against onnxruntime: the per-core reference executor disagrees with both on some
    # sharded tables, a fault of its own)
    assert max_rel_err(got, reference(c.model, inputs)[0]) <= TOLERANCE[dtype]


@settings(max_examples=60, deadline=None)
@given(digits=st.lists(st.tuples(st.integers(2, 4), st.booleans(), st.booleans()), min_size=1,
                       max_size=4),
       seed=st.integers(0, 99), noise=st.booleans())
def test_operands_broadcast_over_the_core_digits_they_depend_on(
        digits: list[tuple[int, bool, bool]], seed: int, noise: bool) -> None:
    """Two replicated operands whose block is a number written by some of the core index's
    mixed-radix digits (a head's query rows met by each of its key columns: one operand
    depends on (head, query), the other on (head, key)) are found as such (`core_digits`),
    and each one's broadcast view (`digit_view`) gives every core its own block; an index
    that is no such number is refused (None), never looped over."""
    rng = np.random.default_rng(seed)
    sizes = [size for size, _, _ in digits]  # innermost digit first
    z = int(np.prod(sizes))
    cores = np.arange(z)
    indices = []
    for which in (1, 2):  # each operand's block: its varying digits' number
        index, place, scale = np.zeros(z, dtype=np.int64), 1, 1
        for size, a, b in digits:
            if (a, b)[which - 1]:
                index += (cores // place % size) * scale
                scale *= size
            place *= size
        indices.append(index)
    if noise:  # one core's block moved: no longer such a number (or still one, by chance)
        indices[0] = indices[0].copy()
        indices[0][int(rng.integers(z))] = int(rng.integers(0, indices[0].max() + 2))
    places = kernels.core_digits(z, indices)
    if places is None:
        assert noise or z < 2
        return
    for index in indices:
        u = int(index.max()) + 1
        blocks = rng.standard_normal((u, 1, 2, 3)).astype(np.float32)
        v = kernels.Replicated(blocks, index, lambda b=blocks, i=index: b[i])
        view = kernels.digit_view(v, blocks, z, places)
        full = np.broadcast_to(view, (*[b // a for a, b in zip(places, places[1:])][::-1],
                                      *blocks.shape[1:])).reshape(z, *blocks.shape[1:])
        assert np.array_equal(full, blocks[index])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), shape=st.tuples(*(st.integers(1, 5),) * 3),
       mkn=st.tuples(*(st.integers(1, 40),) * 3), threads=st.integers(2, 3))
def test_shared_matmul_products_are_their_own(seed: int, shape: tuple[int, int, int],
                                               mkn: tuple[int, int, int], threads: int) -> None:
    """A batched matmul shared among threads (`kernels.matmul`, operands broadcast along some
    batch axes, or the right one not batched at all) gives each product the bits of that
    product computed alone, as the per-core reference executor computes it, and numpy's
    values to float32 rounding."""
    rng = np.random.default_rng(seed)
    m, k, n = mkn
    a_shape = tuple(x if rng.random() < 0.7 else 1 for x in shape)
    b_shape = tuple(x if rng.random() < 0.7 else 1 for x in shape)
    if rng.random() < 0.25:  # one right matrix for the whole stack
        b_shape = (1, 1, 1)
    a = rng.standard_normal((*a_shape, m, k)).astype(np.float32)
    b = rng.standard_normal((*b_shape, k, n)).astype(np.float32)
    saved = kernels.THREADS, kernels.SHARED_WORK, kernels.OWN_COPIES
    # (a right matrix given to each product of a stack one product at a time, now and then)
    kernels.THREADS, kernels.SHARED_WORK = threads, 0
    kernels.OWN_COPIES = 1 if rng.random() < 0.5 else saved[2]
    try:
        got = kernels.matmul(a, b)
        into = np.empty_like(got)
        assert kernels.matmul(a, b, out=into) is into
    finally:
        kernels.THREADS, kernels.SHARED_WORK, kernels.OWN_COPIES = saved
    assert np.array_equal(into.view(np.uint32), got.view(np.uint32))
    for index in np.ndindex(*got.shape[:-2]):
        pick_a = tuple(i if s > 1 else 0 for i, s in zip(index, a_shape))
        pick_b = tuple(i if s > 1 else 0 for i, s in zip(index, b_shape))
        alone = kernels.matmul(a[pick_a], b[pick_b])
        assert np.array_equal(got[index].view(np.uint32), alone.view(np.uint32)), index
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-4, atol=1e-4 * np.sqrt(k))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), cores=st.integers(1, 40), width=st.integers(1, 50),
       block=st.integers(1, 200), threads=st.integers(1, 3))
def test_blocked_body_is_whole(seed: int, cores: int, width: int, block: int,
                               threads: int) -> None:
    """An elementwise body evaluated a few cores at a time, by threads (`_eval_blocks`), gives
    the bits of one evaluation over every core: each value is computed alone (transcendental
    functions, division by zero and an operand broadcast along the row included)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((cores, 1, width)) * 4).astype(np.float32)
    bias = rng.standard_normal((cores, 1, 1)).astype(np.float32)
    body = ("mul", ("erf", ("add", ("in", 0), ("in", 1))),
            ("div", ("tanh", ("in", 0)), ("exp", ("sub", ("in", 0), ("const", 0.5)))))
    body = ("add", body, ("div", ("const", 1.0), ("relu", ("in", 0))))
    saved = kernels.THREADS, kernels.EVAL_BLOCK
    kernels.THREADS, kernels.EVAL_BLOCK = threads, block
    try:
        got = kernels._eval_blocks(body, [x, bias], (cores, 1, width))
    finally:
        kernels.THREADS, kernels.EVAL_BLOCK = saved
    with np.errstate(all="ignore"):
        want = np.broadcast_to(kernels._eval_body(body, [x, bias]), (cores, 1, width))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_host_tiles_read_what_the_cut_holds() -> None:
    """`HostTiles.read` picks what the cut tiles hold, also for many positions in tiles with
    a dimension of one (where numpy 2.4's unravel_index goes wrong past 8192 elements), past
    the tensor's edge (zero) and at padding positions (-1, zero)."""
    rng = np.random.default_rng(7)
    host = rng.standard_normal((300, 5)).astype(np.float32)
    origin = np.array([[0, c] for c in range(5)] + [[256, 0]], dtype=np.int64)
    tiles = HostTiles(host, origin, (64, 1), np.arange(2000) % 6, lambda v: v,
                      np.dtype(np.float32))
    elems = rng.integers(-1, 64, (2000, 12, 1))
    cores = np.arange(2000).reshape(2000, 1, 1)
    cut = tiles.cut()[tiles.index]  # (cores, 64): every core's tile, cut
    want = np.where(elems >= 0, np.take_along_axis(cut, np.maximum(elems, 0).reshape(2000, -1),
                                                   axis=1).reshape(elems.shape), 0)
    assert np.array_equal(tiles.read(cores, elems), want)


def test_tiles_are_cut_into_memory_given_back() -> None:
    """A cut takes its memory from the pool (here full of NaNs, as freed memory may be) and
    holds what a cut into fresh memory does."""
    rng = np.random.default_rng(3)
    host = rng.standard_normal((40, 30)).astype(np.float32)
    origin = np.indices((3, 4)).reshape(2, -1).T * np.array([16, 8])
    pool = Pool()
    freed = np.full(3 * 4 * 16 * 8 + 5, np.nan, dtype=np.float32)
    pool.give(freed)
    cut = HostTiles(host, origin, (16, 8), np.arange(12), lambda v: v, np.dtype(np.float32),
                    pool=pool)
    tiles = cut.cut()
    assert cut.memory == [freed] and np.may_share_memory(tiles, freed) and pool.bytes == 0
    assert np.array_equal(tiles, load_tiles(host, origin, (16, 8))[0])


def test_loaded_tiles_go_back_to_the_pool_after_their_last_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each loaded weight's tiles are dead after the last instruction that reads them
    (`dead_tiles`): the memory they were cut into goes back to the pool there, before the
    buffer's Free, for the next layers' cuts (never for buffers); the outputs are those of a
    run that keeps every cut's memory to itself."""
    shape = (8, 16)
    model = make_model("chain", build(shape, [("matmul", 16), ("relu", 0), ("matmul", 16),
                                              ("relu", 0), ("matmul", 8)]), (shape,))
    c = compile_model(model, PRESETS["test16"], CompileOptions(dtype="fp16"))
    inputs = make_inputs(c.graph, seed=1)
    dead = dead_tiles(c.program)
    assert sum(len(bufs) for bufs in dead.values()) >= 3  # a weight per matmul, at least
    given: list[np.ndarray] = []
    buffers: list[np.ndarray] = []
    deferred: list[HostTiles] = []

    class Watched(Pool):
        def __init__(self, into: list[np.ndarray]) -> None:
            super().__init__()
            self.into = into

        def give(self, flat: np.ndarray) -> None:
            self.into.append(flat)
            super().give(flat)

    class Kept(Memory):
        def defer(self, buf: int, tiles: HostTiles) -> None:
            deferred.append(tiles)
            super().defer(buf, tiles)

    m = Machine(c.program, c.chip)
    m.tile_pool, m.pool, m.mem = Watched(given), Watched(buffers), Kept()
    got, _ = m.run(inputs, c.graph.constants)
    cut = [t for t in deferred if t.memory]
    assert len(cut) >= 3 and not m.cut_memory
    assert all(any(flat is g for g in given) for t in cut for flat in t.memory)
    assert buffers and not any(flat is b for b in buffers for t in cut for flat in t.memory)
    # (each before its buffer's Free: given back at the last read, not with the buffer)
    m2 = Machine(c.program, c.chip)
    m2.dead = {}
    want, _ = m2.run(inputs, c.graph.constants)
    for name in want:
        assert np.array_equal(got[name].view(np.uint32), want[name].view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 12), st.integers(0, 4)),
                    min_size=1, max_size=40))
def test_live_spans_find_the_overlaps_a_pass_would(ops: list[tuple[bool, int, int]]) -> None:
    """The sorted byte ranges that check a new buffer against the live ones (`Spans`) find
    an overlap exactly where a pass over every live buffer does (``start < e and s < end``),
    empty ranges included; a buffer is added where none overlaps, and freed again."""
    spans, live = Spans(), {}
    for n, (add, start, size) in enumerate(ops):
        if not add and live:  # free the oldest live buffer
            buf = next(iter(live))
            spans.remove(*live.pop(buf), buf)
            continue
        end = start + size
        naive = [b for b, (s, e) in live.items() if start < e and s < end]
        found = spans.overlapping(start, end)
        assert (found is None) == (not naive) and (found is None or found in naive)
        if found is None:
            live[n] = (start, end)
            spans.add(start, end, n)


def test_caches_keyed_by_arrays_find_equal_contents() -> None:
    """The exchange caches' keys (`ByArrays`): the same arrays hit by identity, equal arrays
    that are other objects by their bytes, and other contents, shapes, dtypes or extras
    miss."""
    from t10c.emulator.timing import ByArrays

    cache: ByArrays[str] = ByArrays()
    runs, start = np.arange(12, dtype=np.int32).reshape(3, 4), np.array([0, 3], dtype=np.int64)
    cache.put((start, runs, None), "value", 64)
    assert cache.get((start, runs, None), 64) == "value"
    assert cache.get((start.copy(), runs.copy(), None), 64) == "value"
    assert cache.get((start, runs, None), 32) is None
    assert cache.get((start, runs, np.arange(2)), 64) is None
    changed = runs.copy()
    changed[2, 3] = -1
    assert cache.get((start, changed, None), 64) is None
    assert cache.get((start, runs.reshape(4, 3), None), 64) is None
    assert cache.get((start, runs.astype(np.int64), None), 64) is None


def test_a_read_checked_once_is_checked_again_on_a_new_allocation() -> None:
    """`TimingMachine.check_read` remembers the arrays of cores a buffer was read on: the
    same array again is known good while the buffer lives (what a core wrote stays written),
    but not once the buffer is freed and allocated again, nor for other cores."""
    chip = PRESETS["test64-dram"]
    program = Program("reads", chip.name, "fp32", chip.cores, (Buffer(0, "b", 4, "fp32", 0),),
                      (), (), {}, (), 16)
    machine = TimingMachine(program, chip)
    cores = np.arange(8)
    machine.step(Alloc("op", "x", 0))
    machine.mark_written(0, cores)
    for _ in range(2):  # checked, then known
        machine.check_read(0, cores)
    with pytest.raises(EmulatorError, match="never wrote"):
        machine.check_read(0, np.arange(9))
    for ins in (Free("op", "x", 0), Alloc("op", "x", 0)):
        machine.step(ins)
    with pytest.raises(EmulatorError, match="never wrote"):
        machine.check_read(0, cores)  # the same array, on a buffer nothing wrote yet
    machine.mark_written(0, np.arange(4))
    with pytest.raises(EmulatorError, match="never wrote"):
        machine.check_read(0, cores)
