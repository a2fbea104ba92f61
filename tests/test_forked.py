"""Independent work shared among forked processes (`t10c.forked`): the same results, in the
same order, whichever child computed them; a child that fails has its pieces computed by
the parent; ``T10C_JOBS`` is read and refused in one line; and a wafer-sized chip's edges
priced in two processes are the edges priced in one (`partition._edges`), and its ops
searched there the ops searched here (`space.prefetch`)."""

from __future__ import annotations

import os
import time

import pytest

from t10c import forked
from t10c.chips import chip_from_dict
from t10c.cli import main
from t10c.driver import CompileOptions, compile_model
from t10c.models.bert import build_bert


def _square_slowly(k: int) -> tuple[int, int]:
    time.sleep(0.05)  # long enough that the child takes some of the pieces
    return k * k, os.getpid()


def test_pieces_come_back_in_order_from_both_children() -> None:
    """Two children share the pieces; this process only waits (its memory is not written
    while they share it: `t10c.forked`'s doc)."""
    pieces = list(range(10))
    got = forked.map_forked(_square_slowly, pieces, costs=[k % 3 for k in pieces], n=2)
    assert [v for v, _ in got] == [k * k for k in pieces]
    pids = {pid for _, pid in got}
    assert len(pids) == 2 and os.getpid() not in pids, "each child computed some pieces"
    assert forked.map_forked(_square_slowly, pieces[:1], [1.0], n=4) == \
        [(0, os.getpid())], "one piece: no child"


def test_a_failed_child_has_its_pieces_computed_by_the_parent() -> None:
    parent = os.getpid()

    def dies_in_a_child(k: int) -> int:
        time.sleep(0.02)
        if os.getpid() != parent:
            os._exit(3)  # as if killed: no result sent
        return k + 100

    assert forked.map_forked(dies_in_a_child, list(range(8)), [1.0] * 8, n=3) == \
        [k + 100 for k in range(8)]


def test_an_error_surfaces_wherever_the_piece_ran() -> None:
    def fails_on_five(k: int) -> int:
        time.sleep(0.02)
        if k == 5:
            raise ValueError("piece five")
        return k

    with pytest.raises(ValueError, match="piece five"):
        forked.map_forked(fails_on_five, list(range(8)), [1.0] * 8, n=2)


def test_jobs_come_from_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("T10C_JOBS", "3")
    assert forked.jobs() == 3
    monkeypatch.delenv("T10C_JOBS")
    assert 1 <= forked.jobs() <= forked.MAX_JOBS
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("T10C_JOBS", bad)
        with pytest.raises(forked.JobsError):
            forked.jobs()
        assert main(["chips"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"t10c: error: T10C_JOBS={bad!r} is not a positive whole number of "
                       "processes; unset it or set it to 1 or more"]


def _small_bert_on_a_mesh(name: str):  # type: ignore[no-untyped-def]
    """An 8 x 12 mesh and a two-layer BERT, small enough to compile in a second."""
    chip = chip_from_dict({"base": "wse2", "name": name, "grid": [8, 12], "cores": 96})
    return chip, build_bert(32, 2, 2, 64, vocab=40, max_pos=16, seq_len=8, name="bert-small")


def _watch_forked(monkeypatch) -> list[tuple[str, int, int]]:  # type: ignore[no-untyped-def]
    """Every `forked.map_forked` call from now on, as (the piece function's name, processes
    asked for, pieces)."""
    calls: list[tuple[str, int, int]] = []
    shared = forked.map_forked

    def counted(fn, pieces, costs, n):  # type: ignore[no-untyped-def]
        calls.append((getattr(fn, "__qualname__", ""), n, len(pieces)))
        return shared(fn, pieces, costs, n)

    monkeypatch.setattr(forked, "map_forked", counted)
    return calls


def test_edges_priced_in_two_processes_are_those_priced_in_one(monkeypatch) -> None:
    """On a mesh, with the threshold lowered so that its edges (and its searches, and the
    ranking of refine's moves) are shared: the plan, its re-layouts and its cycles are those
    of the same compile in one process."""
    from t10c.partition import space, transitions

    chip, model = _small_bert_on_a_mesh("mesh8x12-forked")
    calls = _watch_forked(monkeypatch)
    plans = []
    for jobs in ("1", "2"):
        monkeypatch.setenv("T10C_JOBS", jobs)
        monkeypatch.setattr(forked, "FORKED_WORK", 0)
        for cache in (transitions._MOST, transitions._HAVES, transitions._WANTS, space._FOUND):
            cache.clear()  # searched and priced afresh each time, not looked up
        plan = compile_model(model, chip, CompileOptions(dtype="fp32")).plan
        plans.append((plan.ops, plan.relayout_cycles, plan.total_cycles))
    assert {n for _, n, _ in calls} >= {1, 2}
    assert any(name.startswith("_ranked") and n == 2 for name, n, _ in calls), \
        "refine's moves were ranked in forked processes"
    assert plans[0] == plans[1]


def test_phases_routed_in_two_processes_are_those_routed_in_one(monkeypatch) -> None:
    """The chosen plans' re-layout phases routed ahead in forked children
    (`meshmove.route_ahead`, its threshold lowered): the same plan and re-layout cycles as in
    one process, and every way of sending an exchange the children decided is known here,
    as if decided here (codegen asks the same)."""
    from t10c import multicast
    from t10c.partition import meshmove

    chip, model = _small_bert_on_a_mesh("mesh8x12-routed")
    calls = _watch_forked(monkeypatch)
    monkeypatch.setattr(meshmove, "FORKED_ELEMENTS", 0)
    got = []
    for jobs in ("1", "2"):
        monkeypatch.setenv("T10C_JOBS", jobs)
        monkeypatch.setattr(meshmove, "_PHASES", {})  # routed afresh each time
        monkeypatch.setattr(multicast, "_WAYS", {})
        monkeypatch.setattr(multicast, "_ROUTES", type(multicast._ROUTES)())
        plan = compile_model(model, chip, CompileOptions(dtype="fp32")).plan
        got.append((plan.ops, plan.relayout_cycles, dict(multicast._WAYS)))
    assert any(name.startswith("route_ahead") and n == 2 and pieces >= 2
               for name, n, pieces in calls), "some phases were routed in two children"
    assert got[0][:2] == got[1][:2]
    assert got[0][2] == got[1][2] and got[0][2], "the same ways known, decided here or there"


_LOADED = """
import sys
from types import SimpleNamespace
from t10c.chips import load_chip
from t10c.partition import _load_kernels

graph = SimpleNamespace(ops=[None] * 400)  # (all it reads: how many ops there are)
_load_kernels(graph, load_chip("ipu-mk2"))
assert "numba" not in sys.modules, "an all-to-all chip loads no kernel"
_load_kernels(graph, load_chip("wse2"))
from numba.core.registry import CPUDispatcher
from t10c import meshkernels
from t10c.partition import kernels
inline = {"_leg", "_first", "_mark_x", "_mark_y"}  # (called by kernels alone: compiled into them)
unloaded = [f"{m.__name__}.{name}" for m in (meshkernels, kernels)
            for name, f in vars(m).items()
            if isinstance(f, CPUDispatcher) and not f.signatures and name not in inline]
print(unloaded)
"""


def test_a_wafer_compile_loads_every_kernel_before_it_forks(tmp_path) -> None:
    """The processes a wafer compile forks inherit every compiled kernel loaded (`partition.
    _load_kernels`, before the search's fork); an all-to-all chip's compile loads none."""
    import subprocess
    import sys

    env = {**os.environ, "T10C_JOBS": "2"}
    # (run in tmp_path, not the repository root, whose t10c/ would shadow the install)
    out = subprocess.run([sys.executable, "-c", _LOADED], capture_output=True, text=True,
                         env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"kernels not loaded: {out.stdout.strip()}"
