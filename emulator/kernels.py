"""Vectorised kernels: one sub-task of a tensor expression on every core at once.

Arrays carry a leading core axis. Inputs are read in the storage dtype and computed in float32
(fp32 accumulation); the caller stores the result back in the buffer's dtype.
"""

from __future__ import annotations

import math

import numpy as np

from t10c.ir import INDIRECT, TensorExpr, is_contraction

IDENTITY = {"sum": 0.0, "max": -np.inf}


def erf(x: np.ndarray) -> np.ndarray:
    """Error function (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7), in float64."""
    x = np.asarray(x, dtype=np.float64)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                          + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "recip": lambda x: 1.0 / x,
    "erf": lambda x: erf(x).astype(np.float32), "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "abs": np.abs, "square": np.square,
}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
}


def gather_slices(buf: np.ndarray, tile: tuple[int, ...], offsets: np.ndarray,
                  sizes: tuple[int, ...]) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
    """Each core's sub-block of ``sizes`` at ``offsets`` from buffers ``buf`` (ncores, elems).

    Returns the (ncores, *sizes) array and the fancy index that addresses it (None when the
    sub-block is the whole tile).
    """
    n = len(offsets)
    arr = buf[:n].reshape((n, *tile))
    if tuple(sizes) == tuple(tile):
        return arr, None
    nd = len(tile)
    index: list[np.ndarray] = [np.arange(n).reshape((n,) + (1,) * nd)]
    for d in range(nd):
        shape = [n] + [1] * nd
        shape[d + 1] = sizes[d]
        index.append((offsets[:, d][:, None] + np.arange(sizes[d])[None, :]).reshape(shape))
    idx = tuple(index)
    return arr[idx], idx


def operand_sizes(expr: TensorExpr, k: int, sub: dict[str, int], tile: tuple[int, ...]
                  ) -> tuple[int, ...]:
    return tuple(t if a == INDIRECT else sub[a] for a, t in zip(expr.operands[k].axes, tile))


def evaluate(expr: TensorExpr, values: list[np.ndarray], sub: dict[str, int],
             origin: np.ndarray) -> np.ndarray:
    """The sub-task's result, (ncores, *output sub-block) in the output operand's axis order."""
    n = values[0].shape[0] if values else len(origin)
    if is_contraction(expr):
        return _contract(expr, [v.astype(np.float32) for v in values])
    if expr.body[0] == "take":
        return _take(expr, values, n)
    axes = expr.axis_names
    full = [v.astype(np.float32) if v.dtype != np.float32 else v for v in values]
    full = [_to_op_order(expr, k, v) for k, v in enumerate(full)]
    result = _eval_body(expr.body, full)
    result = np.broadcast_to(result, (n, *(sub[a] for a in axes)))
    red = expr.reduction_axes
    if expr.combine and red:
        mask = np.ones((n,) + (1,) * len(axes), dtype=bool)
        for a in red:
            j = axes.index(a)
            pos = origin[:, j][:, None] + np.arange(sub[a])[None, :]
            shape = [n] + [1] * len(axes)
            shape[j + 1] = sub[a]
            mask = mask & (pos < expr.extents[a]).reshape(shape)
        result = np.where(mask, result, np.float32(IDENTITY[expr.combine]))
        red_dims = tuple(axes.index(a) + 1 for a in red)
        reducer = np.sum if expr.combine == "sum" else np.max
        result = reducer(result, axis=red_dims)
        kept = [a for a in axes if a not in red]
    else:
        kept = list(axes)
    perm = [0] + [kept.index(a) + 1 for a in expr.output.axes]
    return np.transpose(result, perm)


def _contract(expr: TensorExpr, values: list[np.ndarray]) -> np.ndarray:
    """Batched matmul over the core axis: (Z, batch, m, k) @ (Z, batch, k, n)."""
    a_axes, b_axes = (list(o.axes) for o in expr.inputs)
    out_axes = list(expr.output.axes)
    red = [x for x in expr.reduction_axes]
    if not all(x in a_axes and x in b_axes for x in red) or len(set(a_axes)) != len(a_axes) \
            or len(set(b_axes)) != len(b_axes):
        letters = {x: chr(ord("a") + i) for i, x in enumerate(expr.axis_names)}
        spec = ",".join("Z" + "".join(letters[x] for x in o.axes) for o in expr.inputs)
        return np.einsum(f"{spec}->Z" + "".join(letters[x] for x in out_axes), *values)
    batch = [x for x in out_axes if x in a_axes and x in b_axes]
    m = [x for x in out_axes if x in a_axes and x not in b_axes]
    n = [x for x in out_axes if x in b_axes and x not in a_axes]
    a, b = values
    size = dict(zip(a_axes, a.shape[1:])) | dict(zip(b_axes, b.shape[1:]))
    z = a.shape[0]

    def arrange(v: np.ndarray, have: list[str], order: list[str]) -> np.ndarray:
        return np.transpose(v, [0] + [have.index(x) + 1 for x in order])

    nb, nm, nn, nk = (math.prod(size[x] for x in g) for g in (batch, m, n, red))
    a2 = arrange(a, a_axes, batch + m + red).reshape(z * nb, nm, nk)
    b2 = arrange(b, b_axes, batch + red + n).reshape(z * nb, nk, nn)
    c = np.matmul(a2, b2).reshape([z] + [size[x] for x in batch + m + n])
    return arrange(c, batch + m + n, out_axes)


def _to_op_order(expr: TensorExpr, k: int, v: np.ndarray) -> np.ndarray:
    """Broadcastable view of operand k over the op's axes: (ncores, one dim per op axis)."""
    axes = expr.axis_names
    own = expr.operands[k].axes
    perm = [0] + sorted(range(1, len(own) + 1), key=lambda d: axes.index(own[d - 1]))
    v = np.transpose(v, perm)
    present = sorted(own, key=axes.index)
    shape = [v.shape[0]] + [v.shape[1 + present.index(a)] if a in present else 1 for a in axes]
    return v.reshape(shape)


def _eval_body(node: tuple, full: list[np.ndarray]) -> np.ndarray:
    head = node[0]
    if head == "in":
        return full[node[1]]
    if head == "const":
        return np.float32(node[1])
    args = [_eval_body(a, full) for a in node[1:]]
    if head in UNARY:
        return np.asarray(UNARY[head](args[0]), dtype=np.float32)
    return np.asarray(BINARY[head](args[0], args[1]), dtype=np.float32)


def _take(expr: TensorExpr, values: list[np.ndarray], n: int) -> np.ndarray:
    table_k, index_k = expr.body[1], expr.body[2]
    table, index = values[table_k], values[index_k]
    t_axes = list(expr.inputs[table_k].axes)
    d = t_axes.index(INDIRECT)
    table = np.moveaxis(table, d + 1, 1)  # (n, V, rest...)
    rest = [a for a in t_axes if a != INDIRECT]
    cores = np.arange(n).reshape((n,) + (1,) * (index.ndim - 1))
    picked = table[cores, index.astype(np.int64)]  # (n, *index dims, *rest)
    have = list(expr.inputs[index_k].axes) + rest
    perm = [0] + [have.index(a) + 1 for a in expr.output.axes]
    return np.transpose(picked, perm).astype(np.float32)


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
