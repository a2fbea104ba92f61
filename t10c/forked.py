"""Independent pieces of one compile shared among forked processes.

Some of the planner's work is many independent, pure computations over data the process
already holds: the re-layout prices of every producer -> consumer edge (`partition._edges`),
each a function of the graph, the two ops' plan fronts and the chip alone. On a wafer they
are nearly half of a compile (45% of bert-large's on wse2, where a layout spans 850,000
cores), the searches of its distinct ops a few seconds more (`partition.space.prefetch`),
and the routes of the chosen plans' re-layout phases (`partition.meshmove.route_ahead`).
`map_forked` computes them in ``jobs`` children forked from this process, which waits: a
child inherits the graph, the fronts and every cache as they are (nothing is pickled on the
way in), takes pieces from a shared queue until none is left, and sends back its results,
which are small (cycle counts).

This process takes no piece itself. Computing beside a child, it came out of the pieces
slower and larger: on bert-large on wse2 the compile took 58.5 s against 55.5 s waiting on
two children (medians of three pairs), its system time was 10.7 s against 5.9 s, its peak
memory 4,359 MiB against 2,883 MiB, and codegen's timing routes after the pieces, the same
work, took 5.5 s against 2.8 s. (Writing memory that a child still shares makes the kernel
copy it page by page; that this is what slowed the later work is likely, not shown. The
layouts the children build for their edges die with them.)

What is computed where never changes a result: every piece is a pure function of its
inputs, the results come back in the pieces' order, and a child that fails or dies has its
share computed again here. So a compile writes the same files with one process or eight.

`jobs` is ``T10C_JOBS`` if set, otherwise the cores this process may run on (at most
`MAX_JOBS`). Forking needs ``os.fork`` (Linux; elsewhere everything runs here). A child
writes nothing but its results: it shares the parent's output streams and locks, so it
never prints, and it leaves with ``os._exit``, flushing no buffer of the parent's twice.
It runs the planner's own code only: a fork carries no thread but the caller's, and neither
the solver's threads nor the emulator's kernel threads are asked for in a child.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: at most this many processes by default (a compile's pieces are few dozen distinct ones)
MAX_JOBS = 8


#: the work (cores a layout spans times the pieces) from which a compile's pieces are shared
#: among processes: meshes of wafer size (a one-layer LLaMA-3-8B decode cut on wse2 prices
#: its edges in 25 s of its 43), not an IPU's 1,472 cores, whose pieces take a second or two
#: (a fork and its children's cold caches would cost about what they save)
FORKED_WORK = 1 << 24


class JobsError(ValueError):
    """``T10C_JOBS`` is not a positive whole number."""


def jobs() -> int:
    """Processes a compile may share its independent work among: ``T10C_JOBS`` (a positive
    integer; 1 keeps everything in this process), else the cores this process may run on,
    at most `MAX_JOBS`."""
    value = os.environ.get("T10C_JOBS", "").strip()
    if value:
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise JobsError(f"T10C_JOBS={value!r} is not a positive whole number of "
                             "processes; unset it or set it to 1 or more")
        return n
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    return max(1, min(cores, MAX_JOBS))


def jobs_for(work: int) -> int:
    """`jobs` where ``work`` reaches `FORKED_WORK`, else 1 (all in this process)."""
    return jobs() if work >= FORKED_WORK else 1


def map_forked(fn: Callable[[T], R], pieces: Sequence[T], costs: Sequence[float],
               n: int) -> list[R]:
    """``[fn(p) for p in pieces]``, shared among ``n`` forked children while this process
    waits (the module doc says why): each child takes the next piece, the costliest first (by
    ``costs``), until none is left, so that a long piece does not keep the others waiting
    behind a fixed share. In this process alone where ``n`` is 1, there are fewer than two
    pieces, or the platform cannot fork. ``fn``'s results must pickle. A child that fails (an
    exception, a signal, a result that does not arrive whole) has the pieces it took computed
    here instead, where an exception then surfaces as it would have."""
    if n < 2 or len(pieces) < 2 or not hasattr(os, "fork") or len(pieces) > QUEUED:
        return [fn(p) for p in pieces]
    order = sorted(range(len(pieces)), key=lambda k: (-costs[k], k))
    # the queue: every piece's number, written before any process reads (a pipe holds
    # `QUEUED` of them), read 4 bytes at a time (one read takes one whole number)
    queue, fill = os.pipe()
    os.write(fill, b"".join(_NUMBER.pack(k) for k in order))
    os.close(fill)
    for stream in (sys.stdout, sys.stderr):  # nothing buffered for a child to repeat
        stream.flush()
    children: list[tuple[int, int]] = []  # (pid, read end of its results)
    results: dict[int, R] = {}
    try:
        for _ in range(min(n, len(pieces))):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: compute, send, leave without running any cleanup
                os.close(read)
                code = 1
                try:
                    data = pickle.dumps(list(_drain(fn, pieces, queue).items()),
                                        protocol=pickle.HIGHEST_PROTOCOL)
                    with os.fdopen(write, "wb") as out:
                        out.write(data)
                    code = 0
                finally:
                    os._exit(code)
            os.close(write)
            children.append((pid, read))
        while children:
            pid, read = children[0]
            got = _collect(pid, read)
            children.pop(0)
            os.close(read)
            results.update(got or {})
    finally:  # interrupted (Ctrl-C, an exception here): no child outlives this call
        os.close(queue)
        for pid, read in children:
            _stop(pid, read)
    # a failed child's pieces (taken from the queue, never answered), computed here
    return [results[k] if k in results else fn(pieces[k]) for k in range(len(pieces))]


#: one piece's number in the queue
_NUMBER = struct.Struct("<I")
#: at most this many pieces are queued (a pipe's 64 KiB); more run in this process alone
QUEUED = (1 << 16) // _NUMBER.size


def _drain(fn: Callable[[T], R], pieces: Sequence[T], queue: int) -> dict[int, R]:
    """Compute the pieces this process takes from ``queue`` until it is empty."""
    out: dict[int, R] = {}
    while len(got := os.read(queue, _NUMBER.size)) == _NUMBER.size:
        k = _NUMBER.unpack(got)[0]
        out[k] = fn(pieces[k])
    return out


def _collect(pid: int, read: int) -> dict | None:
    """A child's results by piece, once it has exited cleanly; None otherwise (the pieces it
    took are then computed by the caller). Leaves ``read`` open."""
    chunks = []
    while chunk := os.read(read, 1 << 20):
        chunks.append(chunk)
    data = b"".join(chunks)
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    try:
        got = pickle.loads(data)
    except Exception:  # (a truncated or corrupt message: computed here instead)
        return None
    return dict(got) if isinstance(got, list) else None


def _stop(pid: int, read: int) -> None:
    """End a child that is still running and reap it."""
    import signal

    try:
        os.close(read)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
