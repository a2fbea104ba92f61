"""Drawing the stages' progress on stderr: the ``progress(stage, done, total)`` protocol.

On a terminal each stage gets a tqdm bar whose clock starts at the stage's first call and keeps
ticking while the stage runs (the solve reports little, but must not look frozen). Elsewhere
(a log, a pipe, a test) each stage that took a while prints one line when it ends:
``solve 12.3 s`` (quick stages stay quiet: the compile's summary gives every stage's time).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any

#: without a terminal, a stage that took less than this says nothing (seconds)
QUIET_S = 1.0
#: how often a terminal's bar is redrawn when its stage says nothing (seconds; display only)
REDRAW_S = 0.5


class StageProgress:
    """A ``progress`` callback that draws one line per stage; `close` it when done.

    A stage starts at its first call and ends when ``done >= total``; a later call for a
    stage that ended is ignored (some stages are reported both by their callee and around it).
    """

    def __init__(self, stream: IO[str] | None = None, tty: bool | None = None,
                 quiet_s: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self._lock = threading.Lock()
        self._stage: str | None = None
        self._start = 0.0
        self._bar: Any = None
        self._ended: set[str] = set()
        self._stop = threading.Event()
        self._redraw: threading.Thread | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            if stage in self._ended:
                return
            if stage != self._stage:
                self._end(print_line=True)
                self._begin(stage, total)
            if self._bar is not None:
                self._bar.total = total
                self._bar.n = min(done, total)
                self._bar.refresh()
            if done >= total:
                self._end(print_line=True)

    def close(self) -> None:
        """End the open stage without a line (the run ended early) and stop redrawing."""
        with self._lock:
            self._end(print_line=False)
        self._stop.set()
        if self._redraw is not None:
            self._redraw.join()

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _begin(self, stage: str, total: int) -> None:
        self._stage, self._start = stage, time.perf_counter()
        if not self.tty:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=f"{stage:<8}", file=self.stream, leave=True,
                         dynamic_ncols=True,
                         bar_format="{desc} {percentage:3.0f}%|{bar}| {n}/{total} "
                                    "[{elapsed}<{remaining}]")
        if self._redraw is None:
            self._redraw = threading.Thread(target=self._redraw_loop, daemon=True)
            self._redraw.start()

    def _end(self, print_line: bool) -> None:
        if self._stage is None:
            return
        self._ended.add(self._stage)
        if self._bar is not None:
            self._bar.close()  # tqdm leaves the finished bar, with its elapsed time
            self._bar = None
        elif print_line and time.perf_counter() - self._start >= self.quiet_s:
            print(f"{self._stage} {time.perf_counter() - self._start:.1f} s", file=self.stream,
                  flush=True)
        self._stage = None

    def _redraw_loop(self) -> None:
        while not self._stop.wait(REDRAW_S):
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
