"""Program files from disk: the verifier refuses malformed programs, naming the instruction
and the reason, and the loader turns every corruption into one clear error (fuzzed with
hypothesis over the fields and tables of a small compiled program)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t10c.chips import PRESETS
from t10c.cli import main
from t10c.codegen.program import ProgramError
from t10c.codegen.verify import load_program, verify_program
from t10c.emulator import EmulatorError, emulate
from t10c.rundir import draw_inputs, load_run_dir

CHIP = PRESETS["test16"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """mlp (batch 2) on test16: every instruction kind, Shift and Reduce included (fc1 is
    made to rotate its input: t10 now takes the no-rotation choice here, faster once the
    plans' shared copies and hoisted fetches are counted)."""
    base = tmp_path_factory.mktemp("mlp")
    out = base / "mlp"
    rotate = base / "rotate.toml"
    rotate.write_text('[[op]]\nname = "fc1/MatMul"\nF_op = { k = 2, n = 8 }\n'
                      'f_t = { in0 = { k = 8 } }\n')
    assert main(["compile", "mlp", "--batch", "2", "--chip", "test16", "-o", str(out),
                 "--plan", str(rotate), "--no-table"]) == 0
    kinds = {i["kind"] for i in json.loads((out / "program.json").read_text())["instrs"]}
    assert kinds >= {"Alloc", "Free", "Load", "Fill", "Exchange", "Compute", "Shift", "Reduce",
                     "Sync", "Store"}
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_table(directory: Path, key: str, edit) -> None:
    with np.load(directory / "program.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays[key] = edit(arrays[key].copy())
    with open(directory / "program.npz", "wb") as fh:
        np.savez_compressed(fh, **arrays)


def _first(directory: Path, kind: str) -> tuple[int, dict]:
    doc = json.loads((directory / "program.json").read_text())
    return next((n, i) for n, i in enumerate(doc["instrs"]) if i["kind"] == kind)


def _run_fails(directory: Path, capsys, *words: str) -> str:
    assert main(["run", str(directory)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("t10c: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, err
    return err


def test_a_shift_from_core_minus_one_is_refused(compiled, tmp_path, capsys) -> None:
    """It used to read the last core and exit 0."""
    d = _copy(compiled, tmp_path / "d")
    n, shift = _first(d, "Shift")

    def minus_one(a: np.ndarray) -> np.ndarray:
        a[0] = -1
        return a

    key = shift["src_core"]["npz"]
    _edit_table(d, key, minus_one)
    # equal tables are stored once: the error names the table's first user
    first, field = key[1:].split(".")[:2]
    _run_fails(d, capsys, f"instruction {first} (", f"{field} holds -1")


@pytest.mark.parametrize("kind,field,value,words", [
    ("Exchange", "runs", 16, "a run reads core 16"),
    ("Exchange", "pat", 10 ** 6, "a row names a pattern that does not exist"),
    ("Reduce", "group", -2, "group holds -2"),
    ("Reduce", "offset", -1, "offset holds -1"),
    ("Store", "src_off", -1, "src_off holds -1"),
    ("Load", "origin", 2 ** 31 - 1, "outside the coordinates"),
])
def test_tables_out_of_range_are_refused(compiled, tmp_path, capsys, kind, field, value,
                                         words) -> None:
    d = _copy(compiled, tmp_path / "d")
    n, ins = _first(d, kind)

    def poke(a: np.ndarray) -> np.ndarray:
        a.reshape(-1)[0] = value
        return a

    key = ins[field]["npz"]
    _edit_table(d, key, poke)
    # equal tables are stored once: the error names the table's first user
    first = key[1:].split(".")[0]
    _run_fails(d, capsys, f"instruction {first} (", words)


@pytest.mark.parametrize("column,value,words", [
    (1, 10 ** 6, "a run reads past the"),
    (2, 0, "a run is empty"),
    (2, 10 ** 6, "does not cover the"),
])
def test_exchange_patterns_out_of_range_are_refused(compiled, tmp_path, capsys, column, value,
                                                    words) -> None:
    """A run's source offset past its buffer, an empty run, runs longer than the buffer."""
    d = _copy(compiled, tmp_path / "d")
    n, ins = _first(d, "Exchange")

    def poke(a: np.ndarray) -> np.ndarray:
        a[0, column] = value
        return a

    _edit_table(d, ins["runs"]["npz"], poke)
    _run_fails(d, capsys, f"instruction {n} (Exchange", words)


def test_compute_offsets_outside_the_tile_are_refused(compiled, tmp_path, capsys) -> None:
    d = _copy(compiled, tmp_path / "d")
    n, ins = _first(d, "Compute")
    _edit_table(d, ins["offsets"]["npz"][0], lambda a: a + 10 ** 4)
    _run_fails(d, capsys, f"instruction {n} (Compute", "operand 0's offsets")


@pytest.mark.parametrize("edit,words", [
    (lambda doc: doc["instrs"][3].update(kind="Teleport"), "unknown kind 'Teleport'"),
    (lambda doc: doc["instrs"][0].update(buf=10 ** 6), "buffer 1000000 does not exist"),
    (lambda doc: doc["instrs"][0].update(buf="x"), "buf is not an integer"),
    (lambda doc: doc["instrs"][0].update(colour=1), "unknown fields colour"),
    (lambda doc: doc["instrs"][0].pop("buf"), "lacks field buf"),
    (lambda doc: doc["instrs"].append({"kind": "Sync", "op": "x", "phase": "x"}) or
     doc["instrs"].insert(0, {"kind": "Free", "op": "", "phase": "", "buf": -1}),
     "buffer -1 does not exist"),
    (lambda doc: doc["exprs"][0].update(body=["frobnicate", ["in", 0]]),
     "unknown body function 'frobnicate'"),
    (lambda doc: doc["buffers"][0].update(offset=10 ** 9), "outside the 655360-byte SRAM"),
    (lambda doc: doc.update(cores=32), "the program is for 32 cores, chip test16 has 16"),
    (lambda doc: doc.update(gathers={"x": {"table": 1}}), "field 'gathers' is malformed"),
])
def test_malformed_program_json_is_refused(compiled, tmp_path, capsys, edit, words) -> None:
    d = _copy(compiled, tmp_path / "d")
    doc = json.loads((d / "program.json").read_text())
    edit(doc)
    (d / "program.json").write_text(json.dumps(doc))
    _run_fails(d, capsys, words)


@pytest.mark.parametrize("name", ["program.json", "program.npz", "weights.npz", "inputs.json",
                                  "model.onnx", "compile.json"])
@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_damaged_files_are_refused(compiled, tmp_path, capsys, name, damage) -> None:
    d = _copy(compiled, tmp_path / "d")
    if damage == "delete":
        (d / name).unlink()
    else:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: len(data) // 2])
    _run_fails(d, capsys, name)


def test_program_load_refuses_with_one_error(compiled, tmp_path) -> None:
    d = _copy(compiled, tmp_path / "d")
    (d / "program.npz").write_bytes(b"not a zip")
    with pytest.raises(ProgramError, match="program.npz is not a readable"):
        load_program(d)


# -- fuzzing ------------------------------------------------------------------------------
JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 20), st.integers(-2 ** 40, 2 ** 40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
    st.lists(st.integers(-2, 40), max_size=4), st.just({"npz": "i0.origin"}),
    st.just({"npz": ["nosuch"]}))


def _value(old: object, data) -> object:
    """A replacement for a field: near the old value (an integer nudged), or anything."""
    if type(old) is int and data.draw(st.booleans()):
        return old + data.draw(st.integers(-3, 3))
    return data.draw(JSON_VALUES)


def _mutate_json(doc: dict, data) -> None:
    where = data.draw(st.sampled_from(["instrs", "instrs", "instrs", "buffers", "exprs",
                                       "header"]))
    items = doc.get(where)
    if where == "header" or not isinstance(items, list) or not items \
            or not all(isinstance(x, dict) for x in items):  # an earlier mutation broke it
        key = data.draw(st.sampled_from(sorted(doc)))
        doc[key] = _value(doc[key], data)
        return
    rec = items[data.draw(st.integers(0, len(items) - 1))]
    key = data.draw(st.sampled_from(sorted(rec) + ["kind", "extra"]))
    if where == "instrs" and key == "kind":
        rec[key] = data.draw(st.sampled_from(["Alloc", "Free", "Load", "Fill", "Exchange",
                                              "Compute", "Shift", "Reduce", "Sync", "Store",
                                              "Nope"]))
    elif key in rec and data.draw(st.integers(0, 4)) == 0:
        del rec[key]
    else:
        rec[key] = _value(rec.get(key), data)


def _mutate_table(arrays: dict[str, np.ndarray], data) -> None:
    key = data.draw(st.sampled_from(sorted(arrays)))
    a = arrays[key]
    how = data.draw(st.sampled_from(["poke", "poke", "shrink", "float", "shift"]))
    if how == "poke" and a.size:
        flat = a.reshape(-1).copy()
        at = data.draw(st.integers(0, a.size - 1))
        flat[at] = data.draw(st.integers(-3, 20) | st.integers(-2 ** 31, 2 ** 31 - 1))
        arrays[key] = flat.reshape(a.shape)
    elif how == "shrink" and a.size:
        arrays[key] = a[: len(a) - 1]
    elif how == "float":
        arrays[key] = a.astype(np.float32)
    else:
        arrays[key] = a + data.draw(st.integers(-3, 3))


@pytest.fixture(scope="module")
def run_files(compiled):
    return load_run_dir(compiled)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_programs_load_and_run_or_are_refused(compiled, run_files, data) -> None:
    """Every mutation loads and runs, or is refused with a ProgramError or EmulatorError:
    never another exception."""
    run = run_files
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        doc = json.loads((compiled / "program.json").read_text())
        with np.load(compiled / "program.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}
        for _ in range(data.draw(st.integers(1, 3))):
            if data.draw(st.booleans()):
                _mutate_json(doc, data)
            else:
                _mutate_table(arrays, data)
        (d / "program.json").write_text(json.dumps(doc))
        with open(d / "program.npz", "wb") as fh:
            np.savez(fh, **arrays)
        try:
            program = load_program(d)
            verify_program(program, CHIP)
        except ProgramError as exc:
            assert "\n" not in str(exc)
            return
        try:
            emulate(program, CHIP, draw_inputs(run.inputs), run.weights)
        except EmulatorError as exc:
            assert str(exc).startswith("while executing instruction ") or "input" in str(exc)
