"""The vectorised emulator against the per-core reference executor (`emulator/reference.py`).

The reference is the living definition of the instruction semantics; the emulator must compute
the same outputs up to float rounding. The reference itself is pinned by a hand-checked program
and by onnxruntime on the compiled models.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t10c.chips import PRESETS, Chip, chip_from_dict
from t10c.codegen.pattern import from_table
from t10c.codegen.pattern import width as pattern_width
from t10c.codegen.program import (
    Alloc,
    Buffer,
    Exchange,
    Load,
    Program,
    Reduce,
    Shift,
    Store,
    indexed_load,
)
from t10c.codegen.verify import verify_program
from t10c.driver import (
    TOLERANCE,
    CompileOptions,
    compile_model,
    make_inputs,
    max_rel_err,
    reference,
)
from t10c.emulator import EmulatorError, emulate
from t10c.emulator.reference import run_reference
from t10c.ir import Operand, TensorExpr
from t10c.partition import SearchOptions

MIB = 1024 * 1024


@dataclass(frozen=True)
class Case:
    model: str
    cores: int
    dtype: str
    batch: int | None = None
    seq_len: int | None = None
    sram_mib: int = 1  # test16 has 1 MiB; 7-core mlp and fp32 bert-tiny need 2
    tolerance: float = 1e-6  # max |emulator - reference| over max |reference|

    @property
    def chip(self) -> Chip:
        base = PRESETS["test16"]
        grid = base.grid if self.cores == base.cores else (1, self.cores)
        return dataclasses.replace(base, cores=self.cores, grid=grid,
                                   sram_bytes_per_core=self.sram_mib * MIB)


CASES = [
    Case("mlp", 16, "fp32", batch=2),
    Case("mlp", 7, "fp32", batch=2, sram_mib=2),
    Case("bert-tiny", 16, "fp32", seq_len=8, sram_mib=2),
    Case("bert-tiny", 16, "fp16", seq_len=8, tolerance=1e-3),  # about one fp16 ulp
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.model}-{c.cores}c-{c.dtype}")
def test_emulator_matches_reference(case: Case) -> None:
    c = compile_model(case.model, case.chip,
                      CompileOptions(dtype=case.dtype, batch=case.batch, seq_len=case.seq_len))
    inputs = make_inputs(c.graph, seed=0)
    got, _, _ = emulate(c.program, c.chip, inputs, c.graph.constants)
    want = run_reference(c.program, c.chip, inputs, c.graph.constants)
    assert set(got) == set(want) == set(c.program.outputs)
    for name in want:
        assert got[name].shape == want[name].shape
        assert np.isfinite(want[name]).all(), f"{name}: non-finite (an element never written?)"
    assert max_rel_err(got, want) <= case.tolerance
    ort, _, _ = reference(c.full_model(), inputs)
    assert max_rel_err(want, ort) <= TOLERANCE[case.dtype]


def _hand_program(chip: Chip) -> Program:
    """Load with padding, Exchange with a hole, Shift, Reduce(max) reading past its source."""
    bufs = (Buffer(0, "a", 3, "fp32", 0), Buffer(1, "b", 3, "fp32", 16),
            Buffer(2, "s", 3, "fp32", 32), Buffer(3, "r", 2, "fp32", 48))
    nxt = (np.arange(4) + 1) % 4
    instrs = (
        *(Alloc("", "", b.id) for b in bufs),
        Load("", "", 0, "x", (4, 3), (3,), np.zeros((4, 1), dtype=np.int32),
             np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, -1]])),
        Exchange("", "", 1, 0, np.stack([nxt, nxt, np.full(4, -1)], axis=1),
                 np.tile([0, 2, 0], (4, 1))),
        Shift("", "", 2, 1, np.array([3, 0, 1, 2])),
        Reduce("", "", 3, 2, "max", np.array([[0, 1], [0, 1], [2, 3], [2, 3]]),
               np.array([0, 2, 0, 2])),
        Store("", "", "y", (4, 2), 3, np.repeat(np.arange(4), 2), np.tile([0, 1], 4)),
    )
    return Program("hand", chip.name, "fp32", 4, bufs, (), instrs, {"x": ((4, 3), "fp32")},
                   ("y",), 64)


def test_hand_checked_program() -> None:
    chip = dataclasses.replace(PRESETS["test16"], cores=4, grid=(2, 2))
    x = {"x": np.arange(1, 13, dtype=np.float32).reshape(4, 3)}
    # a = [1 2 3] [4 5 6] [7 8 9] [10 11 0]; b[c] = [a[c+1][0], a[c+1][2], 0]
    # s[c] = b[c-1] = [1 3 0] [4 6 0] [7 9 0] [10 0 0]; r[c] = max over the pair of s[g][off:off+2]
    want = np.array([[4, 6], [0, -np.inf], [10, 9], [0, -np.inf]], dtype=np.float32)
    program = _hand_program(chip)
    np.testing.assert_array_equal(run_reference(program, chip, x, {})["y"], want)
    np.testing.assert_array_equal(emulate(program, chip, x, {})[0]["y"], want)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), width=st.integers(1, 12), chunk=st.integers(1, 6),
       size=st.integers(1, 5), combine=st.sampled_from(("sum", "max")))
def test_a_reduce_over_shared_member_lists_is_each_rows_own(seed: int, width: int,
                                                            chunk: int, size: int,
                                                            combine: str) -> None:
    """Rows that combine the same members in the same order share one combine of the
    members' whole rows (`Machine.reduce`); each row's chunk is then, bit for bit, the
    reference executor's combine of its own chunks in its own order, also where its chunk
    runs past the end of the source (the combine's identity) and where other rows list the
    same members in another order."""
    rng = np.random.default_rng(seed)
    chip = PRESETS["test16"]
    n = chip.cores
    lists = [rng.choice(n, size, replace=False) for _ in range(int(rng.integers(1, 4)))]
    pick = rng.integers(0, len(lists), n)
    group = np.stack([lists[k] if rng.random() < 0.8 else rng.permutation(lists[k])
                      for k in pick])
    offset = rng.integers(0, width + chunk, n)
    bufs = (Buffer(0, "s", width, "fp32", 0), Buffer(1, "r", chunk, "fp32", 64))
    instrs = (
        *(Alloc("", "", b.id) for b in bufs),
        Load("", "", 0, "x", (n, width), (width,), np.zeros((n, 1), dtype=np.int32),
             np.arange(n * width).reshape(n, width)),
        Reduce("", "", 1, 0, combine, group, offset),
        Store("", "", "y", (n, chunk), 1, np.repeat(np.arange(n), chunk),
              np.tile(np.arange(chunk), n)),
    )
    program = Program("reduce", chip.name, "fp32", n, bufs, (), instrs,
                      {"x": ((n, width), "fp32")}, ("y",), 128)
    x = {"x": rng.standard_normal((n, width)).astype(np.float32)}
    want = run_reference(program, chip, x, {})["y"]
    got = emulate(program, chip, x, {})[0]["y"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _fp16_program(chip: Chip) -> Program:
    """A float32 mask of -3.4e38 loaded into fp16 and shifted around: it saturates to -inf."""
    bufs = (Buffer(0, "a", 2, "fp16", 0), Buffer(1, "b", 2, "fp16", 16))
    instrs = (
        Alloc("", "", 0), Alloc("", "", 1),
        Load("", "", 0, "m", (4, 2), (1, 2), np.arange(4, dtype=np.int32)[:, None] * [1, 0]),
        Shift("", "", 1, 0, np.array([1, 2, 3, 0])),
        Store("", "", "y", (4, 2), 1, np.repeat(np.arange(4), 2), np.tile([0, 1], 4)),
    )
    return Program("fp16", chip.name, "fp16", 4, bufs, (), instrs, {"m": ((4, 2), "float32")},
                   ("y",), 32)


def test_fp16_masks_saturate_without_warnings() -> None:
    chip = dataclasses.replace(PRESETS["test16"], cores=4, grid=(2, 2))
    m = np.array([[np.finfo(np.float32).min, 1.0]] * 4, dtype=np.float32)
    want = np.array([[-np.inf, 1.0]] * 4, dtype=np.float32)
    program = _fp16_program(chip)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in cast" would raise
        np.testing.assert_array_equal(emulate(program, chip, {"m": m}, {})[0]["y"], want)
        np.testing.assert_array_equal(run_reference(program, chip, {"m": m}, {})["y"], want)


def test_failures_name_the_instruction_op_and_onnx_node() -> None:
    """A numpy error inside an instruction is reported fx-style, wherever it happens."""
    chip = dataclasses.replace(PRESETS["test16"], cores=4, grid=(2, 2))
    program = _hand_program(chip)
    expr = TensorExpr("layer0/q", (("i", 3),), Operand("y", ("i",)), (Operand("x", ("i",)),),
                      None, ("neg", ("in", 0)), "MatMul node '/encoder/layer.0/q/MatMul'")
    shift = next(n for n, i in enumerate(program.instrs) if isinstance(i, Shift))
    instrs = list(program.instrs)
    # a Shift whose source table is too short for its destination's rows: numpy's error
    instrs[shift] = Shift("layer0/q", "shift", 2, 1, np.array([[3, 0], [1, 2]]))
    bad = dataclasses.replace(program, exprs=(expr,), instrs=tuple(instrs))
    x = {"x": np.zeros((4, 3), dtype=np.float32)}
    with pytest.raises(EmulatorError) as exc:
        emulate(bad, chip, x, {})
    assert str(exc.value).startswith(
        f"while executing instruction {shift} (Shift) of op layer0/q (ONNX MatMul node "
        "'/encoder/layer.0/q/MatMul'): ")
    with pytest.raises(RuntimeError, match=f"instruction {shift} \\(Shift\\) of op layer0/q"):
        run_reference(bad, chip, x, {})


def test_emulate_reports_progress() -> None:
    chip = dataclasses.replace(PRESETS["test16"], cores=4, grid=(2, 2))
    program = _hand_program(chip)
    calls: list[tuple[str, int, int]] = []
    x = {"x": np.arange(1, 13, dtype=np.float32).reshape(4, 3)}
    emulate(program, chip, x, {}, progress=lambda *a: calls.append(a))
    total = len(program.instrs)
    assert calls[0] == ("emulate", 0, total) and calls[-1] == ("emulate", total, total)
    assert all(s == "emulate" and 0 <= d <= t == total for s, d, t in calls)


def test_timing_machine_times_as_the_data_machine() -> None:
    """The timing-only machine shares the data machine's timing handlers: same records."""
    from t10c.emulator import Machine, TimingMachine

    c = compile_model("mlp", PRESETS["test16"], CompileOptions(batch=2))
    inputs = make_inputs(c.graph, seed=0)
    _, full = Machine(c.program, c.chip).run(inputs, c.graph.constants)
    timing = TimingMachine(c.program, c.chip).execute(inputs, c.graph.constants)
    assert timing.records == full.records and timing.cycles > 0
    assert not hasattr(TimingMachine(c.program, c.chip), "mem")


@st.composite
def tables(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    """An exchange table for 4 cores: rows drawn from a few distinct rows, each a mix of
    blocks, strided columns, broadcasts, padding and random elements of an 8-element source."""
    width = draw(st.integers(0, 12))
    distinct = []
    for _ in range(draw(st.integers(1, 3))):
        core, off = np.empty(width, np.int64), np.empty(width, np.int64)
        e = 0
        while e < width:
            n = draw(st.integers(1, width - e))
            kind = draw(st.sampled_from(["block", "stride", "broadcast", "pad", "random"]))
            c = draw(st.integers(0, 3))
            start = draw(st.integers(0, 7))
            step = {"block": 1, "stride": 2, "broadcast": 0}.get(kind, 1)
            n = min(n, (7 - start) // step + 1) if step else n
            core[e:e + n] = -1 if kind == "pad" else c
            off[e:e + n] = (draw(st.lists(st.integers(0, 7), min_size=n, max_size=n))
                            if kind == "random" else start + step * np.arange(n))
            e += n
        distinct.append((core, np.where(core >= 0, off, -1)))
    pick = draw(st.lists(st.integers(0, len(distinct) - 1), min_size=4, max_size=4))
    return (np.stack([distinct[k][0] for k in pick]), np.stack([distinct[k][1] for k in pick]),
            width)


@settings(max_examples=60, deadline=None)
@given(table=tables(), mesh=st.booleans())
def test_patterns_mean_their_tables(table, mesh) -> None:
    """An exchange and an indexed load given as copy patterns move the same values and cost
    the same cycles as their element tables, on the emulator and the reference executor."""
    core, off, width = table
    chip = dataclasses.replace(PRESETS["test16"], cores=4, grid=(2, 2),
                               topology="mesh2d" if mesh else PRESETS["test16"].topology)
    p = from_table(core, off)
    assert pattern_width(p) == width or not width
    bufs = (Buffer(0, "a", 8, "fp32", 0), Buffer(1, "b", width, "fp32", 64),
            Buffer(2, "c", width, "fp32", 128))
    index = np.where(core >= 0, core * 8 + off, -1)  # the load reads the same elements
    loads = (Load("", "", 2, "x", (4, 8), (width,), np.zeros((4, 1), np.int32), index),
             indexed_load("", "", 2, "x", (4, 8), width, index, None, None))
    moves = (Exchange("", "relayout", 1, 0, core, off),
             Exchange("", "relayout", 1, 0, None, None, None, p.pat, p.start, p.runs))
    x = {"x": np.arange(1, 33, dtype=np.float32).reshape(4, 8)}
    results = []
    for load, move in zip(loads, moves):
        instrs = (*(Alloc("", "", b.id) for b in bufs),
                  Load("", "", 0, "x", (4, 8), (1, 8), np.arange(4, dtype=np.int32)[:, None]
                       * [1, 0]), load, move,
                  Store("", "", "y", (4, width), 1, np.repeat(np.arange(4), width),
                        np.tile(np.arange(width), 4)),
                  Store("", "", "z", (4, width), 2, np.repeat(np.arange(4), width),
                        np.tile(np.arange(width), 4)))
        prog = Program("p", chip.name, "fp32", 4, bufs, (), instrs, {"x": ((4, 8), "fp32")},
                       ("y", "z"), 192)
        verify_program(prog, chip)
        out, timeline, _ = emulate(prog, chip, x, {})
        ref = run_reference(prog, chip, x, {})
        for name in ("y", "z"):
            np.testing.assert_array_equal(out[name], ref[name])
        results.append((out, [(r.phase, r.cycles, r.bytes_per_core) for r in timeline.records],
                        timeline.host_bytes))
    (a, ta, ha), (b, tb, hb) = results
    for name in ("y", "z"):
        np.testing.assert_array_equal(a[name], b[name])
    assert ta == tb and ha == hb


def test_reference_runs_each_table_row_on_its_listed_core() -> None:
    """On a mesh an op's table rows name their physical cores (``cores``): a 2 x 2 grid on a
    2 x 3 mesh fills a 2 x 2 square, cores 0, 1, 3 and 4, and the reference puts row 2's
    tile on core 3, as the emulator does (it had put it on core 2, and left core 4's element
    unwritten)."""
    chip = chip_from_dict({"base": "test16", "name": "mesh2x3", "cores": 6,
                           "topology": "mesh2d", "grid": [2, 3]})
    c = compile_model("matmul-2x2x2", chip, CompileOptions(search=SearchOptions(max_steps=1)))
    loads = [ins for ins in c.program.instrs if isinstance(ins, Load)]
    assert any(ins.cores is not None and ins.cores.tolist() == [0, 1, 3, 4] for ins in loads)
    inputs = make_inputs(c.graph, seed=0)
    got, _, _ = emulate(c.program, c.chip, inputs, c.graph.constants)
    want = run_reference(c.program, c.chip, inputs, c.graph.constants)
    for name in want:
        assert np.isfinite(want[name]).all(), name
    assert max_rel_err(got, want) <= 1e-3
