"""The reference executor: a `Program` run one core at a time, plainly and slowly.

This is the living definition of the instruction semantics documented in
`t10c.codegen.program`; the vectorised emulator (`machine.py`) is checked against it in
``tests/test_reference_executor.py``. Keep it obviously correct rather than fast: each core holds
a dict of 1-D buffers, and every instruction is a Python loop over cores with plain numpy per
core. Buffers keep their dtype (fp16, fp32, int32) and arithmetic is float32, as in the emulator.
An allocated buffer's contents are undefined: the emulator zero-fills it, the reference poisons it
(NaN, or the most negative int32), so a program that reads an element it never wrote cannot agree
with the emulator by accident. There is no timing and no SRAM or link checking.

    outputs = run_reference(program, chip, inputs, constants)
"""

from __future__ import annotations

import numpy as np

from t10c.chips import Chip
from t10c.codegen.program import (
    Alloc,
    Compute,
    Exchange,
    Fill,
    Free,
    Instr,
    Load,
    Program,
    Reduce,
    Shift,
    Store,
    Sync,
)
from t10c.dtypes import DTYPES

from .kernels import IDENTITY, evaluate, operand_sizes

NP_DTYPES = {name: d.numpy for name, d in DTYPES.items()}
POISON = {name: d.poison for name, d in DTYPES.items()}
COMBINE = {"sum": np.add, "max": np.maximum}

Memory = list[dict[int, np.ndarray]]  # per core: buffer id -> 1-D array


def run_reference(program: Program, chip: Chip, inputs: dict[str, np.ndarray],
                  constants: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``program`` core by core; returns the stored outputs (float32, graph shapes)."""
    if program.cores != chip.cores:
        raise ValueError(f"program is for {program.cores} cores, chip {chip.name} has "
                         f"{chip.cores}")
    host = {**constants, **inputs}
    mem: Memory = [{} for _ in range(chip.cores)]
    outputs: dict[str, np.ndarray] = {}
    for n, ins in enumerate(program.instrs):
        try:
            _step(program, mem, host, outputs, ins)
        except Exception as exc:
            raise RuntimeError(f"while executing instruction {n} ({type(ins).__name__} of op "
                               f"{ins.op or '-'}): {exc}") from exc
    return outputs


def _step(program: Program, mem: Memory, host: dict[str, np.ndarray],
          outputs: dict[str, np.ndarray], ins: Instr) -> None:
    cores = range(len(mem))
    if isinstance(ins, Alloc):
        b = program.buffers[ins.buf]
        for c in cores:
            mem[c][ins.buf] = np.full(b.elems, POISON[b.dtype], dtype=NP_DTYPES[b.dtype])
    elif isinstance(ins, Free):
        for c in cores:
            del mem[c][ins.buf]
    elif isinstance(ins, Sync):
        pass
    elif isinstance(ins, Load):
        value = np.asarray(host[ins.tensor])
        flat = value.reshape(-1)
        for c in range(ins.ncores):
            if ins.index is not None:
                idx = ins.index[c]
                mem[c][ins.buf][:] = np.where(idx >= 0, flat[np.maximum(idx, 0)], 0)
                continue
            # the tile at origin[c], cut at the tensor's edge, zero beyond it
            block = np.zeros(ins.tile, dtype=mem[c][ins.buf].dtype)
            start = ins.origin[c]
            part = value[tuple(slice(int(s), int(s) + t) for s, t in zip(start, ins.tile))]
            block[tuple(slice(0, n) for n in part.shape)] = part
            mem[c][ins.buf][:] = block.reshape(-1)
    elif isinstance(ins, Fill):
        for c in range(ins.ncores):
            mem[c][ins.buf][:] = ins.value
    elif isinstance(ins, Exchange):
        # every core reads before any core writes (dst may be src)
        new = []
        for c in range(len(ins.src_core)):
            vals = np.zeros_like(mem[c][ins.dst])
            for s in np.unique(ins.src_core[c]):
                if s >= 0:
                    here = ins.src_core[c] == s
                    vals[here] = mem[s][ins.src][ins.src_off[c][here]]
            new.append(vals)
        for c, vals in enumerate(new):
            mem[c][ins.dst][:] = vals
    elif isinstance(ins, Shift):
        new = [mem[s][ins.src].copy() for s in ins.src_core]
        for c, vals in enumerate(new):
            mem[c][ins.dst][:] = vals
    elif isinstance(ins, Reduce):
        chunk = program.buffers[ins.dst].elems
        new = []
        for c in range(len(ins.group)):
            start = int(ins.offset[c])
            total = np.full(chunk, IDENTITY[ins.combine], dtype=np.float32)
            for g in ins.group[c]:
                part = np.full(chunk, IDENTITY[ins.combine], dtype=np.float32)
                have = mem[g][ins.src][start: start + chunk]  # identity past the end
                part[: len(have)] = have
                total = COMBINE[ins.combine](total, part)
            new.append(total)
        for c, vals in enumerate(new):
            mem[c][ins.dst][:] = vals
    elif isinstance(ins, Compute):
        _compute(program, mem, ins)
    elif isinstance(ins, Store):
        core, off = ins.src_core.reshape(-1), ins.src_off.reshape(-1)
        out = np.full(core.size, np.nan, dtype=np.float32)  # NaN: stored by no core
        for c in cores:
            mine = core == c
            out[mine] = mem[c][ins.src][off[mine]]
        outputs[ins.tensor] = out.reshape(ins.shape)
    else:
        raise TypeError(f"unknown instruction {type(ins).__name__}")


def _compute(program: Program, mem: Memory, ins: Compute) -> None:
    expr = program.exprs[ins.expr]
    sub = dict(zip(expr.axis_names, ins.sub))
    buffers = (*ins.ins, ins.out)

    def block(c: int, k: int) -> tuple[np.ndarray, tuple[slice, ...]]:
        """Core c's operand k as its tile (a view), and the slices of its sub-task."""
        tile = mem[c][buffers[k]].reshape(ins.tiles[k])
        sizes = operand_sizes(expr, k, sub, tile.shape)
        region = tuple(slice(int(o), int(o) + s) for o, s in zip(ins.offsets[k][c], sizes))
        if tile[region].shape != tuple(sizes):
            raise IndexError(f"operand {k} block {region} falls outside its tile {tile.shape}")
        return tile, region

    for c in range(len(ins.origin)):
        values = []
        for k in range(len(ins.ins)):
            tile, region = block(c, k)
            values.append(tile[region][None])  # a core axis of size 1 for `evaluate`
        result = evaluate(expr, values, sub, ins.origin[c: c + 1])[0]
        out, region = block(c, len(ins.ins))
        if ins.accumulate:
            if expr.combine is None:
                raise ValueError(f"accumulates into {expr.name}, which has no combine")
            result = COMBINE[expr.combine](out[region].astype(np.float32), result)
        out[region] = result
