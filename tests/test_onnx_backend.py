"""The test models shipped inside the onnx package (``onnx/backend/test/data/pytorch-converted``
and ``pytorch-operator``: PyTorch exports at opsets 6 to 12, each with inputs and expected
outputs), compiled for the IPU MK2 and emulated.

Every case whose ops t10c supports must match the expected outputs (fp32 storage, relative
error under 1e-4); the others must fail with the documented reason (`UNSUPPORTED`, also listed
in the README). ``pytest -s`` shows the count.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model
from t10c.emulator import emulate
from t10c.frontend import FrontendError

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
CASES = sorted(glob.glob(os.path.join(DATA, "pytorch-converted", "*"))
               + glob.glob(os.path.join(DATA, "pytorch-operator", "*")))
CHIP = PRESETS["ipu-mk2"]
TOLERANCE = 1e-4

#: case -> a fragment of the error: the cases t10c does not compile, and why
UNSUPPORTED = {
    # t10c computes in float32 (fp16 storage by default); float64 models are not converted
    "test_operator_add_broadcast": "float64",
    "test_operator_add_size1_broadcast": "float64",
    "test_operator_add_size1_right_broadcast": "float64",
    "test_operator_add_size1_singleton_broadcast": "float64",
    "test_operator_addconstant": "float64",
}

_results: dict[str, str] = {}


def run_case(path: str) -> tuple[str, str]:
    """("pass" | "fail" | "unsupported", detail) for one case directory."""
    model = onnx.load(os.path.join(path, "model.onnx"))
    data = os.path.join(path, "test_data_set_0")
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    inputs = [numpy_helper.to_array(onnx.load_tensor(f))
              for f in sorted(glob.glob(os.path.join(data, "input_*.pb")))]
    wants = [numpy_helper.to_array(onnx.load_tensor(f))
             for f in sorted(glob.glob(os.path.join(data, "output_*.pb")))]
    try:
        compiled = compile_model(model, CHIP, CompileOptions(dtype="fp32"))
    except FrontendError as exc:
        return "unsupported", str(exc)
    outputs, _, _ = emulate(compiled.program, CHIP, dict(zip(names, inputs)),
                            compiled.graph.constants)
    worst = 0.0
    for out, want in zip(model.graph.output, wants):
        got = outputs[out.name].astype(np.float64)
        if got.shape != want.shape:
            return "fail", f"{out.name}: shape {got.shape}, expected {want.shape}"
        nan = np.isnan(want)  # sqrt and pow of negative inputs: NaN where the reference has it
        if (np.isnan(got) != nan).any() or not np.isfinite(got[~nan]).all():
            return "fail", f"{out.name}: NaN or infinity where the reference has none"
        scale = max(float(np.abs(want[~nan]).max(initial=0.0)), 1e-30)
        worst = max(worst, float(np.abs(got - want)[~nan].max(initial=0.0)) / scale)
    return ("pass" if worst <= TOLERANCE else "fail"), f"max relative error {worst:.2e}"


def test_the_onnx_package_has_the_cases() -> None:
    assert len(CASES) > 100


@pytest.mark.parametrize("path", CASES, ids=os.path.basename)
def test_backend_model(path: str) -> None:
    name = os.path.basename(path)
    status, detail = run_case(path)
    _results[name] = status
    if name in UNSUPPORTED:
        assert status == "unsupported" and UNSUPPORTED[name] in detail, detail
    else:
        assert status == "pass", detail


def test_backend_pass_count() -> None:
    for path in CASES:
        name = os.path.basename(path)
        if name not in _results:
            _results[name] = run_case(path)[0]
    passed = sum(s == "pass" for s in _results.values())
    print(f"\nonnx backend test models: {passed} of {len(_results)} pass on {CHIP.name}; "
          f"unsupported: {', '.join(sorted(n for n, s in _results.items() if s != 'pass'))}")
    assert passed == len(_results) - len(UNSUPPORTED)
