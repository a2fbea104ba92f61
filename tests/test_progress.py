"""Progress: every stage reports through ``progress(stage, done, total)``, and the CLI draws
one line per stage whose clock starts with the stage."""

from __future__ import annotations

import io
import re
import time

import pytest

from t10c import progress as progress_module
from t10c.chips import PRESETS
from t10c.cli import main
from t10c.driver import compile_model, run_compiled
from t10c.progress import StageProgress


def test_plain_lines_one_per_stage() -> None:
    out = io.StringIO()
    p = StageProgress(out, tty=False, quiet_s=0.0)
    time.sleep(0.3)  # before the first stage: must not count
    for call in [("frontend", 0, 1), ("frontend", 1, 1), ("search", 1, 3), ("search", 3, 3),
                 ("solve", 0, 1), ("solve", 1, 1), ("solve", 1, 1), ("write", 0, 2)]:
        p(*call)
    p.close()  # "write" never ended: no line for it
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["frontend", "search", "solve"]
    assert all(re.fullmatch(r"\w+ \d+\.\d s", line) for line in lines), lines
    assert lines[0] == "frontend 0.0 s"  # the clock started with the stage, not before


def test_quick_stages_are_quiet_without_a_terminal() -> None:
    out = io.StringIO()
    with StageProgress(out, tty=False, quiet_s=60.0) as p:
        p("search", 0, 2)
        p("search", 2, 2)
    assert out.getvalue() == ""


def test_terminal_bar_keeps_ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "REDRAW_S", 0.05)
    out = io.StringIO()
    with StageProgress(out, tty=True) as p:
        p("solve", 0, 1)
        time.sleep(0.6)  # the solve says nothing for a while: its clock still moves
        drawn = out.getvalue().count("\r")
        p("solve", 1, 1)
    assert drawn >= 4, out.getvalue()
    assert "solve" in out.getvalue() and "1/1" in out.getvalue()


def test_every_stage_reports_in_order() -> None:
    calls: list[tuple[str, int, int]] = []
    compiled = compile_model("mlp", PRESETS["test16"], progress=lambda *c: calls.append(c))
    run_compiled(compiled, progress=lambda *c: calls.append(c))
    stages = list(dict.fromkeys(stage for stage, _, _ in calls))
    assert stages == ["frontend", "search", "solve", "codegen", "emulate"]
    for stage in stages:
        mine = [(d, t) for s, d, t in calls if s == stage]
        assert mine[0][0] < mine[0][1], (stage, mine)  # reported as it starts...
        assert any(d >= t for d, t in mine), (stage, mine)  # ...and as it ends


def test_cli_reports_the_write(capsys: pytest.CaptureFixture[str], tmp_path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "QUIET_S", 0.0)
    assert main(["compile", "mlp", "--chip", "test16", "--no-table", "-o",
                 str(tmp_path / "out")]) == 0
    stages = [line.split()[0] for line in capsys.readouterr().err.splitlines()]
    assert stages == ["frontend", "search", "solve", "codegen", "write"]
