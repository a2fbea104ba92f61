"""Output files and directories are written atomically, and every stage can be interrupted.

A compile directory holds one compile or none: `-o` over an old directory replaces it as a
whole, and an interrupted or failed write leaves the old one (or nothing) and no temporary
siblings. Ctrl-C exits 130 with "t10c: interrupted" at any stage.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t10c import outputs
from t10c.cli import EXIT_FAIL, EXIT_INTERRUPTED, main
from t10c.codegen import Program


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def plan_model(directory: Path) -> str:
    return json.loads((directory / "plan.json").read_text())["model"]


def test_out_replaces_the_whole_directory(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, _, err = run(capsys, "compile", "mlp", "--chip", "test16", "--run", "-o", str(out))
    assert code == 0, err
    assert (out / "run.json").is_file()
    code, _, err = run(capsys, "compile", "matmul-16x32x8", "--chip", "test16", "-o", str(out))
    assert code == 0, err
    assert plan_model(out) == "matmul-16x32x8"
    # nothing of the first compile is left: its run.json would describe another program
    assert sorted(p.name for p in out.iterdir()) == [
        "compile.json", "inputs.json", "model.onnx", "plan.json", "program.json", "program.npz",
        "weights.npz"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary siblings


def _interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def _disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("fail, code, message", [
    (_interrupt, EXIT_INTERRUPTED, "t10c: interrupted"),
    (_disk_full, EXIT_FAIL, "No space left on device"),
], ids=["ctrl-c", "disk-full"])
@pytest.mark.parametrize("old", [True, False], ids=["over-old", "new"])
def test_failed_write_leaves_old_compile_or_none(fail, code: int, message: str, old: bool,
                                                 capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    if old:
        assert main(["compile", "mlp", "--chip", "test16", "-o", str(out)]) == 0
    monkeypatch.setattr(Program, "save", fail)  # fails after plan.json is written
    got, _, err = run(capsys, "compile", "matmul-16x32x8", "--chip", "test16", "-o", str(out))
    assert got == code, err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("t10c:")]) == 1, err
    if old:
        assert plan_model(out) == "mlp" and (out / "program.npz").is_file()
        assert [p.name for p in tmp_path.iterdir()] == ["out"]
    else:
        assert list(tmp_path.iterdir()) == []


def test_report_file_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    outputs.write_text(path, "old\n")
    with pytest.raises(KeyboardInterrupt), outputs.replacing(path) as tmp:
        tmp.write_text("half of the new")
        raise KeyboardInterrupt
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]
    outputs.write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode


def test_bench_json_on_a_full_disk(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "write_text", _disk_full)
    code, _, err = run(capsys, "bench", "--models", "matmul-16x32x8", "--chips", "test16",
                       "--json", str(tmp_path / "bench.json"))
    assert code == EXIT_FAIL
    assert err.splitlines()[-1] == (f"t10c: error: cannot write {tmp_path / 'bench.json'}: "
                                    "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_internal_error_is_one_line(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import t10c.cli

    def bug(args: object) -> int:
        raise KeyError("oops")

    monkeypatch.setattr(t10c.cli, "cmd_chips", bug)
    code, out, err = run(capsys, "chips")
    assert code == EXIT_FAIL
    assert err.count("\n") == 1
    assert "internal error: KeyError" in err and "T10C_DEBUG=1" in err
    monkeypatch.setenv("T10C_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["chips"])


def test_ctrl_c_outside_the_solve(tmp_path: Path) -> None:
    """SIGINT once the solve is over (during codegen, the write or the emulation): exit 130
    promptly, one line, and no partial output directory (an interrupted write leaves none:
    `test_failed_write_leaves_old_compile_or_none` interrupts it at a known point)."""
    out = tmp_path / "out"
    script = ("import sys, t10c.progress as p; p.QUIET_S = 0.0; from t10c.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "compile", "bert-mini", "--chip", "ipu-mk2", "--run",
         "--no-table", "-o", str(out)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        cwd=tmp_path)  # not the repository root, whose t10c/ would shadow the install
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # one line per finished stage
        seen.append(line)
        if line.startswith("solve "):
            break
    else:
        pytest.fail(f"no solve line: {seen}")
    time.sleep(0.3)  # past the solve: it reports its end just before it returns
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    rest = proc.stderr.read()
    code = proc.wait(timeout=60)
    assert time.monotonic() - start < 30
    assert code == EXIT_INTERRUPTED, rest
    assert rest.rstrip().endswith("t10c: interrupted"), rest
    assert "Traceback" not in rest
    # one whole compile (the signal came after the write) or none, and no temporary siblings
    assert [p.name for p in tmp_path.iterdir()] in ([], ["out"])
    if out.exists():  # the whole compile's files (the run's own come after the emulation)
        assert sorted(p.name for p in out.iterdir()) == [
            "compile.json", "inputs.json", "model.onnx", "plan.json", "program.json",
            "program.npz", "weights.npz"]


def test_out_of_a_model_past_the_protobuf_limit_holds_no_weights(capsys, tmp_path: Path,
                                                                 monkeypatch) -> None:
    """-o draws weights for `t10c run`; a model too large to carry them is written without
    them (a note says so) and `t10c run` refuses it in one line."""
    from t10c import models

    monkeypatch.setattr(models, "MAX_WEIGHT_BYTES", 1)
    out = tmp_path / "out"
    code, _, err = run(capsys, "compile", "mlp", "--chip", "test16", "-o", str(out))
    assert code == 0, err
    assert "without weights" in err
    assert not (out / "weights.npz").exists() and (out / "program.json").is_file()
    code, _, err = run(capsys, "run", str(out))
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "weights" in err
    code, _, err = run(capsys, "compile", "mlp", "--chip", "test16", "--run")
    assert code == 1 and "shape-only" in err
