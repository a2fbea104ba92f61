"""`t10c sweep`: a grid over chip fields, models and strategies; results, resumption, Ray."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from t10c.cli import main
from t10c.sweep import load_spec, pareto_front, read_done

SPEC = """models = ["mlp"]
strategies = ["t10", "vgm"]
chip = "test16"
[grid]
sram_bytes_per_core = [65536, 655360]
link_bytes_per_cycle = [4, 8]
"""


def _spec(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return path


def test_local_sweep_and_its_resumption(tmp_path, capsys) -> None:
    spec = _spec(tmp_path)
    assert main(["sweep", str(spec), "--workers", "2"]) == 0
    out = tmp_path / "grid"
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["sram_bytes_per_core"], r["link_bytes_per_cycle"], r["strategy"]) for r in rows] \
        == [(s, b, st) for s in (65536, 655360) for b in (4, 8) for st in ("t10", "vgm")]
    small, big = rows[:4], rows[4:]
    assert all(r["latency_us"] is None and "KiB" in r["error"] for r in small)  # does not fit
    assert all(r["latency_us"] > 0 and not r["error"] for r in big)
    t10 = {r["link_bytes_per_cycle"]: r["latency_us"] for r in big if r["strategy"] == "t10"}
    assert t10[8] < t10[4]  # a faster link is a faster chip
    with (out / "results.csv").open() as f:
        assert [r["key"] for r in csv.DictReader(f)] == [r["key"] for r in rows]
    assert (out / "pareto.png").stat().st_size > 1000
    assert len(read_done(out / "points.jsonl")) == 8
    first = {p: (out / p).read_bytes() for p in ("results.json", "results.csv", "pareto.png")}
    capsys.readouterr()

    # resumption: a point already in points.jsonl is not run again; a new one is
    (out / "points.jsonl").write_text("".join(
        (out / "points.jsonl").read_text().splitlines(keepends=True)[:5]) + '{"key": "cut')
    assert main(["sweep", str(spec), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "8 points, 5 already done, 3 to run" in err and err.count("[") >= 3
    again = {p: (out / p).read_bytes() for p in first}
    assert again == first  # the same files, whichever run computed which point
    assert main(["sweep", str(spec)]) == 0
    assert "8 points, 8 already done, 0 to run" in capsys.readouterr().err
    spec.write_text(SPEC.replace("[4, 8]", "[4, 8, 16]"))  # a larger grid: only the new points
    assert main(["sweep", str(spec), "--workers", "1"]) == 0
    assert "12 points, 8 already done, 4 to run" in capsys.readouterr().err


def test_bad_specs_are_one_line(tmp_path, capsys) -> None:
    for text, words in [
        ("models = []", "models must be"),
        ('models = ["mlp"]\nstrategy = "t10"', "unknown key strategy"),
        ('models = ["mlp"]\n[grid]\nsram_bytes = [1]', "sram_bytes: unknown field"),
        ('models = ["mlp"]\n[grid]\nsram_bytes_per_core = [-1]', "sram_bytes_per_core"),
        ('models = ["no/such.onnx"]', "neither a zoo model nor a file"),
        ("models = [", "is not TOML"),
        ('models = ["mlp"]\nquantize = "int4"', "quantize is one of int8"),
    ]:
        assert main(["sweep", str(_spec(tmp_path, text))]) == 2, text
        err = capsys.readouterr().err
        assert err.startswith("t10c: error: ") and err.count("\n") == 1 and words in err, err


def test_points_are_keyed_by_what_they_compute(tmp_path) -> None:
    spec = load_spec(_spec(tmp_path))
    from t10c.sweep import _canonical, point_key

    keys = [point_key(_canonical(p)) for p in spec.points]
    assert len(set(keys)) == len(keys) == 8
    # a spec that reaches the same chip by another route names the same points
    same = load_spec(_spec(tmp_path, SPEC.replace("[65536, 655360]", "[655360]")))
    assert {point_key(_canonical(p)) for p in same.points} <= set(keys)
    # int8 weights are other points; a spec without quantize keeps the keys it had
    int8 = load_spec(_spec(tmp_path, 'quantize = "int8"\n' + SPEC))
    assert all(p.description["options"]["quantize"] == "int8" for p in int8.points)
    assert not {point_key(_canonical(p)) for p in int8.points} & set(keys)


def test_pareto_front() -> None:
    assert pareto_front([(2, 5), (1, 9), (3, 5), (4, 1), (1, 7)]) == [(1, 7), (2, 5), (4, 1)]


def test_sweep_on_a_local_ray_cluster(tmp_path, capsys, monkeypatch) -> None:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 't10c[sweep]')")
    # Ray's workers start in the driver's folder: not the repository root, whose t10c/ would
    # shadow the installed package (which maps the stage folders in)
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, SPEC.replace('["t10", "vgm"]', '["t10"]'))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # a local cluster
    try:
        assert main(["sweep", str(spec), "--ray", "auto", "-o", str(tmp_path / "ray")]) == 0
    finally:
        ray.shutdown()
    assert "Ray at auto" in capsys.readouterr().err
    assert main(["sweep", str(spec), "--workers", "1", "-o", str(tmp_path / "local")]) == 0
    for name in ("results.json", "results.csv"):  # Ray computes what local workers compute
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()


def _fresh() -> None:
    """Forget every process-wide memo of the planner (a new worker process)."""
    from t10c.partition import search, solve, space, transitions

    for memo in (search._PARTS, space._FOUND, solve._SOLVED, transitions._MOST,
                 transitions._MOVED, transitions._WANTS, transitions._HAVES):
        memo.clear()


def test_a_worker_reusing_other_points_work_plans_as_a_fresh_compile() -> None:
    """A sweep's worker keeps each op's enumeration across SRAM sizes and re-layout counts
    across every field; what it then plans is what a fresh process plans."""
    import dataclasses

    from t10c.chips import PRESETS
    from t10c.driver import CompileOptions, compile_model
    from t10c.partition import search, transitions

    base = PRESETS["test16"]
    options = CompileOptions(seq_len=16, timing_only=True, weights=False)

    def plan(chip):
        p = compile_model("bert-tiny", chip, options).plan
        return p.ops, p.relayout_cycles, p.solver.objective_cycles, p.total_cycles

    chips = [dataclasses.replace(base, sram_bytes_per_core=s, link_bytes_per_cycle=b)
             for s, b in [(560 * 1024, 4), (640 * 1024, 4), (640 * 1024, 8)]]
    fresh = []
    for chip in chips:
        _fresh()
        fresh.append(plan(chip))
    _fresh()
    reused = []
    for chip in chips:  # the memos of the points before are kept (only the whole-choice
        # and whole-search memos go, which would answer an identical point outright)
        from t10c.partition import solve, space

        space._FOUND.clear()
        solve._SOLVED.clear()
        reused.append(plan(chip))
    assert reused == fresh
    assert len(search._PARTS) and len(transitions._MOST)
    assert fresh[0] != fresh[1] != fresh[2]  # the swept fields change the plans


def test_points_that_can_share_work_run_together(tmp_path) -> None:
    from t10c.sweep import _reuse_order

    spec = load_spec(_spec(tmp_path, SPEC.replace('["t10", "vgm"]', '["t10"]')))
    ordered = sorted(spec.points, key=_reuse_order)
    # SRAM sizes innermost: the points of one link rate follow each other
    assert [dict(p.changes)["link_bytes_per_cycle"] for p in ordered] == [4, 4, 8, 8]
