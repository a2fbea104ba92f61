"""Epilogue fusion (`frontend/fuse.py`): which elementwise consumers fold into the matmul or
reduction before them (a table of cases), that every plan of a fused op computes what numpy
computes (split reductions, rotating outputs, a mesh), that its cost is predicted, and that
fused and unfused zoo models agree with onnxruntime and with each other."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ophelpers import check_every_plan

from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.dtypes import IntTensors, ceil_div
from t10c.elementwise import erf
from t10c.frontend.fuse import fuse_elementwise
from t10c.ir import Graph, Operand, TensorExpr, TensorInfo, Window, expr_from_json, expr_to_json
from t10c.partition import SearchOptions, geometry, plan_cost, search_op

BASE = PRESETS["test16"]
M, K, N = 6, 10, 8
MM = TensorExpr("mm", (("m", M), ("k", K), ("n", N)), Operand("C", ("m", "n")),
                (Operand("A", ("m", "k")), Operand("W", ("k", "n"))), "sum",
                ("mul", ("in", 0), ("in", 1)))
ROWSUM = TensorExpr("rowsum", (("m", M), ("k", K)), Operand("C", ("m",)),
                    (Operand("A", ("m", "k")),), "sum", ("in", 0))
SHAPES = {"A": (M, K), "W": (K, N), "b": (N,), "R": (M, N), "C": (M, N), "D": (M, N),
          "E": (M, N), "T": (N, M), "X": (M, N, 3), "F": (M, N, 3), "P": (M, N + 2)}
INPUTS = ("A", "R", "X", "P", "S", "H", "V")


def ew(name: str, out: str, ins: list[tuple[str, tuple]], body: tuple,
       axes: tuple = (("i", M), ("j", N)), out_axes: tuple = ("i", "j")) -> TensorExpr:
    """An elementwise op over ``axes``."""
    return TensorExpr(name, axes, Operand(out, out_axes),
                      tuple(Operand(t, a) for t, a in ins), None, body)


def graph_of(ops: list[TensorExpr], outputs: tuple[str, ...], shapes: dict = SHAPES
             ) -> Graph:
    rng = np.random.default_rng(0)
    named = {o.tensor for op in ops for o in op.operands}
    tensors = {t: TensorInfo(t, shapes[t], "float32") for t in named}
    consts = {t: rng.standard_normal(shapes[t]).astype(np.float32)
              for t in named if t in ("W", "b")}
    return Graph("g", tensors, tuple(ops), {}, consts,
                 tuple(t for t in INPUTS if t in named), outputs)


IJ = ("i", "j")
ADD_B = ew("addb", "D", [("C", IJ), ("b", ("j",))], ("add", ("in", 0), ("in", 1)))
ACC_B = ("add", ("acc",), ("in", 0))


@dataclass(frozen=True)
class Case:
    name: str
    ops: tuple[TensorExpr, ...]
    outputs: tuple[str, ...]
    epilogue: tuple | None  # the fused op's epilogue, None: nothing folds
    extra: tuple[str, ...] = ()
    nops: int = 1


CASES = [
    Case("bias", (MM, ADD_B), ("D",), ACC_B, ("b",)),
    Case("scale", (MM, ew("scale", "D", [("C", IJ)], ("mul", ("in", 0), ("const", 0.125)))),
         ("D",), ("mul", ("acc",), ("const", 0.125))),
    # GELU as one op reading the matmul twice (as the inliner leaves it)
    Case("gelu", (MM, ew("gelu", "D", [("C", IJ), ("C", IJ)],
                         ("mul", ("in", 0), ("erf", ("in", 1))))),
         ("D",), ("mul", ("acc",), ("erf", ("acc",)))),
    Case("residual", (MM, ew("res", "D", [("R", IJ), ("C", IJ)], ("add", ("in", 0), ("in", 1)))),
         ("D",), ("add", ("in", 0), ("acc",)), ("R",)),
    # bias, then residual: the epilogues compose
    Case("bias+residual", (MM, ADD_B, ew("res", "E", [("D", IJ), ("R", IJ)],
                                         ("add", ("in", 0), ("in", 1)))),
         ("E",), ("add", ACC_B, ("in", 1)), ("b", "R")),
    # the consumer writes the result transposed: the output is renamed, not re-laid out
    Case("transposed", (MM, ew("t", "T", [("C", IJ)], ("neg", ("in", 0)),
                               axes=(("j", N), ("i", M)), out_axes=("j", "i"))),
         ("T",), ("neg", ("acc",))),
    Case("row statistic", (ROWSUM, ew("rstd", "D", [("C", ("i",))],
                                      ("rsqrt", ("add", ("in", 0), ("const", 1e-5))),
                                      axes=(("i", M),), out_axes=("i",))),
         ("D",), ("rsqrt", ("add", ("acc",), ("const", 1e-5)))),
    # refused: the result has another reader
    Case("two readers", (MM, ADD_B, ew("twice", "E", [("C", IJ)], ("mul", ("in", 0),
                                                                   ("const", 2.0)))),
         ("D", "E"), None, nops=3),
    # refused: the result is a graph output too
    Case("graph output", (MM, ADD_B), ("C", "D"), None, nops=2),
    # refused: the consumer iterates over more than the result (each point read 3 times)
    Case("wider consumer", (MM, ew("wide", "F", [("C", IJ), ("X", ("i", "j", "c"))],
                                   ("mul", ("in", 0), ("in", 1)),
                                   axes=(("i", M), ("j", N), ("c", 3)),
                                   out_axes=("i", "j", "c"))),
         ("F",), None, nops=2),
    # refused: an extra operand read through a window (a shifted slice), not output-aligned
    Case("window extra", (MM, ew("win", "D", [("C", IJ), ("P", ("i", Window((("j", 1),), 2)))],
                                 ("add", ("in", 0), ("in", 1)))),
         ("D",), None, nops=2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fusion_rules(case: Case) -> None:
    fused = fuse_elementwise(graph_of(list(case.ops), case.outputs))
    assert len(fused.ops) == case.nops
    epilogues = [op for op in fused.ops if op.epilogue is not None]
    if case.epilogue is None:
        assert not epilogues
        return
    (op,) = epilogues
    assert op.epilogue == case.epilogue
    assert tuple(o.tensor for o in op.extra) == case.extra
    assert op.output.tensor == case.outputs[0]
    assert expr_from_json(expr_to_json(op)) == op  # the JSON keeps the epilogue
    # without epilogues the pass leaves the matmul and its consumer apart
    plain = fuse_elementwise(graph_of(list(case.ops), case.outputs), epilogues=False)
    assert all(o.epilogue is None for o in plain.ops) and len(plain.ops) > len(fused.ops)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + erf(x / math.sqrt(2.0)))


def fused_matmul(m: int, k: int, n: int, residual: bool = True) -> Graph:
    """gelu(A @ W + b) (+ R): one fused op with a weight and an input as extra operands."""
    shapes = {"A": (m, k), "W": (k, n), "b": (n,), "R": (m, n), "C": (m, n), "D": (m, n),
              "E": (m, n)}
    mm = dataclasses.replace(MM, axes=(("m", m), ("k", k), ("n", n)))
    ij = (("i", m), ("j", n))
    gelu = ew("gelu", "D", [("C", IJ), ("b", ("j",))],
              ("mul", ("mul", ("add", ("in", 0), ("in", 1)), ("const", 0.5)),
               ("add", ("const", 1.0), ("erf", ("div", ("add", ("in", 0), ("in", 1)),
                                                 ("const", math.sqrt(2.0)))))), axes=ij)
    ops = [mm, gelu]
    if residual:
        ops.append(ew("res", "E", [("D", IJ), ("R", IJ)], ("add", ("in", 0), ("in", 1)),
                      axes=ij))
    graph = fuse_elementwise(graph_of(ops, ("E" if residual else "D",), shapes))
    assert len(graph.ops) == 1 and graph.ops[0].epilogue is not None
    return graph


def fused_rowsum(m: int, k: int) -> Graph:
    shapes = {"A": (m, k), "C": (m,), "D": (m,)}
    op = dataclasses.replace(ROWSUM, axes=(("m", m), ("k", k)))
    rstd = ew("rstd", "D", [("C", ("i",))],
              ("rsqrt", ("add", ("mul", ("in", 0), ("in", 0)), ("const", 1.0))),
              axes=(("i", m),), out_axes=("i",))
    graph = fuse_elementwise(graph_of([op, rstd], ("D",), shapes))
    assert len(graph.ops) == 1 and graph.ops[0].epilogue is not None
    return graph


def want_of(graph: Graph, feeds: dict[str, np.ndarray]) -> np.ndarray:
    a = feeds["A"]
    if graph.ops[0].name == "rowsum":
        s = a.sum(axis=1, dtype=np.float64)
        return 1.0 / np.sqrt(s * s + 1.0)
    d = _gelu(a.astype(np.float64) @ graph.constants["W"] + graph.constants["b"])
    return d + feeds["R"] if "R" in feeds else d


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 12), k=st.integers(1, 24), n=st.integers(1, 12),
       cores=st.sampled_from([1, 2, 3, 5, 8, 12, 16]))
def test_every_plan_of_a_fused_matmul_matches_numpy(m: int, k: int, n: int, cores: int) -> None:
    graph = fused_matmul(m, k, n)
    check_every_plan(graph, dataclasses.replace(BASE, cores=cores), want_of, limit=20)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 10), k=st.integers(1, 40), cores=st.sampled_from([2, 3, 7, 12, 16]))
def test_every_plan_of_a_fused_reduction_matches_numpy(m: int, k: int, cores: int) -> None:
    """Split reductions included: the epilogue runs on the reduce-scattered chunks."""
    check_every_plan(fused_rowsum(m, k), dataclasses.replace(BASE, cores=cores), want_of,
                     limit=20)


def test_fused_plans_split_reductions_and_rotate_outputs() -> None:
    """The sample above is not luck: the plans checked here include reduce-scatters and
    rotating outputs, in fp16, with the cycles of the bias-only op predicted within 5%."""
    graph = fused_matmul(8, 32, 8, residual=False)
    chip = dataclasses.replace(BASE, cores=16)
    plans = search_op(graph, graph.ops[0], chip, "fp16", SearchOptions(chains=True))
    assert any(geometry(graph, graph.ops[0], p).reduce_group > 1 for p in plans)
    assert any(p.rot[-1] for p in plans)
    assert check_every_plan(graph, chip, want_of, "fp16", limit=60, timed=True) > 20


def test_fused_plans_on_a_mesh() -> None:
    graph = fused_matmul(12, 24, 16)
    check_every_plan(graph, PRESETS["wormhole-n150"], want_of, "fp16", limit=12)


def test_fused_costs_vectorised_equal_scalar_and_price_the_epilogue() -> None:
    graph = fused_matmul(12, 40, 20)
    op = graph.ops[0]
    plain = dataclasses.replace(op, epilogue=None, extra=())
    bare = dataclasses.replace(graph, ops=(plain,))
    chip = dataclasses.replace(BASE, cores=12)
    consts = frozenset(graph.constants)
    for home in (False, True):
        opts = SearchOptions(chains=True, weights_home=home)
        for p in search_op(graph, op, chip, "fp16", opts):
            geo = geometry(graph, op, p)
            got = plan_cost(geo, chip, "fp16", IntTensors(), consts, home)
            assert got == (p.cycles, p.hot_bytes_per_core, p.cold_bytes_per_core,
                           p.out_bytes_per_core), p
            base = plan_cost(geometry(bare, plain, p), chip, "fp16", IntTensors(), consts, home)
            # the epilogue adds vector work and two buffers (the residual's exchange is an
            # edge of the whole-graph choice)
            assert got[0].compute > base[0].compute
            assert got[1] > base[1] and got[2] > base[2]
            share = ceil_div(math.prod(geo.tile_shape(2)), geo.reduce_group)
            # the bias waits in its idle layout (20 elements over cores 1 to 11: 2 each) and
            # is fetched, with the weight when it warms up, in one exchange after a barrier
            assert got[2] == base[2] + 2 * 2
            weights = base_fetch(geo) if home else 0
            assert got[0].shift == base[0].shift - chip.transfer_cycles(weights) + \
                chip.transfer_cycles(weights + 2 * share)
            assert got[0].sync == base[0].sync + (0 if home else chip.sync_cycles)


def base_fetch(geo) -> int:
    """Bytes of the weight W's tile (fp16) a warming-up plan fetches."""
    return 2 * math.prod(geo.tile_shape(1))


# every zoo model of the default suite (test_zoo's tiny ones and bert-tiny)
ZOO = ["bert-tiny", "gpt2-tiny", "vit-tiny", "llama-tiny", "resnet-tiny"]


@pytest.mark.parametrize("name", ZOO)
def test_fused_and_unfused_zoo_models_agree(name: str) -> None:
    chip = PRESETS["ipu-mk2"]
    results, counts = {}, {}
    for fuse in ("all", "none"):
        compiled = compile_model(name, chip, CompileOptions(dtype="fp32", seq_len=16,
                                                            fuse=fuse))
        counts[fuse] = len(compiled.graph.ops)
        results[fuse] = run_compiled(compiled)
        assert results[fuse].ok, f"{name} fuse={fuse}: {results[fuse].max_rel_err:.3g}"
    assert counts["all"] < counts["none"]
    for out, value in results["all"].outputs.items():
        ref = results["none"].outputs[out]
        scale = max(float(np.abs(ref).max()), 1e-6)
        assert float(np.abs(value - ref).max()) / scale < 1e-3, out


def test_compile_fuse_options(capsys) -> None:
    """``--no-fuse`` and ``--fuse inline`` reach the frontend: the op table shrinks with
    each level of fusion; a bad level is refused with one line (exit 2)."""
    from t10c.cli import main

    counts = {}
    for flags in (["--no-fuse"], ["--fuse", "inline"], []):
        assert main(["compile", "bert-tiny", "--seq-len", "8", "--chip", "test16",
                     "--no-table", *flags]) == 0
        text = capsys.readouterr().out
        counts[" ".join(flags)] = int(text.split("model bert-tiny: ")[1].split(" ops")[0])
    assert counts[""] < counts["--fuse inline"] < counts["--no-fuse"]
    assert main(["compile", "bert-tiny", "--fuse", "some"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("t10c: error:")


def _halves(g, x: str, lo: tuple[int, int], hi: tuple[int, int], neg: str = "Neg") -> str:
    """``Concat(f(x[..., hi]), x[..., lo]) * 1 + x``: a rotate-half (``f`` = Neg) when ``lo``
    and ``hi`` are the two halves of the last axis, read by one elementwise op."""
    a = g.node("Slice", x, g.ints(lo[0]), g.ints(lo[1]), g.ints(-1))
    b = g.node(neg, g.node("Slice", x, g.ints(hi[0]), g.ints(hi[1]), g.ints(-1)))
    return g.node("Add", g.node("Concat", b, a, axis=-1), x)


ROTATE_CASES = [
    # LLaMA's rotate_half: both Slices and the Neg fold into the Add, one op
    ("rotate half", (0, 4), (4, 8), "Neg", (4, 8), 1),
    # Exp(0) is 1: reading past the Exp's output would not give the Concat's zero padding
    ("exp piece", (0, 4), (4, 8), "Exp", (4, 8), 2),
    # pieces from the middle: around each piece lies more of x, so the Concat's reads past a
    # piece, composed, would read x where they read zero: neither folds
    ("middle pieces", (1, 5), (3, 7), "Neg", (4, 8), 3),
]


@pytest.mark.parametrize("case", ROTATE_CASES, ids=lambda c: c[0])
def test_shifted_reads_of_cheap_producers_fold_only_where_exact(case) -> None:
    """Rule 4 of `frontend/fuse.py`: a Concat's pieces read through shifts inline into their
    reader only where reading past a piece reads every input's padding too, and the body
    gives zero on zeros; the emulated result equals onnxruntime's either way."""
    from ophelpers import make_model

    from t10c.frontend import to_graph

    name, lo, hi, neg, shape, nops = case
    model = make_model(name.replace(" ", "-"),
                       lambda g, xs: _halves(g, xs[0], lo, hi, neg), (shape,))
    assert len(to_graph(model).ops) == nops
    result = run_compiled(compile_model(model, BASE, CompileOptions(dtype="fp32")))
    assert result.ok, f"{name}: {result.max_rel_err:.3g}"


def _rmsnorm(g, xs) -> str:
    """LLaMA's RMSNorm as exported: ``x * (1 / sqrt(mean(x^2, keepdims) + eps)) * w``."""
    x = xs[0]
    mean = g.node("ReduceMean", g.node("Mul", x, x), axes=[-1], keepdims=1)
    scale = g.node("Reciprocal", g.node("Sqrt", g.node("Add", mean, g.const(1e-5))))
    return g.node("Mul", g.node("Mul", x, scale), g.weight(16))


def test_a_matmul_reading_a_slice_stays_a_matmul() -> None:
    """A copy (a Slice) inlined into a matmul's first operand leaves its source in that
    slot: the op is still input 0 times input 1, summed, a contraction on the matrix unit.
    When the source went after the weight instead, the product read ``in1 * in0``, was no
    contraction, and was priced and run as a vector op (16 times slower on the IPU: LLaMA's
    context over a DRAM-resident cache, ViT's classifier on its class token)."""
    from t10c.ir import is_contraction

    first = ew("first", "S", [("X", ("i", "j", Window((), 0)))], ("in", 0))
    head = TensorExpr("head", (("i", M), ("j", N), ("n", 3)), Operand("C", ("i", "n")),
                      (Operand("S", ("i", "j")), Operand("F", ("j", "n"))), "sum",
                      ("mul", ("in", 0), ("in", 1)))
    shapes = {**SHAPES, "S": (M, N), "F": (N, 3), "C": (M, 3)}
    fused = fuse_elementwise(graph_of([first, head], ("C",), shapes))
    (op,) = fused.ops
    assert [o.tensor for o in op.inputs] == ["X", "F"] and is_contraction(op)
    assert op.inputs[0].axes == ("i", "j", Window((), 0))


@pytest.mark.parametrize("name", ["vit-tiny", "llama-tiny-decode"])
def test_every_product_of_two_inputs_is_a_contraction(name: str) -> None:
    """In the device graphs (split caches too: the context over the past cache reads the
    probabilities through a Slice), a summed product of two inputs is always input 0 times
    input 1."""
    from t10c.driver import chip_graph, load_source
    from t10c.ir import is_contraction

    graph = chip_graph(load_source(name, weights=False), PRESETS["test64-dram"], {})
    products = [op for op in graph.ops if op.combine == "sum" and op.body[0] == "mul"
                and all(a[0] == "in" for a in op.body[1:])]
    assert products and all(is_contraction(op) for op in products), [
        op.name for op in products if not is_contraction(op)]


@pytest.mark.parametrize("chip", ["test16", "wormhole-n150"])
def test_a_scalar_statistic_folds_its_scalar_steps(chip: str) -> None:
    """At one token (decode), RMSNorm's statistic is one element kept as ``(1, 1, 1)``: the
    eps Add, the Sqrt and the Reciprocal read it through unit views and still fold into the
    mean as its epilogue (two ops, not five), and the result equals onnxruntime's."""
    from ophelpers import make_model

    from t10c.frontend import to_graph

    model = make_model("rmsnorm-1", _rmsnorm, ((1, 1, 16),))
    ops = to_graph(model).ops
    assert len(ops) == 2, [op.name for op in ops]
    assert ops[0].combine == "sum"
    assert ops[0].epilogue == ("recip", ("sqrt", ("add", ("acc",), ("const", pytest.approx(1e-5)))))
    result = run_compiled(compile_model(model, PRESETS[chip], CompileOptions(dtype="fp32")))
    assert result.ok, f"{chip}: {result.max_rel_err:.3g}"


def test_a_cheap_op_an_epilogue_reads_is_recomputed_by_its_readers() -> None:
    """Rule 5: ``P = exp(V - 1)``, read by a row sum's epilogue and by an elementwise op, is
    computed by both (the epilogue reads ``V`` instead of ``P``) and its op is gone. ``P``
    keeps its op where its recomputation would add two extras to the epilogue, and where the
    epilogue is a matmul's (whose result is as large as ``P``)."""
    rows = (("i", M),)
    shapes = {**SHAPES, "V": (M,), "S": (M,), "H": (M,), "Q": (M,), "G": (M,), "Y": (M,),
              "Z": (M, N), "U": (M, N)}
    cheap = ew("p", "Q", [("V", ("i",))], ("exp", ("sub", ("in", 0), ("const", 1.0))),
               axes=rows, out_axes=("i",))
    res = ew("res", "Y", [("C", ("i",)), ("Q", ("i",))], ("add", ("in", 0), ("in", 1)),
             axes=rows, out_axes=("i",))
    other = ew("other", "G", [("Q", ("i",))], ("mul", ("in", 0), ("const", 2.0)),
               axes=rows, out_axes=("i",))
    sums = {**shapes, "C": (M,)}
    fused = fuse_elementwise(graph_of([ROWSUM, cheap, res, other], ("Y", "G"), sums))
    assert [op.name for op in fused.ops] == ["rowsum", "other"]
    total, doubled = fused.ops
    assert [o.tensor for o in total.extra] == ["V"]
    assert total.epilogue == ("add", ("acc",), ("exp", ("sub", ("in", 0), ("const", 1.0))))
    assert [o.tensor for o in doubled.inputs] == ["V"]
    # three inputs in place of one extra: P keeps its op
    wide = ew("p", "Q", [("V", ("i",)), ("S", ("i",)), ("H", ("i",))],
              ("add", ("add", ("in", 0), ("in", 1)), ("in", 2)), axes=rows, out_axes=("i",))
    fused = fuse_elementwise(graph_of([ROWSUM, wide, res, other], ("Y", "G"), sums))
    assert "p" in [op.name for op in fused.ops]
    # a matmul's residual epilogue: P keeps its op
    big = ew("p", "Z", [("R", IJ)], ("exp", ("sub", ("in", 0), ("const", 1.0))))
    mres = ew("res", "D", [("C", IJ), ("Z", IJ)], ("add", ("in", 0), ("in", 1)))
    mother = ew("other", "U", [("Z", IJ)], ("mul", ("in", 0), ("const", 2.0)))
    fused = fuse_elementwise(graph_of([MM, big, mres, mother], ("D", "U"), shapes))
    assert "p" in [op.name for op in fused.ops]
