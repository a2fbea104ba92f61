"""The plan's lower bounds (partition.bounds) and the run.json of timing-only compiles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from t10c.chips import load_chip
from t10c.cli import main
from t10c.driver import CompileOptions, compile_model
from t10c.partition.bounds import Bounds, ideal_cycles, roofline_cycles
from t10c.partition.plan import Cycles


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


def test_bounds_hold_below_the_emulated_latency() -> None:
    """Both are lower bounds: no plan the emulator times beats them (bert-tiny, two chips)."""
    for chip in ("test16", "ipu-mk2"):
        c = compile_model("bert-tiny", load_chip(chip),
                          CompileOptions(seq_len=16, weights=False, timing_only=True))
        b = c.plan.bounds
        assert b is not None and c.timeline is not None
        assert 0 < b.roofline_cycles <= b.ideal_cycles <= c.timeline.cycles
        roof, ideal = b.fractions(c.timeline.cycles)
        assert 0 < roof <= ideal <= 1


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
    checked = {"seed", "max_rel_err", "tolerance", "ok", "emulate_wall_s", "reference_wall_s"}
    assert set(r) - set(t) == checked and set(t) <= set(r)
    for key in ("cycles", "predicted_cycles", "phases", "barriers", "bounds", "ops",
                "barriers_by_op"):
        assert t[key] == r[key], key  # timing-only emulation times what the data run does
    assert sum(t["phases"].values()) == t["cycles"]
    assert t["barriers"] == sum(t["barriers_by_op"].values()) > 0
    plan = json.loads((timed / "plan.json").read_text())
    assert plan["bounds"] == {k: t["bounds"][k] for k in ("roofline_cycles", "ideal_cycles")}


@pytest.mark.parametrize("flag", ["--timing-only", ""])
def test_bench_prints_both_fractions(capsys, flag: str) -> None:
    args = ["bench", "--models", "mlp", "--chips", "test16"] + ([flag] if flag else [])
    assert main(args) == 0
    out = capsys.readouterr().out
    head, _, row = out.strip().splitlines()[:3]
    assert "of roofline" in head and "of ideal" in head
    assert row.endswith("timing only |" if flag else "yes |")
