"""Chrome Trace Event export of a `Timeline` (open it in Perfetto or chrome://tracing).

One process per run, one thread (lane) per phase (compute, shift, sync, reduce, relayout), a
complete event ("X") per op and phase with the cycles and bytes in its arguments, and a counter
("C") of the SRAM in use per core. Times are microseconds of emulated chip time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .machine import Timeline

LANES = ("compute", "shift", "sync", "reduce", "relayout", "fetch")


def trace_events(timeline: Timeline, name: str = "t10c") -> list[dict[str, Any]]:
    us = 1e6 / timeline.clock_hz
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": name}}]
    for tid, lane in enumerate(LANES, start=1):
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid,
                       "args": {"name": lane}})
    for r in timeline.records:
        tid = LANES.index(r.phase) + 1 if r.phase in LANES else len(LANES) + 1
        events.append({"name": r.op or "(program)", "cat": r.phase, "ph": "X", "pid": 1,
                       "tid": tid, "ts": round(r.start * us, 4), "dur": round(r.cycles * us, 4),
                       "args": {"cycles": r.cycles, "bytes_per_core": r.bytes_per_core}})
    for cycle, in_use in timeline.sram_samples:
        events.append({"name": "SRAM per core", "ph": "C", "pid": 1, "ts": round(cycle * us, 4),
                       "args": {"bytes": in_use}})
    return events


def write_trace(timeline: Timeline, path: Path, name: str = "t10c") -> None:
    doc = {"traceEvents": trace_events(timeline, name), "displayTimeUnit": "ns",
           "otherData": {"clock_hz": timeline.clock_hz, "cycles": timeline.cycles}}
    path.write_text(json.dumps(doc) + "\n")
