"""Property tests over random tensor expressions and core counts: every enumerated plan verifies,
its emulation equals a numpy reference, and the planner's cycles match the emulator's."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from t10c.chips import PRESETS
from t10c.codegen import generate
from t10c.emulator import emulate
from t10c.ir import Graph, Operand, TensorExpr, TensorInfo, Window, distinct_rows
from t10c.partition import Plan, SearchOptions, search_op, verify_plan

CORES = st.sampled_from([1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 16])
SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def one_op_graph(op: TensorExpr, shapes: dict[str, tuple[int, ...]], consts: set[str],
                 seed: int) -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    values = {name: rng.standard_normal(shape).astype(np.float32)
              for name, shape in shapes.items() if name != op.output.tensor}
    tensors = {name: TensorInfo(name, shape, "float32") for name, shape in shapes.items()}
    graph = Graph("expr", tensors, (op,), {},
                  {k: v for k, v in values.items() if k in consts},
                  tuple(k for k in values if k not in consts), (op.output.tensor,))
    return graph, values


def check_plans(graph: Graph, values: dict[str, np.ndarray], want: np.ndarray, cores: int,
                limit: int = 24) -> None:
    chip = dataclasses.replace(PRESETS["test16"], cores=cores)
    op = graph.ops[0]
    plans = search_op(graph, op, chip, "fp32", SearchOptions(chains=True))
    assert plans
    if len(plans) > limit:
        plans = [plans[i] for i in np.linspace(0, len(plans) - 1, limit).astype(int)]
    inputs = {k: v for k, v in values.items() if k in graph.inputs}
    for p in plans:
        plan = Plan(graph.name, chip.name, "fp32", (p,), (0,), (1,))
        verify_plan(graph, plan, chip)
        out, timeline, _ = emulate(generate(graph, plan, chip), chip, inputs, graph.constants)
        got = out[op.output.tensor]
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= 1e-4 * scale, (p, np.abs(got - want).max())
        assert abs(timeline.cycles - p.cycles.total) <= 0.05 * p.cycles.total, (p, timeline.cycles)
        # memory counted right: the program never needs more than the plan says (up to the
        # allocator's 8-byte alignment of each buffer), and exactly that without a reduction
        slack = 8 * (2 * len(op.operands) + 1)
        assert timeline.peak_sram_bytes_per_core <= p.hot_bytes_per_core + slack, p
        if p.cycles.reduce == 0:
            assert timeline.peak_sram_bytes_per_core >= p.hot_bytes_per_core, p


@SETTINGS
@given(n=st.integers(1, 2), ci=st.integers(1, 4), co=st.integers(1, 5), h=st.integers(3, 9),
       k=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1),
       dil=st.integers(1, 2), cores=CORES, seed=st.integers(0, 99))
# a weight and the output both rotating, then a split reduction: the reduce shares the
# restore shift's superstep, and the memory it needs then was once under-counted by 68 bytes
@example(n=2, ci=1, co=5, h=4, k=2, stride=1, pad=1, dil=1, cores=8, seed=0)
def test_conv2d(n, ci, co, h, k, stride, pad, dil, cores, seed) -> None:
    span = dil * (k - 1) + 1
    if h + 2 * pad < span:
        return
    oh = (h + 2 * pad - span) // stride + 1
    win_h = Window((("oh", stride), ("kh", dil)), -pad)
    win_w = Window((("ow", stride), ("kw", dil)), -pad)
    op = TensorExpr("conv", (("n", n), ("co", co), ("oh", oh), ("ow", oh), ("ci", ci),
                             ("kh", k), ("kw", k)),
                    Operand("y", ("n", "co", "oh", "ow")),
                    (Operand("x", ("n", "ci", win_h, win_w)),
                     Operand("w", ("co", "ci", "kh", "kw"))),
                    "sum", ("mul", ("in", 0), ("in", 1)))
    graph, v = one_op_graph(op, {"x": (n, ci, h, h), "w": (co, ci, k, k), "y": (n, co, oh, oh)},
                            {"w"}, seed)
    xp = np.pad(v["x"], ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    want = np.zeros((n, co, oh, oh), np.float64)
    for i in range(k):
        for j in range(k):
            patch = xp[:, :, i * dil:i * dil + stride * (oh - 1) + 1:stride,
                       j * dil:j * dil + stride * (oh - 1) + 1:stride]
            want += np.einsum("ncij,oc->noij", patch, v["w"][:, :, i, j])
    check_plans(graph, v, want, cores)


@SETTINGS
@given(b=st.integers(1, 3), m=st.integers(1, 9), k=st.integers(1, 12), n=st.integers(1, 9),
       cores=CORES, seed=st.integers(0, 99))
def test_batched_matmul(b, m, k, n, cores, seed) -> None:
    op = TensorExpr("bmm", (("b", b), ("m", m), ("k", k), ("n", n)),
                    Operand("c", ("b", "m", "n")),
                    (Operand("a", ("b", "m", "k")), Operand("d", ("b", "k", "n"))), "sum",
                    ("mul", ("in", 0), ("in", 1)))
    graph, v = one_op_graph(op, {"a": (b, m, k), "d": (b, k, n), "c": (b, m, n)}, set(), seed)
    check_plans(graph, v, np.matmul(v["a"], v["d"]), cores)


@SETTINGS
@given(shape=st.lists(st.integers(1, 7), min_size=2, max_size=3), combine=st.sampled_from(
    ["sum", "max"]), body=st.sampled_from(["plain", "exp"]), cores=CORES,
    seed=st.integers(0, 99), data=st.data())
def test_reduction(shape, combine, body, cores, seed, data) -> None:
    axes = [f"a{i}" for i in range(len(shape))]
    red = data.draw(st.lists(st.sampled_from(axes), min_size=1, unique=True))
    kept = tuple(a for a in axes if a not in red)
    expr = ("in", 0) if body == "plain" else ("exp", ("in", 0))
    op = TensorExpr("red", tuple(zip(axes, shape)), Operand("y", kept),
                    (Operand("x", tuple(axes)),), combine, expr)
    out_shape = tuple(s for a, s in zip(axes, shape) if a in kept)
    graph, v = one_op_graph(op, {"x": tuple(shape), "y": out_shape}, set(), seed)
    x = v["x"] if body == "plain" else np.exp(v["x"])
    dims = tuple(axes.index(a) for a in red)
    want = x.sum(axis=dims) if combine == "sum" else x.max(axis=dims)
    check_plans(graph, v, want.reshape(out_shape), cores)


@SETTINGS
@given(m=st.integers(1, 12), n=st.integers(1, 12), cores=CORES, seed=st.integers(0, 99))
def test_broadcast_elementwise(m, n, cores, seed) -> None:
    body = ("div", ("mul", ("in", 0), ("in", 1)), ("add", ("square", ("in", 2)), ("const", 1.0)))
    op = TensorExpr("ew", (("m", m), ("n", n)), Operand("y", ("m", "n")),
                    (Operand("x", ("m", "n")), Operand("r", ("n",)), Operand("c", ("m",))),
                    None, body)
    graph, v = one_op_graph(op, {"x": (m, n), "r": (n,), "c": (m,), "y": (m, n)}, {"r"}, seed)
    want = v["x"] * v["r"][None, :] / (v["c"][:, None] ** 2 + 1)
    check_plans(graph, v, want, cores)


def test_unravel_is_right_where_numpy_2_4_is_not() -> None:
    """An index array whose last dimension is 1, past 8,192 elements: numpy 2.4.6's
    `np.unravel_index` gets it wrong; `ir.unravel` (through a 1-d copy) does not."""
    from t10c.ir import unravel

    n = 20_000
    flat = np.arange(n).reshape(n, 1)
    rows, cols = unravel(flat, (n // 4, 4))
    assert rows.shape == cols.shape == (n, 1)
    assert (rows[:, 0] == np.arange(n) // 4).all() and (cols[:, 0] == np.arange(n) % 4).all()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(0, 4), st.sampled_from([np.int32, np.int64]),
       st.sampled_from([3, 1 << 20, 1 << 40]), st.integers(0, 2 ** 31 - 1))
def test_distinct_rows_are_numpys(n: int, cols: int, dtype, spread: int, seed: int) -> None:
    """`distinct_rows` gives what ``np.unique(rows, axis=0, return_inverse=True)`` gives: the
    same rows in the same order and the same numbering, negative values and ranges too wide to
    pack into one integer included."""
    rng = np.random.default_rng(seed)
    hi = min(spread, np.iinfo(dtype).max)
    rows = rng.integers(-hi, hi, size=(n, cols), endpoint=True).astype(dtype)
    if n > 1:
        rows[n // 2] = rows[0]  # a repeated row
    uniq, inverse = distinct_rows(rows)
    if not n:
        assert uniq.shape == (0, cols) and inverse.shape == (0,)
        return
    want, want_inverse = np.unique(rows, axis=0, return_inverse=True)
    np.testing.assert_array_equal(uniq, want)
    assert uniq.dtype == rows.dtype
    np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))
