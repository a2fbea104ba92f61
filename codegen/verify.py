"""The program verifier: refuse a malformed `Program` before anything executes it.

`verify_program(program)` checks what the program says about itself: buffer ids in range,
expressions whose bodies use known functions (`t10c.elementwise`), and every per-core table of
every instruction (shapes, integer types, source cores, slice offsets, negative values
included) within range, so that no table can make the emulator read outside a buffer or from a
core that does not exist. With a chip it also checks the program against the chip: its core
count, every buffer inside SRAM, and every transfer between cores of the chip's grid (on the
topologies t10c models, all-to-all and dimension-order-routed 2D meshes and tori, any two cores
of the grid are joined by links, so a transfer's links exist exactly when both its ends do).

Every refusal is a `ProgramError` naming the instruction (index, kind, op) and the reason.
`load_program` runs the chip-less checks on every program read from disk; ``t10c run`` and
``--check`` run them with the chip. Dynamic properties (a read of a buffer no core wrote, two
live buffers overlapping) are the emulator's to refuse as it runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import DTYPES
from t10c.elementwise import COMBINES, body_inputs, check_body
from t10c.ir import INDIRECT, TensorExpr, Window, is_contraction

from .pattern import Pattern, check
from .program import (
    DTYPE_BYTES,
    Alloc,
    Compute,
    DmaLoad,
    DmaStore,
    DmaWait,
    Exchange,
    Fill,
    Free,
    Instr,
    Load,
    Program,
    ProgramError,
    Reduce,
    Shift,
    Store,
    Sync,
)

#: coordinates (tile origins) beyond this magnitude are refused: index arithmetic stays in int32
COORD_LIMIT = 2 ** 30


def verify_program(program: Program, chip: Chip | None = None) -> None:
    """Raise `ProgramError` on the first thing wrong with ``program`` (on ``chip``, if given)."""
    _check_header(program)
    for k, expr in enumerate(program.exprs):
        why = _check_expr(expr)
        if why:
            raise ProgramError(f"expression {k} ({expr.name}): {why}")
    if chip is not None:
        _check_chip(program, chip)
    for n, ins in enumerate(program.instrs):
        checker = _CHECKS.get(type(ins))
        if checker is None:
            raise ProgramError(f"instruction {n}: unknown instruction {type(ins).__name__}")
        try:
            checker(program, ins)
        except _Bad as bad:
            raise ProgramError(f"instruction {n} ({type(ins).__name__} of op "
                               f"{ins.op or '-'}): {bad}") from None


class _Bad(Exception):
    """One instruction's fault; `verify_program` adds which instruction it is."""


def _check_header(p: Program) -> None:
    if not (isinstance(p.cores, int) and p.cores >= 1):
        raise ProgramError(f"the program's core count {p.cores!r} is not a positive integer")
    if p.dtype not in DTYPES:
        raise ProgramError(f"the program's dtype {p.dtype!r} is not one of {', '.join(DTYPES)}")
    for i, b in enumerate(p.buffers):
        if b.id != i:
            raise ProgramError(f"buffer {i} has id {b.id}; buffer ids must be 0, 1, 2, ...")
        if b.dtype not in DTYPES:
            raise ProgramError(f"buffer {i} (%{b.name}) has unknown dtype {b.dtype!r}")
        if b.elems < 0 or b.offset < 0:
            raise ProgramError(f"buffer {i} (%{b.name}) has a negative size or address")


def _check_expr(e: TensorExpr) -> str | None:
    extents = dict(e.axes)
    if len(extents) != len(e.axes) or any(x < 1 for x in extents.values()):
        return "its axes must be distinct and of positive extent"
    if e.combine is not None and e.combine not in COMBINES:
        return f"unknown combine {e.combine!r}"
    for o in e.operands:
        for d in o.axes:
            names = d.axes if isinstance(d, Window) else (d,)
            if any(a != INDIRECT and a not in extents for a in names):
                return f"operand {o.tensor} is indexed by an axis the expression lacks"
    used = {a for o in e.operands for a in o.axis_set}
    if any(a not in used for a in extents):
        return "an axis indexes no operand"
    if any(not isinstance(d, str) or d == INDIRECT for d in e.output.axes):
        return "the output must be indexed by plain axes"
    why = check_body(e.body, len(e.inputs))
    if why is None and e.body[0] == "take":
        try:
            e.take_dim()
        except ValueError as exc:
            why = str(exc)
    if why is None and e.prologue:  # `t10c.ir.TensorExpr.prologue`: a contraction's operand
        if not is_contraction(e) or any(slot not in (0, 1) for slot, _ in e.prologue):
            return "a prologue must transform input 0 or 1 of a contraction"
        for slot, body in e.prologue:
            why = why or check_body(body, len(e.inputs))
            axes = set(e.inputs[slot].axis_set)
            if why is None and any(not set(e.inputs[k].axis_set) <= axes
                                   for k in body_inputs(body) if k != 1 - slot):
                why = "a prologue's inputs must index a subset of its operand's axes"
            elif why is None and 1 - slot in body_inputs(body):
                why = "a prologue must not read the other operand of its matmul"
    return why



def _check_chip(p: Program, chip: Chip) -> None:
    if p.cores != chip.cores:
        raise ProgramError(f"the program is for {p.cores} cores, chip {chip.name} has "
                           f"{chip.cores}")
    if chip.is_mesh and chip.rows * chip.cols < chip.cores:
        raise ProgramError(f"chip {chip.name}'s grid has fewer positions than cores")
    for b in p.buffers:
        if b.offset + b.nbytes > chip.sram_bytes_per_core:
            raise ProgramError(f"buffer %{b.name} [{b.offset}, {b.offset + b.nbytes}) lies "
                               f"outside the {chip.sram_bytes_per_core}-byte SRAM of {chip.name}")


# -- tables -----------------------------------------------------------------------------------
def _table(name: str, a: object, shape: tuple[int | None, ...]) -> np.ndarray:
    """``a`` as an integer array of ``shape`` (None: any length)."""
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
        raise _Bad(f"{name} is not an integer table")
    if a.ndim != len(shape) or any(s is not None and s != t for s, t in zip(shape, a.shape)):
        want = "x".join("*" if s is None else str(s) for s in shape)
        raise _Bad(f"{name} has shape {'x'.join(map(str, a.shape)) or 'scalar'}, not {want}")
    return a


def _within(name: str, a: np.ndarray, low: int, high: int, what: str) -> None:
    """Every value of ``a`` in [low, high)."""
    if a.size and (int(a.min()) < low or int(a.max()) >= high):
        bad = int(a.min()) if int(a.min()) < low else int(a.max())
        raise _Bad(f"{name} holds {bad}, outside {what} [{low}, {high})")


def _buf(p: Program, name: str, b: object) -> int:
    if type(b) is not int or not 0 <= b < len(p.buffers):
        raise _Bad(f"{name} buffer {b!r} does not exist (the program has {len(p.buffers)})")
    return b


def _rows(p: Program, ins: Instr, n: int) -> None:
    """The ``n`` table rows stand for cores 0..n-1, or for the listed ``cores``."""
    cores = getattr(ins, "cores", None)
    if cores is None:
        if n > p.cores:
            raise _Bad(f"its tables have {n} rows for {p.cores} cores")
        return
    _table("cores", cores, (n,))
    _within("cores", cores, 0, p.cores, "the cores")
    if len(np.unique(cores)) != n:
        raise _Bad("cores lists a core twice")


def _sources(p: Program, name: str, a: np.ndarray, padding: bool = False) -> None:
    _within(name, a, -1 if padding else 0, p.cores, "the cores" + (" (or -1)" if padding
                                                                    else ""))


def _shape(name: str, s: object) -> tuple[int, ...]:
    if not isinstance(s, tuple) or not all(type(x) is int and x >= 0 for x in s):
        raise _Bad(f"{name} {s!r} is not a shape")
    return s


# -- one checker per instruction class ------------------------------------------------------
def _alloc(p: Program, ins: Alloc | Free) -> None:
    _buf(p, "its", ins.buf)


def _sync(p: Program, ins: Sync) -> None:
    pass


def _load(p: Program, ins: Load) -> None:
    b = p.buffers[_buf(p, "destination", ins.buf)]
    if not isinstance(ins.tensor, str):
        raise _Bad("its tensor is not a name")
    shape, tile = _shape("tensor shape", ins.shape), _shape("tile", ins.tile)
    if len(tile) != len(shape) and not ins.indexed:
        raise _Bad(f"tile {tile} and tensor shape {shape} differ in rank")
    if math.prod(tile) != b.elems:
        raise _Bad(f"tile {tile} has {math.prod(tile)} elements, buffer %{b.name} {b.elems}")
    origin = _table("origin", ins.origin, (None, len(tile)))
    n = len(origin)
    _within("origin", origin, -COORD_LIMIT, COORD_LIMIT, "the coordinates")
    if ins.index is not None:
        index = _table("index", ins.index, (n, b.elems))
        _within("index", index, -1, max(math.prod(shape), 0), "the tensor's elements (or -1)")
    if ins.pat is not None:
        if ins.index is not None:
            raise _Bad("it has both an index table and a pattern")
        pat = _pattern(ins, b.elems, max(math.prod(shape), 0), 1)
        if pat.rows != n:
            raise _Bad(f"its pattern has {pat.rows} rows, its origin table {n}")
    if ins.perm or ins.src_shape:
        src = _shape("transposed shape", ins.src_shape)
        if ins.indexed:
            raise _Bad("it reads through a transpose and gives its elements one by one")
        if sorted(ins.perm) != list(range(len(src))) or math.prod(src) != math.prod(shape):
            raise _Bad(f"transpose {ins.perm} of shape {src} does not read as {shape}")
    _rows(p, ins, n)


def _pattern(ins: Exchange | Load, elems: int, src_elems: int, cores: int) -> Pattern:
    """The instruction's copy pattern, checked: its rows cover ``elems`` destination elements
    exactly, from within ``src_elems`` source elements of cores that exist."""
    parts = (_table("pat", ins.pat, (None,)), _table("pat_start", ins.pat_start, (None,)),
             _table("runs", ins.runs, (None, 4)))
    p = Pattern(*parts)
    wrong = check(p, elems, src_elems, cores)
    if wrong:
        raise _Bad(wrong)
    return p


def _fill(p: Program, ins: Fill) -> None:
    _buf(p, "destination", ins.buf)
    if not isinstance(ins.value, int | float) or isinstance(ins.value, bool) \
            or math.isnan(ins.value):
        raise _Bad(f"fill value {ins.value!r} is not a number")
    if type(ins.ncores) is not int or ins.ncores < 0:
        raise _Bad(f"ncores {ins.ncores!r} is not a core count")
    _rows(p, ins, ins.ncores)


def _exchange(p: Program, ins: Exchange) -> None:
    dst = p.buffers[_buf(p, "destination", ins.dst)]
    src = p.buffers[_buf(p, "source", ins.src)]
    if ins.pat is not None:
        if ins.src_core is not None or ins.src_off is not None:
            raise _Bad("it has both an element table and a pattern")
        _rows(p, ins, _pattern(ins, dst.elems, src.elems, p.cores).rows)
        return
    core = _table("src_core", ins.src_core, (None, dst.elems))
    off = _table("src_off", ins.src_off, core.shape)
    _sources(p, "src_core", core, padding=True)
    _within("src_off", off[core >= 0], 0, src.elems, f"buffer %{src.name}")
    _rows(p, ins, len(core))


def _shift(p: Program, ins: Shift) -> None:
    dst = p.buffers[_buf(p, "destination", ins.dst)]
    src = p.buffers[_buf(p, "source", ins.src)]
    if src.elems != dst.elems:
        raise _Bad(f"shifts %{src.name} ({src.elems} elements) into %{dst.name} "
                   f"({dst.elems})")
    core = _table("src_core", ins.src_core, (None,))
    _sources(p, "src_core", core)
    _rows(p, ins, len(core))


def _reduce(p: Program, ins: Reduce) -> None:
    dst = p.buffers[_buf(p, "destination", ins.dst)]
    src = p.buffers[_buf(p, "source", ins.src)]
    if ins.combine not in COMBINES:
        raise _Bad(f"unknown combine {ins.combine!r}")
    group = _table("group", ins.group, (None, None))
    if group.shape[1] < 1:
        raise _Bad("its groups are empty")
    _sources(p, "group", group)
    offset = _table("offset", ins.offset, (len(group),))
    _within("offset", offset, 0, max(src.elems, group.shape[1] * dst.elems) + 1,
            f"buffer %{src.name}")
    if ins.sizes is not None:
        _within("sizes", _table("sizes", ins.sizes, (len(group),)), 0, dst.elems + 1,
                f"the chunk of %{dst.name}")
    _rows(p, ins, len(group))


def _compute(p: Program, ins: Compute) -> None:
    if type(ins.expr) is not int or not 0 <= ins.expr < len(p.exprs):
        raise _Bad(f"expression {ins.expr!r} does not exist (the program has {len(p.exprs)})")
    expr = p.exprs[ins.expr]
    if not isinstance(ins.ins, tuple) or len(ins.ins) != len(expr.inputs):
        raise _Bad(f"{expr.name} has {len(expr.inputs)} inputs, the instruction names "
                   f"{len(ins.ins) if isinstance(ins.ins, tuple) else ins.ins!r}")
    bufs = [p.buffers[_buf(p, f"input {k}", b)] for k, b in enumerate(ins.ins)]
    bufs.append(p.buffers[_buf(p, "output", ins.out)])
    sub = _shape("sub-task", ins.sub)
    if len(sub) != len(expr.axes) or any(not 1 <= s <= e for s, (_, e) in zip(sub, expr.axes)):
        raise _Bad(f"sub-task {sub} does not fit the axes {dict(expr.axes)}")
    if type(ins.accumulate) is not bool or (ins.accumulate and expr.combine is None):
        raise _Bad(f"accumulate {ins.accumulate!r} is not possible for {expr.name}")
    if not isinstance(ins.tiles, tuple) or len(ins.tiles) != len(bufs) \
            or not isinstance(ins.offsets, tuple) or len(ins.offsets) != len(bufs):
        raise _Bad(f"it needs a tile and an offset table for each of {len(bufs)} operands")
    origin = _table("origin", ins.origin, (None, len(expr.axes)))
    n = len(origin)
    _within("origin", origin, 0, COORD_LIMIT, "the coordinates")
    sizes = dict(zip(expr.axis_names, sub))
    for k, (operand, b) in enumerate(zip(expr.operands, bufs)):
        tile = _shape(f"operand {k}'s tile", ins.tiles[k])
        if len(tile) != len(operand.axes) or math.prod(tile) != b.elems:
            raise _Bad(f"operand {k}'s tile {tile} does not match %{b.name} ({b.elems} "
                       f"elements, {len(operand.axes)} dimensions)")
        off = _table(f"operand {k}'s offsets", ins.offsets[k], (n, len(tile)))
        for d, (dim, t) in enumerate(zip(operand.axes, tile)):
            if isinstance(dim, Window):
                size = sum(c * (sizes[a] - 1) for a, c in dim.terms) + 1
            else:
                size = t if dim == INDIRECT else sizes[dim]
            _within(f"operand {k}'s offsets (dimension {d})", off[:, d], 0, t - size + 1,
                    f"its {t}-element tile for a {size}-element block")
    _rows(p, ins, n)


def _store(p: Program, ins: Store) -> None:
    src = p.buffers[_buf(p, "source", ins.src)]
    if not isinstance(ins.tensor, str):
        raise _Bad("its tensor is not a name")
    shape = _shape("tensor shape", ins.shape)
    if ins.index is None:
        core = _table("src_core", ins.src_core, (math.prod(shape),))
    else:  # the stored elements only: their places in the tensor, and where they are held
        index = _table("index", ins.index, (None,))
        _within("index", index, 0, math.prod(shape), f"the {math.prod(shape)}-element tensor")
        core = _table("src_core", ins.src_core, index.shape)
    off = _table("src_off", ins.src_off, core.shape)
    _sources(p, "src_core", core)
    _within("src_off", off, 0, src.elems, f"buffer %{src.name}")
    if ins.base and ins.base not in p.inputs:
        raise _Bad(f"its base {ins.base!r} is not an input of the program")


def _dma_store(p: Program, ins: DmaStore) -> None:
    _store(p, ins)
    if ins.dtype not in DTYPE_BYTES:
        raise _Bad(f"its dtype {ins.dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    if ins.cores is not None:
        _sources(p, "cores", _table("cores", ins.cores, (None,)))


def _dma_wait(p: Program, ins: DmaWait) -> None:
    _buf(p, "its", ins.buf)


_CHECKS: dict[type[Instr], Callable[[Program, Any], None]] = {
    Alloc: _alloc, Free: _alloc, Load: _load, Fill: _fill, Exchange: _exchange, Shift: _shift,
    Reduce: _reduce, Compute: _compute, Sync: _sync, Store: _store, DmaLoad: _load,
    DmaStore: _dma_store,
    DmaWait: _dma_wait}


def load_program(directory: Path) -> Program:
    """Read a program written by `Program.save` and verify it without a chip
    (`verify_program`): a program read from disk is never trusted. Raises `ProgramError`."""
    program = Program.parse(Path(directory))
    verify_program(program)
    return program
