"""Prologue fusion (`frontend/fuse.py`, `t10c.ir.TensorExpr.prologue`): an elementwise op read
only by contractions (and epilogues) is folded into each of them, so that Softmax's and
LayerNorm's normalising tails are not ops of their own. Which ops fold (a table of cases), that
every plan of a contraction with a prologue computes what numpy computes, that its cost is
priced alike by the scalar and vectorised models and measured by the emulator, that the JSON
and the graph check know the field, and that a BERT layer loses its elementwise ops."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ophelpers import check_every_plan

from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.dtypes import IntTensors
from t10c.frontend.fuse import fuse_elementwise
from t10c.graphcheck import GraphError, verify_graph
from t10c.ir import Graph, Operand, TensorExpr, TensorInfo, expr_from_json, expr_to_json
from t10c.partition import SearchOptions, geometry, plan_cost, search_op

BASE = PRESETS["test16"]
M, K, N = 6, 10, 8
IJ = ("i", "j")


def mm(name: str, a: str, w: str, out: str, m: int = M, k: int = K, n: int = N,
       transposed: bool = False) -> TensorExpr:
    """out[m, n] = sum_k a[m, k] w[k, n] (``transposed``: w[m, k] a[k, n])."""
    ins = (Operand(w, ("m", "k")), Operand(a, ("k", "n"))) if transposed else \
        (Operand(a, ("m", "k")), Operand(w, ("k", "n")))
    return TensorExpr(name, (("m", m), ("k", k), ("n", n)), Operand(out, ("m", "n")), ins,
                      "sum", ("mul", ("in", 0), ("in", 1)))


def ew(name: str, out: str, ins: list[tuple[str, tuple]], body: tuple,
       axes: tuple = (("i", M), ("j", K))) -> TensorExpr:
    return TensorExpr(name, axes, Operand(out, IJ), tuple(Operand(t, a) for t, a in ins),
                      None, body)


#: softmax-like: exp(x - max) * g, with max a row statistic and g a weight along the row
NORM_BODY = ("mul", ("exp", ("sub", ("in", 0), ("in", 1))), ("in", 2))
ROWMAX = TensorExpr("rowmax", (("i", M), ("j", K)), Operand("mx", ("i",)),
                    (Operand("X", IJ),), "max", ("in", 0))


def norm(out: str = "Y", axes: tuple = (("i", M), ("j", K))) -> TensorExpr:
    return ew("norm", out, [("X", IJ), ("mx", ("i",)), ("g", ("j",))], NORM_BODY, axes)


SHAPES = {"X": (M, K), "mx": (M,), "g": (K,), "Y": (M, K), "W": (K, N), "W2": (K, N),
          "V": (K, M), "C": (M, N), "C2": (M, N), "B": (M, K), "U": (K, K), "P": (M, K),
          "E": (M, K), "s": (M,), "CT": (K, K)}
CONSTS = ("W", "W2", "g", "U", "V")


def graph_of(ops: list[TensorExpr], outputs: tuple[str, ...], shapes: dict = SHAPES,
             inputs: tuple[str, ...] = ("X", "B")) -> Graph:
    rng = np.random.default_rng(0)
    named = {o.tensor for op in ops for o in op.operands}
    tensors = {t: TensorInfo(t, shapes[t], "float32") for t in named}
    consts = {t: rng.standard_normal(shapes[t]).astype(np.float32)
              for t in named if t in CONSTS}
    return Graph("g", tensors, tuple(ops), {}, consts,
                 tuple(t for t in inputs if t in named), outputs)


@dataclass(frozen=True)
class Case:
    name: str
    ops: tuple[TensorExpr, ...]
    outputs: tuple[str, ...]
    prologues: int  # contractions that carry the normalise as a prologue
    nops: int
    recomputed: int = 0  # epilogues that recompute it


RES = ew("res", "E", [("P", IJ), ("Y", IJ)], ("add", ("in", 0), ("in", 1)))
CASES = [
    Case("one matmul", (ROWMAX, norm(), mm("mm", "Y", "W", "C")), ("C",), 1, 2),
    Case("as the second operand", (ROWMAX, norm(), mm("mm", "Y", "V", "CT", m=K, k=M, n=K,
                                                     transposed=True)), ("CT",), 1, 2),
    # q, k and v: each recomputes it
    Case("two matmuls", (ROWMAX, norm(), mm("mm", "Y", "W", "C"), mm("mm2", "Y", "W2", "C2")),
         ("C", "C2"), 2, 3),
    # a matmul and a residual add after another matmul (the next layer's): the epilogue
    # recomputes it too
    Case("matmul and residual", (ROWMAX, norm(), mm("mm", "Y", "W", "C"),
                                 mm("mm2", "B", "U", "P", k=K, n=K), RES), ("C", "E"), 1, 3,
         recomputed=1),
    # refused: also a graph output
    Case("graph output", (ROWMAX, norm(), mm("mm", "Y", "W", "C")), ("C", "Y"), 0, 3),
    # refused: a reduction reads it too (not a contraction, not an epilogue)
    Case("a reduction reads it", (ROWMAX, norm(), mm("mm", "Y", "W", "C"),
                                  TensorExpr("rowsum", (("i", M), ("j", K)), Operand("s", ("i",)),
                                             (Operand("Y", IJ),), "sum", ("in", 0))),
         ("C", "s"), 0, 4),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_prologue_rules(case: Case) -> None:
    graph = fuse_elementwise(graph_of(list(case.ops), case.outputs), prologues=True)
    verify_graph(graph)
    assert len(graph.ops) == case.nops, [op.name for op in graph.ops]
    with_prologue = [op for op in graph.ops if op.prologue]
    assert len(with_prologue) == case.prologues
    for op in with_prologue:
        ((slot, body),) = op.prologue
        assert op.inputs[slot].tensor == "X"  # the stored operand is what the norm read
        assert {o.tensor for o in op.inputs[2:]} == {"mx", "g"}
        assert body[0] == "mul" and body[1][0] == "exp"
        assert expr_from_json(expr_to_json(op)) == op  # the JSON keeps the prologue
    recomputed = [op for op in graph.ops if op.epilogue is not None
                  and any(o.tensor == "mx" for o in op.extra)]
    assert len(recomputed) == case.recomputed
    # by default (``--fuse all``) and without epilogues (``--fuse inline``) there are none
    for plain in (fuse_elementwise(graph_of(list(case.ops), case.outputs)),
                  fuse_elementwise(graph_of(list(case.ops), case.outputs), epilogues=False,
                                   prologues=True)):
        assert not any(op.prologue for op in plain.ops)


def test_graph_check_refuses_a_bad_prologue() -> None:
    graph = fuse_elementwise(graph_of([ROWMAX, norm(), mm("mm", "Y", "W", "C")], ("C",)),
                             prologues=True)
    op = graph.ops[1]
    slot, body = op.prologue[0]
    for bad, why in [(((2, body),), "only inputs 0 and 1"),
                     (((slot, ("in", 9)),), "prologue of input 0"),
                     (((slot, ("add", ("in", 0), ("in", 1))),), "not among the operand's")]:
        broken = dataclasses.replace(graph, ops=(graph.ops[0], dataclasses.replace(op,
                                                                               prologue=bad)))
        with pytest.raises(GraphError, match=why):
            verify_graph(broken)


def prologue_matmul(m: int, k: int, n: int) -> Graph:
    """(exp(X - mx) * g) @ W with X and mx inputs: one contraction with a prologue."""
    shapes = {"X": (m, k), "mx": (m,), "g": (k,), "Y": (m, k), "W": (k, n), "C": (m, n)}
    graph = fuse_elementwise(graph_of([norm(axes=(("i", m), ("j", k))),
                                       mm("mm", "Y", "W", "C", m, k, n)], ("C",), shapes,
                                      inputs=("X", "mx")), prologues=True)
    assert len(graph.ops) == 1 and graph.ops[0].prologue
    return graph


def prologue_want(graph: Graph, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """exp(X - mx) * g @ W in float64, the prologue matmul's result."""
    x, mx = feeds["X"].astype(np.float64), feeds["mx"].astype(np.float64)
    return (np.exp(x - mx[:, None]) * graph.constants["g"]) @ graph.constants["W"]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 12), k=st.integers(1, 24), n=st.integers(1, 12),
       cores=st.sampled_from([1, 2, 3, 5, 8, 12, 16]))
def test_every_plan_of_a_prologue_matmul_matches_numpy(m: int, k: int, n: int, cores: int
                                                       ) -> None:
    check_every_plan(prologue_matmul(m, k, n), dataclasses.replace(BASE, cores=cores),
                     prologue_want, limit=20)


def test_prologue_plans_rotate_and_are_timed() -> None:
    """The plans checked include rotating and split operands, in fp16, each predicted within
    5% of its emulated cycles; the prologue's inputs rotate with the operand they transform."""
    graph = prologue_matmul(8, 32, 8)
    chip = dataclasses.replace(BASE, cores=16)
    op = graph.ops[0]
    plans = search_op(graph, op, chip, "fp16", SearchOptions(chains=True))
    assert any(p.rot[0] for p in plans)
    extras = [i for i, o in enumerate(op.inputs) if o.tensor == "mx"]
    assert all(bool(p.rot[i]) == bool(p.rot[0]) for p in plans for i in extras
               if "m" in (p.rot[0] or ("m",)))
    assert check_every_plan(graph, chip, prologue_want, "fp16", limit=60, timed=True) > 20


def test_prologue_plans_on_a_mesh() -> None:
    check_every_plan(prologue_matmul(12, 24, 16), PRESETS["wormhole-n150"], prologue_want,
                     "fp16", limit=12)


def test_prologue_costs_vectorised_equal_scalar_and_price_the_prologue() -> None:
    graph = prologue_matmul(12, 40, 20)
    op = graph.ops[0]
    plain = dataclasses.replace(op, inputs=op.inputs[:2], prologue=())
    bare = dataclasses.replace(graph, ops=(plain,))
    chip = dataclasses.replace(BASE, cores=12)
    consts = frozenset(graph.constants)
    plans = search_op(graph, op, chip, "fp16", SearchOptions(chains=True))
    for p in plans:
        geo = geometry(graph, op, p)
        got = plan_cost(geo, chip, "fp16", IntTensors(), consts)
        assert got == (p.cycles, p.hot_bytes_per_core, p.cold_bytes_per_core,
                       p.out_bytes_per_core), p
        if not any(p.rot[2:]):
            q = dataclasses.replace(p, rot=p.rot[:2] + p.rot[-1:], chain=p.chain[:2]
                                    + p.chain[-1:])
            base = plan_cost(geometry(bare, plain, q), chip, "fp16", IntTensors(), consts)
            # the prologue adds vector work on every step and its operands' tiles
            assert got[0].compute > base[0].compute and got[1] > base[1]


def test_a_bert_layer_has_no_elementwise_ops() -> None:
    """Softmax's normalise is the context MatMul's prologue, LayerNorm's the prologue of the
    matmuls after it (recomputed in the residual's epilogue); only the model's last
    LayerNorm, a graph output, stays an op."""
    from t10c import frontend
    from t10c.driver import load_source

    model = load_source("bert-tiny", seq_len=16)
    graph = frontend.to_graph(model, name="bert-tiny", prologues=True)
    verify_graph(graph)
    elementwise = [op.name for op in graph.ops if op.kind == "elementwise"
                   and not op.name.startswith("embeddings/")]  # the embeddings' sum
    assert elementwise == ["layer1/ffn/ln/LayerNormalization"], elementwise
    layer = [op for op in graph.ops if op.name.startswith("layer0/")]
    assert len(layer) == 14, [op.name for op in layer]
    context = next(op for op in layer if op.name.endswith("context/MatMul"))
    assert context.prologue and context.kind == "contraction"
    default = frontend.to_graph(model, name="bert-tiny")  # --fuse all: no prologues
    assert not any(op.prologue for op in default.ops)
    assert len([op for op in default.ops if op.name.startswith("layer0/")]) == 17


@pytest.mark.parametrize("name", ["bert-tiny", "gpt2-tiny"])
def test_prologue_models_agree_with_onnxruntime_and_unfused(name: str) -> None:
    chip = PRESETS["ipu-mk2"]
    results, graphs = {}, {}
    for fuse in ("prologues", "none"):
        compiled = compile_model(name, chip, CompileOptions(dtype="fp32", seq_len=16,
                                                            fuse=fuse))
        graphs[fuse] = compiled.graph
        results[fuse] = run_compiled(compiled)
        assert results[fuse].ok, f"{name} fuse={fuse}: {results[fuse].max_rel_err:.3g}"
    assert any(op.prologue for op in graphs["prologues"].ops)
    for out, value in results["prologues"].outputs.items():
        ref = results["none"].outputs[out]
        scale = max(float(np.abs(ref).max()), 1e-6)
        assert float(np.abs(value - ref).max()) / scale < 1e-3, out


def test_compile_fuse_prologues(capsys, tmp_path) -> None:
    """``--fuse prologues`` reaches the frontend: fewer ops than ``--fuse all``; the program
    written with them is read back, verified and run again by ``t10c run``."""
    import json

    from t10c.cli import main

    counts = {}
    out = tmp_path / "run"
    for flags in (["--fuse", "prologues", "--run", "-o", str(out)], []):
        assert main(["compile", "bert-tiny", "--seq-len", "8", "--chip", "test16",
                     "--no-table", *flags]) == 0
        text = capsys.readouterr().out
        counts[flags[0] if flags else ""] = int(text.split("model bert-tiny: ")[1]
                                                .split(" ops")[0])
    assert counts["--fuse"] < counts[""]
    exprs = json.loads((out / "program.json").read_text())["exprs"]
    assert any("prologue" in e for e in exprs)
    assert main(["run", str(out)]) == 0
    assert "OK" in capsys.readouterr().out
    # a hand-edited prologue that reads past the inputs is refused with one line
    doc = json.loads((out / "program.json").read_text())
    fused = next(e for e in doc["exprs"] if "prologue" in e)
    fused["prologue"][0][1] = ["exp", ["in", 99]]
    (out / "program.json").write_text(json.dumps(doc))
    assert main(["run", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("t10c: error:"), err


def test_fuse_best_keeps_the_faster_predicted_plan() -> None:
    chip = PRESETS["test16"]
    tried = ("all", "epilogues", "prologues")
    compiled = {fuse: compile_model("bert-tiny", chip, CompileOptions(seq_len=8, fuse=fuse))
                for fuse in (*tried, "best")}
    best = compiled["best"]
    assert best.options.fuse in tried  # says which it kept
    kept = compiled[best.options.fuse]
    assert len(best.graph.ops) == len(kept.graph.ops)
    assert best.plan.total_cycles == kept.plan.total_cycles == min(
        compiled[f].plan.total_cycles for f in tried)
