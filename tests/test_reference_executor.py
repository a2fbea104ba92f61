"""The vectorised emulator against the per-core reference executor (`emulator/reference.py`).

The reference is the living definition of the instruction semantics; the emulator must compute
the same outputs up to float rounding. The reference itself is pinned by a hand-checked program
and by onnxruntime on the compiled models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest

from t10c.chips import PRESETS, Chip
from t10c.codegen.program import (
    Alloc,
    Buffer,
    Exchange,
    Load,
    Program,
    Reduce,
    Shift,
    Store,
)
from t10c.driver import (
    TOLERANCE,
    CompileOptions,
    compile_model,
    make_inputs,
    max_rel_err,
    reference,
)
from t10c.emulator import emulate
from t10c.emulator.reference import run_reference

MIB = 1024 * 1024


@dataclass(frozen=True)
class Case:
    model: str
    cores: int
    dtype: str
    batch: int | None = None
    seq_len: int | None = None
    sram_mib: int = 1  # test16 has 1 MiB; 7-core mlp and fp32 bert-tiny need 2
    tolerance: float = 1e-6  # max |emulator - reference| over max |reference|

    @property
    def chip(self) -> Chip:
        base = PRESETS["test16"]
        grid = base.grid if self.cores == base.cores else (1, self.cores)
        return dataclasses.replace(base, cores=self.cores, grid=grid,
                                   sram_bytes_per_core=self.sram_mib * MIB)


CASES = [
    Case("mlp", 16, "fp32", batch=2),
    Case("mlp", 7, "fp32", batch=2, sram_mib=2),
    Case("bert-tiny", 16, "fp32", seq_len=8, sram_mib=2),
    Case("bert-tiny", 16, "fp16", seq_len=8, tolerance=1e-3),  # about one fp16 ulp
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.model}-{c.cores}c-{c.dtype}")
def test_emulator_matches_reference(case: Case) -> None:
    c = compile_model(case.model, case.chip,
                      CompileOptions(dtype=case.dtype, batch=case.batch, seq_len=case.seq_len))
    inputs = make_inputs(c.graph, seed=0)
    got, _, _ = emulate(c.program, c.chip, inputs, c.graph.constants)
    want = run_reference(c.program, c.chip, inputs, c.graph.constants)
    assert set(got) == set(want) == set(c.program.outputs)
    for name in want:
        assert got[name].shape == want[name].shape
        assert np.isfinite(want[name]).all(), f"{name}: non-finite (an element never written?)"
    assert max_rel_err(got, want) <= case.tolerance
    ort, _ = reference(c.model, inputs)
    assert max_rel_err(want, ort) <= TOLERANCE[case.dtype]


def _hand_program(chip: Chip) -> Program:
    """Load with padding, Exchange with a hole, Shift, Reduce(max) reading past its source."""
    bufs = (Buffer(0, "a", 3, "fp32", 0), Buffer(1, "b", 3, "fp32", 16),
            Buffer(2, "s", 3, "fp32", 32), Buffer(3, "r", 2, "fp32", 48))
    nxt = (np.arange(4) + 1) % 4
    instrs = (
        *(Alloc("", "", b.id) for b in bufs),
        Load("", "", 0, "x", (4, 3), (3,), np.zeros((4, 1), dtype=np.int32),
             np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, -1]])),
        Exchange("", "", 1, 0, np.stack([nxt, nxt, np.full(4, -1)], axis=1),
                 np.tile([0, 2, 0], (4, 1))),
        Shift("", "", 2, 1, np.array([3, 0, 1, 2])),
        Reduce("", "", 3, 2, "max", np.array([[0, 1], [0, 1], [2, 3], [2, 3]]),
               np.array([0, 2, 0, 2])),
        Store("", "", "y", (4, 2), 3, np.repeat(np.arange(4), 2), np.tile([0, 1], 4)),
    )
    return Program("hand", chip.name, "fp32", 4, bufs, (), instrs, {"x": ((4, 3), "fp32")},
                   ("y",), 64)


def test_hand_checked_program() -> None:
    chip = dataclasses.replace(PRESETS["test16"], cores=4, grid=(2, 2))
    x = {"x": np.arange(1, 13, dtype=np.float32).reshape(4, 3)}
    # a = [1 2 3] [4 5 6] [7 8 9] [10 11 0]; b[c] = [a[c+1][0], a[c+1][2], 0]
    # s[c] = b[c-1] = [1 3 0] [4 6 0] [7 9 0] [10 0 0]; r[c] = max over the pair of s[g][off:off+2]
    want = np.array([[4, 6], [0, -np.inf], [10, 9], [0, -np.inf]], dtype=np.float32)
    program = _hand_program(chip)
    np.testing.assert_array_equal(run_reference(program, chip, x, {})["y"], want)
    np.testing.assert_array_equal(emulate(program, chip, x, {})[0]["y"], want)
