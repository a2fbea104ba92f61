"""Op tests, layout ops: views (Reshape, Flatten, Squeeze, Unsqueeze) and copies through index
maps (Slice, Concat, Split, Gather, GatherElements, Expand, Tile, Pad, Trilu) on activations,
checked against onnxruntime like `test_ops`.

Each copy is followed by an elementwise op or a matmul in some cases, so that both the copy on
its own (a graph output) and the copy folded into its reader by the fusion pass are exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
from ophelpers import CHIPS, Build, Case, G, Ids, case_model, check_case, with_fp16

from t10c.frontend import to_graph


def then_relu(build: Build) -> Build:
    return lambda g, x: g.node("Relu", build(g, x))


def then_matmul(build: Build, k: int, n: int = 3) -> Build:
    return lambda g, x: g.node("MatMul", build(g, x), g.weight(k, n))


def slice_(starts: list[int], ends: list[int], axes: list[int] | None = None,
           steps: list[int] | None = None) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = [x[0], g.ints(*starts), g.ints(*ends)]
        if axes is not None:
            ins.append(g.ints(*axes))
        if steps is not None:
            ins.append(g.ints(*steps))
        return g.node("Slice", *ins)
    return build


def slice_1(starts: list[int], ends: list[int], axes: list[int]) -> Build:
    return lambda g, x: g.node("Slice", x[0], starts=starts, ends=ends, axes=axes)


def concat(axis: int, with_weight: tuple[int, ...] | None = None) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = list(x) + ([g.weight(*with_weight)] if with_weight else [])
        return g.node("Concat", *ins, axis=axis)
    return build


def rotate_half(g: G, x: list[str]) -> str:
    """LLaMA's RoPE: x * cos + cat(-x2, x1) * sin with x1, x2 the halves of the last axis."""
    half = 4
    x1 = g.node("Slice", x[0], g.ints(0), g.ints(half), g.ints(-1))
    x2 = g.node("Slice", x[0], g.ints(half), g.ints(2 ** 62), g.ints(-1))
    rotated = g.node("Concat", g.node("Neg", x2), x1, axis=-1)
    cos, sin = g.weight(5, 8), g.weight(5, 8)
    return g.node("Add", g.node("Mul", x[0], cos), g.node("Mul", rotated, sin))


def split(axis: int, sizes: list[int] | None, outputs: int, opset: int = 17,
          num_outputs: int | None = None) -> Build:
    def build(g: G, x: list[str]) -> list[str]:
        ins = [x[0]] + ([g.ints(*sizes)] if sizes is not None and opset >= 13 else [])
        attrs: dict[str, object] = {"axis": axis}
        if sizes is not None and opset < 13:
            attrs["split"] = sizes
        if num_outputs is not None:
            attrs["num_outputs"] = num_outputs
        outs = g.multi("Split", outputs, *ins, **attrs)
        return [g.node("Relu", outs[0])] + outs[1:]
    return build


def glu(g: G, x: list[str]) -> str:
    a, b = g.multi("Split", 2, x[0], g.ints(3, 3), axis=1)
    return g.node("Mul", a, g.node("Sigmoid", b))


def gather_axis(indices: object, axis: int) -> Build:
    return lambda g, x: g.node("Gather", x[0], g.const(indices, np.int64), axis=axis)


def gather_nd(indices: object) -> Build:
    return lambda g, x: g.node("GatherND", x[0], g.const(indices, np.int64))


def gather_table_axis1(g: G, x: list[str]) -> str:
    return g.node("Gather", g.weight(3, 10), x[0], axis=1)


def gather_elements(indices: np.ndarray, axis: int) -> Build:
    return lambda g, x: g.node("GatherElements", x[0], g.const(indices, np.int64), axis=axis)


def expand(*shape: int) -> Build:
    return lambda g, x: g.node("Expand", x[0], g.ints(*shape))


def repeat_kv(g: G, x: list[str]) -> str:
    """LLaMA's grouped-query attention: [b, kv, s, d] -> [b, kv, 2, s, d] -> [b, 2*kv, s, d]."""
    wide = g.node("Expand", g.node("Unsqueeze", x[0], g.ints(2)), g.ints(1, 2, 2, 3, 4))
    heads = g.node("Reshape", wide, g.ints(1, 4, 3, 4))
    return g.node("MatMul", x[1], g.node("Transpose", heads, perm=[0, 1, 3, 2]))


def tile(*repeats: int) -> Build:
    return lambda g, x: g.node("Tile", x[0], g.ints(*repeats))


def pad(pads: list[int], value: float | None = None, axes: list[int] | None = None) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = [x[0], g.ints(*pads)]
        if value is not None or axes is not None:
            ins.append(g.const(value or 0.0) if value is not None else "")
        if axes is not None:
            ins.append(g.ints(*axes))
        return g.node("Pad", *ins, mode="constant")
    return build


def pad_mode(pads: list[int], mode: str) -> Build:
    return lambda g, x: g.node("Pad", x[0], g.ints(*pads), mode=mode)


def pad_2(pads: list[int], value: float) -> Build:
    return lambda g, x: g.node("Pad", x[0], pads=pads, value=value)


def trilu(upper: int, k: int | None = None) -> Build:
    def build(g: G, x: list[str]) -> str:
        ins = [x[0]] + ([g.const(k, np.int64)] if k is not None else [])
        return g.node("Trilu", *ins, upper=upper)
    return build


def views(g: G, x: list[str]) -> str:
    flat = g.node("Flatten", g.node("Unsqueeze", x[0], g.ints(0)), axis=2)
    squeezed = g.node("Squeeze", g.node("Reshape", flat, g.ints(1, 2, 12)), g.ints(0))
    return g.node("MatMul", squeezed, g.weight(12, 3))


def views_11(g: G, x: list[str]) -> str:
    up = g.node("Unsqueeze", x[0], axes=[0, 3])
    return g.node("Relu", g.node("Squeeze", up, axes=[0]))


FP32_CASES: list[Case] = [
    Case("views", views, ((2, 3, 4),)),
    Case("Squeeze-Unsqueeze-11", views_11, ((2, 3),), opset=11),
    Case("Slice", slice_([1], [3], [1]), ((2, 4, 5),)),
    Case("Slice-negative-start", slice_([-3, 0], [2 ** 62, 2], [2, 0]), ((3, 4, 6),)),
    Case("Slice-steps", slice_([0, 1], [4, 6], [1, 2], [2, 2]), ((2, 4, 6),)),
    Case("Slice-Relu", then_relu(slice_([1], [4], [0])), ((5, 3),)),
    Case("Slice-MatMul", then_matmul(slice_([2], [6], [1]), 4), ((3, 7),)),
    Case("Slice-1", slice_1([1, 0], [3, 2], [0, 1]), ((4, 5),), opset=9),
    Case("Concat-axis0", concat(0), ((2, 3), (4, 3))),
    Case("Concat-axis-1-three", concat(-1), ((2, 3, 1), (2, 3, 4), (2, 3, 2))),
    Case("Concat-weight", concat(1, (2, 5)), ((2, 3),)),
    Case("Concat-Relu", then_relu(concat(1)), ((2, 3), (2, 2))),
    Case("Concat-MatMul", then_matmul(concat(1), 6), ((2, 3), (2, 3))),
    Case("rotate-half", rotate_half, ((2, 5, 8),)),
    Case("Split-equal", split(1, None, 2), ((2, 6),)),
    Case("Split-sizes-13", split(0, [1, 3], 2), ((4, 5),)),
    Case("Split-attr-11", split(-1, [2, 1, 3], 3, opset=11), ((2, 6),), opset=11),
    Case("Split-num-outputs-18", split(1, None, 3, num_outputs=3), ((2, 7),), opset=18),
    Case("GLU", glu, ((4, 6),)),
    Case("Gather-scalar-axis1", gather_axis(0, 1), ((2, 5, 3),)),
    Case("Gather-negative-scalar", gather_axis(-1, 0), ((4, 3),)),
    Case("Gather-range", then_relu(gather_axis([1, 2, 3], 1)), ((2, 5),)),
    Case("Gather-strided-2d", gather_axis([[0, 2], [4, 6]], 0), ((8, 3),)),
    Case("Gather-table-axis1", gather_table_axis1, (Ids((2, 4)),)),
    Case("GatherND-rows", gather_nd([[0, 1], [1, 2], [1, 3]]), ((2, 4, 3),)),
    Case("GatherND-affine", then_relu(gather_nd([[[0], [1]], [[1], [2]]])), ((3, 5),)),
    Case("GatherElements-computed", lambda g, x: g.node("GatherElements", x[0], x[1], axis=1),
         ((2, 3), Ids((2, 4)))),
    # flat positions up to 4033: rounded if they were stored as fp16
    Case("GatherElements-computed-large", lambda g, x: g.node("GatherElements", x[0], x[1],
                                                              axis=1), ((64, 64), Ids((64, 2)))),
    Case("GatherElements-computed-negative", lambda g, x: g.node(
        "GatherElements", x[0], g.node("Sub", x[1], g.const([2], np.int64)), axis=0),
         ((2, 3), Ids((2, 3)))),
    Case("GatherElements-shift", gather_elements(np.tile(np.arange(1, 4), (2, 1)), 1),
         ((2, 5),)),
    Case("GatherElements-permutation", gather_elements(np.array([[2, 0, 1], [1, 1, 0]]), 0),
         ((3, 3),)),
    Case("GatherElements-smaller", gather_elements(np.array([[4, 0], [1, 3]]), 1), ((3, 5),)),
    Case("Expand", expand(2, 3, 4), ((3, 1),)),
    Case("Expand-Mul", lambda g, x: g.node("Mul", expand(3, 4)(g, x), x[1]), ((4,), (3, 4))),
    Case("repeat-kv", repeat_kv, ((1, 2, 3, 4), (1, 4, 5, 4))),
    Case("Tile", tile(2, 3), ((2, 3),)),
    Case("Tile-3d", tile(1, 2, 1), ((2, 3, 2),)),
    Case("Pad", pad([0, 1, 2, 0, 2, 1]), ((2, 3, 4),)),
    Case("Pad-value", pad([1, 1, 1, 1], 1.5), ((3, 4),)),
    Case("Pad-computed-value", lambda g, x: g.node(
        "Pad", x[0], g.ints(1, 0, 0, 2), g.node("ReduceMax", x[1], keepdims=0)), ((3, 4), (5,))),
    Case("Pad-negative", pad([0, -1, 0, 2]), ((3, 4),)),
    Case("Pad-axes-18", pad([1, 2], 0.25, [1]), ((3, 4),), opset=18),
    Case("Pad-2", pad_2([0, 0, 1, 2, 0, 0, 2, 1], -0.5), ((1, 2, 3, 3),), opset=9),
    Case("Slice-reversed", slice_([-1, 3], [-2 ** 62, 0], [1, 2], [-1, -2]), ((2, 4, 6),)),
    Case("Slice-mixed-steps", then_relu(slice_([0, 5], [3, 0], [0, 1], [2, -2])), ((4, 6),)),
    Case("Gather-permutation", gather_axis([2, 0, 1, 1], 1), ((3, 4),)),
    Case("Gather-computed-indices", lambda g, x: g.node("Gather", g.node("Relu", x[0]), x[1],
                                                         axis=1), ((3, 6), Ids((2, 2)))),
    Case("Pad-reflect", pad_mode([0, 0, 1, 2, 0, 0, 2, 1], "reflect"), ((1, 2, 4, 4),)),
    Case("Pad-edge", pad_mode([1, 0, 0, 2], "edge"), ((3, 4),)),
    Case("Pad-wrap-19", pad_mode([0, 2, 0, 1], "wrap"), ((3, 4),), opset=19),
    Case("Trilu-upper", trilu(1), ((2, 4, 5),)),
    Case("Trilu-lower-k", trilu(0, -1), ((4, 5),)),
]

CASES = with_fp16(FP32_CASES)


@pytest.mark.parametrize("chip", list(CHIPS), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_layout_op_matches_onnxruntime(case: Case, chip: str) -> None:
    check_case(case, chip)


def test_case_names_are_unique() -> None:
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("name,ops", [
    ("Slice-Relu", 1), ("Slice-MatMul", 1), ("Concat-Relu", 1), ("GLU", 1), ("Expand-Mul", 1),
    # the halves (a slice, and a slice + Neg) concatenated and read by the RoPE sum through
    # windows fold into it: where a window reads past its half (zero), the composed window
    # reads past x too, and Neg(0) = 0 (rule 4 of frontend/fuse.py)
    ("rotate-half", 1),
])
def test_copies_fold_into_their_reader(name: str, ops: int) -> None:
    case = next(c for c in FP32_CASES if c.name == name)
    graph = to_graph(case_model(case))
    assert len(graph.ops) == ops, [op.name for op in graph.ops]
