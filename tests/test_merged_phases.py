"""Merged re-layout phases (`partition.transitions.merged_phases`): an op whose inputs were
all computed before an earlier op's re-layout phase receives them there, when that is
cheaper, and opens no phase of its own; priced so, generated so (its exchanges are the
carrier's, into buffers named for it), emulated so, the outputs onnxruntime's, and a
timing-only run with repeated layers replayed gives the same cycles."""

from __future__ import annotations

import pytest

from t10c.chips import PRESETS, chip_from_dict
from t10c.codegen.program import Exchange, Sync
from t10c.driver import CompileOptions, compile_model, run_compiled, time_only
from t10c.models.llama import build_llama_decode
from t10c.partition.space import tensor_sets
from t10c.partition.transitions import merged_phases

MESH8 = chip_from_dict({"base": "wse2", "name": "mesh8", "grid": [8, 8], "cores": 64})
CHIPS = {"ipu-mk2": PRESETS["ipu-mk2"], "mesh8": MESH8}


def _decode(layers: int):
    return build_llama_decode(64, layers, 4, 2, 128, vocab=50, tied=False, past_len=16,
                              name=f"decode{layers}")


@pytest.mark.parametrize("chip", sorted(CHIPS))
def test_merged_phases_are_priced_emulated_and_correct(chip: str, monkeypatch) -> None:
    import t10c.codegen.lower as lower

    c = CHIPS[chip]
    compiled = compile_model(_decode(2), c, CompileOptions(dtype="fp32"))
    graph, plan = compiled.graph, compiled.plan
    ints = tensor_sets(graph)[0]
    merged = merged_phases(graph, plan.ops, c, "fp32", ints)
    assert merged, "LLaMA's k projection (or rotary, or value cache) joins an earlier phase"
    names = [op.name for op in graph.ops]
    instrs = compiled.program.instrs
    for m, n in merged.items():
        assert n < m and plan.relayout_cycles[m] == 0
        # no barrier of its own; its inputs arrive by the carrier's exchanges
        assert not any(isinstance(ins, Sync) and ins.op == names[m] and ins.phase == "relayout"
                       for ins in instrs)
        assert any(isinstance(ins, Exchange) and ins.op == names[n]
                   and compiled.program.buffers[ins.dst].name.startswith(f"{names[m]}.in")
                   for ins in instrs)
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err
    assert result.timeline.cycles == plan.total_cycles  # priced as emulated
    # the same plans generated with every op in its own phase emulate slower
    monkeypatch.setattr(lower, "merged_phases", lambda *a, **k: {})
    apart = run_compiled(compile_model(_decode(2), c, CompileOptions(dtype="fp32")))
    assert apart.ok and apart.timeline.cycles > result.timeline.cycles


@pytest.mark.parametrize("chip", sorted(CHIPS))
def test_merged_phases_replay_in_a_timing_only_run(chip: str) -> None:
    """Four layers: the streamed run replays the repeated ones, carriers and carried ops
    alike, and gives the functional run's cycles."""
    c = CHIPS[chip]
    compiled = compile_model(_decode(4), c, CompileOptions(dtype="fp32"))
    assert merged_phases(compiled.graph, compiled.plan.ops, c, "fp32",
                         tensor_sets(compiled.graph)[0])
    functional = run_compiled(compiled)
    _, _, streamed = time_only(compiled.graph, compiled.plan, c)
    assert streamed.cycles == functional.timeline.cycles == compiled.plan.total_cycles
