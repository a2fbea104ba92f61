"""A timing-only run's machine on a thread of its own beside codegen (`driver._PipedSink`):
the same timeline as stepped in line; the calls reach the machine in the order made, a
mark's box and a `since` filled where the stream got to; a failure of the machine is
raised as codegen's, the first one in the stream winning over a later one of codegen's; an
interrupt drops what is queued; and no thread outlives a run."""

from __future__ import annotations

import threading
import time

import pytest

from t10c import driver, forked
from t10c.chips import chip_from_dict
from t10c.codegen import CodegenError
from t10c.driver import CompileOptions, _PipedSink, compile_model, time_only
from t10c.emulator import EmulatorError
from t10c.models.bert import build_bert


class _Machine:
    """Records what it is asked, in order; fails at step number ``fail`` if given."""

    def __init__(self, fail: int | None = None) -> None:
        self.log: list[object] = []
        self.fail = fail

    def step(self, ins: object) -> None:
        if len(self.log) == self.fail:
            raise EmulatorError(f"while executing instruction {ins}: refused")
        self.log.append(ins)

    def mark(self) -> int:
        return len(self.log)

    def since(self, mark: int, cached: dict) -> dict:
        cached["records"] = self.log[mark:]
        return cached

    def replay(self, op: str, cached: dict) -> None:
        self.log.append((op, tuple(cached["records"])))

    def mark_written(self, buf: int, cores: object) -> None:
        self.log.append(("written", buf))


def _timing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "t10c-timing"]


def test_calls_reach_the_machine_in_order() -> None:
    machine = _Machine()
    sink = _PipedSink(machine)  # type: ignore[arg-type]
    sink(1)
    box = sink.mark()
    for k in (2, 3):
        sink(k)
    cached = sink.since(box, {})
    sink.written(7, None)  # type: ignore[arg-type]
    sink.replay("again", cached)
    sink(4)
    sink.close()
    assert box == [1] and cached == {"records": [2, 3]}
    assert machine.log == [1, 2, 3, ("written", 7), ("again", (2, 3)), 4]
    assert not _timing_threads()


def test_a_failure_of_the_machine_is_raised_as_codegens() -> None:
    machine = _Machine(fail=2)
    sink = _PipedSink(machine)  # type: ignore[arg-type]
    for k in range(5):
        sink(k)
    with pytest.raises(CodegenError, match="instruction 2: refused"):
        sink.close()
    assert machine.log == [0, 1], "nothing after the failure is timed"
    sink.close()  # raised once
    assert not _timing_threads()


def test_the_machines_earlier_failure_wins_over_codegens_later_one() -> None:
    machine = _Machine(fail=1)
    sink = _PipedSink(machine)  # type: ignore[arg-type]
    sink(0)
    sink(1)
    with pytest.raises(CodegenError, match="instruction 1") as got:
        sink.close(ValueError("codegen failed later"))
    assert isinstance(got.value.__cause__, EmulatorError)
    # without a failure of the machine, the caller raises its own
    sink = _PipedSink(_Machine())  # type: ignore[arg-type]
    sink(0)
    sink.close(ValueError("codegen failed"))
    assert not _timing_threads()


def test_an_interrupt_drops_what_waits() -> None:
    started = threading.Event()

    class Slow(_Machine):
        def step(self, ins: object) -> None:  # (the first step lasts until the interrupt)
            started.set()
            for _ in range(5000):
                if sink.stop:
                    break
                time.sleep(0.001)
            super().step(ins)

    machine = Slow()
    sink = _PipedSink(machine)  # type: ignore[arg-type]
    for k in range(4):
        sink(k)
    assert started.wait(5)
    sink.close(KeyboardInterrupt())
    assert machine.log == [0] and not _timing_threads()
    # nor is a failure of the machine raised over an interrupt
    sink = _PipedSink(_Machine(fail=0))  # type: ignore[arg-type]
    sink(0)
    sink.close(KeyboardInterrupt())
    assert not _timing_threads()


def test_a_piped_timing_only_run_times_as_one_in_line(monkeypatch) -> None:
    """A four-layer BERT on a mesh, its repeated layers replayed: the piped machine's
    timeline is the in-line one's, record for record."""
    chip = chip_from_dict({"base": "wse2", "name": "mesh8x12-piped", "grid": [8, 12],
                           "cores": 96})
    model = build_bert(32, 4, 2, 64, vocab=40, max_pos=16, seq_len=8, name="bert-small")
    compiled = compile_model(model, chip, CompileOptions(dtype="fp32"))
    runs = []
    replays = []

    class Watched(_PipedSink):
        def replay(self, op: str, cached: object) -> None:
            replays.append(op)
            super().replay(op, cached)

    monkeypatch.setattr(driver, "_PipedSink", Watched)
    for jobs in ("1", "2"):
        monkeypatch.setenv("T10C_JOBS", jobs)
        monkeypatch.setattr(forked, "FORKED_WORK", 0)
        _, program, timeline = time_only(compiled.graph, compiled.plan, chip)
        runs.append((timeline.records, timeline.cycles, program.peak_sram_bytes_per_core,
                     None if timeline.link_bytes is None else timeline.link_bytes.tolist()))
        assert bool(replays) == (jobs == "2"), "piped with two jobs, in line with one"
    assert runs[0] == runs[1]
    assert runs[0][1] == compiled.plan.total_cycles
    assert not _timing_threads()
