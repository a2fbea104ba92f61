"""Pods: chips joined by inter-chip links, planned as one machine. Chip fields, an exchange
timed by hand on a tiny 2-chip pod, every plan of an op on it emulated and predicted, and a
small LLaMA with its weights in the pod's DRAM against onnxruntime."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_fusion import MM, graph_of

from t10c.chips import PRESETS, ChipError, chip_from_dict, describe
from t10c.codegen import generate
from t10c.codegen.pattern import chip_pair_counts, from_table
from t10c.codegen.program import Alloc, Buffer, Exchange, Fill, Program, Shift, Store
from t10c.dtypes import IntTensors
from t10c.emulator import emulate
from t10c.emulator.timing import TimingMachine
from t10c.partition import Plan, SearchOptions, geometry, search_op
from t10c.partition.pod import ring_cross, ring_cross_row, spread_cross

POD = PRESETS["test-pod2"]
POD_FIELDS = ("chips", "chip_links", "chip_link_bytes_per_cycle", "chip_link_latency_cycles")


def test_pod_presets_cite_every_figure() -> None:
    for name in ("elk-pod4", "ipu-pod4"):
        chip = PRESETS[name]
        assert chip.is_pod and chip.has_dram and chip.topology == "all-to-all"
        for f in (*POD_FIELDS, "dram_bytes", "dram_bytes_per_cycle", "dram_attach"):
            assert f in chip.sources, (name, f)
        assert (chip.chips, chip.cores_per_chip, chip.sram_bytes_per_core) == (4, 1472,
                                                                               624 * 1024)
        # 10 IPU-Links of 32 GB/s at 1.325 GHz: 24 B/cycle each, 240 per chip and direction
        assert chip.pod_bytes_per_cycle == 240
    elk = PRESETS["elk-pod4"]
    assert abs(elk.dram_bytes_per_cycle * elk.clock_hz - 16e12) < 0.01 * 16e12  # 16 TB/s
    rows = dict(describe(elk))
    assert rows["pod"].startswith("4 chips of 1472 cores, 10 links per chip of 24 B/cycle")
    assert "each of the 4 chips reaches its own 1/4" in rows["off-chip memory"]
    assert "pod" not in dict(describe(PRESETS["ipu-mk2"]))


def test_chip_file_pod_fields_are_strict() -> None:
    chip = chip_from_dict({"name": "x", "base": "test16", "chips": 4, "chip_links": 2,
                           "chip_link_bytes_per_cycle": 3})
    assert chip.is_pod and chip.cores_per_chip == 4 and chip.pod_bytes_per_cycle == 6
    with pytest.raises(ChipError) as info:
        chip_from_dict({"name": "x", "base": "test64-dram", "chips": 3, "chip_links": 0})
    text = str(info.value)
    assert "chips: 3 chips do not divide cores = 64" in text
    assert "chip_links: a pod of 3 chips needs at least 1" in text
    assert "chip_link_bytes_per_cycle: a pod of 3 chips needs at least 1" in text
    assert "dram_bytes_per_cycle: 64 is the pod's whole DRAM bandwidth" in text
    assert "\n" not in text
    with pytest.raises(ChipError, match="chip_links, chip_link_latency_cycles: set for a "
                                        "single chip; give chips"):
        chip_from_dict({"name": "x", "base": "test16", "chip_links": 2,
                        "chip_link_latency_cycles": 9})
    with pytest.raises(ChipError, match="chips: a pod of mesh2d chips is not modelled"):
        chip_from_dict({"name": "x", "base": "voxel-3d", "chips": 2, "chip_links": 1,
                        "chip_link_bytes_per_cycle": 1})
    with pytest.raises(ChipError, match="chips: expected an integer from 1"):
        chip_from_dict({"name": "x", "base": "test16", "chips": 0})


def _shift_program(src_core: np.ndarray, elems: int) -> Program:
    bufs = (Buffer(0, "a", elems, "fp16", 0), Buffer(1, "b", elems, "fp16", 2 * elems))
    instrs = (Alloc("op", "alloc", 0), Alloc("op", "alloc", 1), Fill("op", "fill", 0, 1.0, 16),
              Shift("op", "shift", 1, 0, src_core),
              Store("", "host", "out", (elems,), 1, np.zeros(elems, dtype=np.int32),
                    np.arange(elems, dtype=np.int32)))
    return Program("shift", POD.name, "fp16", POD.cores, bufs, (), instrs, {}, ("out",),
                   4 * elems)


def test_exchange_by_hand_on_a_two_chip_pod() -> None:
    """test-pod2: two chips of 8 cores, one 2 B/cycle link each way between them (latency
    50), cores 4 B/cycle each (latency 16). Each core receives 2,048 bytes from its ring
    neighbour: the per-core bound is 16 + 2,048 / 4 = 528 cycles. A ring over all 16 cores
    crosses each way once: core 7 receives from core 8 and core 15 from core 0, so each
    chip sends and receives 2,048 bytes over its link: 50 + 2,048 / 2 = 1,074 cycles.
    Rings of 8 cores inside each chip cross nothing: 528."""
    assert POD.exchange_cycles(2048, 2048) == 1074
    assert POD.exchange_cycles(2048, 0) == PRESETS["test16"].transfer_cycles(2048) == 528
    cores = np.arange(16)
    across = (cores + 1) % 16
    inside = cores // 8 * 8 + (cores + 1) % 8
    for src, want in ((across, 1074), (inside, 528)):
        tm = TimingMachine(_shift_program(src.astype(np.int32), 1024), POD)
        tm.execute({}, {})
        assert [(r.phase, r.cycles) for r in tm.timeline.records] == [("shift", want)]
    # the planner counts the same crossings from a plan's ring sources
    assert list(ring_cross(POD, cores, across)) == [1, 1]
    assert list(ring_cross(POD, cores, inside)) == [0, 0]
    assert ring_cross_row(POD, (16,), 0, 16) == (1, 1)  # one ring over all 16 cores
    assert ring_cross_row(POD, (2, 8), 1, 8) == (0, 0)  # a ring per chip
    assert ring_cross_row(POD, (8, 2), 0, 8) == (2, 2)  # two rings of stride 2, both across
    # sources spread over the pod: half of each core's bytes cross (8 cores x 1,000 / 2)
    assert spread_cross(POD, 16, 1000) == 4000
    assert spread_cross(PRESETS["test16"], 16, 1000) == 0


def _broadcast_program(src_core: np.ndarray, src_off: np.ndarray, pattern: bool) -> Program:
    elems = src_core.shape[1]
    bufs = (Buffer(0, "a", elems, "fp16", 0), Buffer(1, "b", elems, "fp16", 2 * elems))
    if pattern:
        p = from_table(src_core, src_off)
        ex = Exchange("op", "relayout", 1, 0, None, None, None, p.pat, p.start, p.runs)
    else:
        ex = Exchange("op", "relayout", 1, 0, src_core, src_off)
    instrs = (Alloc("op", "alloc", 0), Alloc("op", "alloc", 1), Fill("op", "fill", 0, 1.0, 16),
              ex)
    return Program("fan", POD.name, "fp16", POD.cores, bufs, (), instrs, {}, (), 4 * elems)


def test_fan_out_by_hand_on_a_two_chip_pod() -> None:
    """Every core of test-pod2 reads the same 1,024 fp16 values of core 0 (an activation
    replicated on every core): each core but core 0 receives 2,048 bytes (16 + 2,048 / 4 =
    528 cycles), and the values cross to chip 1 once, to be fanned out there: 2,048 bytes
    over the link, 50 + 2,048 / 2 = 1,074 cycles (not 8 x 2,048 B: 8,242 cycles). Half of
    them from core 0 and half from core 8 (on chip 1), each element read twice on each chip
    at different offsets: 1,024 bytes cross each way, 50 + 512 = 562."""
    off = np.tile(np.arange(1024, dtype=np.int32), (16, 1))
    same = np.zeros((16, 1024), dtype=np.int32)
    halves = np.where(np.arange(1024) < 512, 0, 8).astype(np.int32)[None, :].repeat(16, 0)
    twice = np.tile(np.arange(512, dtype=np.int32), (16, 2))
    for pattern in (False, True):
        for core, offs, want in ((same, off, 1074), (halves, twice, 562)):
            tm = TimingMachine(_broadcast_program(core, offs, pattern), POD)
            tm.execute({}, {})
            assert [(r.phase, r.cycles) for r in tm.timeline.records] == [
                ("relayout", want)], (pattern, want)


def test_chip_pair_counts_equal_counting_every_element() -> None:
    """The distinct elements each chip receives from each core of another chip, from the
    runs of a pattern (strided, broadcast and padded rows, repeated rows), equal those
    counted from its table element by element."""
    rng = np.random.default_rng(7)
    chip = PRESETS["elk-pod4"]
    for trial in range(20):
        rows, width = int(rng.integers(1, 40)), int(rng.integers(1, 60))
        pick_core = rng.integers(-1, 12, size=(5, width))  # 12 source cores over 4 chips
        core = np.where(pick_core < 0, -1, pick_core * 500).astype(np.int32)
        step = rng.integers(0, 4, size=(5, 1))
        start = rng.integers(0, 50, size=(5, 1))
        off = np.where(core < 0, 0, start + step * np.arange(width)[None, :]).astype(np.int32)
        pick = rng.integers(0, 5, size=rows)
        core, off = core[pick], off[pick]
        here = rng.choice(chip.cores, size=rows, replace=False)
        here = (here // 1472 * 1472 + here % 3).astype(np.int64)  # a few cores per chip
        p = from_table(core, off)
        got = sorted(zip(*(a.tolist() for a in chip_pair_counts(p, here, 1472, 4))))
        want: dict[tuple[int, int], set[int]] = {}
        for r in range(rows):
            for c, o in zip(core[r], off[r]):
                if c >= 0 and c // 1472 != here[r] // 1472:
                    want.setdefault((int(c), int(here[r] // 1472)), set()).add(int(o))
        assert got == sorted((c, d, len(v)) for (c, d), v in want.items()), trial


def test_every_plan_on_a_pod_matches_numpy_and_its_prediction() -> None:
    """Every plan of a matmul on test-pod2 computes the right values and is measured within
    5% of its prediction; some rotate or reduce across the chips' boundary, and those are
    predicted slower than the same plan on one 16-core chip."""
    shapes = {"A": (8, 64), "W": (64, 16), "C": (8, 16)}
    graph = graph_of([dataclasses.replace(MM, axes=(("m", 8), ("k", 64), ("n", 16)))], ("C",),
                     shapes)
    op = graph.ops[0]
    plans = search_op(graph, op, POD, "fp16", SearchOptions(chains=True))
    crossing = [p for p in plans if any(
        geometry(graph, op, p).rotation_axis(i) is not None
        and ring_cross(POD, np.arange(geometry(graph, op, p).ncores),
                       geometry(graph, op, p).ring_source(i)).any()
        for i in range(len(op.operands)))]
    assert crossing
    one_chip = dataclasses.replace(POD, name="one", chips=1, chip_links=0,
                                   chip_link_bytes_per_cycle=0, chip_link_latency_cycles=0)
    alone = {(p.F, p.T, p.rot): p.cycles.total
             for p in search_op(graph, op, one_chip, "fp16", SearchOptions(chains=True))}
    assert any(p.cycles.total > alone[(p.F, p.T, p.rot)] for p in crossing)
    assert any(geometry(graph, op, p).reduce_group > 1 for p in crossing)
    # every plan but those rotating an input slower than its axis (legal but dominated: the
    # cores crossing a partition boundary differ from step to step, and the pod's bytes are
    # priced at their average, within 25%)
    rng = np.random.default_rng(1)
    feeds = {"A": rng.standard_normal((8, 64)).astype(np.float32)}
    want = feeds["A"] @ graph.constants["W"]
    full = [p for p in plans if all(c == 1 or not r or c == p.T[op.axis_names.index(r[0])]
                                    for c, r in zip(p.chain, p.rot))]
    assert len(full) > 20 and any(p in full for p in crossing)
    for p in plans:
        plan = Plan(graph.name, "test", "fp16", (p,), (0,), (1,))
        out, timeline, _ = emulate(generate(graph, plan, POD), POD, feeds, graph.constants)
        assert np.abs(out["C"] - want).max() < 2e-2 * np.abs(want).max(), p
        if p in full:
            assert timeline.cycles == p.cycles.total, (p, timeline.cycles)
        else:
            assert abs(timeline.cycles - p.cycles.total) <= 0.25 * p.cycles.total, p


def test_every_warm_up_on_a_pod_is_predicted_exactly() -> None:
    """Every plan of a matmul on test-pod2 with its weight warmed up from the compact idle
    layout before the run: right values, and emulated in exactly its predicted cycles. A
    replicated plan's cores want many copies of one weight tile and each element crosses to
    a chip once (`cost.fetch_wanted`): priced per receiving core instead, 71 of these 235
    plans were predicted up to 1.7x slow."""
    from t10c.partition.space import warm_up_twins

    shapes = {"A": (8, 64), "W": (64, 16), "C": (8, 16)}
    graph = graph_of([dataclasses.replace(MM, axes=(("m", 8), ("k", 64), ("n", 16)))], ("C",),
                     shapes)
    op = graph.ops[0]
    twins = warm_up_twins(graph, op, search_op(graph, op, POD, "fp16", SearchOptions()), POD,
                          "fp16", IntTensors(), frozenset({"W"}))
    assert len(twins) > 100 and all(p.home for p in twins)
    rng = np.random.default_rng(1)
    feeds = {"A": rng.standard_normal((8, 64)).astype(np.float32)}
    want = feeds["A"] @ graph.constants["W"]
    for p in twins:
        plan = Plan(graph.name, "test", "fp16", (p,), (0,), (1,))
        out, timeline, _ = emulate(generate(graph, plan, POD), POD, feeds, graph.constants)
        assert np.abs(out["C"] - want).max() < 2e-2 * np.abs(want).max(), p
        assert timeline.cycles == p.cycles.total, (p, timeline.cycles)


@pytest.fixture(scope="module")
def pod_run() -> tuple:
    from t10c.driver import CompileOptions, compile_model, run_compiled

    chip = chip_from_dict({"name": "test-pod2-dram", "base": "test64-dram", "chips": 2,
                           "chip_links": 1, "chip_link_bytes_per_cycle": 2,
                           "chip_link_latency_cycles": 50})
    c = compile_model("llama-tiny-decode", chip, CompileOptions())
    return c, run_compiled(c)


def test_llama_on_a_pod_with_dram_runs(pod_run: tuple) -> None:
    """llama-tiny-decode on two 32-core chips with their DRAM: the outputs match
    onnxruntime's, and the emulator measures the planner's prediction, op by op: each
    re-layout's bytes that cross between the chips are counted element by element
    (`pod.element_cross`), as the emulator counts them. (They had been estimated as if the
    sources were spread evenly over the pod: 7% over here, 16,150 cycles predicted against
    15,090, which the DMA queue hid while the embedding's whole table was loaded.)"""
    c, r = pod_run
    assert r.ok, r.max_rel_err
    assert any(p.dram_cycles for p in c.plan.ops)
    assert r.timeline.cycles == c.plan.total_cycles
    emulated: dict[str, int] = {}
    for rec in r.timeline.records:
        if rec.phase != "dram":
            emulated[rec.op] = emulated.get(rec.op, 0) + rec.cycles
    for p, relayout in zip(c.plan.ops, c.plan.relayout_cycles):
        assert emulated.get(p.op, 0) == p.cycles.total + relayout, p.op


def test_fetched_weights_cross_the_pod_as_counted(tmp_path) -> None:
    """gpt2-tiny on ipu-pod4 fetches weights (its epilogues' biases) from their idle layouts,
    spread over the pod's cores: after the solve each fetch's bytes that cross chips are counted
    element by element (`transitions.pod_fetches`), not estimated, and the step is emulated
    as predicted (gpt2-xl had been 3% over: 3,896.5 us predicted, 3,780.7 emulated). The
    plan file replays to the same plan."""
    from t10c.cli import main
    from t10c.driver import CompileOptions, compile_model
    from t10c.partition.transitions import fetches

    chip = PRESETS["ipu-pod4"]
    c = compile_model("gpt2-tiny", chip, CompileOptions(timing_only=True))
    assert sum(fetches(c.graph, i, p, chip) for i, p in enumerate(c.plan.ops)) >= 4
    assert c.timeline is not None and c.timeline.cycles == c.plan.total_cycles
    first, again = tmp_path / "first", tmp_path / "again"
    first.mkdir()
    again.mkdir()
    assert main(["compile", "gpt2-tiny", "--chip", "ipu-pod4", "--timing-only", "--no-table",
                 "-o", str(first)]) == 0
    assert main(["compile", "gpt2-tiny", "--chip", "ipu-pod4", "--timing-only", "--no-table",
                 "-o", str(again), "--plan", str(first / "plan.json")]) == 0
    assert (first / "plan.json").read_bytes() == (again / "plan.json").read_bytes()
