"""Test tiers: every test gets one tier marker from the table below, by its module, so that a
change's test cost is visible and a tier can be run alone (`pytest -m unit`, `-m ops`,
`-m e2e`; `-m slow` runs the whole-model tests the default run leaves out).

- unit: one function or type at a time, on hand-made inputs (seconds in all);
- ops: single ONNX ops and generated node cases through the whole pipeline, against
  onnxruntime or the onnx package's expected outputs;
- e2e: whole models and the command line, end to end.

Property tests (hypothesis) draw new examples on every run, except under CI (the environment
variable ``CI`` set, as `.ci/run` does), where they draw the same ones: a submission's check
does not depend on luck, and local runs keep looking for new failures.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

#: the tier of each test module; a module missing here fails the collection (add it)
TIERS: dict[str, str] = {
    "test_bench": "e2e", "test_bounds": "e2e", "test_check": "e2e", "test_chips": "unit",
    "test_cli": "e2e", "test_compile_speed": "unit", "test_heap": "unit", "test_forked": "e2e",
    "test_timing_pipe": "e2e",
    "test_siblings": "e2e",
    "test_constant_outputs": "ops", "test_decode": "e2e", "test_determinism": "e2e",
    "test_dram": "e2e", "test_pods": "e2e",
    "test_emulator_speed": "unit", "test_expressions": "unit", "test_fixtures": "e2e",
    "test_fusion": "e2e", "test_graphcheck": "unit",
    "test_layers": "unit",
    "test_routed_fetches": "e2e",
    "test_light_models": "e2e", "test_loader": "unit", "test_memory": "unit",
    "test_merged_phases": "e2e", "test_mesh": "e2e", "test_models": "unit",
    "test_multicast": "e2e", "test_onnx_backend": "ops",
    "test_onnx_node": "ops", "test_ops": "ops", "test_ops_layout": "ops", "test_ops_nn": "ops",
    "test_outputs": "e2e", "test_pipeline": "e2e", "test_planfile": "e2e",
    "test_plan_override": "e2e", "test_plan_space": "e2e",
    "test_planner": "unit", "test_program_files": "e2e", "test_progress": "e2e",
    "test_prologue": "e2e", "test_quantize": "e2e",
    "test_reference_executor": "unit", "test_registry": "unit",
    "test_recalibrated": "e2e", "test_relayout": "e2e", "test_report": "e2e",
    "test_reduced": "unit", "test_run_dir": "e2e", "test_solver": "unit",
    "test_strategies": "unit", "test_sweep": "e2e",
    "test_trace": "e2e", "test_wafer_collectives": "e2e", "test_zoo": "e2e",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = set()
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        tier = TIERS.get(module)
        if tier is None:
            missing.add(module)
            continue
        item.add_marker(getattr(pytest.mark, tier))
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: give {', '.join(sorted(missing))} a tier "
                                f"in TIERS (unit, ops or e2e)")
