"""The onnx package's generated node tests (``onnx.backend.test.case.node``) for every op
t10c claims, through the whole pipeline: compile for test16 in fp32, emulate, compare with the
case's expected outputs at t10c's fp32 tolerance (`nodecases.run_case`).

A case outside t10c's ops or data types is skipped with the reason (`nodecases.scope`); a case
t10c refuses by design is listed in `REFUSED` with the reason, and must fail with t10c's own
error (a `FrontendError`), never a crash. ``pytest -s -k count`` prints the pass count that
the README states.
"""

from __future__ import annotations

import pytest
from nodecases import CHIP, all_cases, ops_of, run_case, scope

#: case -> a fragment of t10c's error: the cases t10c refuses by design, and why
REFUSED = {
    # training mode: the running statistics outputs are training state
    "test_batchnorm_epsilon_training_mode": "training mode",
    "test_batchnorm_example_training_mode": "training mode",
    # a float Range's length depends on run-time inputs: a dynamic shape
    "test_range_float_type_positive_delta": "must be known at compile time",
    # zero-size outputs: nothing to compute, and t10c writes no empty tensors
    "test_reduce_sum_empty_set_non_reduced_axis_zero": "zero-size",
    "test_reshape_allowzero_reordered": "zero-size",
    "test_shape_start_greater_than_end": "zero-size",
    "test_slice_start_out_of_bounds": "zero-size",
    "test_split_zero_size_splits_opset13": "zero-size",
    "test_split_zero_size_splits_opset18": "zero-size",
}

#: cases whose expected outputs the generator wrote with four decimals: compared at the
#: case's own relative tolerance (t10c's result is the exact average, 0.15106 for 0.1511)
ROUNDED = {"test_averagepool_2d_ceil_last_window_starts_on_pad": 1e-3}

CASES = sorted(all_cases())
_results: dict[str, str] = {}


@pytest.mark.parametrize("name", CASES)
def test_node_case(name: str) -> None:
    case = all_cases()[name]
    why = scope(case)
    if why is not None:
        assert name not in REFUSED, f"{name} is refused by design but out of scope: {why}"
        pytest.skip(why)
    status, detail = run_case(case, ROUNDED.get(name))
    _results[name] = status
    if name in REFUSED:
        assert status == "refused" and REFUSED[name] in detail, detail
    else:
        assert status == "pass", detail


def test_node_case_count() -> None:
    """Every claimed case runs (those not yet run here are run now) and the count is printed."""
    claimed = [n for n in CASES if scope(all_cases()[n]) is None]
    for name in claimed:
        if name not in _results:
            _results[name] = run_case(all_cases()[name], ROUNDED.get(name))[0]
    passed = [n for n in claimed if _results[n] == "pass"]
    ops = {op for n in claimed for op in ops_of(all_cases()[n].model)}
    passed_ops = ops - {op for n in claimed if _results[n] != "pass"
                        for op in ops_of(all_cases()[n].model)}
    print(f"\nonnx node tests on {CHIP.name} (fp32): {len(passed)} of {len(claimed)} cases pass "
          f"({len(CASES) - len(claimed)} outside t10c's ops or data types skipped), "
          f"{len(REFUSED)} refused by design; {len(passed_ops)} of {len(ops)} ops pass every "
          "case")
    assert len(claimed) > 500
    assert sorted(set(claimed) - set(passed)) == sorted(REFUSED)
