"""Weight fetches on a mesh priced as routed (`partition.transitions.route_fetches`): a
mesh plan that fetches its weights from their idle layouts (vgm's warm-up of every weight, an
epilogue's bias) has the fetch out of its own cycles and in its re-layout phase, routed as
codegen emits it (a bias broadcast over the result's rows travels one tree per distinct
table), on meshes with DRAM as without; the prediction equals the emulated cycles, and the
outputs are onnxruntime's."""

from __future__ import annotations

import pytest

from t10c.chips import chip_from_dict
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.models.bert import build_bert
from t10c.models.llama import build_llama_decode
from t10c.partition.plan import geometry
from t10c.partition.space import tensor_sets
from t10c.partition.transitions import Views, fetch_estimate, fetches
from t10c.strategies import search_options

MESH = chip_from_dict({"base": "wse2", "name": "mesh8x12", "grid": [8, 12], "cores": 96})
#: the same mesh for the bias case, whose epilogue weights are fetched as on a mesh with DRAM
#: (`cost.fetches_epilogue_weights`: on a mesh without DRAM they stay resident instead); a
#: chip of its own, so that no cached search carries the patched rule to other tests
FETCHING = chip_from_dict({"base": "wse2", "name": "mesh8x12-fetching", "grid": [8, 12],
                           "cores": 96})
#: a mesh with DRAM (GDDR at its edge), where epilogue weights are fetched by the rule itself
DRAM_MESH = chip_from_dict({"base": "wormhole-n150", "name": "mesh8x12-dram",
                            "topology": "mesh2d", "grid": [8, 12], "cores": 96})

MODELS = {
    # every weight warmed up from its idle layout
    "vgm-decode": (lambda: build_llama_decode(64, 2, 4, 2, 128, vocab=50, tied=False,
                                              past_len=16, name="decode2"), "vgm", MESH),
    # biases (epilogue weights) fetched beside the result
    "t10-bert": (lambda: build_bert(32, 1, 2, 64, vocab=40, max_pos=16, seq_len=8,
                                    name="bert-small"), "t10", FETCHING),
    # the same, on a mesh with DRAM: one barrier for the re-layout and the fetch
    "t10-bert-dram": (lambda: build_bert(32, 1, 2, 64, vocab=40, max_pos=16, seq_len=8,
                                         name="bert-small"), "t10", DRAM_MESH),
}


@pytest.mark.parametrize("case", sorted(MODELS))
def test_fetches_are_routed_and_priced_as_emulated(case: str, monkeypatch) -> None:
    from t10c.codegen import lower
    from t10c.partition import cost, transitions

    build, strategy, chip = MODELS[case]
    if chip is FETCHING:
        for module in (cost, transitions, lower):
            monkeypatch.setattr(module, "fetches_epilogue_weights", lambda c: c.cores > 1)
    opts = CompileOptions(dtype="fp32", search=search_options(strategy))
    compiled = compile_model(build(), chip, opts)
    graph, plan = compiled.graph, compiled.plan
    ints = tensor_sets(graph)[0]
    fetching = [i for i, p in enumerate(plan.ops) if fetches(graph, i, p, chip)]
    assert fetching, "the case has ops that fetch weights"
    consts = Views(graph).const_tensors()
    for i in fetching:  # the estimate left the plan's cycles; the fetch is in its phase
        p = plan.ops[i]
        shift, sync = fetch_estimate(geometry(graph, graph.ops[i], p), chip, "fp32", ints,
                                     consts, p.home)
        assert shift > 0 and sync == chip.sync_cycles
        assert plan.relayout_cycles[i] > 0
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err
    fetched = {r.op for r in result.timeline.records if r.phase == "fetch" and r.cycles}
    assert {graph.ops[i].name for i in fetching} <= fetched
    assert result.timeline.cycles == plan.total_cycles
