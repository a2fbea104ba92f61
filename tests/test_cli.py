"""CLI tests: ``t10c.cli.main`` driven in-process, checking exit codes, messages and files.

Exit codes (see `t10c.cli`): 0 success; 1 the model cannot be compiled or run; 2 bad usage.
Error cases are a table of `ErrorCase` records: how to build the argument list (given a
temporary directory to write files into), the exit code, and fragments the message must hold.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from t10c.chips import PRESETS
from t10c.cli import EXIT_FAIL, EXIT_USAGE, hugepage_switch, main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("t10c: error:")]


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def model_of(nodes: list[onnx.NodeProto], x_dims: list[int | str], out_dims: list[int | str],
             inits: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "cli", [helper.make_tensor_value_info(
        "feats", TensorProto.FLOAT, x_dims)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, out_dims)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def dynamic_model(path: Path) -> Path:
    """feats[batch, 8] @ w[8, 4] -> Relu -> y[batch, 4], with ``batch`` a dim_param."""
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["feats", "w"], ["m"], name="proj"),
             helper.make_node("Relu", ["m"], ["y"], name="act")]
    return save(model_of(nodes, ["batch", 8], ["batch", 4], [w]), path)


def unsupported_model(path: Path) -> Path:
    """Round, Sign and Floor of the input (not constants, so nothing folds), summed."""
    nodes = [helper.make_node("Round", ["feats"], ["a"], name="my_round"),
             helper.make_node("Sign", ["feats"], ["b"], name="my_sign"),
             helper.make_node("Floor", ["feats"], ["c"], name="my_floor"),
             helper.make_node("Add", ["a", "b"], ["ab"], name="sum1"),
             helper.make_node("Add", ["ab", "c"], ["y"], name="sum2")]
    return save(model_of(nodes, [2, 8], [2, 8]), path)


def write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


# -- chips ----------------------------------------------------------------------------------

def test_chips_lists_presets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "chips")
    assert code == 0 and err == ""
    heads = [line.split(":")[0] for line in out.splitlines() if not line.startswith(" ")]
    assert heads == list(PRESETS)
    assert {"ipu-mk2", "test16"} <= set(heads)
    assert "sources:" not in out


def test_chip_shows_sources(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "chips", "ipu-mk2")
    assert code == 0
    assert out.startswith("ipu-mk2:")
    assert "1472" in out
    assert "sources:" in out
    sources = out.split("sources:", 1)[1]
    for key in ("cores", "clock_hz", "sram_bytes_per_core", "link_bytes_per_cycle"):
        assert f"    {key}: " in sources
    assert "datasheet" in sources


def test_mesh_chip_shows_links_and_sources(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "chips", "wse2")
    assert code == 0 and out.startswith("wse2:")
    assert "757 x 996 mesh2d" in out and "1 cycle per hop" in out
    assert "compute/transfer overlap yes" in out
    sources = out.split("sources:", 1)[1]
    for key in ("cores", "link_bytes_per_cycle", "hop_latency_cycles", "routes_per_core"):
        assert f"    {key}: " in sources


def test_chips_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "chips", "--json")
    assert code == 0
    assert [c["name"] for c in json.loads(out)] == list(PRESETS)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("t10c ")


# -- compile --------------------------------------------------------------------------------

# the fields README.md ("Files") documents
PLAN_KEYS = {"format", "model", "chip", "dtype", "cores", "sram_bytes_per_core", "ops",
             "total_cycles", "peak_sram_bytes_per_core", "solver"}
PLAN_OP_KEYS = {"name", "kind", "source", "axes", "F_op", "T", "operands", "steps", "cores",
                "front_size", "cycles", "relayout_cycles", "hot_bytes_per_core",
                "cold_bytes_per_core"}
SOLVER_KEYS = {"name", "status", "objective_cycles", "bound_cycles", "workers", "seed",
               "time_limit_s"}
RUN_KEYS = {"cycles", "latency_s", "predicted_cycles", "max_rel_err", "tolerance", "ok",
            "peak_sram_bytes_per_core", "host_bytes", "emulate_wall_s", "reference_wall_s",
            "emulate_prepare_s", "reference_session_s", "ops"}
KINDS = {"contraction", "reduce", "elementwise", "gather"}
PHASES = {"compute", "shift", "sync", "reduce", "total"}


def test_compile_run_writes_plan_and_run(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "compile", "mlp", "--chip", "test16", "--run", "--dtype",
                         "fp32", "-o", str(out_dir))
    assert code == 0, err
    assert error_lines(err) == []
    assert "OK" in out and "MISMATCH" not in out
    assert "plan.json" in out and "run.json" in out

    plan = json.loads((out_dir / "plan.json").read_text())
    assert plan["format"] == "t10c-plan/2"
    assert PLAN_KEYS <= set(plan)
    assert (plan["model"], plan["chip"], plan["dtype"]) == ("mlp", "test16", "fp32")
    assert plan["cores"] == PRESETS["test16"].cores
    assert plan["ops"]
    for op in plan["ops"]:
        assert PLAN_OP_KEYS <= set(op), op["name"]
        assert isinstance(op["name"], str) and op["kind"] in KINDS
        assert set(op["F_op"]) == set(op["axes"]) == set(op["T"])
        assert op["cores"] == math.prod(op["F_op"].values()) <= plan["cores"]
        assert isinstance(op["relayout_cycles"], int) and op["relayout_cycles"] >= 0
        assert isinstance(op["steps"], int) and op["steps"] >= 1
        assert set(op["cycles"]) == PHASES
        assert all(isinstance(v, int) and v >= 0 for v in op["cycles"].values())
        assert op["cycles"]["total"] == sum(op["cycles"][p] for p in PHASES - {"total"})
        assert isinstance(op["hot_bytes_per_core"], int)
        assert isinstance(op["cold_bytes_per_core"], int)
        roles = [o["role"] for o in op["operands"]]
        assert roles.count("output") == 1 and set(roles) == {"input", "output"}
        for operand in op["operands"]:
            assert isinstance(operand["tensor"], str)
            assert set(operand["axes"]) <= set(op["axes"])
            assert set(operand["f_t"]) <= set(operand["axes"])
    assert any(o["tensor"] == "x" for op in plan["ops"] for o in op["operands"])
    assert isinstance(plan["total_cycles"], int) and plan["total_cycles"] > 0
    assert 0 < plan["peak_sram_bytes_per_core"] <= PRESETS["test16"].sram_bytes_per_core
    solver = plan["solver"]
    assert SOLVER_KEYS <= set(solver)
    assert solver["status"] in ("OPTIMAL", "FEASIBLE")
    assert isinstance(solver["objective_cycles"], int)
    assert "wall_s" not in solver  # wall times live in compile.json: plan.json is reproducible
    timing = json.loads((out_dir / "compile.json").read_text())
    assert isinstance(timing["solver_wall_s"], float) and timing["timings_s"]["total_s"] > 0

    result = json.loads((out_dir / "run.json").read_text())
    assert RUN_KEYS <= set(result)
    assert result["ok"] is True and result["tolerance"] == 1e-4
    assert result["predicted_cycles"] == plan["total_cycles"]
    assert set(result["ops"]) <= {op["name"] for op in plan["ops"]}
    assert isinstance(result["cycles"], int) and result["cycles"] > 0
    assert result["latency_s"] == pytest.approx(result["cycles"] / PRESETS["test16"].clock_hz)
    assert 0 <= result["max_rel_err"] <= 1e-4
    assert 0 < result["peak_sram_bytes_per_core"] <= PRESETS["test16"].sram_bytes_per_core
    assert result["emulate_wall_s"] >= 0 and result["reference_wall_s"] >= 0
    assert result["emulate_prepare_s"] >= 0 and result["reference_session_s"] > 0
    assert (out_dir / "program.json").is_file() and (out_dir / "program.npz").is_file()


def test_emit_asm(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "compile", "mlp", "--chip", "test16", "--emit", "asm",
                       "--core", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("; core 3 of 16")
    mnemonics = {line.split()[0] for line in lines[1:] if line.strip()}
    assert {"alloc", "comp"} <= mnemonics
    assert "op  " not in out  # no per-op table with --emit


def test_explain_sees_the_graph_compile_plans(capsys: pytest.CaptureFixture[str]) -> None:
    """`t10c explain` plans the graph `t10c compile` plans for the chip (`driver.chip_graph`):
    on a chip with DRAM a decode step's attention reads the past cache itself (the op over
    it is ``.../cache0``), and the Concat that appended the cache is not an op."""
    code, out, _ = run(capsys, "explain", "llama-tiny-decode", "--chip", "test64-dram",
                       "--op", "layers0/attn/scores/MatMul/cache0")
    assert code == 0 and "op layers0/attn/scores/MatMul/cache0 (contraction" in out
    code, _, err = run(capsys, "explain", "llama-tiny-decode", "--chip", "test64-dram",
                       "--op", "layers0/attn/k_cache/Concat")
    assert code == EXIT_USAGE and "layers0/attn/k_cache/Concat" in err
    code, out, _ = run(capsys, "explain", "llama-tiny-decode", "--chip", "test16",
                       "--op", "layers0/attn/k_cache/Concat")
    assert code == 0  # (an SRAM-only all-to-all chip: the cache is concatenated on chip)


def test_user_chip_compiles(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    chip = write(tmp_path / "eight.toml", 'base = "test16"\ncores = 8\n')
    code, out, err = run(capsys, "compile", "mlp", "--chip", str(chip), "--no-table")
    assert code == 0, err
    assert "predicted latency" in out
    code, out, _ = run(capsys, "compile", "mlp", "--chip", str(chip), "--emit", "asm",
                       "--core", "7")
    assert code == 0 and out.startswith("; core 7 of 8")


def test_refine_reports_its_trials(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`--refine TRIALS` prints what its trials saved under the solver line, and plan.json
    keeps it; on bert-mini (ipu-mk2) six trials find a faster plan."""
    code, out, err = run(capsys, "compile", "bert-mini", "--timing-only", "--no-table",
                         "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "refined:" not in out
    base = json.loads((tmp_path / "out" / "plan.json").read_text())
    code, out, err = run(capsys, "compile", "bert-mini", "--timing-only", "--no-table",
                         "--refine", "6", "-o", str(tmp_path / "out"))
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("refined:"))
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    trials, saved = plan["solver"]["refined"]
    assert line == f"refined: {trials} trial(s) of --refine 6 saved {saved} cycles"
    assert 0 < trials <= 6 and saved > 0
    assert plan["total_cycles"] < base["total_cycles"]


def test_a_mesh_refines_by_default_and_says_so(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    """On a mesh chip without DRAM the compile prices the costliest op's moves after the
    solve unless told (`refine.trials_for`), and its summary says it was the default;
    `--refine 0` prices none and prints no such line."""
    chip = write(tmp_path / "mesh.toml",
                 'base = "wse2"\nname = "mesh16"\ngrid = [16, 16]\ncores = 256\n')
    code, out, err = run(capsys, "compile", "mlp", "--chip", str(chip), "--timing-only",
                         "--no-table", "-o", str(tmp_path / "out"))
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("refined:"))
    trials, saved = json.loads((tmp_path / "out" / "plan.json").read_text())["solver"]["refined"]
    assert line == (f"refined: {trials} trial(s) (the default on a mesh: the costliest op's "
                    f"moves, at most 3) saved {saved} cycles")
    code, out, err = run(capsys, "compile", "mlp", "--chip", str(chip), "--timing-only",
                         "--no-table", "--refine", "0")
    assert code == 0, err
    assert "refined:" not in out


def test_dynamic_dimension_needs_shape(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    path = dynamic_model(tmp_path / "dyn.onnx")
    code, out, err = run(capsys, "compile", str(path), "--chip", "test16")
    assert code == EXIT_FAIL
    assert len(error_lines(err)) == 1
    assert "--shape" in err and "feats" in err and "batch" in err

    code, out, err = run(capsys, "compile", str(path), "--chip", "test16", "--shape",
                         "feats=2x8", "--run", "--dtype", "fp32", "--no-table")
    assert code == 0, err
    assert "OK" in out


# -- errors ---------------------------------------------------------------------------------

Argv = Callable[[Path], list[str]]


@dataclass(frozen=True)
class ErrorCase:
    """A command that must fail with ``code`` (None: any non-zero) and an error naming every
    fragment."""

    name: str
    argv: Argv
    code: int | None
    fragments: tuple[str, ...]


def compile_file(data: str | bytes, name: str = "bad.onnx") -> Argv:
    return lambda tmp: ["compile", str(write(tmp / name, data)), "--chip", "test16"]


def with_chip_file(text: str, *rest: str) -> Argv:
    return lambda tmp: [*rest, str(write(tmp / "chip.toml", text))]


ERROR_CASES = [
    ErrorCase("core-out-of-range",
              lambda tmp: ["compile", "mlp", "--chip", "test16", "--emit", "asm", "--core", "99"],
              EXIT_USAGE, ("core 99", "16 cores")),
    ErrorCase("random-bytes", compile_file(np.random.default_rng(0).bytes(512)),
              EXIT_FAIL, ("bad.onnx", "not an ONNX model")),
    ErrorCase("text-file", compile_file("this is a text file, not a model\n"),
              EXIT_FAIL, ("bad.onnx", "not an ONNX model")),
    ErrorCase("empty-file", compile_file(b""), EXIT_FAIL, ("bad.onnx", "not an ONNX model")),
    ErrorCase("missing-path",
              lambda tmp: ["compile", str(tmp / "nowhere" / "model.onnx"), "--chip", "test16"],
              None, ("nowhere/model.onnx",)),
    ErrorCase("directory", lambda tmp: ["compile", str(tmp), "--chip", "test16"],
              EXIT_FAIL, ("directory",)),
    ErrorCase("unknown-chip", lambda tmp: ["compile", "mlp", "--chip", "tpu-v9"],
              EXIT_USAGE, ("tpu-v9", *PRESETS)),
    ErrorCase("unknown-chip-in-chips", lambda tmp: ["chips", "tpu-v9"],
              EXIT_USAGE, ("tpu-v9", *PRESETS)),
    ErrorCase("chip-file-bad-fields",
              with_chip_file('base = "test16"\ncores = "many"\ncolour = 3\n',
                             "compile", "mlp", "--chip"),
              EXIT_USAGE, ("chip.toml", "cores", "'many'", "colour", "unknown field")),
    ErrorCase("chip-file-bad-fields-in-chips",
              with_chip_file('base = "test16"\ncores = "many"\ncolour = 3\n', "chips"),
              EXIT_USAGE, ("cores", "colour")),
    ErrorCase("chip-file-bad-base",
              with_chip_file('base = "ipu-mk9"\n', "compile", "mlp", "--chip"),
              EXIT_USAGE, ("base", "ipu-mk9", *PRESETS)),
    ErrorCase("chip-file-not-toml",
              with_chip_file("cores = = 3\n", "compile", "mlp", "--chip"),
              EXIT_USAGE, ("chip.toml", "not valid TOML")),
    ErrorCase("chip-file-missing",
              lambda tmp: ["compile", "mlp", "--chip", str(tmp / "absent.toml")],
              EXIT_USAGE, ("absent.toml", "does not exist")),
    ErrorCase("unsupported-ops",
              lambda tmp: ["compile", str(unsupported_model(tmp / "rounding.onnx")), "--chip",
                           "test16"],
              EXIT_FAIL, ("3 unsupported", "my_round", "my_sign", "my_floor", "Supported ops")),
    ErrorCase("dynamic-shape",
              lambda tmp: ["compile", str(dynamic_model(tmp / "dyn.onnx")), "--chip", "test16"],
              EXIT_FAIL, ("--shape", "feats=Nx8")),
    ErrorCase("shape-unknown-input",
              lambda tmp: ["compile", str(dynamic_model(tmp / "dyn.onnx")), "--chip", "test16",
                           "--shape", "ids=2x8"],
              EXIT_FAIL, ("ids", "feats")),
    ErrorCase("shape-wrong-rank",
              lambda tmp: ["compile", str(dynamic_model(tmp / "dyn.onnx")), "--chip", "test16",
                           "--shape", "feats=2"],
              EXIT_FAIL, ("feats", "rank 2")),
    ErrorCase("shape-contradicts-model",
              lambda tmp: ["compile", str(dynamic_model(tmp / "dyn.onnx")), "--chip", "test16",
                           "--shape", "feats=2x9"],
              EXIT_FAIL, ("feats", "8", "9")),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.name)
def test_error(case: ErrorCase, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = case.argv(tmp_path)
    capsys.readouterr()  # drop anything printed while building the inputs
    code, out, err = run(capsys, *argv)
    assert code != 0 if case.code is None else code == case.code, err
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert err.startswith("t10c: error:"), err
    for fragment in case.fragments:
        assert fragment in err, (fragment, err)
    assert "Traceback" not in err


def test_unknown_model_name_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "compile", "resnet-50", "--chip", "test16")
    assert "resnet-50" in err and "mlp" in err
    assert code == EXIT_USAGE


def test_not_onnx_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path / "bad.onnx", np.random.default_rng(1).bytes(300))
    code, out, err = run(capsys, "compile", str(path), "--chip", "test16")
    assert code == EXIT_FAIL
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("t10c: error:")
    assert "not an ONNX model" in err


@pytest.mark.parametrize("argv", [
    ["compile", "mlp", "--dtype", "fp64"],
    ["compile", "mlp", "--emit", "hex"],
    ["compile", "mlp", "--shape", "feats"],
    ["compile", "mlp", "--colour"],
    ["compile"],
    [],
], ids=["dtype", "emit", "shape-syntax", "unknown-flag", "no-model", "no-command"])
def test_argparse_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == EXIT_USAGE
    assert len(error_lines(err)) == 1 and err.count("\n") == 1, err
    assert "--help" in err


# -- every flag's bad values: one line, exit 2, before any work -----------------------------

def compile_with(*flags: str) -> Argv:
    return lambda tmp: ["compile", "mlp", "--chip", "test16", *flags]


def non_empty_dir(tmp: Path) -> Path:
    (tmp / "mine").mkdir()
    write(tmp / "mine" / "notes.txt", "my notes\n")
    return tmp / "mine"


BAD_VALUES = [
    ErrorCase("seed-negative", compile_with("--seed", "-1"), EXIT_USAGE,
              ("--seed", "at least 0", "-1")),
    ErrorCase("seed-not-int", compile_with("--seed", "1.5"), EXIT_USAGE,
              ("--seed", "integer", "1.5")),
    ErrorCase("time-limit-negative", compile_with("--time-limit", "-1"), EXIT_USAGE,
              ("--time-limit", "above 0")),
    ErrorCase("time-limit-zero", compile_with("--time-limit", "0"), EXIT_USAGE,
              ("--time-limit", "above 0")),
    ErrorCase("time-limit-nan", compile_with("--time-limit", "nan"), EXIT_USAGE,
              ("--time-limit", "finite", "nan")),
    ErrorCase("time-limit-inf", compile_with("--time-limit", "inf"), EXIT_USAGE,
              ("--time-limit", "finite")),
    ErrorCase("workers-negative", compile_with("--workers", "-3"), EXIT_USAGE,
              ("--workers", "at least 1", "-3")),
    ErrorCase("front-zero", compile_with("--front", "0"), EXIT_USAGE,
              ("--front", "at least 1")),
    ErrorCase("refine-negative", compile_with("--refine", "-1"), EXIT_USAGE,
              ("--refine", "at least 0")),
    ErrorCase("refine-with-dram", lambda tmp: ["compile", "mlp", "--chip", "test64-dram",
                                                "--refine", "4"], EXIT_USAGE,
              ("--refine", "off-chip memory", "test64-dram")),
    ErrorCase("refine-with-greedy", compile_with("--refine", "4", "--planner", "greedy"),
              EXIT_USAGE, ("--refine", "--planner greedy")),
    ErrorCase("gap-above-one", compile_with("--gap", "2"), EXIT_USAGE,
              ("--gap", "at most 1")),
    ErrorCase("gap-nan", compile_with("--gap", "nan"), EXIT_USAGE, ("--gap", "finite")),
    ErrorCase("seq-len-zero", compile_with("--seq-len", "0"), EXIT_USAGE,
              ("--seq-len", "at least 1")),
    ErrorCase("batch-zero", compile_with("--batch", "0"), EXIT_USAGE,
              ("--batch", "at least 1")),
    ErrorCase("min-util-above-one", compile_with("--min-util", "1.5"), EXIT_USAGE,
              ("--min-util", "at most 1")),
    ErrorCase("max-pad-negative", compile_with("--max-pad", "-0.1"), EXIT_USAGE,
              ("--max-pad", "at least 0")),
    ErrorCase("max-steps-zero", compile_with("--max-steps", "0"), EXIT_USAGE,
              ("--max-steps", "at least 1")),
    ErrorCase("core-negative", compile_with("--emit", "asm", "--core", "-1"), EXIT_USAGE,
              ("--core", "at least 0")),
    ErrorCase("core-without-emit", compile_with("--core", "3"), EXIT_USAGE,
              ("--core", "--emit asm")),
    ErrorCase("shape-zero-dim", compile_with("--shape", "feats=0x8"), EXIT_USAGE,
              ("--shape", "positive", "feats=0x8")),
    ErrorCase("strategy-misspelt", compile_with("--strategy", "vgn"), EXIT_USAGE,
              ("vgn", "did you mean vgm?", "no-rotation")),
    ErrorCase("model-misspelt", lambda tmp: ["compile", "bert-mni"], EXIT_USAGE,
              ("bert-mni", "did you mean bert-mini?", "mlp")),
    ErrorCase("chip-misspelt", lambda tmp: ["compile", "mlp", "--chip", "ipu-mk3"], EXIT_USAGE,
              ("ipu-mk3", "did you mean ipu-mk2?", "wse2")),
    ErrorCase("out-onto-file",
              lambda tmp: compile_with("-o", str(write(tmp / "plan.txt", "x")))(tmp),
              EXIT_USAGE, ("plan.txt", "not a directory")),
    ErrorCase("out-into-missing-dir", lambda tmp: compile_with("-o", str(tmp / "no" / "d"))(tmp),
              EXIT_USAGE, ("no", "does not exist", "create it first")),
    ErrorCase("out-over-foreign-dir",
              lambda tmp: compile_with("-o", str(non_empty_dir(tmp)))(tmp),
              EXIT_USAGE, ("mine", "holds no compile")),
    ErrorCase("out-over-working-dir", lambda tmp: compile_with("-o", ".")(tmp), EXIT_USAGE,
              ("current directory",)),
    ErrorCase("trace-into-dir", lambda tmp: compile_with("--run", "--trace", str(tmp))(tmp),
              EXIT_USAGE, ("--trace", "is a directory")),
    ErrorCase("trace-without-run", lambda tmp: compile_with("--trace",
                                                            str(tmp / "t.json"))(tmp),
              EXIT_USAGE, ("--trace", "--run or --timing-only")),
    ErrorCase("trace-inside-out",
              lambda tmp: compile_with("--run", "-o", str(tmp), "--trace",
                                       str(tmp / "t.json"))(tmp),
              EXIT_USAGE, ("--trace", "-o directory")),
    ErrorCase("trace-into-missing-dir",
              lambda tmp: compile_with("--run", "--trace", str(tmp / "no" / "t.json"))(tmp),
              EXIT_USAGE, ("--trace", "does not exist")),
    ErrorCase("bench-unknown-model", lambda tmp: ["bench", "--models", "mlp,nosuch"],
              EXIT_USAGE, ("--models", "nosuch")),
    ErrorCase("bench-unknown-chip", lambda tmp: ["bench", "--chips", "test16,tpu"],
              EXIT_USAGE, ("--chips", "tpu")),
    ErrorCase("bench-zero-batch", lambda tmp: ["bench", "--batch", "1,0"],
              EXIT_USAGE, ("--batch", "must be at least 1")),
    ErrorCase("bench-empty-list", lambda tmp: ["bench", "--models", "mlp,"],
              EXIT_USAGE, ("--models", "comma-separated")),
    ErrorCase("bench-json-into-dir", lambda tmp: ["bench", "--json", str(tmp)],
              EXIT_USAGE, ("--json", "is a directory")),
    ErrorCase("compare-unknown-strategy",
              lambda tmp: ["compare", "mlp", "--strategies", "t10,t11"], EXIT_USAGE,
              ("t11", "did you mean t10?")),
    ErrorCase("compare-out-into-missing-dir",
              lambda tmp: ["compare", "mlp", "-o", str(tmp / "no" / "r.html")], EXIT_USAGE,
              ("does not exist",)),
    ErrorCase("mesh-compare-bad-gemm", lambda tmp: ["mesh-compare", "--gemm", "12x3"],
              EXIT_USAGE, ("--gemm", "3 positive integers", "12x3")),
    ErrorCase("mesh-compare-zero-gemv", lambda tmp: ["mesh-compare", "--gemv", "0x8"],
              EXIT_USAGE, ("--gemv", "0x8")),
    ErrorCase("mesh-compare-not-a-mesh", lambda tmp: ["mesh-compare", "--chip", "test16"],
              EXIT_FAIL, ("test16", "all-to-all", "mesh")),
    ErrorCase("explain-unknown-model", lambda tmp: ["explain", "gpt3", "--op", "x"],
              EXIT_USAGE, ("gpt3",)),
    ErrorCase("run-seed-negative", lambda tmp: ["run", str(tmp), "--seed", "-2"],
              EXIT_USAGE, ("--seed", "at least 0")),
    ErrorCase("chips-misspelt", lambda tmp: ["chips", "wse-2"], EXIT_USAGE,
              ("wse-2", "did you mean")),
]


@pytest.mark.parametrize("case", BAD_VALUES, ids=lambda c: c.name)
def test_bad_value(case: ErrorCase, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Refused by the argument parser (or before any stage starts): one line, no output."""
    argv = case.argv(tmp_path)
    capsys.readouterr()
    code, out, err = run(capsys, *argv)
    assert code == case.code, err
    assert err.count("\n") == 1 and err.startswith("t10c: error:"), err
    for fragment in case.fragments:
        assert fragment in err, (fragment, err)
    assert out == ""



def test_out_into_unwritable_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    # as root every directory is writable: say this one is not, as it would be to a user
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    code, out, err = run(capsys, "compile", "mlp", "-o", str(locked / "out"))
    assert code == EXIT_USAGE and err.count("\n") == 1
    assert "not writable" in err and str(locked) in err


def test_commands_ask_numpy_for_plain_pages_unless_told(monkeypatch, capsys) -> None:
    """A command turns off numpy's huge-page advice for its arrays (`cli._plain_pages`: the
    kernel's compaction on first touch cost a wafer compile up to a quarter of its CPU time), unless
    ``NUMPY_MADVISE_HUGEPAGE`` is set, which numpy then follows as it always does."""
    switch = hugepage_switch()
    if switch is None:
        pytest.skip("this numpy has no huge-page switch")
    before = switch(True)
    try:
        monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
        assert main(["chips"]) == 0
        assert switch(True) is False  # (turned off; on again for the next case)
        monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
        assert main(["chips"]) == 0
        assert switch(True) is True
    finally:
        switch(before)
    capsys.readouterr()
