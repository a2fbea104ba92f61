"""Reproducible and interruptible solves (issue 11): the same files on a loaded machine, and
Ctrl-C during the solve stops the compile with exit 130."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: bert-mini's CP-SAT solve finds the optimum between 0.35 and 0.4 deterministic seconds (the
#: greedy's plan before): a limit of 0.4 puts the stopping point right where a solve that also
#: read the wall clock would return another plan when the machine is busy (0.4 deterministic
#: seconds took 2.4 s of wall time on the shared test machine)
LIMIT = "0.4"
#: (measured without epilogues, whose graph the solver finishes sooner)
COMPILE = ["compile", "bert-mini", "--chip", "ipu-mk2", "--time-limit", LIMIT, "--no-table",
           "--fuse", "inline"]
FILES = ("plan.json", "program.json", "program.npz")
SPIN = "while True: pass"


def _compile(out: Path) -> None:
    from t10c.cli import main

    assert main([*COMPILE, "-o", str(out)]) == 0


def test_same_files_beside_a_busy_machine(tmp_path: Path) -> None:
    _compile(tmp_path / "idle")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        _compile(tmp_path / "busy")
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    for f in FILES:
        assert (tmp_path / "idle" / f).read_bytes() == (tmp_path / "busy" / f).read_bytes(), f
    import json

    solver = json.loads((tmp_path / "idle" / "plan.json").read_text())["solver"]
    # the limit matters: the solver moved away from the greedy's plan within it
    assert solver["objective_cycles"] < solver["greedy_objective_cycles"]


#: ``t10c compile`` as the console script runs it, with one line printed when the plan's
#: CP-SAT solve starts (the test's own hook, so that SIGINT is sent during the solve whatever
#: the progress display looks like)
CHILD = """
import sys
from t10c import cli
from t10c.partition import cpsat
real = cpsat.run
def run(*args, **kwargs):
    print("solve started", flush=True)
    return real(*args, **kwargs)
cpsat.run = run
sys.exit(cli.main(sys.argv[1:]))
"""


def test_ctrl_c_during_the_solve_exits_130(tmp_path) -> None:
    """SIGINT while CP-SAT works (bert-base with no gap allowed: at least 14 s of solving)
    stops the compile within a few seconds with exit 130 and one line, no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "compile", "bert-base", "--chip", "ipu-mk2", "--gap", "0",
         "--time-limit", "600", "--no-table"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path)  # not the repository root, whose t10c/ would shadow the install
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "solve started\n", (line, proc.stderr.read() if proc.stderr else "")
        time.sleep(1.0)  # well inside the solve
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the compile ignored Ctrl-C during the solve")
        waited = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert waited < 5, waited
    assert err.strip().splitlines()[-1] == "t10c: interrupted" and "Traceback" not in err
    assert "solver" not in out  # it stopped: no plan was printed
