"""``t10c compile --plan FILE``: replaying a plan.json gives the same files; constraints on named
ops change those ops' plans (and the result still matches onnxruntime); every kind of illegal
constraint or foreign plan is one error line with its exit code."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from t10c.chips import load_chip
from t10c.cli import EXIT_FAIL, EXIT_USAGE, main
from t10c.driver import CompileOptions
from t10c.dtypes import IntTensors
from t10c.frontend import to_graph
from t10c.models import build
from t10c.partition import (
    Constraint,
    ConstraintError,
    SearchOptions,
    plan_graph,
    search_op,
)
from t10c.planfile import PlanFileError, constraints_from, load_plan_arg

UP = "layer0/ffn/up/MatMul"
Q = "layer0/attn/q+k+v/MatMul"  # q, k and v: one matmul (`rewrite.fuse_sibling_matmuls`)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def ops_of(directory: Path) -> dict[str, dict]:
    doc = json.loads((directory / "plan.json").read_text())
    return {o["name"]: o for o in doc["ops"]}


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """bert-tiny compiled without --plan, once per chip, into a directory."""
    dirs = {}
    for chip in ("test16", "ipu-mk2"):
        out = tmp_path_factory.mktemp(chip) / "a"
        assert main(["compile", "bert-tiny", "--chip", chip, "-o", str(out), "--no-table"]) == 0
        dirs[chip] = out
    return dirs


@pytest.mark.parametrize("chip", ["test16", "ipu-mk2"])
def test_replaying_a_plan_gives_the_same_files(first, chip: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    a = first[chip]
    code, out, err = run(capsys, "compile", "bert-tiny", "--chip", chip, "-o", tmp_path / "b",
                         "--no-table", "--plan", a / "plan.json")
    assert code == 0, err
    assert "plan replayed" in out
    assert json.loads((tmp_path / "b" / "compile.json").read_text())["given_plan"] == "replayed"
    for name in ("plan.json", "program.json", "program.npz"):
        assert (a / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_constraint_changes_its_ops_plans_and_still_matches_onnxruntime(
        first, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = ops_of(first["test16"])
    # what the unconstrained planner chose differs from what is asked, so the test can fail
    assert before[UP]["F_op"] != {"m": 16, "n": 1, "k": 1}
    assert before[Q]["operands"][1]["f_t"]["n"] == 1  # (its weights may be either: asked below)
    plan = write(tmp_path / "c.toml", f'''
[[op]]
name = "layer*/ffn/up/MatMul"
F_op = {{ m = 16, n = 1, k = 1 }}

[[op]]
name = "{Q}"
f_t = {{ in1 = {{ n = 2 }} }}
weights = "resident"
''')
    out = tmp_path / "out"
    code, stdout, err = run(capsys, "compile", "bert-tiny", "--chip", "test16", "-o", out,
                            "--no-table", "--run", "--plan", plan)
    assert code == 0, err
    assert "2 plan constraint(s) from --plan obeyed" in stdout
    after = ops_of(out)
    for layer in ("layer0", "layer1"):
        assert after[f"{layer}/ffn/up/MatMul"]["F_op"] == {"m": 16, "n": 1, "k": 1}
    assert after[Q]["weights"] == "resident"
    assert after[Q]["operands"][1]["f_t"]["n"] == 2
    run_doc = json.loads((out / "run.json").read_text())
    assert run_doc["ok"] and run_doc["max_rel_err"] <= run_doc["tolerance"]
    # compile.json says what was obeyed, in a form that reads back as the same constraints
    given = json.loads((out / "compile.json").read_text())["given_plan"]
    assert constraints_from(given, "compile.json") == load_plan_arg(plan)
    # the same constraints as JSON give the same plan
    as_json = write(tmp_path / "c.json", json.dumps({"op": [
        {"name": "layer*/ffn/up/MatMul", "F_op": {"m": 16, "n": 1, "k": 1}},
        {"name": Q, "f_t": {"in1": {"n": 2}}, "weights": "resident"}]}))
    code, _, err = run(capsys, "compile", "bert-tiny", "--chip", "test16", "-o",
                       tmp_path / "out2", "--no-table", "--plan", as_json)
    assert code == 0, err
    assert (out / "plan.json").read_bytes() == (tmp_path / "out2" / "plan.json").read_bytes()


def test_a_constrained_front_holds_pruned_plans_and_only_obeying_ones() -> None:
    chip = load_chip("test16")
    # unfused (no epilogues): the bias Add is an op of its own, a small elementwise one
    graph = to_graph(build("bert-tiny", seq_len=16, weights=False), name="bert-tiny",
                     epilogues=False)
    add = next(op for op in graph.ops if op.name == "layer0/attn/q/Add")
    # one core of sixteen: the search's min_util prunes it
    assert not [p for p in search_op(graph, add, chip, "fp16") if math.prod(p.F) == 1]
    ones = tuple((a, 1) for a in add.axis_names)
    plan = plan_graph(graph, chip, "fp16", constraints=(Constraint(add.name, ones),))
    chosen = dict(zip((op.name for op in graph.ops), plan.ops))
    assert chosen[add.name].F == (1,) * len(add.axes)
    # every plan on a constrained front obeys: seen through the one the solver picks under a
    # tighter objective, and on the front itself
    from t10c.partition.constrain import constrained_front
    # (this graph has no epilogues, and so keeps q, k and v apart)
    mm = next(op for op in graph.ops if op.name == "layer0/attn/q/MatMul")
    c = Constraint(mm.name, (("m", 4),), (("in1", "n", 2),))
    got = constrained_front(graph, mm, c, chip, "fp16", SearchOptions(), 16, IntTensors(),
                            frozenset(o.tensor for o in mm.inputs[1:]))
    assert got.front
    for p in got.front:
        assert p.F[mm.axis_names.index("m")] == 4
        assert p.f_t(mm, 1)["n"] == 2


# (file text, exit code, fragments of the one error line)
CONSTRAINT_ERRORS = {
    "unknown op": ('[[op]]\nname = "layer9/*"\nF_op = {m = 2}\n', EXIT_FAIL,
                   ["'layer9/*'", "matches no op"]),
    "two constraints": ('[[op]]\nname = "layer0/*"\nweights = "resident"\n[[op]]\n'
                        f'name = "{Q}"\nF_op = {{m = 2}}\n', EXIT_FAIL,
                        [Q, "two constraints"]),
    "unknown axis": (f'[[op]]\nname = "{Q}"\nF_op = {{z = 2}}\n', EXIT_FAIL,
                     [Q, "axis 'z'", "m, k, n"]),
    "not dividing": (f'[[op]]\nname = "{Q}"\nF_op = {{m = 3}}\n', EXIT_FAIL,
                     [Q, "F_op[m]=3 does not divide", "128"]),
    "above the cores": (f'[[op]]\nname = "{Q}"\nF_op = {{m = 32}}\n', EXIT_FAIL,
                        [Q, "F_op[m]=32", "16 cores"]),
    "product above the cores": (f'[[op]]\nname = "{Q}"\nF_op = {{m = 8, n = 4}}\n', EXIT_FAIL,
                                [Q, "uses 32 cores", "has 16"]),
    "unknown operand": (f'[[op]]\nname = "{Q}"\nf_t = {{in7 = {{k = 2}}}}\n', EXIT_FAIL,
                        [Q, "no operand 'in7'", "in0="]),
    "axis the operand lacks": (f'[[op]]\nname = "{Q}"\nf_t = {{in1 = {{m = 2}}}}\n',
                               EXIT_FAIL, [Q, "operand in1 has no axis 'm'"]),
    "f_t not dividing its ring": (f'[[op]]\nname = "{Q}"\nF_op = {{m = 4, n = 4, k = 1}}\n'
                                  'f_t = {in0 = {k = 8}}\n', EXIT_FAIL,
                                  [Q, "f_t[in0][k]=8 does not divide its ring", "F_op[n]=4"]),
    "two rotation axes": (f'[[op]]\nname = "{Q}"\nf_t = {{in0 = {{k = 2, m = 2}}}}\n',
                          EXIT_FAIL, [Q, "one axis at most"]),
    "no weights": ('[[op]]\nname = "layer0/attn/scores/MatMul"\nweights = "resident"\n',
                   EXIT_FAIL, ["layer0/attn/scores/MatMul", "no weights"]),
    "does not fit": ('[[op]]\nname = "embeddings/word/Gather"\nF_op = {d1 = 1, d2 = 1, d3 = 1}\n',
                     EXIT_FAIL, ["embeddings/word/Gather", "fits the SRAM", "655360"]),
    # in1 rotating along n needs m (which it lacks) split a multiple of 2: no cores are left
    "no legal plan": (f'[[op]]\nname = "{Q}"\nF_op = {{n = 16}}\nf_t = {{in1 = {{n = 2}}}}\n',
                      EXIT_FAIL, [Q, "no legal plan", "f_t[in1][n]=2"]),
    "not TOML": ("[[op\n", EXIT_USAGE, ["neither JSON nor TOML"]),
    "wrong type": (f'[[op]]\nname = "{Q}"\nF_op = {{m = "two"}}\n', EXIT_USAGE,
                   ["F_op.m must be a whole number"]),
    "unknown key": (f'[[op]]\nname = "{Q}"\nsplit = 2\n', EXIT_USAGE, ["unknown key 'split'"]),
    "bad weights": (f'[[op]]\nname = "{Q}"\nweights = "hot"\n', EXIT_USAGE,
                    ['"resident" or "warmed-up"']),
    "nothing constrained": (f'[[op]]\nname = "{Q}"\n', EXIT_USAGE, ["constrains nothing"]),
    "no op list": ('ops = 1\n', EXIT_USAGE, ["only key is `op`"]),
}


@pytest.mark.parametrize("case", list(CONSTRAINT_ERRORS))
def test_illegal_constraints_are_one_line(case: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text, want, fragments = CONSTRAINT_ERRORS[case]
    plan = write(tmp_path / "c.toml", text)
    code, out, err = run(capsys, "compile", "bert-tiny", "--chip", "test16", "--no-table",
                         "--plan", plan)
    assert code == want, err
    lines = [line for line in err.splitlines() if line.startswith("t10c:")]
    assert len(lines) == 1 and lines[0].startswith("t10c: error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert "Traceback" not in err


def test_a_plan_named_by_an_unknown_op_raises_a_constraint_error() -> None:
    chip = load_chip("test16")
    graph = to_graph(build("bert-tiny", seq_len=16, weights=False), name="bert-tiny")
    with pytest.raises(ConstraintError, match="matches no op"):
        plan_graph(graph, chip, constraints=(Constraint("nope", (("m", 2),)),))


def _edited(first, tmp_path: Path, edit) -> Path:
    doc = json.loads((first["test16"] / "plan.json").read_text())
    edit(doc)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def _cycles_edit(doc: dict) -> None:
    doc["ops"][5]["cycles"]["compute"] += 1


REPLAY_ERRORS = {
    "another chip": (["--chip", "ipu-mk2"], None, ["made for chip test16, not ipu-mk2"]),
    "another dtype": (["--dtype", "fp32"], None, ["made for dtype fp16, not fp32"]),
    "another model": (["--model", "bert-mini"], None, ["another model", "bert-mini"]),
    "another shape": (["--seq-len", "64"], None, ["another shape", "d1=128", "d1=64",
                                                  "--seq-len"]),
    "edited costs": ([], _cycles_edit, [Q, "the plan predicts"]),
}


@pytest.mark.parametrize("case", list(REPLAY_ERRORS))
def test_a_foreign_plan_is_refused_in_one_line(first, case: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    extra, edit, fragments = REPLAY_ERRORS[case]
    plan = _edited(first, tmp_path, edit) if edit else first["test16"] / "plan.json"
    model = "bert-tiny"
    if extra[:1] == ["--model"]:
        model, extra = extra[1], extra[2:]
    argv = ["compile", model, "--no-table", "--plan", plan, *extra]
    if "--chip" not in extra:
        argv += ["--chip", "test16"]
    code, out, err = run(capsys, *argv)
    assert code == EXIT_FAIL, err
    lines = [line for line in err.splitlines() if line.startswith("t10c:")]
    assert len(lines) == 1 and lines[0].startswith("t10c: error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def test_a_chip_file_of_the_same_name_is_refused(first, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    chip = write(tmp_path / "t8.toml", 'name = "test16"\nbase = "test16"\ncores = 8\n')
    code, _, err = run(capsys, "compile", "bert-tiny", "--chip", chip, "--no-table", "--plan",
                       first["test16"] / "plan.json")
    assert code == EXIT_FAIL
    lines = [line for line in err.splitlines() if line.startswith("t10c:")]
    assert len(lines) == 1 and "16 cores" in err and "this one has 8" in err


def test_load_plan_arg_tells_the_two_kinds_apart(first, tmp_path: Path) -> None:
    replay = load_plan_arg(first["test16"] / "plan.json")
    assert not isinstance(replay, tuple) and replay.cores == 16
    got = load_plan_arg(write(tmp_path / "c.toml", f'[[op]]\nname = "{UP}"\nF_op = {{m = 2}}\n'))
    assert got == (Constraint(UP, (("m", 2),)),)
    with pytest.raises(PlanFileError, match="cannot read"):
        load_plan_arg(tmp_path / "missing.json")
    assert CompileOptions().replay is None and CompileOptions().constraints == ()


def test_explain_shows_where_the_given_plans_sit(first, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    one_core = write(tmp_path / "c.toml",
                     f'[[op]]\nname = "{UP}"\nF_op = {{m = 1, n = 1, k = 1}}\n')
    code, out, err = run(capsys, "explain", "bert-tiny", "--chip", "test16", "--op", UP,
                         "--plan", one_core)
    assert code == 0, err
    assert "obeying" in out and "behind the front" in out
    code, out, err = run(capsys, "explain", "bert-tiny", "--chip", "test16", "--op", UP,
                         "--plan", first["test16"] / "plan.json")
    assert code == 0, err
    # the plan the solver chose for the op, found on its front or placed against it
    assert f"the plan {first['test16'] / 'plan.json'} gives {UP}" in out
    assert "front plan #" in out
    code, _, err = run(capsys, "explain", "bert-tiny", "--chip", "test16", "--op", Q,
                       "--plan", one_core)
    assert code == EXIT_USAGE and "does not constrain" in err


def test_resident_weights_under_vgm_are_refused(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    plan = write(tmp_path / "c.toml", f'[[op]]\nname = "{Q}"\nweights = "resident"\n')
    code, _, err = run(capsys, "compile", "bert-tiny", "--chip", "test16", "--no-table",
                       "--strategy", "vgm", "--plan", plan)
    assert code == EXIT_FAIL and Q in err and "vgm" in err
