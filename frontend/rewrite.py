"""Rewrites of the ONNX node list before lowering.

`fold_batchnorm`: a BatchNormalization (inference) that is the only reader of a Conv with
constant weights is folded into that Conv: ``W' = W * s`` per output channel and
``B' = (B - mean) * s + bias`` with ``s = scale / sqrt(var + eps)``. The Conv then writes the
BatchNormalization's output and the BatchNormalization node disappears.

`keep_quantized_weights`: a matmul reading int8 weights through a ``DequantizeLinear``
reads the int8 weights themselves and scales its result: the weights stay a byte an element
on chip.

`fold_scale_into_matmuls`: a constant per-column scale whose result only matmuls with
constant float weights read is folded into those weights (RMSNorm's weight before LLaMA's
projections).

`fuse_sibling_matmuls`: matmuls that read one activation with constant weights of their own
(q, k and v; gate and up) become one over the weights side by side, its result sliced;
`slice_heads_after_split`: a Split's piece read as attention's heads is sliced after the
heads' Reshape and Transpose (both under ``--fuse all`` and ``prologues``).

`split_large_matmuls`: on a chip with DRAM, a matmul whose constant weights would take more
than half of the chip's SRAM becomes several over column blocks of them, concatenated.

`fold_repeat_kv`: grouped-query attention's repeated keys and values are read unrepeated.

`split_cache_concat`: an attention matmul over ``Concat(past cache, new entries)`` becomes
one matmul per part, so that the one over the past reads the graph input itself;
`split_softmax_over_parts`: the Softmax over the scores' parts it leaves, and the Slices
that take the parts back for the context matmuls, become statistics per part.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np
import onnx
from onnx import helper

from t10c.dtypes import ceil_div, dtype_bytes, on_chip_dtype
from t10c.shape_only import has_values, values_unknown


def fold_batchnorm(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                   outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with every foldable Conv + BatchNormalization pair merged; new weights are
    added to ``constants``."""
    readers = Counter(name for n in nodes for name in n.input if name)
    producer = {out: i for i, n in enumerate(nodes) for out in n.output}
    merged: dict[int, onnx.NodeProto] = {}
    dropped: set[int] = set()
    for j, bn in enumerate(nodes):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in bn.attribute}
        if attrs.get("training_mode", 0) or any(bn.output[1:]) or not attrs.get("spatial", 1):
            continue
        i = producer.get(bn.input[0])
        if i is None or i in merged or nodes[i].op_type != "Conv":
            continue
        conv = nodes[i]
        if readers[conv.output[0]] != 1 or conv.output[0] in outputs:
            continue
        params = list(bn.input[1:5])
        weights = [conv.input[1]] + ([conv.input[2]] if len(conv.input) > 2 and conv.input[2]
                                     else [])
        if not all(n in constants for n in params + weights):
            continue
        scale, bias, mean, var = (constants[n].astype(np.float64) for n in params)
        s = scale / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
        w = constants[weights[0]].astype(np.float64)
        b = constants[weights[1]].astype(np.float64) if len(weights) > 1 else np.zeros(len(s))
        w_name, b_name = f"{weights[0]}~bn{j}", f"{conv.output[0]}~bn{j}.bias"
        constants[w_name] = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)
        constants[b_name] = ((b - mean) * s + bias).astype(np.float32)
        folded = onnx.NodeProto()
        folded.CopyFrom(conv)
        del folded.input[:]
        folded.input.extend([conv.input[0], w_name, b_name])
        del folded.output[:]
        folded.output.append(bn.output[0])
        merged[i] = folded
        dropped.add(j)
    return [merged.get(i, n) for i, n in enumerate(nodes) if i not in dropped]


def keep_quantized_weights(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                           shapes: dict[str, tuple[int, ...]], outputs: set[str]
                           ) -> list[onnx.NodeProto]:
    """``nodes`` with every ``MatMul(a, DequantizeLinear(w, s))`` of a constant int8 matrix
    ``w`` (``[K, N]``), a constant scale ``s`` per tensor or per column (``axis`` 1) and no
    zero point (or an all-zero one) rewritten as ``MatMul(a, w) * s``: symmetric quantization
    scales whole columns, so the scale moves past the sum over K, and the matmul reads the
    int8 weights, a byte an element on chip (`t10c.dtypes.on_chip_dtype`), their values
    exact in the float type it computes in. The scale then fuses into the matmul as an
    epilogue. A ``DequantizeLinear`` that does not fit (asymmetric, blocked, per row, read
    by anything but a matmul's weight) is left alone, and lowering folds it into a float
    constant, stored in ``--dtype`` like any other."""
    _, readers = _producers_and_readers(nodes)
    dropped: set[int] = set()
    replaced: dict[int, list[onnx.NodeProto]] = {}
    for k, dq in enumerate(nodes):
        if dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") \
                or dq.output[0] in outputs or len(dq.input) < 2:
            continue
        w_name, s_name = dq.input[:2]
        zp = dq.input[2] if len(dq.input) > 2 else ""
        w, s = constants.get(w_name), constants.get(s_name)
        if w is None or s is None or w.dtype != np.int8 or w.ndim != 2 \
                or s.dtype.kind != "f" or _int_attr(dq, "block_size", 0) \
                or _int_attr(dq, "output_dtype", 0) not in (0, onnx.TensorProto.FLOAT):
            continue
        if zp and (zp not in constants or not has_values(constants[zp])
                   or np.any(constants[zp])):
            continue
        per_column = s.ndim == 1 and s.shape[0] == w.shape[1] \
            and _int_attr(dq, "axis", 1) % 2 == 1
        if s.size != 1 and not per_column:
            continue
        mms = readers.get(dq.output[0], [])
        if not mms or any(m.op_type != "MatMul" or m.domain not in ("", "ai.onnx")
                          or list(m.input) != [m.input[0], dq.output[0]]
                          or m.input[0] == dq.output[0] for m in mms):
            continue
        scale = s_name if s.ndim == 1 else f"{s_name}~scalar"
        if s.ndim != 1:  # a per-tensor scale, as a scalar that broadcasts
            constants[scale] = s.reshape(())
        for m in mms:
            out = m.output[0]
            product = f"{out}~int8"
            shapes[product] = shapes[out]
            read = onnx.NodeProto()
            read.CopyFrom(m)
            del read.input[:], read.output[:]
            read.input.extend([m.input[0], w_name])
            read.output.append(product)
            scaled = helper.make_node("Mul", [product, scale], [out],
                                      name=f"{m.name or out}/dequantize")
            replaced[id(m)] = [read, scaled]
        dropped.add(k)
    return [r for k, n in enumerate(nodes) if k not in dropped
            for r in replaced.get(id(n), [n])]


#: `split_large_matmuls` cuts columns in multiples of this (a matrix unit's tile edge)
SPLIT_ALIGN = 32


def _by_constant_matrix(mm: onnx.NodeProto, constants: dict[str, np.ndarray],
                        shapes: dict[str, tuple[int, ...]]
                        ) -> tuple[str, str, np.ndarray] | None:
    """(activation, weight name, weight) where ``mm`` is ``MatMul(a, W)`` of a computed ``a``
    and a constant matrix ``W``, its result's shape known; None otherwise."""
    if mm.op_type != "MatMul" or mm.domain not in ("", "ai.onnx") or len(mm.input) != 2:
        return None
    a, w_name = mm.input
    w = constants.get(w_name)
    if w is None or w.ndim != 2 or a in constants or mm.output[0] not in shapes:
        return None
    return a, w_name, w


def split_large_matmuls(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                        shapes: dict[str, tuple[int, ...]], max_bytes: int, storage: str
                        ) -> list[onnx.NodeProto]:
    """``nodes`` with every ``MatMul(a, W)`` of a constant matrix ``W`` (``[K, N]``) larger
    than ``max_bytes`` on chip (`t10c.dtypes.on_chip_dtype`: floats in ``storage``, int8 a
    byte) split into as many
    matmuls over column blocks of ``W`` (``W[:, j0:j1]``, new constants; in multiples of
    `SPLIT_ALIGN` columns) as keep each block within ``max_bytes``, their results joined by a
    ``Concat`` along the last axis into the matmul's output.

    On a chip with off-chip memory every op's weights are loaded into SRAM before it runs, all
    of them at once: an op whose weights exceed the SRAM (LLaMA-3-8B's LM head, 525 MB in int8
    against a Wormhole n150's 105 MB) has no plan at all. As blocks, they are ops of their
    own, whose loads the schedule preloads and overlaps like any other's; the Concat's copy
    is of the result only. The driver asks for half the chip's SRAM (`t10c.driver.chip_graph`):
    room beside a block for its activations and the next op's preload."""
    dropped: dict[int, list[onnx.NodeProto]] = {}
    for k, mm in enumerate(nodes):
        if (found := _by_constant_matrix(mm, constants, shapes)) is None:
            continue
        a, w_name, w = found
        out = mm.output[0]
        size = dtype_bytes(on_chip_dtype("float32" if w.dtype.kind == "f" else str(w.dtype),
                                         storage))
        pieces = ceil_div(w.size * size, max_bytes)
        if pieces < 2:
            continue
        n = w.shape[1]
        width = ceil_div(ceil_div(n, pieces), SPLIT_ALIGN) * SPLIT_ALIGN
        if width >= n:
            continue
        parts = []
        for j, start in enumerate(range(0, n, width)):
            stop = min(n, start + width)
            block, part = f"{w_name}~cols{j}", f"{out}~cols{j}"
            constants[block] = (np.ascontiguousarray(w[:, start:stop]) if has_values(w)
                                else values_unknown((w.shape[0], stop - start), w.dtype))
            shapes[part] = shapes[out][:-1] + (stop - start,)
            piece = onnx.NodeProto()
            piece.CopyFrom(mm)
            del piece.input[:], piece.output[:]
            piece.input.extend([a, block])
            piece.output.append(part)
            piece.name = f"{mm.name or out}~cols{j}"
            parts.append(piece)
        concat = helper.make_node("Concat", [p.output[0] for p in parts], [out],
                                  name=f"{mm.name or out}/join", axis=len(shapes[out]) - 1)
        dropped[k] = [*parts, concat]
    return [r for k, n in enumerate(nodes) for r in dropped.get(k, [n])]


def fuse_sibling_matmuls(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                         shapes: dict[str, tuple[int, ...]], outputs: set[str], opset: int,
                         max_bytes: int | None = None, storage: str = "fp16"
                         ) -> list[onnx.NodeProto]:
    """``nodes`` with the matmuls that read one activation with constant weights of their own
    (attention's q, k and v; a gated MLP's gate and up) made one: ``MatMul(x, [W_1 ... W_n])``
    over the weights side by side, or woven where their results meet point by point
    (`_weave`), as a new constant; ``+ [b_1 ... b_n]`` where each of them was followed by an
    ``Add`` of a constant bias over its columns (the Adds go); and a slice of its columns
    for each of the matmuls' (or the Adds') outputs (`_piece`, `_strided_piece`), where the
    first of them was.

    One op where there were n: the activation is laid out for it once, and the barriers, the
    reductions and the fetches are one op's. The slices are copies, which fold into the ops
    that read them point by point (`fuse.py`, rule 2). Left as they are: weights that
    anything else reads, and on a chip with DRAM (``max_bytes``, `split_large_matmuls`) a
    concatenation larger than ``max_bytes`` on chip, which would be split up again."""
    _, readers = _producers_and_readers(nodes)
    groups: dict[str, list[int]] = {}
    for k, mm in enumerate(nodes):
        if (found := _by_constant_matrix(mm, constants, shapes)) is None:
            continue
        x, w_name, w = found
        if w.dtype.kind != "f" or len(readers.get(w_name, [])) != 1 or w_name in outputs:
            continue
        groups.setdefault(x, []).append(k)
    size = dtype_bytes(on_chip_dtype("float32", storage))
    at: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    position = {id(n): k for k, n in enumerate(nodes)}
    for x, members in groups.items():
        mms = [nodes[k] for k in members]
        ws = [constants[mm.input[1]] for mm in mms]
        if len(members) < 2 or len({w.shape[0] for w in ws}) != 1:
            continue
        width = sum(w.shape[1] for w in ws)
        if max_bytes is not None and ws[0].shape[0] * width * size > max_bytes:
            continue
        biases = [_bias_add(mm, w.shape[1], readers, constants, shapes, outputs)
                  for mm, w in zip(mms, ws)]
        with_bias = all(b is not None for b in biases)
        base = _joined_name([mm.name or mm.output[0] for mm in mms])
        pieces = [mm.output[0] for mm in mms]
        woven = opset >= 10 and _weave(pieces, [int(w.shape[1]) for w in ws], readers, shapes)
        weight = f"{mms[0].input[1]}~fused"
        constants[weight] = (_side_by_side(ws, woven) if all(has_values(w) for w in ws)
                             else values_unknown((ws[0].shape[0], width), ws[0].dtype))
        for mm in mms:
            del constants[mm.input[1]]
        product = f"{mms[0].output[0]}~fused"
        shapes[product] = shapes[mms[0].output[0]][:-1] + (width,)
        made = [helper.make_node("MatMul", [x, weight], [product], name=base)]
        if with_bias:
            adds = [b for b in biases if b is not None]
            values = [constants[name].reshape(1, -1) for _, name in adds]
            bias = f"{adds[0][1]}~fused"
            constants[bias] = (_side_by_side(values, woven).reshape(-1)
                               if all(has_values(v) for v in values)
                               else values_unknown((width,), values[0].dtype))
            biased = f"{product}+bias"
            shapes[biased] = shapes[product]
            made.append(helper.make_node("Add", [product, bias], [biased], name=f"{base}/bias"))
            product, pieces = biased, [add.output[0] for add, _ in adds]
            dropped.update(position[id(add)] for add, _ in adds)
        start = 0
        for j, (piece, w) in enumerate(zip(pieces, ws)):
            if woven:
                made += _strided_piece(product, piece, j, len(ws), width, f"{base}/{j}",
                                       shapes, constants)
                continue
            stop = start + int(w.shape[1])
            made += _piece(product, piece, start, stop, f"{base}/{j}", readers, shapes,
                           constants, opset, position, dropped)
            start = stop
        at[members[0]] = made
        dropped.update(members[1:])
    return [r for k, n in enumerate(nodes) if k not in dropped for r in at.get(k, [n])]


def _weave(pieces: list[str], widths: list[int], readers: dict[str, list[onnx.NodeProto]],
           shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether the fused matmul's columns interleave its pieces' (column ``i`` of piece
    ``j`` at ``i * n + j`` of ``n`` pieces) rather than lie side by side: where the pieces
    are as wide and meet in one node within a few steps of same-shaped nodes (a gated MLP's
    ``act(gate) * up``). Whatever contiguous run of columns a core then computes holds the
    same columns of every piece, so the op that combines them point by point reads them
    where they were computed; side by side, column ``i`` of the gate and of the up
    projection lie half the matmul apart (on a wafer, half the wafer). Either way computes
    the same values."""
    if len(set(widths)) != 1:
        return False

    def reach(piece: str) -> set[int]:
        shape, frontier = shapes.get(piece), [piece]
        seen: set[int] = set()
        for _ in range(_WEAVE_STEPS):
            same = [r for t in frontier for r in readers.get(t, [])
                    if r.output and shapes.get(r.output[0]) == shape]
            seen.update(id(r) for r in same)
            frontier = [r.output[0] for r in same]
        return seen
    return bool(set.intersection(*(reach(p) for p in pieces)))


_WEAVE_STEPS = 3  # act(gate) * up: sigmoid, gate * sigmoid, * up


def _side_by_side(parts: list[np.ndarray], woven: bool) -> np.ndarray:
    """The columns of ``parts`` (2-D, as many rows) in one matrix: one after another, or
    woven (`_weave`). Parts that are already that matrix's columns, views of one buffer in
    its layout (the zoo's q, k and v: `t10c.models._builder.side_by_side`), give a view of
    the buffer, not a copy."""
    whole = _whole_of(parts, woven)
    if whole is not None:
        return whole
    if not woven:
        return np.concatenate(parts, axis=1)
    return np.stack(parts, axis=2).reshape(parts[0].shape[0], -1)


def _whole_of(parts: list[np.ndarray], woven: bool) -> np.ndarray | None:
    """The matrix whose columns ``parts`` are, where they are views of it laid out as
    `_side_by_side` would lay them (same memory, same strides); None otherwise."""
    base = parts[0].base
    if base is None or any(p.base is not base or p.ndim != 2 for p in parts):
        return None
    rows, width = parts[0].shape[0], sum(p.shape[1] for p in parts)
    if not isinstance(base, np.ndarray) or base.size != rows * width or \
            not base.flags.c_contiguous:
        return None
    whole = base.reshape(rows, width)  # (a view)
    start = 0
    for j, p in enumerate(parts):
        want = whole[:, j::len(parts)] if woven else whole[:, start:start + p.shape[1]]
        start += p.shape[1]
        if (want.shape != p.shape or want.strides != p.strides
                or want.__array_interface__["data"][0] != p.__array_interface__["data"][0]):
            return None
    return whole


def _strided_piece(product: str, piece: str, j: int, n: int, width: int, name: str,
                   shapes: dict[str, tuple[int, ...]], constants: dict[str, np.ndarray]
                   ) -> list[onnx.NodeProto]:
    """The Slice that makes ``piece``, every ``n``-th column of the woven ``product`` from
    column ``j`` (`_weave`): a copy through the window ``n * i + j``, which folds into its
    reader (`fuse.py`, rule 2)."""
    return [_slice(product, piece, name, constants, j, width, len(shapes[product]) - 1, n)]


def _slice(source: str, out: str, name: str, constants: dict[str, np.ndarray], start: int,
           stop: int, axis: int, step: int | None = None, prefix: str | None = None
           ) -> onnx.NodeProto:
    """``out = source[start:stop:step]`` along ``axis``, as a Slice of opset 10 or later: its
    bounds constant inputs named ``prefix`` (``name/``) and what they are."""
    what = ("starts", "ends", "axes") + (("steps",) if step is not None else ())
    bounds = [f"{prefix if prefix is not None else name + '/'}{w}" for w in what]
    for b, v in zip(bounds, (start, stop, axis, step)):
        constants[b] = np.array([v], dtype=np.int64)
    return helper.make_node("Slice", [source, *bounds], [out], name=name)


def _piece(product: str, piece: str, start: int, stop: int, name: str,
           readers: dict[str, list[onnx.NodeProto]], shapes: dict[str, tuple[int, ...]],
           constants: dict[str, np.ndarray], opset: int, position: dict[int, int],
           dropped: set[int]) -> list[onnx.NodeProto]:
    """The nodes that make ``piece``, columns ``start:stop`` of the fused ``product``.

    Where the piece's one reader is a Reshape that splits its columns into heads of ``D``
    (``[..., n] -> [..., n / D, D]``, ``start`` a multiple of ``D``), perhaps read only by a
    Transpose (attention's heads), the slice is taken after them instead: ``product``
    reshaped into heads, transposed the same way, and sliced along the heads, into the
    Transpose's (or the Reshape's) output; the two go. Reshape and Transpose are views on
    chip, and a slice read point by point folds into its reader (`fuse.py`, rule 2), where a
    slice read through views would stay a copy op of its own."""
    rank = len(shapes[product])
    axis, lo, hi, source, out = rank - 1, start, stop, product, piece
    made: list[onnx.NodeProto] = []
    chain = readers.get(piece, [])
    if opset >= 10 and len(chain) == 1 and chain[0].op_type == "Reshape" and \
            chain[0].output[0] in shapes:
        reshape = chain[0]
        heads = shapes[reshape.output[0]]
        width = stop - start
        if len(heads) == rank + 1 and heads[:rank - 1] == shapes[piece][:-1] and \
                heads[-1] and heads[-2] * heads[-1] == width and start % heads[-1] == 0:
            size = heads[-1]
            shape = f"{name}/heads"
            constants[shape] = np.array([*heads[:-2], shapes[product][-1] // size, size],
                                        dtype=np.int64)
            source = f"{product}~{name}/heads"
            shapes[source] = tuple(int(v) for v in constants[shape])
            made.append(helper.make_node("Reshape", [product, shape], [source],
                                         name=f"{name}/heads"))
            axis, lo, hi, out = rank - 1, start // size, stop // size, reshape.output[0]
            dropped.add(position[id(reshape)])
            after = readers.get(reshape.output[0], [])
            if len(after) == 1 and after[0].op_type == "Transpose":
                transpose = after[0]
                perm = [int(v) for v in _ints_attr(transpose, "perm")] or \
                    list(range(rank, -1, -1))
                moved = f"{source}~T"
                shapes[moved] = tuple(shapes[source][p] for p in perm)
                made.append(helper.make_node("Transpose", [source], [moved], perm=perm,
                                             name=f"{name}/transpose"))
                source, axis, out = moved, perm.index(rank - 1), transpose.output[0]
                dropped.add(position[id(transpose)])
    if opset >= 10:  # (the bounds as inputs)
        made.append(_slice(source, out, name, constants, lo, hi, axis))
    else:
        made.append(helper.make_node("Slice", [source], [out], name=name, starts=[lo],
                                     ends=[hi], axes=[axis]))
    return made


def slice_heads_after_split(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                            shapes: dict[str, tuple[int, ...]], opset: int
                            ) -> list[onnx.NodeProto]:
    """``nodes`` with each ``Split`` of a last axis made one slice per piece (`_piece`): a
    piece read as attention's heads (a Reshape into heads, a Transpose) is sliced after
    them, where it folds into its reader, rather than copied before them (GPT-2's ``c_attn``
    split into q, k and v); any other piece is the slice the Split's lowering makes, under
    the same name."""
    if opset < 10:  # (Slice takes its bounds as inputs from opset 10)
        return nodes
    _, readers = _producers_and_readers(nodes)
    position = {id(n): k for k, n in enumerate(nodes)}
    at: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    for k, split in enumerate(nodes):
        if split.op_type != "Split" or split.domain not in ("", "ai.onnx"):
            continue
        data = split.input[0]
        if data not in shapes or not all(o and o in shapes for o in split.output):
            continue
        rank = len(shapes[data])
        widths = [shapes[o][-1] for o in split.output]
        if not rank or _int_attr(split, "axis", 0) % rank != rank - 1 or \
                sum(widths) != shapes[data][-1]:
            continue
        base = split.name or split.output[0]
        made: list[onnx.NodeProto] = []
        start = 0
        for j, (piece, width) in enumerate(zip(split.output, widths)):
            made += _piece(data, piece, start, start + width, f"{base}/{j}", readers, shapes,
                           constants, opset, position, dropped)
            start += width
        at[k] = made
    return [r for k, n in enumerate(nodes) if k not in dropped for r in at.get(k, [n])]


def _bias_add(mm: onnx.NodeProto, columns: int, readers: dict[str, list[onnx.NodeProto]],
              constants: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
              outputs: set[str]) -> tuple[onnx.NodeProto, str] | None:
    """The ``Add`` of a constant bias over its ``columns`` columns that is the only reader of
    matmul ``mm``'s result, and the bias's name; None if there is none."""
    out = mm.output[0]
    rd = readers.get(out, [])
    if len(rd) != 1 or out in outputs or rd[0].op_type != "Add" or len(rd[0].input) != 2:
        return None
    add = rd[0]
    bias = add.input[1] if add.input[0] == out else add.input[0]
    b = constants.get(bias)
    if b is None or b.dtype.kind != "f" or b.size != columns or \
            (b.ndim and b.shape[-1] != columns) or shapes.get(add.output[0]) != shapes[out]:
        return None
    return add, bias


def _joined_name(names: list[str]) -> str:
    """One name for ops fused side by side: the parts of their names ``/`` separates that
    differ, joined by ``+`` between the parts they share (``layer0/attn/q+k+v/MatMul``)."""
    split = [n.split("/") for n in names]
    if len({len(s) for s in split}) != 1:
        return "+".join(names)
    parts = ["+".join(dict.fromkeys(column)) for column in zip(*split)]
    return "/".join(parts)


def fold_scale_into_matmuls(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                            shapes: dict[str, tuple[int, ...]], outputs: set[str]
                            ) -> list[onnx.NodeProto]:
    """``nodes`` with every ``Mul(y, g)`` by a constant vector ``g`` along ``y``'s last axis,
    whose result only ``MatMul(., W)`` nodes read, each with a constant float matrix ``W``
    that it alone reads, folded into those weights: ``(y * g) @ W = y @ (g[:, None] * W)``. The
    matmuls read ``y`` and the scaled weights (added to ``constants``, the unread ones
    dropped), and the Mul disappears. LLaMA's RMSNorm weight then leaves the normalisation,
    which becomes an op without weights of its own (on a wafer its copy of the residual can
    stay on the cores of the mean's, `partition._match_reads`). Shape-only weights stay
    shape-only."""
    _, readers = _producers_and_readers(nodes)
    count = Counter(name for n in nodes for name in n.input if name)
    dropped: set[int] = set()
    replaced: dict[int, onnx.NodeProto] = {}
    for k, mul in enumerate(nodes):
        if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.input) != 2 \
                or mul.output[0] in outputs:
            continue
        a, b = mul.input
        g_name, y = (a, b) if a in constants else (b, a)
        if g_name not in constants or y in constants or y not in shapes:
            continue
        g = constants[g_name]
        if g.ndim != 1 or not shapes[y] or shapes[y][-1] != g.shape[0] \
                or shapes.get(mul.output[0]) != shapes[y]:
            continue
        mms = readers.get(mul.output[0], [])
        if not mms or any(m.op_type != "MatMul" or m.domain not in ("", "ai.onnx")
                          or list(m.input).index(mul.output[0]) != 0 or m.input[1] == g_name
                          or m.input[1] not in constants or count[m.input[1]] != 1
                          or constants[m.input[1]].dtype.kind != "f"
                          or constants[m.input[1]].shape[:1] != g.shape
                          or constants[m.input[1]].ndim != 2 for m in mms):
            continue
        for m in mms:
            w_name = m.input[1]
            scaled = f"{w_name}~scaled"
            constants[scaled] = _scaled_rows(constants.pop(w_name), g)
            folded = onnx.NodeProto()
            folded.CopyFrom(m)
            del folded.input[:]
            folded.input.extend([y, scaled])
            replaced[id(m)] = folded
        dropped.add(k)
    return [replaced.get(id(n), n) for k, n in enumerate(nodes) if k not in dropped]


def _scaled_rows(w: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``g[:, None] * w`` in ``w``'s dtype; shape-only if either is."""
    if not (has_values(w) and has_values(g)):
        return values_unknown(w.shape, w.dtype)
    return (g.astype(np.float64)[:, None] * w.astype(np.float64)).astype(w.dtype)


def _producers_and_readers(nodes: list[onnx.NodeProto]
                           ) -> tuple[dict[str, onnx.NodeProto],
                                      dict[str, list[onnx.NodeProto]]]:
    """(the node that makes each tensor, the nodes that read each tensor, in order)."""
    producer = {out: n for n in nodes for out in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    return producer, readers


def fold_repeat_kv(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                   shapes: dict[str, tuple[int, ...]], outputs: set[str]
                   ) -> list[onnx.NodeProto]:
    """``nodes`` with grouped-query attention's repeated keys and values folded into the
    matmuls that read them.

    A LLaMA export repeats each of ``kv`` key/value heads to ``rep`` query heads before the
    attention matmuls (HF's ``repeat_kv``): ``B = Reshape(Expand(X))`` from ``[.., kv, 1, s,
    d]`` through ``[.., kv, rep, s, d]`` to ``[.., kv * rep, s, d]``, read by ``MatMul(A, B)``
    or by ``MatMul(A, B^T)`` (last two axes swapped), B^T written as any chain of Reshapes and
    Transposes that amounts to it (`_views_as`), with ``A`` of shape ``[.., kv * rep, m,
    k]``. The same product is ``Reshape(MatMul(Reshape(A, [.., kv, rep * m, k]), X'))``
    with ``X'`` the unrepeated ``[.., kv, s, d]`` (transposed as B was): the query heads of a
    group become rows of one matmul that reads its key/value head once, so the cache is
    neither copied ``rep`` times nor re-laid out from the copy (on a wafer that re-layout was
    a quarter of a decode step). The reshapes are views; the matmul keeps its name, and a
    scale by a scalar that alone reads its result moves before the view (`_scalar_scale`).
    The repeat nodes nothing reads any more are dropped; the new tensors' shapes and reshape
    targets are added to ``shapes`` and ``constants``."""
    producer, reader_nodes = _producers_and_readers(nodes)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    chains: list[onnx.NodeProto] = []
    absorbed: list[onnx.NodeProto] = []
    for j, mm in enumerate(nodes):
        if mm.op_type == "MatMul" and mm.domain in ("", "ai.onnx"):
            scale = None if mm.output[0] in outputs else _scalar_scale(
                reader_nodes.get(mm.output[0], []), constants, outputs)
            found = _folded_matmul(mm, producer, constants, shapes, scale)
            if found is not None:
                replaced[j], chain = found
                chains.extend(chain)
                absorbed.extend([scale] if scale is not None else [])
    gone = {id(n) for n in absorbed}
    out = [n for j, mm in enumerate(nodes) for n in replaced.get(j, [mm]) if id(n) not in gone]
    return _without_unread(out, chains, outputs)


def _scalar_operand(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> str | None:
    """The scalar constant a Mul multiplies by, or a Div divides by; None for other nodes."""
    if node.op_type not in ("Mul", "Div") or node.domain not in ("", "ai.onnx") \
            or len(node.input) != 2 or node.input[0] == node.input[1]:
        return None
    candidates = node.input[1:] if node.op_type == "Div" else node.input
    return next((c for c in candidates if c in constants and constants[c].size == 1), None)


def _scalar_scale(readers: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                  outputs: set[str]) -> onnx.NodeProto | None:
    """The one reader of a matmul's result when it is a Mul or Div by a scalar constant (the
    attention scores' ``1 / sqrt(d)``): the folded matmul scales its result before the view,
    so that the scale still fuses into it as an epilogue (`fuse.fuse_epilogue` does not look
    through views)."""
    if len(readers) != 1 or readers[0].output[0] in outputs \
            or _scalar_operand(readers[0], constants) is None:
        return None
    return readers[0]


def _folded_matmul(mm: onnx.NodeProto, producer: dict[str, onnx.NodeProto],
                   constants: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                   scale: onnx.NodeProto | None
                   ) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]] | None:
    """The nodes that replace ``mm`` (`fold_repeat_kv`), with ``scale`` (`_scalar_scale`)
    applied before the view when given, and the repeat chain it read; None when its B
    operand is not a repeat."""
    a, b = mm.input[0], mm.input[1]
    chain = []  # the views (and scales by a scalar) from B back to the Expand
    scales: list[onnx.NodeProto] = []
    node = producer.get(b)
    while node is not None and len(chain) < 8:
        const = _scalar_operand(node, constants)
        if node.op_type in ("Reshape", "Transpose"):
            data = node.input[0]
        elif const is not None:
            scales.append(node)
            data = next(i for i in node.input if i != const)
        else:
            break
        chain.append(node)
        node = producer.get(data)
    expand = node
    if expand is None or expand.op_type != "Expand" or not chain or not all(
            t in shapes for t in (a, b, mm.output[0], expand.input[0], expand.output[0],
                                  *(n.output[0] for n in chain))):
        return None
    chain.append(expand)
    src, big = shapes[expand.input[0]], shapes[expand.output[0]]
    grown = [i for i, (x, y) in enumerate(zip(src, big)) if x != y]
    if len(src) != len(big) or len(grown) != 1 or src[grown[0]] != 1 or grown[0] == 0:
        return None
    axis = grown[0]  # the repeat axis, merged into the head axis before it
    rep, merged = big[axis], big[:axis - 1] + (big[axis - 1] * big[axis],) + big[axis + 1:]
    a_shape, out_shape = shapes[a], shapes[mm.output[0]]
    if len(merged) < 3 or axis - 1 != len(merged) - 3 or len(a_shape) != len(merged) \
            or a_shape[:-2] != merged[:-2]:
        return None  # the heads must be the axis before a matrix of A and of B
    transposed = _views_as(big, merged, tuple(
        (n.op_type, shapes[n.output[0]], tuple(_attr(n, "perm", ())))  # type: ignore[arg-type]
        for n in reversed(chain[:-1]) if n.op_type in ("Reshape", "Transpose")))
    if transposed is None:
        return None
    lead, kv = a_shape[:-3], big[axis - 1]
    name = mm.name or mm.output[0]

    def reshape_to(tensor: str, shape: tuple[int, ...], tag: str, out: str = "") -> onnx.NodeProto:
        target, out = f"{name}/gqa/{tag}.shape", out or f"{name}/gqa/{tag}"
        constants[target] = np.array(shape, dtype=np.int64)
        shapes[target], shapes[out] = (len(shape),), shape
        return helper.make_node("Reshape", [tensor, target], [out], name=f"{name}/gqa/{tag}")

    def scaled_by(node: onnx.NodeProto, product: str, tag: str) -> onnx.NodeProto:
        """``node``'s scale by its scalar, applied to ``product``."""
        const = _scalar_operand(node, constants)
        shapes[f"{name}/gqa/{tag}"] = shapes[product]
        return helper.make_node(node.op_type, [product, const], [f"{name}/gqa/{tag}"],
                                name=node.name)  # (a Div's scalar is its divisor)

    rows = reshape_to(a, lead + (kv, rep * a_shape[-2], a_shape[-1]), "rows")
    heads = reshape_to(expand.input[0], src[:axis] + src[axis + 1:], "heads")
    new = [rows, heads]
    operand = heads.output[0]
    if transposed:
        t_shape = shapes[operand][:-2] + shapes[operand][-2:][::-1]
        shapes[f"{name}/gqa/transposed"] = t_shape
        new.append(helper.make_node("Transpose", [operand], [f"{name}/gqa/transposed"],
                                    name=f"{name}/gqa/Transpose",
                                    perm=[*range(len(t_shape) - 2), len(t_shape) - 1,
                                          len(t_shape) - 2]))
        operand = new[-1].output[0]
    product = f"{name}/gqa/product"
    shapes[product] = lead + (kv, rep * a_shape[-2], out_shape[-1])
    new.append(helper.make_node("MatMul", [rows.output[0], operand], [product], name=mm.name))
    # B's scales by a scalar apply to the product instead (where they fuse into the matmul
    # as epilogues), and so does the one reader's scale (as the model applied it)
    tagged = [(sc, f"scaled_b{k}") for k, sc in enumerate(scales)]
    for sc, tag in tagged + ([(scale, "scaled")] if scale is not None else []):
        new.append(scaled_by(sc, product, tag))
        product = new[-1].output[0]
    new.append(reshape_to(product, out_shape, "out",
                          scale.output[0] if scale is not None else mm.output[0]))
    return new, chain


def split_cache_concat(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                       shapes: dict[str, tuple[int, ...]], inputs: set[str],
                       outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` with every matmul that reads a key/value cache through the Concat that
    appends a step's new entries split over the Concat's parts.

    A decode step attends over ``Concat(past, new)`` along the cache's sequence axis, with
    ``past`` a graph input. Read whole, the concatenated cache is a new tensor that the
    attention matmuls must have re-laid into their own layouts every step (on a wafer, two
    thirds of the attention's time). Split, each matmul reads ``past`` itself, which is
    loaded in the matmul's own layout as any graph input is (the cache stays where attention
    reads it, as WaferLLM keeps it), and the few new entries in a matmul of their own:

    - where the sequence axis is B's column axis (the scores ``q K^T``), ``MatMul(A, B)`` is
      the Concat of the parts' products along the result's last axis, each part's product
      scaled first by a scalar that alone reads the result (so that the scale still fuses
      into the matmuls as an epilogue);
    - where it is B's row axis (the context ``p V``), it is the sum of the parts' products
      with the matching columns of ``A`` (Slices).

    B may be the Concat seen through views that leave its shape whole (an Unsqueeze and a
    Reshape back, as `fold_repeat_kv` leaves them) and Transposes. The Concat itself stays
    only while something else reads it (the ``present`` output). Sums are in a different
    order than the matmul over the whole cache, by at most a rounding per part."""
    producer, readers = _producers_and_readers(nodes)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    absorbed: set[int] = set()  # the scales applied to the parts instead
    chains: list[onnx.NodeProto] = []  # the views and Concats the split matmuls read
    for j, mm in enumerate(nodes):
        if mm.op_type != "MatMul" or mm.domain not in ("", "ai.onnx") \
                or not all(t in shapes for t in (mm.input[0], mm.output[0])):
            continue
        found = _cache_operand(mm.input[1], producer, shapes, inputs)
        if found is None:
            continue
        concat, perm, views = found
        rank, axis = len(perm), _int_attr(concat, "axis", 0) % len(perm)
        seq = perm.index(axis)  # where the sequence axis is in B
        if seq < rank - 2 or len(shapes[mm.input[0]]) != rank \
                or len(shapes[mm.output[0]]) != rank:  # (batch axes broadcast: left alone)
            continue
        chains.extend([*views, concat])
        columns = seq == rank - 1  # the scores' case; else the context's
        scale = _scalar_scale(readers.get(mm.output[0], []), constants, outputs) \
            if columns and mm.output[0] not in outputs else None
        name = mm.name or mm.output[0]
        new: list[onnx.NodeProto] = []
        parts: list[str] = []
        offset = 0
        for k, part in enumerate(concat.input):
            tag, width = f"{name}/cache{k}", shapes[part][axis]
            b = part
            if perm != tuple(range(rank)):
                b = f"{tag}/B"
                shapes[b] = tuple(shapes[part][p] for p in perm)
                new.append(helper.make_node("Transpose", [part], [b], perm=list(perm),
                                            name=f"{tag}/Transpose"))
            a = mm.input[0]
            if not columns:  # the columns of A that meet this part's rows
                a = f"{tag}/A"
                cut = _slice(mm.input[0], a, f"{tag}/Slice", constants, offset, offset + width,
                             rank - 1, prefix=f"{a}.")
                shapes.update((c, (1,)) for c in cut.input[1:])
                shapes[a] = shapes[mm.input[0]][:-1] + (width,)
                new.append(cut)
            shapes[tag] = shapes[a][:-1] + (shapes[b][-1],)
            new.append(helper.make_node("MatMul", [a, b], [tag], name=tag))
            product = tag
            if scale is not None:  # each part scaled (where the scale fuses into its matmul)
                product = f"{tag}/scaled"
                shapes[product] = shapes[tag]
                new.append(helper.make_node(scale.op_type,
                                            [tag, str(_scalar_operand(scale, constants))],
                                            [product], name=f"{tag}/scale"))
            parts.append(product)
            offset += width
        if columns:
            done = scale.output[0] if scale is not None else mm.output[0]
            new.append(helper.make_node("Concat", parts, [done], axis=rank - 1,
                                        name=f"{name}/cache"))
        else:
            total = parts[0]
            for k, product in enumerate(parts[1:], 1):
                total_next = mm.output[0] if k == len(parts) - 1 else f"{name}/cache/sum{k}"
                shapes[total_next] = shapes[mm.output[0]]
                new.append(helper.make_node("Add", [total, product], [total_next],
                                            name=f"{name}/cache/Add{k}"))
                total = total_next
        replaced[j] = new
        if scale is not None:
            absorbed.add(id(scale))
    if not replaced:
        return nodes
    out = [n for j, n in enumerate(nodes) for n in replaced.get(j, [n]) if id(n) not in absorbed]
    return _without_unread(out, chains, outputs)


#: the opset from which a reduction takes its axes as an input rather than an attribute
AXES_AS_INPUT = {"ReduceSum": 13, "ReduceMax": 18}


def split_softmax_over_parts(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray],
                             shapes: dict[str, tuple[int, ...]], outputs: set[str], opset: int
                             ) -> list[onnx.NodeProto]:
    """``nodes`` with every Softmax over the last axis of a Concat along that axis, whose
    result is read only by Slices that each take one of the Concat's parts back, computed
    part by part (as flash-decoding does): with ``s_k`` the parts,

        m = max_k max(s_k),   e_k = exp(s_k - m),   z = sum_k sum(e_k),   p_k = e_k / z

    and each Slice's result ``p_k``. Reshapes that keep the last axis may stand between the
    Concat, the Softmax and the Slices (attention's heads merged and split again): a row of
    the Softmax is then a row of the Concat. This is the shape `split_cache_concat` leaves
    in a decode step, the scores over the past cache and over the new entries side by side:
    without it the scores are copied into one tensor, normalised there, and sliced again for
    the context matmuls, and on a mesh each of those copies crosses the attention's cores.
    Split, the statistics are reductions over each part where it lies, and each part's
    probabilities are what its context matmul reads (an elementwise op on the statistics'
    cores, or with ``--fuse prologues`` the matmul's prologue). The sums run in a different
    order than over the whole row, by at most a rounding per part."""
    producer, readers = _producers_and_readers(nodes)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    gone: set[int] = set()
    for j, sm in enumerate(nodes):
        if sm.op_type != "Softmax" or sm.domain not in ("", "ai.onnx"):
            continue
        found = _softmax_over_parts(sm, producer, readers, constants, shapes, outputs, opset)
        if found is None:
            continue
        concat, views, slices = found
        replaced[j] = _softmax_parts(sm, concat, slices, shapes, constants, opset)
        gone.update(id(n) for n in (concat, *views, *(s for s, _ in slices)))
    if not replaced:
        return nodes
    return [n for j, n in enumerate(nodes) for n in replaced.get(j, [n]) if id(n) not in gone]


def _softmax_over_parts(sm: onnx.NodeProto, producer: dict[str, onnx.NodeProto],
                        readers: dict[str, list[onnx.NodeProto]],
                        constants: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                        outputs: set[str], opset: int
                        ) -> tuple[onnx.NodeProto, list[onnx.NodeProto],
                                   list[tuple[onnx.NodeProto, int]]] | None:
    """(the Concat, the Reshapes between it, the Softmax and the Slices, and every Slice with
    the part it takes) when ``sm`` is a Softmax `split_softmax_over_parts` splits; else
    None."""
    x, y = sm.input[0], sm.output[0]
    if x not in shapes or y not in shapes or not shapes[x]:
        return None
    rank, width = len(shapes[x]), shapes[x][-1]
    # before opset 13 Softmax flattens from its axis: over the last one alone it is the same
    if _int_attr(sm, "axis", -1 if opset >= 13 else 1) % rank != rank - 1:
        return None

    def kept(t: str) -> bool:  # a tensor of the chain: read once, rows of ``width``
        return t not in outputs and len(readers.get(t, [])) == 1 \
            and shapes.get(t, (0,))[-1:] == (width,)

    views: list[onnx.NodeProto] = []
    node = producer.get(x)
    while node is not None and node.op_type == "Reshape" and kept(node.output[0]):
        views.append(node)
        node = producer.get(node.input[0])
    if node is None or node.op_type != "Concat" or node.domain not in ("", "ai.onnx") \
            or len(node.input) < 2 or not kept(node.output[0]) \
            or not all(p in shapes for p in node.input):
        return None
    concat = node
    crank = len(shapes[concat.output[0]])
    if _int_attr(concat, "axis", 0) % crank != crank - 1:
        return None
    starts = [0]
    for p in concat.input:
        starts.append(starts[-1] + shapes[p][-1])
    if y in outputs:
        return None
    slices: list[tuple[onnx.NodeProto, int]] = []
    frontier = [y]
    while frontier:
        t = frontier.pop()
        for r in readers.get(t, []):
            if r.op_type == "Reshape" and r.input[0] == t and shapes.get(r.output[0], (0,))[-1:] \
                    == (width,) and r.output[0] not in outputs:
                views.append(r)
                frontier.append(r.output[0])
                continue
            part = _sliced_part(r, t, starts, shapes, constants)
            if part is None:
                return None
            slices.append((r, part))
    return (concat, views, slices) if slices else None


def _sliced_part(node: onnx.NodeProto, source: str, starts: list[int],
                 shapes: dict[str, tuple[int, ...]], constants: dict[str, np.ndarray]
                 ) -> int | None:
    """The part ``k`` when ``node`` is a Slice of ``source`` along its last axis from
    ``starts[k]`` to ``starts[k + 1]`` in steps of one (bounds as constant inputs); else
    None."""
    if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or len(node.input) < 4 \
            or not node.input[3] or node.input[0] != source or node.output[0] not in shapes \
            or not all(b in constants for b in node.input[1:] if b):
        return None
    rank = len(shapes[source])
    step = node.input[4] if len(node.input) > 4 and node.input[4] else None  # (default 1)
    begin, end, axes, steps = (constants[b].reshape(-1) if b else np.ones(1, np.int64)
                               for b in (*node.input[1:4], step))
    if any(len(b) != 1 for b in (begin, end, axes, steps)) \
            or int(axes[0]) % rank != rank - 1 or int(steps[0]) != 1:
        return None
    # ONNX clamps like Python slices do (as the Slice lowering, `layout._slice_node`)
    lo, hi, _ = slice(int(begin[0]), int(end[0])).indices(starts[-1])
    for k in range(len(starts) - 1):
        if (lo, hi) == (starts[k], starts[k + 1]):
            return k
    return None


def _softmax_parts(sm: onnx.NodeProto, concat: onnx.NodeProto,
                   slices: list[tuple[onnx.NodeProto, int]], shapes: dict[str, tuple[int, ...]],
                   constants: dict[str, np.ndarray], opset: int) -> list[onnx.NodeProto]:
    """The nodes of the Softmax computed part by part (`split_softmax_over_parts`), each
    Slice's result written by them."""
    name = sm.name or sm.output[0]
    parts = list(concat.input)
    rows = shapes[parts[0]][:-1] + (1,)
    new: list[onnx.NodeProto] = []

    def node(op: str, ins: list[str], out: str, shape: tuple[int, ...], **kw: Any) -> str:
        shapes[out] = shape
        new.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    def over_row(op: str, part: str, k: int, tag: str) -> str:  # a one-wide part is its own
        if shapes[part][-1] == 1:
            return part
        if opset >= AXES_AS_INPUT[op]:
            constants[f"{name}/axes"] = np.array([-1], dtype=np.int64)
            return node(op, [part, f"{name}/axes"], f"{name}/{tag}{k}", rows, keepdims=1)
        return node(op, [part], f"{name}/{tag}{k}", rows, axes=[-1], keepdims=1)

    peaks = [over_row("ReduceMax", p, k, "max") for k, p in enumerate(parts)]
    peak = node("Max", peaks, f"{name}/max", rows)
    exps = [node("Exp", [node("Sub", [p, peak], f"{name}/shifted{k}", shapes[p])],
                 f"{name}/exp{k}", shapes[p]) for k, p in enumerate(parts)]
    total = node("Sum", [over_row("ReduceSum", e, k, "sum") for k, e in enumerate(exps)],
                 f"{name}/sum", rows)
    probs: dict[int, str] = {}  # each part's probabilities, made once
    for s, k in slices:
        out = s.output[0]
        if k not in probs and shapes[out] == shapes[parts[k]]:  # written where the Slice wrote
            probs[k] = node("Div", [exps[k], total], out, shapes[out])
            continue
        if k not in probs:
            probs[k] = node("Div", [exps[k], total], f"{name}/part{k}", shapes[parts[k]])
        constants[f"{out}.shape"] = np.array(shapes[out], dtype=np.int64)
        node("Reshape", [probs[k], f"{out}.shape"], out, shapes[out])
    return new


def _cache_operand(b: str, producer: dict[str, onnx.NodeProto],
                   shapes: dict[str, tuple[int, ...]], inputs: set[str]
                   ) -> tuple[onnx.NodeProto, tuple[int, ...], list[onnx.NodeProto]] | None:
    """The Concat that ``b`` views (`split_cache_concat`), the permutation of its axes that
    ``b`` is, and the views between them, when ``b`` is a cache: a Concat of at least one
    graph input, seen through Transposes and views that leave its shape whole; else None."""
    views: list[onnx.NodeProto] = []
    node = producer.get(b)
    while node is not None and node.op_type in ("Transpose", "Reshape", "Unsqueeze",
                                                "Squeeze") and len(views) < 8:
        views.append(node)
        node = producer.get(node.input[0])
    if node is None or node.op_type != "Concat" or node.domain not in ("", "ai.onnx") \
            or not any(i in inputs for i in node.input) \
            or not all(t in shapes for t in (*node.input, node.output[0],
                                             *(v.output[0] for v in views))):
        return None
    shape = shapes[node.output[0]]
    perm = tuple(range(len(shape)))
    current = shape  # the tensor's shape as the views go, from the Concat's
    for v in reversed(views):
        if v.op_type == "Transpose":
            if current != tuple(shape[p] for p in perm):  # the reshapes before it are not whole
                return None
            order = _ints_attr(v, "perm") or list(range(len(current)))[::-1]
            perm = tuple(perm[x] for x in order)
        current = shapes[v.output[0]]
    if current != tuple(shape[p] for p in perm):
        return None
    return node, perm, views


def _int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    value = _attr(node, name, default)
    return int(value) if isinstance(value, (int, np.integer)) else default


def _ints_attr(node: onnx.NodeProto, name: str) -> list[int]:
    value = _attr(node, name, ())
    return [int(x) for x in value] if isinstance(value, (list, tuple)) else []


def _without_unread(nodes: list[onnx.NodeProto], chains: list[onnx.NodeProto],
                    outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without the nodes of ``chains`` that nothing reads any more (a Shape or Size
    reader does not count: shapes are static), dropped in turn (a view, then what it read;
    chains may share nodes)."""
    readers = Counter(name for n in nodes for name in n.input if name)
    readers.subtract(i for n in nodes if n.op_type in ("Shape", "Size") for i in n.input)
    gone: set[int] = set()
    dropped = True
    while dropped:
        dropped = False
        for n in chains:
            if id(n) not in gone and not any(readers[o] or o in outputs for o in n.output):
                gone.add(id(n))
                readers.subtract(i for i in n.input if i)
                dropped = True
    return [n for n in nodes if id(n) not in gone]


#: the largest repeated tensor whose view chain `_views_as` checks position by position (two
#: int32 copies of it: 256 MB)
VIEW_CHECK_ELEMENTS = 2**25


@lru_cache(maxsize=64)
def _views_as(big: tuple[int, ...], merged: tuple[int, ...],
              views: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]) -> bool | None:
    """Whether the Reshape and Transpose ``views`` (op type, output shape, perm), applied in
    order to a tensor of shape ``big``, give its reshape to ``merged`` (False) or that with
    its last two axes swapped (True); None when they give anything else. Decided on the
    elements' positions, so any chain of views that amounts to one of the two is seen
    through (a torch.dynamo export flattens the heads into the batch and back). The chain
    the zoo writes (that reshape, then that swap or nothing) is known without arrays; other
    chains are decided on positions when the tensor has at most `VIEW_CHECK_ELEMENTS`
    elements, and not folded otherwise."""
    rank = len(merged)
    swap = (*range(rank - 2), rank - 1, rank - 2)
    if views == (("Reshape", merged, ()),):
        return False
    if views[:1] == (("Reshape", merged, ()),) and len(views) == 2 \
            and views[1][0] == "Transpose" and views[1][2] == swap:
        return True
    if math.prod(big) > VIEW_CHECK_ELEMENTS:
        return None
    x = np.arange(math.prod(big), dtype=np.int32).reshape(big)
    for op_type, shape, perm in views:
        x = x.reshape(shape) if op_type == "Reshape" else x.transpose(perm or None)
    plain = np.arange(math.prod(big), dtype=np.int32).reshape(merged)
    if x.shape == plain.shape and np.array_equal(x, plain):
        return False
    swapped = plain.swapaxes(-1, -2)
    if x.shape == swapped.shape and np.array_equal(x, swapped):
        return True
    return None


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
