"""The plan's lower bounds (partition.bounds) and the run.json of timing-only compiles."""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from t10c.chips import chip_from_dict, load_chip
from t10c.cli import main
from t10c.driver import CompileOptions, compile_model
from t10c.partition.bounds import Bounds, exchange_cycles, ideal_cycles, roofline_cycles
from t10c.partition.plan import Cycles
from t10c.partition.space import tensor_sets

# the module (`t10c.partition.bounds` the attribute is its function `bounds`)
B = importlib.import_module("t10c.partition.bounds")


def test_roofline_is_the_flops_at_the_peak_rate() -> None:
    chip = load_chip("ipu-mk2")
    c = compile_model("matmul-64x128x32", chip, CompileOptions(weights=False))
    per_cycle = chip.peak_flops("fp16") / chip.clock_hz  # 2 * 64 MACs * 1472 cores
    assert per_cycle == 2 * 64 * 1472
    assert c.plan.bounds is not None
    assert c.plan.bounds.roofline_cycles == math.ceil(2 * 64 * 128 * 32 / per_cycle) \
        == roofline_cycles(c.graph, chip, "fp16")


class _Plan:  # the one field `ideal_cycles` reads
    def __init__(self, total: int) -> None:
        self.cycles = Cycles(total, 0, 0, 0)


def test_ideal_takes_each_ops_fastest_plan() -> None:
    fronts = [[_Plan(50), _Plan(30), _Plan(40)], [_Plan(7)], []]
    assert ideal_cycles(fronts) == 37  # type: ignore[arg-type]


@pytest.mark.parametrize("model, chip", [("bert-tiny", "test16"), ("mlp", "test16"),
                                         ("bert-tiny", "ipu-mk2"), ("gpt2-tiny", "ipu-mk2"),
                                         ("llama-tiny", "ipu-mk2")])
def test_bounds_hold_below_the_emulated_latency(model: str, chip: str) -> None:
    """All three are lower bounds: no plan the emulator times beats them, on the MK2 and on
    a chip where the weights must rotate (memory binds)."""
    c = compile_model(model, load_chip(chip),
                      CompileOptions(seq_len=16, weights=False, timing_only=True))
    b = c.plan.bounds
    assert b is not None and c.timeline is not None
    assert 0 < b.roofline_cycles <= b.ideal_cycles <= b.exchange_cycles <= c.timeline.cycles
    roof, ideal = b.fractions(c.timeline.cycles)
    assert 0 < roof <= ideal <= b.of_exchange(c.timeline.cycles) <= 1


@pytest.mark.parametrize("model, chip", [("llama-tiny", "ipu-mk2"), ("mlp", "test16")])
def test_the_exchange_bound_counts_what_a_weight_matmul_must_receive(model: str, chip: str
                                                                     ) -> None:
    """Where weight matmuls' activations must reach many cores (llama-tiny on the MK2) or
    their weights cannot all be held where they are used (the mlp on 16 cores), the bound
    is above the ideal; there is none on a mesh, where routes, not bytes, set the time."""
    opts = CompileOptions(seq_len=16, weights=False, timing_only=True)
    c = compile_model(model, load_chip(chip), opts)
    b = c.plan.bounds
    assert b is not None and c.timeline is not None
    assert b.ideal_cycles < b.exchange_cycles <= c.timeline.cycles
    mesh = chip_from_dict({"base": "wse2", "name": "mesh64", "grid": [64, 64], "cores": 4096})
    assert exchange_cycles(c.graph, mesh, "fp16", []) == 0
    assert math.isnan(Bounds(1, 2).of_exchange(10))


def test_a_cuts_bytes_and_copies_are_counted_by_hand() -> None:
    """One cut of a (64 x 128) by (128 x 32) product on the MK2, F = (m 4, k 8, n 2): blocks
    of 16 x 16 x 16. The activation is needed by 2 column blocks, the weight by 4 row blocks,
    and 8 blocks along k hold fp32 partial sums of every output element."""
    chip = load_chip("ipu-mk2")
    c = compile_model("matmul-64x128x32", chip, CompileOptions(weights=False, timing_only=True))
    op = c.graph.ops[0]
    ints, consts = tensor_sets(c.graph)
    slot = next(i for i, o in enumerate(op.inputs) if o.tensor in consts)
    cuts = B._cuts(c.graph, op, slot, chip, "fp16", ints, consts, share=1.0)
    grid = dict(zip(op.axis_names, (4, 8, 2) if op.axis_names == ("m", "k", "n") else ()))
    assert grid, op.axis_names
    F = B._cut_grid([e for _, e in op.axes], chip.cores)
    row = int(np.flatnonzero((F == [grid[a] for a in op.axis_names]).all(axis=1))[0])
    arriving = (2 - 1) * 64 * 128 * 2 + (4 - 1) * 128 * 32 * 2 + (8 - 1) * 64 * 32 * 4
    compute = 32 + 16 * 16 * 16 // 64  # one step's overhead and the 16 x 16 x 16 product
    assert cuts.base[row] == pytest.approx(compute + arriving / (4 * 1472))
    assert cuts.per_copy == pytest.approx(128 * 32 * 2 / (4 * 1472))
    assert cuts.copy_bytes == pytest.approx(128 * 32 * 2 / 1472)
    assert cuts.copies[row] == 4


def test_the_least_of_a_cut_takes_copies_where_they_pay() -> None:
    """Two cuts; holding copies saves 10 cycles each and costs 1 byte each: free SRAM (no
    multiplier) takes all 4 copies down to the ideal's floor, dear SRAM takes one."""
    cuts = B._Cuts(np.array([100.0, 90.0]), 10.0, 1.0, np.array([4.0, 2.0]))
    assert B._least(cuts, 0, 0.0) == pytest.approx(70.0)  # cut 0 with 4 copies
    assert B._least(cuts, 75, 0.0) == pytest.approx(75.0)  # the ideal is the floor
    assert B._least(cuts, 75, 0.5) == pytest.approx(75.0 + 0.5 * 3.5)  # copies up to the floor
    assert B._least(cuts, 0, 100.0) == pytest.approx(90.0 + 100.0)  # one copy, the cheaper cut


def test_fractions_of_an_empty_run_are_not_numbers() -> None:
    assert all(math.isnan(f) for f in Bounds(10, 20).fractions(0))


def test_timing_only_writes_run_json_read_like_a_functional_one(tmp_path: Path, capsys
                                                                 ) -> None:
    timed, ran = tmp_path / "timed", tmp_path / "ran"
    common = ["--chip", "test16", "--seq-len", "16", "--no-table"]
    assert main(["compile", "bert-tiny", *common, "--timing-only", "-o", str(timed)]) == 0
    assert main(["compile", "bert-tiny", *common, "--run", "-o", str(ran)]) == 0
    out = capsys.readouterr().out
    assert "of the compute roofline" in out and "of the ideal" in out
    t = json.loads((timed / "run.json").read_text())
    r = json.loads((ran / "run.json").read_text())
    assert t["timing_only"] is True and r["timing_only"] is False
    # the same fields, apart from the check against onnxruntime that only data can make
    checked = {"seed", "max_rel_err", "tolerance", "ok", "emulate_wall_s", "reference_wall_s",
               "emulate_prepare_s", "reference_session_s"}
    assert set(r) - set(t) == checked and set(t) <= set(r)
    for key in ("cycles", "predicted_cycles", "phases", "barriers", "bounds", "ops",
                "barriers_by_op"):
        assert t[key] == r[key], key  # timing-only emulation times what the data run does
    assert sum(t["phases"].values()) == t["cycles"]
    assert t["barriers"] == sum(t["barriers_by_op"].values()) > 0
    plan = json.loads((timed / "plan.json").read_text())
    assert plan["bounds"] == {k: t["bounds"][k]
                              for k in ("roofline_cycles", "ideal_cycles", "exchange_cycles")}
    assert t["bounds"]["of_exchange"] == round(t["bounds"]["exchange_cycles"] / t["cycles"], 6)


@pytest.mark.parametrize("flag", ["--timing-only", ""])
def test_bench_prints_both_fractions(capsys, flag: str) -> None:
    args = ["bench", "--models", "mlp", "--chips", "test16"] + ([flag] if flag else [])
    assert main(args) == 0
    out = capsys.readouterr().out
    head, _, row = out.strip().splitlines()[:3]
    assert "of roofline" in head and "of ideal" in head and "of exchange bound" in head
    assert row.endswith("timing only |" if flag else "yes |")
