"""plan.json reads back: the loaded plan is the compiled one, verifies, and gives the same
program byte for byte."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from t10c.chips import load_chip
from t10c.codegen import generate
from t10c.driver import CompileOptions, compile_model
from t10c.partition import verify_plan
from t10c.planfile import PlanFileError, load_plan, plan_document, write_json


@pytest.fixture(scope="module")
def compiled():
    return compile_model("bert-tiny", load_chip("test16"), CompileOptions(seq_len=16))


def test_a_loaded_plan_is_the_plan(compiled, tmp_path: Path) -> None:
    write_json(tmp_path / "plan.json", plan_document(compiled))
    loaded = load_plan(tmp_path / "plan.json")
    # wall times and the solves' deterministic time (none for a look-up) are not stored
    want = dataclasses.replace(compiled.plan, search_wall_s=0.0,
                               solver=dataclasses.replace(compiled.plan.solver, wall_s=0.0,
                                                          deterministic_s=0.0))
    assert loaded == want
    verify_plan(compiled.graph, loaded, compiled.chip)
    again = generate(compiled.graph, loaded, compiled.chip)
    for name, program in (("a", compiled.program), ("b", again)):
        (tmp_path / name).mkdir()
        program.save(tmp_path / name)
    for f in ("program.json", "program.npz"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_a_loaded_plan_writes_the_same_file(compiled, tmp_path: Path) -> None:
    write_json(tmp_path / "plan.json", plan_document(compiled))
    loaded = load_plan(tmp_path / "plan.json")
    write_json(tmp_path / "again.json",
               plan_document(dataclasses.replace(compiled, plan=loaded)))
    assert (tmp_path / "plan.json").read_bytes() == (tmp_path / "again.json").read_bytes()


def test_core_maps_are_runs_of_one_step_each(tmp_path: Path) -> None:
    """An aligned plan's core map is written as runs of one step (`_runs`), ``[first, count]``
    where the step is 1: read back, every map is the one written; and a ``t10c-plan/1`` file,
    whose runs are all of consecutive cores, still loads as the same plan (llama-tiny-decode
    on an 8 x 8 mesh: five aligned plans)."""
    import random

    from t10c.chips import chip_from_dict
    from t10c.planfile import _runs, _unruns

    rng = random.Random(3)
    maps = [(), (5,), (1, 2, 3, 7, 9, 11, 20), tuple(range(40, 0, -3)),
            *(tuple(rng.sample(range(500), rng.randint(1, 60))) for _ in range(200))]
    for cores in maps:
        runs = _runs(cores)
        assert _unruns(runs) == cores
        assert all(len(r) == 2 or (r[1] > 1 and r[2] != 1) for r in runs)
    assert _runs((1, 2, 3, 7, 9, 11, 20)) == [[1, 3], [7, 3, 2], [20, 1]]
    mesh = chip_from_dict({"base": "wse2", "name": "mesh8", "grid": [8, 8], "cores": 64,
                           "sram_bytes_per_core": 1 << 20})
    aligned = compile_model("llama-tiny-decode", mesh)
    doc = plan_document(aligned)
    maps = [o for o in doc["ops"] if o["core_map"] is not None]
    assert maps
    for o in maps:  # as the first format wrote them: runs of consecutive cores only
        o["core_map"] = [[c, 1] for c in _unruns(o["core_map"]) or ()]
    doc["format"] = "t10c-plan/1"
    write_json(tmp_path / "old.json", doc)
    write_json(tmp_path / "new.json", plan_document(aligned))
    assert load_plan(tmp_path / "old.json") == load_plan(tmp_path / "new.json")


def test_files_are_written_indented_with_lists_of_numbers_on_one_line(compiled) -> None:
    """`planfile.dumps` is the document `json.dumps(indent=1, sort_keys=True)` writes, laid out
    the same but for lists of scalars (or of lists of scalars), each on one line: a core
    map's runs, an op's axes."""
    from t10c.planfile import dumps

    tricky = {"b": [[1, 2], [3, [4, 5]]], "a": [{"z": None, "y": [1.5, True, "s"]}],
              "c": [], "d": {}, "e": [[], [7]], "f": "x"}
    for doc in (plan_document(compiled), tricky):
        text = dumps(doc)
        assert json.loads(text) == json.loads(json.dumps(doc, indent=1, sort_keys=True))
    assert dumps(tricky) == "\n".join([
        "{", ' "a": [', "  {", '   "y": [1.5, true, "s"],', '   "z": null', "  }", " ],",
        ' "b": [', "  [1, 2],", "  [3, [4, 5]]", " ],", ' "c": [],', ' "d": {},',
        ' "e": [[], [7]],', ' "f": "x"', "}"])


def test_a_broken_plan_file_is_refused(compiled, tmp_path: Path) -> None:
    doc = plan_document(compiled)
    path = tmp_path / "plan.json"
    path.write_text("{")
    with pytest.raises(PlanFileError, match="cannot read"):
        load_plan(path)
    path.write_text(json.dumps({**doc, "format": "t10c-plan/0"}))
    with pytest.raises(PlanFileError, match="is not a t10c-plan/2 file"):
        load_plan(path)
    del doc["ops"][0]["drivers"]
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError, match="drivers"):
        load_plan(path)
