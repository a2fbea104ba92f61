"""t10's plan space contains the baselines' (`partition/space.py`), so its plan is never
slower than a baseline's that fits: predicted, by construction, and emulated, on small models
on chips where memory binds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from t10c.chips import PRESETS, load_chip
from t10c.driver import CompileOptions, compile_model, load_source
from t10c.frontend import to_graph
from t10c.partition import DoesNotFitError, SolverOptions, _edges, _front_ids, plan_cost
from t10c.partition import solve as solving
from t10c.partition import space as space_module
from t10c.partition.plan import geometry
from t10c.partition.solve import choose_plans
from t10c.partition.space import baseline_options, space_of, tensor_sets, union
from t10c.partition.tie import tie_classes
from t10c.partition.transitions import Views
from t10c.strategies import search_options

TEST16 = PRESETS["test16"]


def _graph(name: str = "bert-tiny", seq_len: int = 16):
    return to_graph(load_source(name, seq_len=seq_len), name=name)


def test_only_rotating_strategies_take_in_the_baselines() -> None:
    assert len(baseline_options(search_options("t10"))) == 2
    assert len(baseline_options(search_options("all-to-all"))) == 2
    assert baseline_options(search_options("no-rotation")) == ()
    assert baseline_options(search_options("vgm")) == ()


def test_every_baseline_plan_is_a_t10_plan() -> None:
    graph = _graph()
    t10 = search_options("t10")
    spaces = [space_of(graph, TEST16, "fp16", s, 16) for s in (t10, *baseline_options(t10))]
    united, maps = union(spaces)
    for space, where in zip(spaces, maps):
        for i, front in enumerate(space.fronts):
            assert [united.fronts[i][k] for k in where[i]] == list(front)
    # the no-rotation and vgm plans are there, and t10's own space lacks some of them
    norot = {p for f in spaces[1].fronts for p in f}
    assert norot - {p for f in spaces[0].fronts for p in f}
    assert all(not any(p.rot) for f in spaces[1].fronts for p in f)
    # vgm fetches the weights of every op that has some (an op without weights has none)
    _, consts = tensor_sets(graph)
    for op, front in zip(graph.ops, spaces[2].fronts):
        weighted = any(o.tensor in consts for o in op.inputs)
        assert all(p.home == weighted for p in front)
    # the non-warmed-up plans come first (the greedy walks those), fastest first
    for front in united.fronts:
        homes = [p.home for p in front]
        assert homes == sorted(homes)
        plain = [p.cycles.total for p in front if not p.home]
        assert plain == sorted(plain)


@pytest.mark.parametrize("strategy", ["t10", "no-rotation"])
def test_every_front_plan_of_a_weighted_op_has_its_warm_up_twin(strategy: str) -> None:
    """A twin for every plan whose weights kept at home take fewer resident bytes (rotated
    weights are already spread out: they have none), not only for the fastest plan."""
    graph = _graph()
    ints, consts = tensor_sets(graph)
    space = space_of(graph, TEST16, "fp16", search_options(strategy), 16, every_twin=True)
    twinned, beyond_fastest = 0, 0
    for op, front in zip(graph.ops, space.fronts):
        weighted = any(o.tensor in consts for o in op.inputs)
        warm = {(p.F, p.T, p.rot, p.chain): p for p in front if p.home}
        if not weighted:
            assert not warm
            continue
        for p in (p for p in front if not p.home):
            _, _, cold, _ = plan_cost(geometry(graph, op, p), TEST16, "fp16", ints, consts,
                                      weights_home=True)
            twin = warm.get((p.F, p.T, p.rot, p.chain))
            assert (twin is not None) == (cold < p.cold_bytes_per_core), (op.name, p)
            if twin is not None:
                assert twin.cold_bytes_per_core == cold
                twinned += 1
                beyond_fastest += p != front[0]
    if strategy == "t10":  # the LayerNorms' second plans replicate their scale and bias
        assert twinned and beyond_fastest


def test_the_solve_is_never_worse_than_a_start() -> None:
    """With no time to search, the answer is the best of the greedy and the starts."""
    graph = _graph()
    space = space_of(graph, TEST16, "fp16", search_options("t10"), 16)
    fronts = [list(f) for f in space.fronts]
    none = [[0] * len(f) for f in fronts]
    start = tuple(len(f) - 1 if f[-1].home else 0 for f in fronts)
    quick = SolverOptions(time_limit_s=0.0)
    base, _ = choose_plans(graph, fronts, none, [], 10 ** 9, quick)
    assert base is not None
    # the fastest plan everywhere is optimal here (no edges, memory to spare): as a start
    # it wins however short the search
    fastest = tuple(0 for _ in fronts)
    result, _ = choose_plans(graph, fronts, none, [], 10 ** 9, quick, starts=[start, fastest])
    assert result is not None
    assert result.objective_cycles == sum(f[0].cycles.total for f in fronts)
    assert result.objective_cycles <= base.objective_cycles


def _chip(tmp_path: Path, name: str, text: str):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'base = "test16"\nname = "{name}"\n{text}')
    return load_chip(str(path))


#: (model, seq_len, chip file body): memory binds (the default test16 holds bert-tiny only
#: with rotation or replication, vgm needs 2 MiB) and the core count varies
CASES = [
    ("bert-tiny", 16, "sram_bytes_per_core = 614400\n"),
    ("bert-tiny", 16, "sram_bytes_per_core = 2097152\n"),
    ("bert-tiny", 16, "cores = 8\ngrid = [2, 4]\nsram_bytes_per_core = 4194304\n"),
]


@pytest.mark.parametrize("model,seq_len,text", CASES)
def test_t10_is_never_slower_than_a_baseline_that_fits(tmp_path: Path, model: str,
                                                       seq_len: int, text: str) -> None:
    chip = _chip(tmp_path, "bound", text)
    results = {}
    for strategy in ("t10", "no-rotation", "vgm"):
        options = CompileOptions(seq_len=seq_len, search=search_options(strategy),
                                 timing_only=True)
        try:
            c = compile_model(model, chip, options)
        except DoesNotFitError:
            continue
        assert c.timeline is not None
        results[strategy] = (c.plan.solver.objective_cycles, c.timeline.cycles)
    assert "t10" in results and len(results) > 1, results
    predicted, emulated = results["t10"]
    for strategy, (their_predicted, their_emulated) in results.items():
        assert predicted <= their_predicted, (strategy, results)
        assert emulated <= their_emulated, (strategy, results)


def test_the_united_space_is_deterministic() -> None:
    graph = _graph()
    t10 = search_options("t10")
    chip = dataclasses.replace(TEST16, sram_bytes_per_core=600 * 1024)
    a = union([space_of(graph, chip, "fp16", s, 16) for s in (t10, *baseline_options(t10))])
    space_module._FOUND.clear()  # searched again, not looked up
    b = union([space_of(graph, chip, "fp16", s, 16) for s in (t10, *baseline_options(t10))])
    assert a == b


def _model(graph, chip=TEST16):
    fronts = [list(f) for f in space_of(graph, chip, "fp16", search_options("t10"), 16).fronts]
    ints, _ = tensor_sets(graph)
    edges = _edges(graph, _front_ids(fronts), fronts, chip, "fp16", ints, Views(graph))
    return fronts, edges


def test_repeated_layers_tie_and_other_ops_do_not() -> None:
    """The ops of bert-tiny's second layer mostly share a class with their first-layer twin
    (not those next to the embeddings or the output), and a class never mixes fronts."""
    graph = _graph()
    fronts, edges = _model(graph)
    cycles = [[p.cycles.total for p in f] for f in fronts]
    tie = tie_classes(fronts, cycles, [(e.src, e.dst, e.slot, e.cost) for e in edges])
    index = {op.name: i for i, op in enumerate(graph.ops)}
    pairs = [(index[op.name.replace("layer1", "layer0", 1)], i) for i, op in enumerate(graph.ops)
             if op.name.startswith("layer1") and op.name.replace("layer1", "layer0", 1) in index]
    assert len(pairs) > 10
    tied = sum(tie[a] == tie[b] for a, b in pairs)
    assert len(pairs) // 2 < tied < len(pairs)
    for a, b in ((i, j) for i in range(len(tie)) for j in range(i) if tie[i] == tie[j]):
        assert [dataclasses.replace(p, op="") for p in fronts[a]] == \
            [dataclasses.replace(p, op="") for p in fronts[b]]
    # refined to the end, every op would be told apart from every other
    assert len(set(tie_classes(fronts, cycles, [(e.src, e.dst, e.slot, e.cost) for e in edges],
                               rounds=len(graph.ops)))) > len(set(tie))


def test_a_repeated_solve_is_a_look_up() -> None:
    """The same model again (a baseline's, solved inside t10's compile and then by its own
    compile) gives the same choice at once; another memory size is another model."""
    graph = _graph()
    fronts, edges = _model(graph)
    none = [[0] * len(f) for f in fronts]
    solving._SOLVED.clear()
    opts = SolverOptions(time_limit_s=5.0)
    first, _ = choose_plans(graph, fronts, none, edges, 600 * 1024, opts)
    calls: list[tuple[str, int, int]] = []
    again, _ = choose_plans(graph, fronts, none, edges, 600 * 1024, opts,
                            lambda *c: calls.append(c))
    assert first is not None and again is not None
    assert (again.choice, again.objective_cycles, again.bound_cycles, again.status) == \
        (first.choice, first.objective_cycles, first.bound_cycles, first.status)
    assert calls == [("solve", 0, 5000), ("solve", 5000, 5000)]
    calls.clear()
    other, _ = choose_plans(graph, fronts, none, edges, 10 ** 9, opts,
                            lambda *c: calls.append(c))
    assert other is not None and other.objective_cycles <= first.objective_cycles
    assert len(solving._SOLVED) == 2
