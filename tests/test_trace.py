"""The Chrome trace of a run: well-formed events that add up to the emulated time."""

from __future__ import annotations

import json

from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.emulator.trace import write_trace


def test_trace_covers_the_timeline(tmp_path) -> None:
    compiled = compile_model("bert-tiny", PRESETS["test16"], CompileOptions(seq_len=16))
    result = run_compiled(compiled)
    path = tmp_path / "trace.json"
    write_trace(result.timeline, path, "bert-tiny")
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} >= {"compute", "sync"}
    assert sum(e["args"]["cycles"] for e in spans) == result.timeline.cycles
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    counters = [e for e in events if e["ph"] == "C"]
    assert max(e["args"]["bytes"] for e in counters) <= compiled.program.peak_sram_bytes_per_core
