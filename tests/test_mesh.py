"""Mesh and torus chips: presets, placement, routing, and plans that are cheap because they are
placed (every shift at most 2 hops), checked on the emulator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_planner import matmul_graph, one_op_plan

from t10c.chips import PRESETS, ChipError, chip_from_dict
from t10c.codegen import generate
from t10c.codegen.program import Compute, Shift
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.dtypes import IntTensors
from t10c.emulator import emulate
from t10c.emulator.routing import hops, route
from t10c.partition import (
    SearchOptions,
    SolverOptions,
    SolverReport,
    geometry,
    plan_cost,
    search_op,
    verify_plan,
)
from t10c.partition.place import (
    Embedding,
    grid_coords,
    grid_physical_cores,
    interleave,
    physical_cores,
)

MESH = chip_from_dict({"base": "wse2", "name": "mesh4x4", "grid": [4, 4], "cores": 16,
                       "sram_bytes_per_core": 640 * 1024})
MESH35 = dataclasses.replace(MESH, name="mesh3x5", grid=(3, 5), cores=15, overlap=False)
TORUS = dataclasses.replace(MESH, name="torus4x4", topology="torus2d", overlap=False)


def test_mesh_presets_carry_sources() -> None:
    for name in ("wse2", "wse3", "wormhole-n150", "blackhole-p150"):
        chip = PRESETS[name]
        assert chip.is_mesh and chip.rows * chip.cols == chip.cores
        for key in ("cores", "sram_bytes_per_core", "clock_hz", "link_bytes_per_cycle",
                    "hop_latency_cycles", "matmul_macs_per_cycle"):
            assert chip.sources.get(key), (name, key)
    assert PRESETS["wse2"].grid == (757, 996)


def test_user_mesh_from_toml_fields() -> None:
    chip = chip_from_dict({"base": "wse2", "name": "m", "grid": [64, 64], "cores": 4096})
    assert (chip.rows, chip.cols, chip.topology) == (64, 64, "mesh2d")
    with pytest.raises(ChipError, match="grid"):
        chip_from_dict({"base": "wse2", "grid": [64, 64], "cores": 4000})
    with pytest.raises(ChipError, match="overlap"):
        chip_from_dict({"base": "wse2", "grid": [2, 2], "cores": 4, "overlap": "yes"})


def test_dimension_order_routing_by_hand() -> None:
    line = dataclasses.replace(MESH, grid=(1, 4), cores=4)
    # 0 -> 3 and 1 -> 2 share link 1-2 eastward: 8 + 4 bytes on it
    r = route(line, np.array([0, 1]), np.array([3, 2]), np.array([8, 4]))
    assert (r.max_hops, r.max_link_bytes) == (3, 12)
    assert r.cycles == 3 * line.hop_latency_cycles + 12 // line.link_bytes_per_cycle
    assert r.loads[0, 0].tolist() == [8, 12, 8, 0] and not r.loads[1].any()
    # X first, then Y: (0,0) -> (1,1) on a 4x4 mesh goes east along row 0, then south
    r = route(MESH, np.array([0]), np.array([5]), np.array([4]))
    assert r.loads[0, 0, 0] == 4 and r.loads[2, 0, 1] == 4 and r.max_hops == 2
    # a torus wraps: 0 -> 3 is one hop west
    r = route(TORUS, np.array([0]), np.array([3]), np.array([4]))
    assert r.max_hops == 1 and r.loads[1, 0, 3] == 4
    assert hops(TORUS, np.array([0]), np.array([15])).tolist() == [2]


@pytest.mark.parametrize("t", range(1, 40))
def test_interleaved_rings_are_at_most_two_hops(t: int) -> None:
    pos = interleave(np.arange(t), t)
    assert sorted(pos.tolist()) == list(range(t))
    edges = np.abs(pos - np.roll(pos, -1))
    assert edges.max(initial=0) <= 2


@pytest.mark.parametrize("chip", [MESH, MESH35, TORUS], ids=lambda c: c.name)
def test_every_plan_on_a_mesh_is_right_placed_and_priced(chip) -> None:
    """Every enumerated plan: one core per physical core, right result, every shift within 2
    hops, and the emulator's shift cycles equal the planner's."""
    graph = matmul_graph(12, 40, 20)
    op = graph.ops[0]
    plans = search_op(graph, op, chip, "fp32", SearchOptions())
    assert any(p.steps > 1 for p in plans)
    a = np.random.default_rng(1).standard_normal((12, 40)).astype(np.float32)
    want = a @ graph.constants["B"]
    for p in plans[:: max(1, len(plans) // 40)]:
        plan = dataclasses.replace(one_op_plan(graph, p), dtype="fp32")
        verify_plan(graph, plan, chip)
        phys = geometry(graph, op, p).phys
        assert len(set(phys.tolist())) == len(phys) and phys.max() < chip.cores
        prog = generate(graph, plan, chip)
        for ins in prog.instrs:
            if isinstance(ins, Shift):
                assert hops(chip, ins.src_core, ins.cores).max() <= 2, p
        out, timeline, _ = emulate(prog, chip, {"A": a}, graph.constants)
        assert np.abs(out["C"] - want).max() <= 1e-5 * np.abs(want).max(), p
        shift = sum(r.cycles for r in timeline.records if r.phase == "shift")
        assert shift == p.cycles.shift, (p, shift)


def test_grid_placement_from_sub_grids_equals_the_core_by_core_one() -> None:
    """`grid_physical_cores` (two sub-grids summed where the embedding separates) gives every
    core the physical core `physical_cores` gives it, on random grids and embeddings (half
    of them separable) and on every plan searched on the test meshes."""
    rng = np.random.default_rng(1)
    for _ in range(600):
        axes = tuple("abcd"[:int(rng.integers(1, 5))])
        F = [int(x) for x in rng.choice([1, 2, 3, 4, 6, 8], len(axes))]
        red = {a for a in axes if rng.random() < 0.4}
        cd = str(rng.choice(["", *axes]))
        rd = str(rng.choice(["", *[a for a in axes if a != cd]]))
        ct = int(rng.choice([2, 3, 4])) if cd else 1
        rt = int(rng.choice([2, 3])) if rd else 1
        for a, t in ((cd, ct), (rd, rt)):
            if a:
                F[axes.index(a)] *= t
        e = Embedding(rt * int(rng.choice([1, 2, 4, 16, 64])),
                      ct * int(rng.choice([1, 2, 3, 4, 8, 16])), cd, ct, rd, rt)
        want = physical_cores(grid_coords(tuple(F)), tuple(F), axes, red, e)
        assert (grid_physical_cores(tuple(F), axes, red, e) == want).all(), (F, axes, red, e)
    graph = matmul_graph(12, 40, 20, batch=2)
    op = graph.ops[0]
    for chip in (MESH, MESH35, TORUS):
        for p in search_op(graph, op, chip, "fp16", SearchOptions(chains=True)):
            geo = geometry(graph, op, p)
            if geo.embed is not None:
                red = {a for a in geo.axes if a not in op.output.axes}
                want = physical_cores(grid_coords(geo.F), geo.F, geo.axes, red, geo.embed)
                assert (geo.phys == want).all(), p



def test_grid_placements_are_kept_read_only_within_their_budget(monkeypatch) -> None:
    """A placement asked for again is the one kept (read-only, so that no caller can change
    another's); the least recently asked for go once the kept bytes pass the budget, and a
    placement made again is the same."""
    from t10c.partition import place

    monkeypatch.setattr(place, "_PLACED", type(place._PLACED)())
    monkeypatch.setattr(place, "_PLACED_BYTES", 0)
    e = Embedding(16, 16, "", 1, "", 1)
    first = grid_physical_cores((4, 8), ("a", "b"), set(), e)
    assert grid_physical_cores((4, 8), ("a", "b"), set(), e) is first
    assert not first.flags.writeable
    monkeypatch.setattr(place, "PLACED_KEPT_BYTES", first.nbytes * 2)
    others = [grid_physical_cores((4, 8), ("a", "b"), {"b"}, e),
              grid_physical_cores((8, 4), ("a", "b"), set(), e)]
    assert len(place._PLACED) == 2 and place._PLACED_BYTES == first.nbytes * 2
    again = grid_physical_cores((4, 8), ("a", "b"), set(), e)  # dropped, made again
    assert again is not first and (again == first).all()
    assert grid_physical_cores((8, 4), ("a", "b"), set(), e) is others[1]

def test_reduce_positions_made_over_the_grid_are_the_gathered_ones() -> None:
    """`collectives._grid_positions` (a reduce-scatter's final positions written over the
    core grid, where the groups are the grid's reduction axes and the placement is a sum of
    their part and the other axes') gives every core the position `_scatter_of` works out
    from the members' physical cores, on random grids and placements and on every plan
    searched on the test meshes and a 12 x 20 one, where it applies to two in five reducing
    plans; where the groups are no rectangle it leaves them to `_scatter_of`."""
    from t10c.ir import Operand, TensorExpr
    from t10c.partition.collectives import _grid_positions, _members, _rectangle, _scatter_of
    from t10c.partition.plan import Geometry

    rng = np.random.default_rng(3)
    expr = TensorExpr("bmm", (("b", 12), ("m", 12), ("k", 48), ("n", 12)),
                      Operand("C", ("b", "n", "m")),
                      (Operand("A", ("b", "m", "k")), Operand("B", ("k", "n"))), "sum",
                      ("mul", ("in", 0), ("in", 1)))
    kinds: dict[str, int] = {"same": 0, "line": 0}
    for _ in range(400):
        F = [int(x) for x in rng.choice([1, 2, 3, 4], 4)]
        F[2] = int(rng.choice([2, 3, 4, 6, 8]))  # k: the reduction, split
        cd = str(rng.choice(["", "b", "m", "k", "n"]))
        ct = int(rng.choice([2, 3])) if cd else 1
        if cd:
            F["bmkn".index(cd)] *= ct
        e = Embedding(int(rng.choice([8, 16, 64])), ct * int(rng.choice([2, 3, 5, 8, 16])),
                      cd, ct)
        geo = Geometry(expr, tuple(F), (1, 1, 1, 1), ((), (), (), ()), ((), (), (), ()), {},
                       embed=e)
        if len(np.unique(geo.phys)) < geo.ncores or int(geo.phys.max()) >= e.rows * e.cols:
            continue  # (a grid that does not fit this mesh)
        fast = _grid_positions(geo)
        if _rectangle(geo, _members(geo)[0]) is None:  # groups on a line: the definition's
            assert fast is None, (F, e)
            kinds["line"] += 1
        elif fast is not None:
            assert np.array_equal(fast, _scatter_of(geo, True).pos), (F, e)
            kinds["same"] += 1
    assert kinds["same"] > 100 and kinds["line"] > 5, kinds
    graph = matmul_graph(12, 96, 20, batch=2)
    op = graph.ops[0]
    wide = dataclasses.replace(MESH, name="mesh12x20", grid=(12, 20), cores=240)
    fast_ones = reducing = 0
    for chip in (MESH, MESH35, TORUS, wide):
        for p in search_op(graph, op, chip, "fp16", SearchOptions(chains=True)):
            geo = geometry(graph, op, p)
            if geo.reduce_group <= 1:
                continue
            reducing += 1
            fast = _grid_positions(geo)
            if fast is not None:
                assert np.array_equal(fast, _scatter_of(geo, True).pos), (chip.name, p)
                fast_ones += 1
    assert fast_ones > reducing // 3, (fast_ones, reducing)


def _extent(phys: np.ndarray, cols: int) -> tuple[int, int, int, int]:
    """(columns, rows, first column, first row) of the rectangle around some cores."""
    r, c = np.divmod(phys, cols)
    return int(np.ptp(c)) + 1, int(np.ptp(r)) + 1, int(c.min()), int(r.min())


def test_every_op_fills_the_squarest_region_centred_on_the_mesh() -> None:
    """An op's blocks fill the squarest rectangle that holds them (`place.region_width`), not
    rows of the whole mesh, centred on the mesh: on wse2 (757 x 996) 2,048 cores without
    rings span 46 x 45, not 3 x 996; ops of every size share the mesh's centre; rings keep
    their blocks whole, and reduction groups their rectangles."""
    wse2 = PRESETS["wse2"]
    e = Embedding(wse2.rows, wse2.cols)
    for ncores, side in ((2048, 46), (4096, 64), (100, 10), (1, 1)):
        phys = physical_cores(grid_coords((ncores,)), (ncores,), ("a",), set(), e)
        rows = -(-ncores // side)
        assert _extent(phys, wse2.cols) == (side, rows, (996 - side) // 2, (757 - rows) // 2)
        assert len(set(phys.tolist())) == ncores
    tall = Embedding(wse2.rows, wse2.cols, "", 1, "a", 4)  # blocks of 4 x 1 cores
    phys = physical_cores(grid_coords((4096,)), (4096,), ("a",), set(), tall)
    # 64 blocks a row, 16 rows of blocks of 4 cores
    assert _extent(phys, wse2.cols) == (64, 64, (996 - 64) // 2, (757 - 64) // 2)
    F, axes = (64, 16), ("n", "k")  # 64 groups of 16 partial sums
    phys = physical_cores(grid_coords(F), F, axes, {"k"}, e)
    r, c = np.divmod(phys, wse2.cols)
    groups = r.reshape(F), c.reshape(F)
    assert all(np.ptp(g, axis=1).max() == 3 for g in groups)  # each group 4 x 4
    assert _extent(phys, wse2.cols)[:2] == (32, 32)
    phys = physical_cores(grid_coords((64,)), (64,), ("a",), set(), Embedding(2, 64))
    assert _extent(phys, 64) == (32, 2, 16, 0)  # as square as a mesh of two rows allows
    whole = physical_cores(grid_coords((8, 8)), (8, 8), ("a", "b"), set(), Embedding(8, 8))
    assert sorted(whole.tolist()) == list(range(64))  # an op of the whole mesh is the mesh


def test_vectorised_mesh_costs_equal_the_scalar_definition() -> None:
    graph = matmul_graph(12, 40, 20, batch=2)
    consts = frozenset(graph.constants)
    for chip in (MESH, MESH35):
        for home in (False, True):
            opts = SearchOptions(chains=True, weights_home=home)
            for p in search_op(graph, graph.ops[0], chip, "fp16", opts):
                got = plan_cost(geometry(graph, graph.ops[0], p), chip, "fp16", IntTensors(),
                                consts, home)
                assert got == (p.cycles, p.hot_bytes_per_core, p.cold_bytes_per_core,
                               p.out_bytes_per_core), p


def test_all_to_all_assumption_keeps_row_major_numbering() -> None:
    graph = matmul_graph(12, 40, 20)
    plans = search_op(graph, graph.ops[0], MESH, "fp32", SearchOptions(mesh_aware=False))
    assert plans and all(p.embed is None for p in plans)
    aware = search_op(graph, graph.ops[0], MESH, "fp32", SearchOptions())
    assert all(p.embed is not None for p in aware)


MESH64 = chip_from_dict({"base": "wse2", "name": "mesh64", "grid": [64, 64], "cores": 4096})


def test_embedding_rows_are_split_when_the_table_is_too_big() -> None:
    """A sharded lookup: each core holds a block of the table's rows, the sum over them
    completes the lookup; the table is 32,000 bytes in fp16, each core has 4 KiB."""
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).standard_normal((4000, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "lookup",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4])],
        [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    chip = dataclasses.replace(MESH, sram_bytes_per_core=4096)
    c = compile_model(model, chip)
    op, p = c.graph.ops[0], c.plan.ops[0]
    rows = op.take_axis()
    assert rows is not None and p.F[op.axis_names.index(rows)] > 1
    r = run_compiled(c)
    assert r.ok, r.max_rel_err


@pytest.mark.parametrize("model", [
    "bert-tiny",
    # the slowest default test (27 s on a loaded machine); llama-tiny's decode step on a
    # 64 x 64 mesh stays in the default run (tests/test_multicast.py)
    pytest.param("llama-tiny", marks=pytest.mark.slow)])
def test_models_on_a_64x64_mesh_match_onnxruntime(model: str) -> None:
    c = compile_model(model, MESH64)
    for op, p in zip(c.graph.ops, c.plan.ops):  # placed: embedded, or aligned to a producer
        assert p.embed is not None or p.aligned >= 0, op.name  # (row-major cores: None)
    shifts = [ins for ins in c.program.instrs if isinstance(ins, Shift)]
    assert shifts and all(hops(MESH64, s.src_core, s.cores).max() <= 2 for s in shifts)
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    assert r.timeline.cycles == c.plan.total_cycles  # every placed plan's re-layout is routed
    assert r.timeline.link_bytes is not None and r.timeline.link_bytes.shape == (4, 64, 64)


MESH8 = chip_from_dict({"base": "wse2", "name": "mesh8", "grid": [8, 8], "cores": 64,
                        "sram_bytes_per_core": 1024 * 1024})


@pytest.mark.parametrize("model", ["bert-tiny", "llama-tiny-decode"])
def test_timing_only_equals_the_functional_timeline(model: str) -> None:
    """The streamed, data-less run (repeated layers replayed) times exactly what the
    functional run times: every record, every link."""
    from t10c.driver import CompileOptions

    run = run_compiled(compile_model(model, MESH8))
    assert run.ok, run.max_rel_err
    full = run.timeline
    fast = compile_model(model, MESH8, CompileOptions(timing_only=True, weights=False)).timeline
    assert fast is not None
    assert [(r.op, r.phase, r.cycles, r.hops) for r in fast.records] == \
        [(r.op, r.phase, r.cycles, r.hops) for r in full.records]
    assert (fast.link_bytes == full.link_bytes).all()


def test_all_to_all_strategy_is_t10_on_an_all_to_all_chip() -> None:
    from t10c.compare import strategy_options

    a = compile_model("mlp", PRESETS["test16"], strategy_options("t10")).plan
    b = compile_model("mlp", PRESETS["test16"], strategy_options("all-to-all")).plan
    assert a.ops == b.ops


def test_cli_timing_only_and_mesh_compare(tmp_path, capsys) -> None:
    from t10c.cli import main

    toml = tmp_path / "mesh8.toml"
    toml.write_text('name = "mesh8"\nbase = "wse2"\ngrid = [8, 8]\ncores = 64\n'
                    'sram_bytes_per_core = 262144\n')
    assert main(["compile", "bert-tiny", "--chip", str(toml), "--timing-only", "--no-table",
                 "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "emulated latency (timing only)" in out and "longest shift route" in out
    assert (tmp_path / "out" / "plan.json").exists()
    assert not (tmp_path / "out" / "program.npz").exists()
    assert main(["compile", "bert-tiny", "--chip", str(toml), "--timing-only", "--run"]) == 2
    assert main(["mesh-compare", "--chip", str(toml), "--gemm", "64x128x128",
                 "--gemv", "128x128", "--model", "mlp", "--decode", "mlp",
                 "--cache-len", "16"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 4 and all("x |" in r for r in rows)
    tokens = rows[3].split(" | ")[5]  # the decode row in tokens/s, mesh-aware / all-to-all
    assert rows[0].split(" | ")[5] == "-"
    assert rows[3].startswith("| decode step (cache 16) | mlp")
    assert all(float(t.replace(",", "")) > 0 for t in tokens.split(" / "))
    # a subset of the rows, in their order whatever the list's; each row logged as it is done
    assert main(["mesh-compare", "--chip", str(toml), "--gemv", "128x128", "--decode", "mlp",
                 "--cache-len", "16", "--rows", "decode,gemv"]) == 0
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| decode GEMV", "| decode step (cache 16)"]
    assert "decode GEMV: mesh-aware " in captured.err and "x\n" in captured.err
    assert main(["mesh-compare", "--chip", str(toml), "--rows", "gemm,foo"]) == 2
    assert main(["mesh-compare", "--chip", str(toml), "--cache-len", "0"]) == 2
    assert main(["mesh-compare", "--chip", "ipu-mk2"]) == 1


def test_mesh_compare_records_a_side_that_fails(tmp_path, capsys, monkeypatch) -> None:
    """A side that cannot be compiled (here the all-to-all assumption's, made to run out of
    memory as a wafer's row-major exchange does) is a row's result, not the run's end: the
    other rows still run, and the table says which side failed and why."""
    import t10c.meshcompare as mc
    from t10c.cli import main
    from t10c.codegen import CodegenError

    real = mc.run_side

    def run_side(model, chip, strategy, *args, **kwargs):
        if strategy == "all-to-all" and model == "mlp":
            raise CodegenError("while generating op fc1: an exchange of 9 pairs needs 1 TB")
        return real(model, chip, strategy, *args, **kwargs)

    monkeypatch.setattr(mc, "run_side", run_side)
    toml = tmp_path / "mesh8.toml"
    toml.write_text('name = "mesh8"\nbase = "wse2"\ngrid = [8, 8]\ncores = 64\n'
                    'sram_bytes_per_core = 262144\n')
    assert main(["mesh-compare", "--chip", str(toml), "--gemv", "128x128", "--model", "mlp",
                 "--rows", "gemv,model"]) == 0
    captured = capsys.readouterr()
    rows = [line.split(" | ") for line in captured.out.splitlines() if line.startswith("| ")]
    gemv, model = rows[1], rows[2]
    assert gemv[4].endswith("x") and float(gemv[3]) > 0
    assert model[3] == "failed" and model[4] == "-" and float(model[2]) > 0
    assert model[6].endswith(" / failed")
    assert "- failed: model, all-to-all assumed: while generating op fc1: an exchange of 9 " \
        "pairs needs 1 TB" in captured.out
    assert "model: mesh-aware " in captured.err and "all-to-all assumed failed (" in captured.err


@pytest.mark.parametrize("chip", ["wormhole-n150", "blackhole-p150"])
def test_bert_tiny_on_the_tenstorrent_tori(chip: str) -> None:
    r = run_compiled(compile_model("bert-tiny", PRESETS[chip]))
    assert r.ok, r.max_rel_err
    assert max((rec.hops for rec in r.timeline.records if rec.phase == "shift"), default=0) <= 2


def test_an_exchange_too_large_to_route_is_refused_in_one_line(tmp_path, capsys,
                                                                monkeypatch) -> None:
    """An exchange whose (core, source core) pairs would not fit this machine's memory is
    refused at once, saying how much it needs and what would fit, not killed partway by the
    system (here the machine is made to have 64 KiB)."""
    from t10c import multicast
    from t10c.cli import main

    toml = tmp_path / "mesh8.toml"
    toml.write_text('name = "mesh8"\nbase = "wse2"\ngrid = [8, 8]\ncores = 64\n'
                    'sram_bytes_per_core = 262144\n')
    from t10c.partition import meshmove

    monkeypatch.setattr(multicast, "physical_memory", lambda: 1 << 16)
    monkeypatch.setattr(meshmove, "_PHASES", {})  # (a phase priced before needs no memory)
    # the planner, pricing the mesh-aware plan's re-layouts by their routes, refuses first
    assert main(["compile", "mlp", "--chip", str(toml), "--timing-only", "--no-table"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "(core, source core) pairs" in err[0], err
    assert "more than half of this machine's 64.0 KiB" in err[0]
    assert "the planner cannot price its re-layout" in err[0] and "--seq-len" in err[0]
    # codegen refuses an exchange the planner does not route (the all-to-all assumption's)
    assert main(["compile", "mlp", "--chip", str(toml), "--timing-only", "--no-table",
                 "--strategy", "all-to-all"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "(core, source core) pairs" in err[0], err
    assert "mesh-aware strategy" in err[0]
    # mesh-compare, where every side fails so, says the same in one line (no internal error)
    assert main(["mesh-compare", "--chip", str(toml), "--rows", "model", "--model",
                 "mlp"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "(core, source core) pairs" in err[0], err
    assert "internal error" not in err[0]


def test_neighbours_on_a_mesh_read_one_received_copy(monkeypatch) -> None:
    """After the solve, two neighbours over the same axes that read one activation in two
    layouts try each other's plan (`partition._share_layouts`), so that the second reads the
    first one's received copy: llama-tiny's up projection (gate and up apart, 8 tokens)
    takes a plan that reads the normalised vector as the gate projection (left by the solve)
    does. The copy is kept on a mesh, the routed prices see the phase it saves, and the run
    matches onnxruntime."""
    import t10c.partition as planner
    from t10c.partition.space import tensor_sets
    from t10c.partition.transitions import shared_inputs

    def up_reads_a_copy(c) -> bool:
        shared = shared_inputs(c.graph, c.plan.ops, MESH64, c.plan.dtype,
                               tensor_sets(c.graph)[0])
        return any(c.graph.ops[i].name.endswith("up_proj/MatMul") for i, _ in shared)

    apart = CompileOptions(fuse="epilogues", seq_len=8)
    c = compile_model("llama-tiny", MESH64, apart)
    assert up_reads_a_copy(c)
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    assert r.timeline.cycles == c.plan.total_cycles
    # without the swap the up projection receives its own copy, and the compile is slower
    monkeypatch.setattr(planner, "_share_layouts", lambda graph, chosen, relayout, *a, **k:
                        (chosen, relayout))
    without = compile_model("llama-tiny", MESH64, apart)
    assert not up_reads_a_copy(without)
    assert without.plan.total_cycles > c.plan.total_cycles


@pytest.mark.parametrize("chip", [MESH64, PRESETS["ipu-mk2"]], ids=["64x64", "ipu-mk2"])
def test_a_rotated_copy_goes_home_for_the_next_op(chip, monkeypatch) -> None:
    """LLaMA's gate and up projections held to one plan that rotates the normalised vector
    (as the solve gives LLaMA-3-8B's decode on wse2): the gate keeps its copy, shifts it back
    to its step-0 placement after the last step (one more ring shift, in the superstep of
    its reduce-scatter: `transitions.kept_restores`), and the up projection reads it, with
    no re-layout of its own. The run matches onnxruntime, the prediction equals the
    emulated time, and the same compile that does not keep rotated copies is slower."""
    import t10c.partition.transitions as transitions
    from t10c.partition.space import tensor_sets
    from t10c.planfile import constraints_from

    held = {"F_op": {"k": 8, "n": 44}, "f_t": {"in0": {"k": 2}}}
    options = CompileOptions(constraints=constraints_from({"op": [
        {"name": "layers*/mlp/gate_proj/MatMul", **held},
        {"name": "layers*/mlp/up_proj/MatMul", **held}]}, "test"),
        fuse="epilogues")  # (the gate and the up projection apart)
    c = compile_model("llama-tiny-decode", chip, options)
    g, plan = c.graph, c.plan
    shared = transitions.shared_inputs(g, plan.ops, chip, plan.dtype, tensor_sets(g)[0])
    ups = [i for i, op in enumerate(g.ops) if op.name.endswith("up_proj/MatMul")]
    assert len(ups) == 2
    for i in ups:
        assert g.ops[i - 1].name.endswith("gate_proj/MatMul")
        assert plan.ops[i - 1].rot[0] and plan.ops[i].rot[0]  # both rotate the vector
        assert shared.get((i, 0)) == 0 and plan.relayout_cycles[i] == 0
        # the gate's cycles carry the return shift's superstep (its barrier, which the
        # reduce-scatter then shares); codegen emits it into the kept buffer
        gate = g.ops[i - 1].name
        alone = plan_cost(geometry(g, g.ops[i - 1], plan.ops[i - 1]), chip, plan.dtype,
                          IntTensors(), frozenset(o.tensor for o in g.ops[i - 1].inputs[1:]))[0]
        assert plan.ops[i - 1].cycles.sync == alone.sync + chip.sync_cycles
        assert plan.ops[i - 1].cycles.total >= alone.total
        first = next(ins for ins in c.program.instrs
                     if isinstance(ins, Compute) and ins.op == g.ops[i].name)
        assert c.program.buffers[first.ins[0]].name.startswith(gate + ".")
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    assert r.timeline.cycles == plan.total_cycles
    # timing only, the second layer replays the first one's instructions, the copy included
    timed = compile_model("llama-tiny-decode", chip, dataclasses.replace(options,
                                                                           timing_only=True))
    assert timed.timeline is not None and timed.timeline.cycles == plan.total_cycles
    monkeypatch.setattr(transitions, "_would_move", lambda *a: False)
    assert compile_model("llama-tiny-decode", chip, options).plan.total_cycles > \
        plan.total_cycles


def _shared_after(c, name: str, before: str) -> tuple[dict[tuple[int, int], int], list[int]]:
    """The compile's shared inputs (`transitions.shared_inputs`) and the ops named ``...name``
    of llama-tiny-decode's two layers, each checked to follow an op named ``...before``."""
    from t10c.partition.space import tensor_sets
    from t10c.partition.transitions import shared_inputs

    g, plan = c.graph, c.plan
    shared = shared_inputs(g, plan.ops, MESH64, plan.dtype, tensor_sets(g)[0])
    ops = [i for i, op in enumerate(g.ops) if op.name.endswith(name)]
    assert len(ops) == 2
    assert all(g.ops[i - 1].name.endswith(before) for i in ops)
    return shared, ops


def test_a_sum_takes_its_max_plan_to_read_its_copy(monkeypatch) -> None:
    """Neighbours whose operands differ (a decode step's Softmax sum over the past cache's
    scores reads their max too) try each other's plan where it rotates nothing
    (`partition._share_layouts`): llama-tiny-decode's sum (a 64-token cache) then computes
    on the max's tiles and reads its received copy of the scores; the run matches
    onnxruntime, the prediction
    equals the emulated time, and without the pass the compile is slower. Plans are traded
    so only between two reductions: an elementwise op's plan may be aligned to a producer's
    layout, whose cores no reduction group would sit on (bert-mini's Softmax sum had taken
    such a plan from the Softmax after it, and ran 2x its prediction)."""
    import t10c.partition as planner
    from t10c.partition.space import tensor_sets
    from t10c.partition.transitions import shared_inputs

    c = compile_model("llama-tiny-decode", MESH64, CompileOptions(seq_len=64))
    g, plan = c.graph, c.plan
    shared = shared_inputs(g, plan.ops, MESH64, plan.dtype, tensor_sets(g)[0])
    sums = [i for i, op in enumerate(g.ops) if op.name.endswith("Softmax/sum0")]
    assert len(sums) == 2
    for i in sums:
        assert g.ops[i - 1].name.endswith("Softmax/max0")
        assert plan.ops[i].F == plan.ops[i - 1].F and (i, 0) in shared
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    assert r.timeline.cycles == plan.total_cycles
    mini = compile_model("bert-mini", MESH64, CompileOptions(timing_only=True))
    assert all(p.aligned < 0 for p, op in zip(mini.plan.ops, mini.graph.ops)
               if op.combine is not None)
    assert mini.timeline is not None and mini.timeline.cycles == mini.plan.total_cycles
    monkeypatch.setattr(planner, "_share_layouts", lambda graph, chosen, relayout, *a, **k:
                        (chosen, relayout))
    assert compile_model("llama-tiny-decode", MESH64,
                         CompileOptions(seq_len=64)).plan.total_cycles > plan.total_cycles


def test_an_op_computes_on_the_tiles_its_neighbour_read(monkeypatch) -> None:
    """After the solve on a mesh, an op that reads the activation its predecessor read in
    another layout tries the plan that computes on exactly the predecessor's tiles, on its
    cores (`partition._match_reads`): llama-tiny-decode's RMSNorm scaling then reads the
    residual stream from its mean's received copy and receives none of it. The run matches
    onnxruntime, the prediction equals the emulated time, and the compile without the pass
    is slower."""
    import t10c.partition as planner

    c = compile_model("llama-tiny-decode", MESH64)
    g, plan = c.graph, c.plan
    shared, scales = _shared_after(c, "input_norm/Mul", "input_norm/ReduceMean")
    for i in scales:
        x = next(k for k, o in enumerate(g.ops[i].inputs)
                 if g.root(o.tensor) == g.root(g.ops[i - 1].inputs[0].tensor))
        assert shared.get((i, x)) == 0
        assert plan.ops[i].aligned == x and plan.ops[i].F.count(1) == len(plan.ops[i].F) - 1
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    assert r.timeline.cycles == plan.total_cycles
    monkeypatch.setattr(planner, "_match_reads", lambda graph, chosen, relayout, *a, **k:
                        (chosen, relayout))
    assert compile_model("llama-tiny-decode", MESH64).plan.total_cycles > plan.total_cycles


def test_views_of_one_activation_share_a_received_copy() -> None:
    """Softmax's max and sum read the scores through views of their own (the frontend gives
    each reader of reshaped scores a view tensor, here dropping the unit axes of
    ``[1, 32, 1, 24]``) along the same chain: held to one layout, the sum reads the max's
    received copy (`Views.same_read`) and moves nothing of it; the run matches onnxruntime
    and the prediction equals the emulated time. (A decode step's Softmax over its cache
    is computed part by part on a mesh, `rewrite.split_softmax_over_parts`, so this is a
    model of its own.)"""
    from onnx import TensorProto, helper, numpy_helper

    from t10c.partition.space import tensor_sets
    from t10c.partition.transitions import shared_inputs
    from t10c.planfile import constraints_from

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 768)).astype(np.float32), "W")
    shape = numpy_helper.from_array(np.array([1, 32, 1, 192], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"], name="scores"),
         helper.make_node("Reshape", ["xw", "shape"], ["heads"], name="heads"),
         helper.make_node("Softmax", ["heads"], ["p"], axis=-1, name="sm")],
        "softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 32, 1, 192])], [w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    held = {"F_op": {"d1": 8, "d3": 48}}
    options = CompileOptions(constraints=constraints_from({"op": [
        {"name": "sm/max", **held}, {"name": "sm/sum", **held}]}, "test"))
    c = compile_model(model, MESH64, options)
    g, plan = c.graph, c.plan
    i = next(k for k, op in enumerate(g.ops) if op.name == "sm/sum")
    assert g.ops[i - 1].name == "sm/max"
    mine, theirs = g.ops[i].inputs[0].tensor, g.ops[i - 1].inputs[0].tensor
    assert mine != theirs and g.root(mine) == g.root(theirs)
    shared = shared_inputs(g, plan.ops, MESH64, plan.dtype, tensor_sets(g)[0])
    assert shared.get((i, 0)) == 0
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    assert r.timeline.cycles == plan.total_cycles


def test_a_wafer_keeps_epilogue_weights_beside_the_result() -> None:
    """A bias (an epilogue weight) waits in a compact idle layout and is fetched before each
    run on an all-to-all chip; on a mesh without DRAM the fetch would cross the mesh before
    every op, so it stays resident beside the result: no fetch phase, and the run still
    matches onnxruntime, predicted as emulated."""
    from onnx import TensorProto, helper, numpy_helper

    from t10c.partition.cost import fetches_epilogue_weights

    assert fetches_epilogue_weights(PRESETS["ipu-mk2"])
    assert fetches_epilogue_weights(PRESETS["wormhole-n150"])  # (a torus with DRAM)
    assert not fetches_epilogue_weights(MESH64) and not fetches_epilogue_weights(PRESETS["wse2"])
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 96)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "B"], ["y"])],
        "bias", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 96])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for chip, fetched in ((MESH64, False), (PRESETS["test16"], True)):
        c = compile_model(model, chip)
        assert c.graph.ops[0].epilogue is not None
        r = run_compiled(c)
        assert r.ok and r.timeline.cycles == c.plan.total_cycles
        assert any(rec.phase == "fetch" for rec in r.timeline.records) == fetched, chip.name


def test_a_mesh_refines_by_default() -> None:
    """Unless told, a mesh chip without DRAM spends up to `refine.MESH_TRIALS` exact pricings
    after the solve, and nothing else does: an all-to-all chip, a mesh with DRAM, the greedy
    planner; an explicit count, 0 included, is what is spent."""
    from t10c.partition.refine import MESH_TRIALS, trials_for

    default = SolverOptions()
    assert default.refine is None and MESH_TRIALS > 0
    assert trials_for(default, MESH64) == MESH_TRIALS
    assert trials_for(default, PRESETS["ipu-mk2"]) == 0
    assert trials_for(default, PRESETS["voxel-3d"]) == 0  # a mesh with DRAM
    assert trials_for(SolverOptions(planner="greedy"), MESH64) == 0
    assert trials_for(SolverOptions(refine=0), MESH64) == 0
    assert trials_for(SolverOptions(refine=5), PRESETS["ipu-mk2"]) == 5
    c = compile_model("llama-tiny-decode", MESH64, CompileOptions(seq_len=64))
    trials, _ = c.plan.solver.refined
    assert 0 < trials <= MESH_TRIALS


@pytest.mark.parametrize("worth", [False, True])
def test_the_default_refine_prices_the_costliest_ops_moves_while_worth_it(
        monkeypatch: pytest.MonkeyPatch, worth: bool) -> None:
    """By default the search prices the costliest group's moves only, in their ranked order,
    the next one while `refine.worth_pricing` says it may still gain; an explicit count is
    spent whatever it says, sweep after sweep."""
    from t10c.partition import refine

    asked: list[tuple[int, int]] = []
    groups: list[int] = []
    real_ranked = refine._ranked

    def ranked(graph, i, moves, *rest):  # type: ignore[no-untyped-def]
        got = real_ranked(graph, i, moves, *rest)
        if got[0]:
            groups.append(i)
        return got

    def judged(estimated: int, priced: int) -> bool:
        asked.append((estimated, priced))
        return worth

    monkeypatch.setattr(refine, "_ranked", ranked)
    monkeypatch.setattr(refine, "worth_pricing", judged)
    c = compile_model("llama-tiny-decode", MESH64, CompileOptions(seq_len=64))
    trials, _ = c.plan.solver.refined
    assert len(groups) == 1  # one group's moves
    # (this op has three moves or more); asked before each move after the first
    assert trials == (refine.PER_GROUP if worth else 1)
    assert len(asked) == (trials - 1 if worth else 1)
    asked.clear()
    groups.clear()
    solver = SolverOptions(refine=2 * refine.PER_GROUP)
    c = compile_model("llama-tiny-decode", MESH64, CompileOptions(seq_len=64, solver=solver))
    assert not asked and len(groups) > 1
    assert c.plan.solver.refined[0] == 2 * refine.PER_GROUP


def test_a_move_is_worth_pricing_while_its_estimate_could_beat_the_best_priced() -> None:
    from t10c.partition.refine import ESTIMATE_SLACK, worth_pricing

    assert worth_pricing(1023, 119) and not worth_pricing(974, 700)  # wse3's down_proj
    assert not worth_pricing(462, 723)  # wse2's
    assert worth_pricing(1, -50) and not worth_pricing(0, -50)  # nothing saved yet
    assert not worth_pricing(ESTIMATE_SLACK * 100, 100)


def test_baselines_asked_for_late_give_the_plan_of_those_given_first(monkeypatch) -> None:
    """On a mesh the solve asks for the baselines' choices once it knows its best (they are
    only its starts there), and a baseline whose LP bound is above that stops after its LP
    (`solve.CUT_OFF`): the plan is the one that every baseline's whole solve, given first,
    gives."""
    from t10c import partition
    from t10c.partition import solve as solving

    real = partition.choose_plans
    statuses: list[str] = []

    def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
        got = real(*args, **kwargs)
        statuses.append(got[1])
        return got

    def first(graph, fronts, relayout_in, edges, sram, opts, progress=None, starts=(),
              **kwargs):  # type: ignore[no-untyped-def]
        late = kwargs.pop("more_starts", None)
        if late is not None:  # every baseline solved whole, before the solve
            starts = [*starts, *late(None)]
        return real(graph, fronts, relayout_in, edges, sram, opts, progress, starts, **kwargs)

    plans = []
    for wrapper in (watched, first):
        solving._SOLVED.clear()
        monkeypatch.setattr(partition, "choose_plans", wrapper)
        plan = compile_model("llama-tiny-decode", MESH64, CompileOptions(seq_len=64)).plan
        plans.append((plan.ops, plan.relayout_cycles, plan.total_cycles))
    assert solving.CUT_OFF in statuses
    assert plans[0] == plans[1]


def test_refine_routes_plans_off_the_fronts() -> None:
    """`--refine TRIALS` (`partition/refine.py`): after the solve, plans the fronts left out
    are tried op by op and routed exactly. On llama-tiny-decode (a 64-token cache) eight
    trials find a faster choice; the run matches onnxruntime, the prediction equals the
    emulated time, plan.json records the trials and the cycles saved, and the same options
    give the same plan again."""
    options = CompileOptions(seq_len=64, solver=SolverOptions(refine=0))
    base = compile_model("llama-tiny-decode", MESH64, options)
    refined = dataclasses.replace(options, solver=SolverOptions(refine=8))
    c = compile_model("llama-tiny-decode", MESH64, refined)
    assert c.plan.total_cycles < base.plan.total_cycles
    assert any(p.F != q.F or p.rot != q.rot for p, q in zip(c.plan.ops, base.plan.ops))
    r = run_compiled(c)
    assert r.ok, r.max_rel_err
    assert r.timeline.cycles == c.plan.total_cycles
    trials, saved = c.plan.solver.refined
    assert 0 < trials <= 8 and saved > 0
    assert SolverReport.from_document(c.plan.solver.document()) == \
        dataclasses.replace(c.plan.solver, wall_s=0.0, deterministic_s=0.0)
    assert "refined" not in base.plan.solver.document()
    assert compile_model("llama-tiny-decode", MESH64, refined).plan.ops == c.plan.ops


@pytest.mark.parametrize("model, chip", [("llama-tiny-decode", "mesh64"),
                                         ("bert-mini", "ipu-mk2")])
def test_the_refine_candidates_are_the_enumerated_plans_pareto_front(model: str,
                                                                      chip: str) -> None:
    """`search.region_front`, on arrays, is its definition on every plan materialised:
    `enumerate_plans` within the SRAM cap, sorted by cycles, hot bytes and cores (stable),
    each kept where no plan before it has at most its hot bytes and at most its cores; on a
    mesh the search's uncapped list (`SearchResult.region`) within the cap is the same."""
    import math

    from t10c.driver import chip_graph, load_source
    from t10c.partition import enumerate_plans
    from t10c.partition.plan import operand_shapes
    from t10c.partition.search import SearchOptions, region_front, search_front
    from t10c.partition.space import tensor_sets

    target = MESH64 if chip == "mesh64" else PRESETS[chip]
    graph = chip_graph(load_source(model, seq_len=64), target, {}, model)
    ints, consts = tensor_sets(graph)
    opts = SearchOptions()
    seen: set[str] = set()
    checked = 0
    for op in graph.ops:
        if op.signature() in seen:
            continue
        seen.add(op.signature())
        shapes = operand_shapes(graph, op)
        every = enumerate_plans(op, target, "fp16", shapes, ints, consts, opts)
        if not every:
            continue
        # caps that keep every plan, about half of them, and the smallest one alone
        hots = sorted(p.hot_bytes_per_core for p in every)
        for cap in (hots[-1], hots[len(hots) // 2], hots[0]):
            within = sorted((p for p in every if p.hot_bytes_per_core <= cap),
                            key=lambda p: (p.cycles.total, p.hot_bytes_per_core,
                                           math.prod(p.F)))
            front: list = []
            for p in within:
                if not any(q.hot_bytes_per_core <= p.hot_bytes_per_core
                           and math.prod(q.F) <= math.prod(p.F) for q in front):
                    front.append(p)
            assert region_front(op, target, "fp16", shapes, ints, consts, opts, cap) == front
            if target.is_mesh:  # the search's own list, uncapped, then within the cap
                found = search_front(op, target, "fp16", shapes, ints, consts, opts, 16)
                assert [p for p in found.region if p.hot_bytes_per_core <= cap] == front
            else:
                assert not search_front(op, target, "fp16", shapes, ints, consts, opts).region
            checked += 1
    assert checked >= 9
