"""Vectorised kernels: one sub-task of a tensor expression on every core at once.

Arrays carry a leading core axis. Inputs are read in the storage dtype and computed in float32
(fp32 accumulation); the caller stores the result back in the buffer's dtype. A contraction's
per-core matrix products are onnxruntime's MatMul (MLAS), each product a GEMM of its own
(`matmul`): a product's bits depend on its own operands only, so that the per-core reference
executor, one core at a time, computes the same values.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np

from t10c.dtypes import ceil_div
from t10c.elementwise import COMBINES, FNS
from t10c.ir import INDIRECT, TensorExpr, Window, is_contraction


def gather_slices(buf: np.ndarray, tile: tuple[int, ...], offsets: np.ndarray,
                  sizes: tuple[int, ...]
                  ) -> tuple[np.ndarray, tuple[np.ndarray | slice, ...] | None]:
    """Each core's sub-block of ``sizes`` at ``offsets`` from buffers ``buf`` (ncores, elems).

    Returns the (ncores, *sizes) array and the index that addresses it in the buffers viewed
    as (ncores, *tile) (None when the sub-block is the whole tile). When every core's block
    starts at the same offset (most sub-tasks) the index is slices and the block a view, not
    a copy; otherwise the blocks are copied whole from a window view (one block per core, not
    element by element) and the index is a fancy index.
    """
    n = len(offsets)
    arr = buf[:n].reshape((n, *tile))
    if tuple(sizes) == tuple(tile):
        return arr, None
    nd = len(tile)
    if n and (offsets == offsets[0]).all():
        cut = (slice(None), *(slice(int(o), int(o) + s) for o, s in zip(offsets[0], sizes)))
        return arr[cut], cut
    index: list[np.ndarray | slice] = [np.arange(n).reshape((n,) + (1,) * nd)]
    for d in range(nd):
        shape = [n] + [1] * nd
        shape[d + 1] = sizes[d]
        index.append((offsets[:, d][:, None] + np.arange(sizes[d])[None, :]).reshape(shape))
    return _windows(arr, sizes)[_starts(offsets)], tuple(index)


def put_slices(buf: np.ndarray, tile: tuple[int, ...], offsets: np.ndarray,
               sizes: tuple[int, ...], values: np.ndarray) -> None:
    """Write ``values`` (ncores, *sizes) into each core's sub-block at ``offsets`` of buffers
    ``buf`` (ncores, elems): the inverse of `gather_slices`."""
    n = len(offsets)
    arr = buf[:n].reshape((n, *tile))
    if tuple(sizes) == tuple(tile):
        arr[...] = values
    elif n and (offsets == offsets[0]).all():
        cut = (slice(None), *(slice(int(o), int(o) + s) for o, s in zip(offsets[0], sizes)))
        arr[cut] = values
    else:  # each core writes one window of its own tile: the windows never overlap
        _windows(arr, sizes, writeable=True)[_starts(offsets)] = values


def _windows(arr: np.ndarray, sizes: tuple[int, ...], writeable: bool = False) -> np.ndarray:
    """(n, *positions, *sizes): every ``sizes`` window of every core's tile, as a view."""
    from numpy.lib.stride_tricks import sliding_window_view

    return sliding_window_view(arr, sizes, axis=tuple(range(1, arr.ndim)),
                               writeable=writeable)


def _starts(offsets: np.ndarray) -> tuple[np.ndarray, ...]:
    """The index of each core's own window in `_windows`."""
    return (np.arange(len(offsets)), *(offsets[:, d] for d in range(offsets.shape[1])))


def operand_sizes(expr: TensorExpr, k: int, sub: dict[str, int], tile: tuple[int, ...]
                  ) -> tuple[int, ...]:
    """Shape of the part of operand k's buffer that a sub-task with axis sizes ``sub`` reads."""
    out = []
    for d, t in zip(expr.operands[k].axes, tile):
        if isinstance(d, Window):
            out.append(sum(c * (sub[a] - 1) for a, c in d.terms) + 1)
        else:
            out.append(t if d == INDIRECT else sub[d])
    return tuple(out)


def expand(expr: TensorExpr, k: int, v: np.ndarray, sub: dict[str, int]
           ) -> tuple[np.ndarray, list[str]]:
    """Operand k's sub-block as an array over the axes it depends on, in op order.

    Plain dimensions are a transpose; windowed ones (and repeated axes) a gather, which for a
    convolution is the im2col expansion.
    """
    operand = expr.operands[k]
    axes = [a for a in expr.axis_names if a in operand.axis_set]
    dims = operand.axes
    if all(isinstance(d, str) for d in dims) and len(set(dims)) == len(dims):
        return np.transpose(v, [0] + [dims.index(a) + 1 for a in axes]), axes
    n = v.shape[0]
    rank = len(axes) + 1
    index = [np.arange(n).reshape([n] + [1] * len(axes))]
    for d in dims:
        terms = d.terms if isinstance(d, Window) else ((d, 1),)
        idx = np.zeros([1] * rank, dtype=np.int64)
        for a, c in terms:
            shape = [1] * rank
            shape[axes.index(a) + 1] = sub[a]
            idx = idx + c * np.arange(sub[a]).reshape(shape)
        index.append(idx)
    return v[tuple(index)], axes


@dataclass(frozen=True)
class Replicated:
    """An operand whose cores hold few distinct blocks (a weight tile loaded onto many cores):
    core c's block is ``blocks[index[c]]``. A contraction copies only the distinct blocks into
    its matrix layout, then the matrix rows per core; ``dense()`` gives the operand as the
    buffers hold it, for every other use."""

    blocks: np.ndarray
    index: np.ndarray
    dense: Callable[[], np.ndarray]


def evaluate(expr: TensorExpr, values: Sequence[np.ndarray | Replicated], sub: dict[str, int],
             origin: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The sub-task's result, (ncores, *output sub-block) in the output operand's axis order.
    ``out`` (contiguous float32 of as many elements): where a contraction whose product is
    already in that order may write it (the buffer it is stored in); the result is then a
    view of it, else a fresh array."""
    if expr.body[0] == "take" or not is_contraction(expr) or expr.prologue:
        values = [v.dense() if isinstance(v, Replicated) else v for v in values]
    n = len(origin)
    if expr.body[0] == "take":
        return _take(expr, values, n, origin)  # type: ignore[arg-type]  # dense above
    if is_contraction(expr):
        pair = [_expand_operand(expr, k, v, sub) for k, v in enumerate(values)]
        return _contract(expr, _prologues(expr, pair, sub, n), n, out)  # type: ignore[arg-type]
    expanded = [expand(expr, k, v.astype(np.float32, copy=False), sub)  # type: ignore[union-attr]
                for k, v in enumerate(values)]
    axes = expr.axis_names
    full = [v.reshape([n] + [sub[a] if a in have else 1 for a in axes]) for v, have in expanded]
    red = expr.reduction_axes
    whole = (n, *(sub[a] for a in axes))
    if not (expr.combine and red) and math.prod(whole) > 2 * EVAL_BLOCK:
        result = _eval_blocks(expr.body, full, whole)
    else:
        result = np.broadcast_to(_eval_body(expr.body, full), whole)
    if expr.combine and red:
        mask = np.ones((n,) + (1,) * len(axes), dtype=bool)
        for a in red:
            j = axes.index(a)
            pos = origin[:, j][:, None] + np.arange(sub[a])[None, :]
            shape = [n] + [1] * len(axes)
            shape[j + 1] = sub[a]
            mask = mask & (pos < expr.extents[a]).reshape(shape)
        combine = COMBINES[expr.combine]
        if not (result.flags.c_contiguous and mask.all()):  # (else the same array, copied)
            result = np.where(mask, result, np.float32(combine.identity))
        red_dims = tuple(axes.index(a) + 1 for a in red)
        result = combine.ufunc.reduce(result, axis=red_dims)
        kept = [a for a in axes if a not in red]
    else:
        kept = list(axes)
    perm = [0] + [kept.index(str(a)) + 1 for a in expr.output.axes]
    return np.transpose(result, perm)


def _prologues(expr: TensorExpr, expanded: list[tuple[np.ndarray, list[str]]],
               sub: dict[str, int], n: int) -> list[tuple[np.ndarray, list[str]]]:
    """A contraction's two operands, each as its prologue (if any) transforms it: the body
    evaluated over the operand's axes, the inputs it reads broadcast along the ones they lack
    (they index a subset of them)."""
    pair = list(expanded[:2])
    for slot, body in expr.prologue:
        axes = pair[slot][1]
        full = []
        for v, have in expanded:
            if not set(have) <= set(axes):
                full.append(v)  # not read by this prologue (the other matmul operand)
                continue
            full.append(v.reshape([n] + [sub[a] if a in have else 1 for a in axes]))
        value = _eval_body(body, full)
        pair[slot] = (np.broadcast_to(value, (n, *(sub[a] for a in axes))), axes)
    return pair


def _expand_operand(expr: TensorExpr, k: int, v: np.ndarray | Replicated, sub: dict[str, int]
                    ) -> tuple[np.ndarray | Replicated, list[str]]:
    """`expand` of a contraction operand, a replicated one block by block."""
    if not isinstance(v, Replicated):
        return expand(expr, k, v.astype(np.float32, copy=False), sub)
    blocks, axes = expand(expr, k, v.blocks.astype(np.float32, copy=False), sub)
    dense = v.dense
    return Replicated(blocks, v.index, lambda: expand(
        expr, k, dense().astype(np.float32, copy=False), sub)[0]), axes


def _contract(expr: TensorExpr, expanded: list[tuple[np.ndarray | Replicated, list[str]]],
              z: int, out: np.ndarray | None = None) -> np.ndarray:
    """Batched matmul over the core axis (``z`` cores): (Z, batch, m, k) @ (Z, batch, k, n),
    into ``out`` where the product's order is the output's (`evaluate`)."""
    (a, a_axes), (b, b_axes) = expanded
    out_axes = [str(a) for a in expr.output.axes]  # output dimensions are plain axes
    lifted = [x for x in out_axes if x not in a_axes and x not in b_axes]
    if lifted:  # the unit axis of a scalar result (`Context.emit` adds it): one more of a's
        unit = (1,) * len(lifted)
        if isinstance(a, Replicated):
            dense = a.dense
            a = Replicated(a.blocks.reshape(a.blocks.shape + unit), a.index,
                           lambda: (lambda d: d.reshape(d.shape + unit))(dense()))
        else:
            a = a.reshape(a.shape + unit)
        a_axes = [*a_axes, *lifted]
    red = list(expr.reduction_axes)
    if not all(x in a_axes and x in b_axes for x in red):
        a, b = (v.dense() if isinstance(v, Replicated) else v for v in (a, b))
        letters = {x: chr(ord("a") + i) for i, x in enumerate(expr.axis_names)}
        spec = ",".join("Z" + "".join(letters[x] for x in have) for have in (a_axes, b_axes))
        return np.einsum(f"{spec}->Z" + "".join(letters[x] for x in out_axes), a, b)
    batch = [x for x in out_axes if x in a_axes and x in b_axes]
    m = [x for x in out_axes if x in a_axes and x not in b_axes]
    n = [x for x in out_axes if x in b_axes and x not in a_axes]
    shape_a = (a.blocks if isinstance(a, Replicated) else a).shape
    shape_b = (b.blocks if isinstance(b, Replicated) else b).shape
    size = dict(zip(a_axes, shape_a[1:])) | dict(zip(b_axes, shape_b[1:]))

    def arrange(v: np.ndarray, have: list[str], order: list[str]) -> np.ndarray:
        return np.transpose(v, [0] + [have.index(x) + 1 for x in order])

    def matrix(v: np.ndarray | Replicated, have: list[str], order: list[str], rows: int,
               cols: int) -> np.ndarray:
        """The operand as (z * batch, rows, cols); a replicated one's distinct blocks are
        arranged, then copied per core, where the buffers' arranged blocks are contiguous too
        (copied, or already so): the matmul sees the same contiguous matrices, the same bits."""
        if isinstance(v, Replicated):
            u = len(v.blocks)
            mat = arrange(v.blocks, have, order).reshape(u * nb, rows, cols)
            if u >= 2 and z >= 2 and mat.flags.c_contiguous:
                return mat.reshape(u, -1)[v.index].reshape(z * nb, rows, cols)
            v = v.dense()
        return arrange(v, have, order).reshape(z * nb, rows, cols)

    nb, nm, nn, nk = (math.prod(size[x] for x in g) for g in (batch, m, n, red))
    orders = (batch + m + red, nm, nk), (batch + red + n, nk, nn)
    digits = core_digits(z, [v.index for v in (a, b) if isinstance(v, Replicated)])
    if digits is not None:  # each core's pair of matrices as broadcast views: nothing copied
        a2, b2 = (digit_view(v, arrange(v.blocks if isinstance(v, Replicated) else v, have,
                                        order).reshape(-1, nb, rows, cols), z, digits)
                  for v, have, (order, rows, cols) in zip((a, b), (a_axes, b_axes), orders))
    else:
        a2, b2 = (matrix(v, have, *o) for v, have, o in zip((a, b), (a_axes, b_axes), orders))
    shape = [z] + [size[x] for x in batch + m + n]
    if out is not None and batch + m + n == out_axes and out.size == math.prod(shape):
        batch_shape = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        return matmul(a2, b2, out=out.reshape(*batch_shape, nm, nn)).reshape(shape)
    c = matmul(a2, b2).reshape(shape)
    return arrange(c, batch + m + n, out_axes)


#: threads a large batched matmul (or rounding) is shared among: each share is computed by one
#: thread, and each matrix product is its own GEMM whichever share it falls in (`matmul`)
THREADS = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1, 8)
#: multiply-adds below which one call is not shared (a thread costs tens of microseconds)
SHARED_WORK = 1 << 22
_POOL: list[ThreadPoolExecutor] = []


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b)`` (batch axes broadcast), each matrix product of the batch a GEMM of
    its own: float32 ones by onnxruntime's MatMul (MLAS, `gemms`), others by numpy. Each
    product's bits then depend on its own shape and values only, not on the batch around it
    nor on the threads: the per-core reference executor, one core at a time, gets the same
    bits. The batch is cut into `THREADS` shares along its first axis longer than one.

    MLAS on one thread computes these small per-core products several times faster than
    numpy's BLAS calls, one per matrix (README: Performance, Emulator speed). Into ``out``
    if given (contiguous, of the result's shape and dtype)."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if out is None:
        out = np.empty((*batch, a.shape[-2], b.shape[-1]), dtype=np.result_type(a, b))
    elif not out.flags.c_contiguous:
        raise ValueError("matmul: out must be contiguous")
    depth = a.shape[-1]
    mlas = out.dtype == a.dtype == b.dtype == np.float32 and out.size and depth
    a, b = (v.reshape((1,) * (len(batch) + 2 - v.ndim) + v.shape) for v in (a, b))
    run = partial(_own_products, gemms()) if mlas else _np_gemms
    axis = next((i for i, x in enumerate(batch) if x > 1), None)
    if THREADS < 2 or axis is None or out.size * depth < SHARED_WORK:
        run(a, b, out)
        return out
    cuts = np.linspace(0, batch[axis], min(PIECES * THREADS, batch[axis]) + 1).astype(
        int).tolist()

    def part(lo: int, hi: int) -> None:
        cut = (slice(None),) * axis + (slice(lo, hi),)
        run(a[cut] if a.shape[axis] > 1 else a, b[cut] if b.shape[axis] > 1 else b, out[cut])

    share(part, cuts)
    return out


def _np_gemms(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.matmul(a, b, out=out)


#: elements of a right matrix copied at once where each product of a stack is given its own
#: (`_own_products`): a few MiB, whatever the stack
OWN_COPIES = 1 << 20


def _own_products(run: Callable[[np.ndarray, np.ndarray, np.ndarray], None], a: np.ndarray,
                  b: np.ndarray, out: np.ndarray) -> None:
    """``run(a, b, out)``, where onnxruntime would compute a stack against one right matrix
    as one GEMM of all the stack's rows (other bits than each product alone): then every
    product is given its own right matrix, a few products at a time (`OWN_COPIES`)."""
    batch = math.prod(out.shape[:-2])
    if math.prod(b.shape[:-2]) > 1 or batch == 1:
        run(a, b, out)
        return
    a3, o3 = a.reshape(batch, *a.shape[-2:]), out.reshape(batch, *out.shape[-2:])
    b3 = b.reshape(1, *b.shape[-2:])
    step = max(1, min(batch, OWN_COPIES // max(b3.size, 1)))
    for lo in range(0, batch, step):
        hi = min(lo + step, batch)
        run(a3[lo:hi], np.broadcast_to(b3, (hi - lo, *b3.shape[1:])), o3[lo:hi])


_GEMMS: list[Callable[[np.ndarray, np.ndarray, np.ndarray], None]] = []
_GEMMS_LOCK = threading.Lock()


def gemms() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """onnxruntime's float32 MatMul on one thread, as ``gemms(a, b, out)``: ``a @ b`` (batch
    axes of one broadcast) into ``out``, contiguous and of the result's shape (the leading
    axes of a share of `matmul`'s batch are ones, so a share is contiguous). Built at the
    first use; onnxruntime is a dependency of the project (the reference it checks against)."""
    with _GEMMS_LOCK:
        if not _GEMMS:
            _GEMMS.append(_make_gemms())
        return _GEMMS[0]


def _make_gemms() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "gemms",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # (as `cast_rounding`'s)
    opts = ort.SessionOptions()
    # one thread: a product's bits must not depend on how many share it (MLAS would split
    # one large GEMM among its threads); `matmul` shares the batch among its own
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        io = session.io_binding()
        io.bind_cpu_input("a", np.ascontiguousarray(a))
        io.bind_cpu_input("b", np.ascontiguousarray(b))
        io.bind_output("c", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        session.run_with_iobinding(io)

    return run


def sharing() -> int:
    """The threads a large kernel may be shared among from this thread: `THREADS` from the
    main thread; one (none shared) from a helper thread (the cut-ahead thread, say), which
    already runs beside the main thread: sharing its work too would have more threads than
    the host has cores contend for the interpreter's lock."""
    return THREADS if threading.current_thread() is threading.main_thread() else 1


def share(run: Callable[[int, int], object], cuts: list[int]) -> None:
    """``run(lo, hi)`` for each pair of consecutive ``cuts``, taken in turn by this thread and
    up to `THREADS` - 1 of the pool's meanwhile (rather than every share handed to the pool
    while this thread waits: a thread fewer woken, and none idle). Cut finer than the
    threads (`PIECES`), a thread slowed by other work (the cut thread shares the host's
    cores) takes fewer pieces, where equal shares had this thread wait for the slowest."""
    pieces = zip(cuts, cuts[1:])
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                piece = next(pieces, None)
            if piece is None:
                return
            run(*piece)

    pending = [pool().submit(work) for _ in range(min(THREADS, len(cuts) - 1) - 1)]
    try:
        work()
    finally:
        for done in pending:
            done.result()


#: pieces per thread a shared kernel is cut into (`share`)
PIECES = 4


def pool() -> ThreadPoolExecutor:
    """The threads that share large matmuls and roundings (made at the first use)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(THREADS, thread_name_prefix="t10c-kernels"))
    return _POOL[0]


def prepare() -> None:
    """Make the kernels' onnxruntime sessions now (`gemms`, `cast_rounding`), importing
    onnxruntime: once per process, ahead of a timed run. Made at their first use instead,
    inside a run, the import holds the interpreter's lock for tens of milliseconds while
    the other threads wait, and the run's wall time counts the process's set-up, where the
    reference's counts only its session's run (`t10c.driver.reference`)."""
    gemms()
    cast_rounding()


#: `index_digits` by the index's place in the array that owns its memory (held, so that
#: neither is reused): the tables of repeated layers are one array each
_DIGITS: dict[tuple, tuple[np.ndarray, list[tuple[int, bool]] | None]] = {}
_DIGITS_LOCK = threading.Lock()


def index_digits(index: np.ndarray, z: int) -> list[tuple[int, bool]] | None:
    """Core c's block ``index[c]`` (c < ``z``) as mixed-radix digits of c, innermost first:
    each digit's size and whether the block depends on it, the block being the number its
    digits write (the outer ones the more significant: a weight tile held by every ``u``-th
    core, an exchanged row shared by ``h`` neighbouring cores, a head's query rows each met
    by all its key columns); None where the index is no such number."""
    owner = index if index.base is None else index.base
    key = (id(owner), index.__array_interface__["data"][0], index.shape, index.strides,
           index.dtype.str, z)
    with _DIGITS_LOCK:
        hit = _DIGITS.get(key)
    if hit is not None and hit[0] is owner:
        return hit[1]
    digits = _index_digits(index, z)
    with _DIGITS_LOCK:
        if len(_DIGITS) >= 4096:  # (a long-lived process: the oldest tables forgotten)
            _DIGITS.clear()
        _DIGITS[key] = (owner, digits)
    return digits


def _index_digits(index: np.ndarray, z: int) -> list[tuple[int, bool]] | None:
    x = index[:z]
    if not len(x) or x[0] != 0:
        return None
    digits: list[tuple[int, bool]] = []
    scale = 1  # the place value of the next digit the block depends on
    while len(x) > 1:
        varies = bool(x[1] != x[0])
        if varies:  # a run counting up by ``scale``
            off = np.flatnonzero(np.diff(x) != scale)
            size = int(off[0]) + 1 if len(off) else len(x)
        else:  # a run of one block
            off = np.flatnonzero(x != x[0])
            size = int(off[0]) if len(off) else len(x)
        if size < 2 or len(x) % size:  # (a step of other than ``scale``: no such number)
            return None
        runs = x.reshape(-1, size) - x[::size, None]
        if not np.array_equal(runs, np.broadcast_to(np.arange(size) * scale if varies
                                                    else np.zeros(size, dtype=x.dtype),
                                                    runs.shape)):
            return None
        digits.append((size, varies))
        x = x[::size]
        if varies:
            scale *= size
    return digits


def core_digits(z: int, indices: list[np.ndarray]) -> list[int] | None:
    """The core axis as mixed-radix digits (their place values ``p``, innermost first, ending
    with ``z``) that every replicated operand's block index is a number of (`index_digits`),
    or None (some index is irregular, or their digits do not nest)."""
    if not indices or z < 2:
        return None
    places = {1, z}
    for index in indices:
        digits = index_digits(index, z)
        if digits is None:
            return None
        place = 1
        for size, _ in digits:
            place *= size
            places.add(place)
    chain = sorted(places)
    if any(b % a for a, b in zip(chain, chain[1:])):
        return None
    return chain


def digit_view(v: np.ndarray | Replicated, mat: np.ndarray, z: int, places: list[int]
               ) -> np.ndarray:
    """Operand ``v``'s matrices ``mat`` ((z or u, nb, rows, cols)) over the core digits
    ``places`` (outermost first in the result): a dense operand's split by digit, a
    replicated one's distinct matrices (made contiguous, as the dense copies are) with an axis
    of one, broadcast by the matmul, for each digit its block does not depend on."""
    sizes = [b // a for a, b in zip(places, places[1:])]  # innermost digit first
    if not isinstance(v, Replicated):
        return mat.reshape(*sizes[::-1], *mat.shape[1:])
    own = index_digits(v.index, z)
    assert own is not None  # (`core_digits` found every replicated operand's)
    shape, u = [], 1
    bounds, place = [], 1  # each own digit's (upper place value, varies)
    for size, varies in own:
        place *= size
        bounds.append((place, varies))
    for low, size in zip(places, sizes):  # the own digit each core digit lies in
        varies = next(vary for high, vary in bounds if low < high)
        shape.append(size if varies else 1)
        u *= size if varies else 1
    return np.ascontiguousarray(mat[:u]).reshape(*shape[::-1], *mat.shape[1:])


#: elements of an elementwise body evaluated at once: its temporaries (256 KiB each) stay in
#: a core's L2 cache, and a long body (GELU's erf, 14 passes) makes few numpy calls a block
#: (bert-base on ipu-mk2: 1 << 14 took 8 to 10 ms more of the main thread's time in its FFN)
EVAL_BLOCK = 1 << 16


def _eval_blocks(body: tuple, full: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """`_eval_body` over ``shape`` (cores first), a few cores' rows at a time (each value is
    computed alone, so the blocks give the same bits), the blocks shared among `THREADS`."""
    out = np.empty(shape, dtype=np.float32)
    n = shape[0]
    step = max(1, EVAL_BLOCK // max(math.prod(shape[1:]), 1))
    starts = list(range(0, n, step))

    def part(first: int, last: int) -> None:
        with np.errstate(all="ignore"):  # (the caller's state is not the thread's)
            for lo in starts[first:last]:
                hi = lo + step
                np.copyto(out[lo:hi], _eval_body(body, [v[lo:hi] for v in full]))

    parts = min(PIECES * THREADS, len(starts)) if THREADS > 1 else 1
    cuts = [len(starts) * k // parts for k in range(parts + 1)]
    if parts < 2:
        part(0, len(starts))
    else:
        share(part, cuts)
    return out


def _eval_body(node: tuple, full: list[np.ndarray]) -> np.ndarray:
    head = node[0]
    if head == "in":
        return full[node[1]]
    if head == "const":
        return np.asarray(node[1], dtype=np.float32)
    args = [_eval_body(a, full) for a in node[1:]]
    return np.asarray(FNS[head].numpy(*args), dtype=np.float32)


def _take(expr: TensorExpr, values: list[np.ndarray], n: int, origin: np.ndarray
          ) -> np.ndarray:
    table_k, index_k = expr.body[1], expr.body[2]
    table, index = values[table_k], values[index_k]
    t_axes = list(expr.inputs[table_k].axes)
    d = expr.take_dim()
    table = np.moveaxis(table, d + 1, 1)  # (n, V, rest...)
    rest = [a for i, a in enumerate(t_axes) if i != d]
    cores = np.arange(n).reshape((n,) + (1,) * (index.ndim - 1))
    index = index.astype(np.int64)
    sharded = expr.take_axis()
    if sharded is not None:  # this core holds rows [first, first + V) of the table
        first = origin[:, expr.axis_names.index(sharded)].reshape(cores.shape)
        index = index - first
        hit = (index >= 0) & (index < table.shape[1])
        index = np.where(hit, index, 0)
    picked = table[cores, index]  # (n, *index dims, *rest)
    if sharded is not None:
        picked = np.where(hit.reshape(hit.shape + (1,) * len(rest)), picked, 0)
    have = list(expr.inputs[index_k].axes) + rest
    lifted = [a for a in expr.output.axes if a not in have]  # a unit axis (a width-1 table)
    picked = picked.reshape(picked.shape + (1,) * len(lifted))
    have += lifted
    perm = [0] + [have.index(a) + 1 for a in expr.output.axes]
    return np.transpose(picked, perm).astype(np.float32)


def to_storage(values: np.ndarray, dtype: np.dtype | type[np.generic]) -> np.ndarray:
    """``values`` cast to a buffer's dtype, saturating: a float too large for a narrower float
    type becomes an infinity of its sign, so an fp16 mask of -3.4e38 is -inf.

    That is what IEEE round-to-nearest does (numpy's cast is IEEE), so one cast suffices; only
    numpy's "overflow encountered in cast" warning is silenced. No copy when the dtype is
    already the target's."""
    values = np.asarray(values)
    target = np.dtype(dtype)
    if values.dtype == target:
        return values
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(target)


#: elements rounded at once by `round_fp16`: its few passes stay in the cache
ROUND_BLOCK = 1 << 15
#: the bits of fp16's smallest normal (2^-14; below it the spacing is 2^-24) as a float32, less
#: one: ``|x|``'s bits less one are below it for the values under it but zero (which wraps)
_TINY16_BITS = np.uint32(0x38800000 - 1)
_HUGE16 = np.float32(65520.0)  # from here IEEE rounding to fp16 gives an infinity


def round_fp16(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 ``values`` rounded to the nearest fp16 value, as float32: bit for bit
    ``to_storage(values, np.float16).astype(np.float32)``, several times faster (numpy's fp16
    casts are scalar code here).

    The float32 adder rounds: ``(|x| + m) - m``, where ``m`` is 2^13 times the power of two
    at or below ``|x|`` (2^-14 at least, below which fp16's spacing stays 2^-24), rounds
    ``|x|`` to nearest even on fp16's spacing there, since ``m``'s ulp is that spacing and the
    subtraction is exact; the sign bit is put back (a negative value that rounds to zero is
    -0). A block holding a value of 2^15 or more, an infinity or a NaN goes by bits instead
    (`_round_fp16_bits`): from 65520 up the result is an infinity of the value's sign; NaNs
    take numpy's cast (its payload rule). Large parts without a NaN are rounded by
    onnxruntime's Cast instead (`cast_rounding`: the host's fp16 conversion instructions,
    the same bits).

    Into ``out`` if given (contiguous float32 of as many elements; ``values`` itself, to
    round in place)."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    if out is None:
        out = np.empty_like(x)
    elif not (out.flags.c_contiguous and out.size == x.size and out.dtype == np.float32):
        raise ValueError("round_fp16: out must be contiguous float32 of the values' size")
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)
    blocks = ceil_div(flat_x.size, ROUND_BLOCK)
    parts = min(sharing(), blocks // 4)  # a large array's blocks shared among the cores
    if parts < 2:
        _round_fp16_part(flat_x, flat_out)
        return out
    cuts = [ROUND_BLOCK * (blocks * k // parts) for k in range(parts)] + [flat_x.size]
    share(lambda lo, hi: _round_fp16_part(flat_x[lo:hi], flat_out[lo:hi]), cuts)
    return out


#: elements from which `round_fp16` has onnxruntime's Cast round them: its kernel converts
#: with the host's fp16 instructions, several times faster than the adder's numpy passes;
#: below, the call costs more than it saves
CAST_MIN = 1 << 14
_CAST: list[Callable[[np.ndarray, np.ndarray], None] | None] = []
_CAST_LOCK = threading.Lock()


def _round_fp16_part(flat_x: np.ndarray, flat_out: np.ndarray) -> None:
    """`round_fp16` of a flat part: by onnxruntime's Cast where it is large, holds no NaN
    (whose payload follows numpy's rule, not the Cast's) and the Cast is at hand, else by
    the float32 adder."""
    cast = cast_rounding() if flat_x.size >= CAST_MIN else None
    if cast is not None and not np.isnan(flat_x.max()):
        cast(flat_x, flat_out)
    else:
        _round_fp16_into(flat_x, flat_out)


def cast_rounding() -> Callable[[np.ndarray, np.ndarray], None] | None:
    """onnxruntime's float32 -> fp16 -> float32 Cast pair as a rounding of a flat
    contiguous float32 array into another of its size (the same one, to round in place:
    the first Cast reads it whole before the second writes), or None where onnxruntime
    cannot run it or its values differ from numpy's cast on fp16's edges and a sample of
    every exponent (checked once, at the first use; numpy's rule is the definition)."""
    with _CAST_LOCK:
        if not _CAST:
            _CAST.append(_make_cast_rounding())
        return _CAST[0]


def _make_cast_rounding() -> Callable[[np.ndarray, np.ndarray], None] | None:
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)], "round_fp16",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8  # (opset 17's: any onnxruntime that runs opset 17 reads it)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # both Casts
        opts.log_severity_level = 3
        session = ort.InferenceSession(model.SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])

        def cast(flat_x: np.ndarray, flat_out: np.ndarray) -> None:
            io = session.io_binding()
            io.bind_cpu_input("x", flat_x)
            io.bind_output("y", "cpu", 0, np.float32, [flat_x.size], flat_out.ctypes.data)
            session.run_with_iobinding(io)

        rng = np.random.default_rng(0)
        bits = np.concatenate([rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint32),
                               FP16_EDGES])
        sample = bits.view(np.float32)
        sample = sample[~np.isnan(sample)]
        with np.errstate(all="ignore"):
            want = sample.astype(np.float16).astype(np.float32)
        got = np.empty_like(sample)
        cast(sample, got)
    except Exception:  # noqa: BLE001 - any failure: the adder rounds instead
        return None
    return cast if np.array_equal(got.view(np.uint32), want.view(np.uint32)) else None


#: float32 bits around every edge of fp16's rounding: ties, the subnormal boundary, the largest
#: finite value and the infinities, NaNs with and without payload, both zeros (what
#: `cast_rounding` is checked on, its NaNs left out, and the tests)
FP16_EDGES = np.array([0x00000000, 0x80000000, 0x33000000, 0x33000001, 0x337FFFFF,
                       0x38800000, 0x387FFFFF, 0x387FF000, 0x387FEFFF, 0x3F801000,
                       0x3F803000, 0x3F800FFF, 0x477FE000, 0x477FEFFF, 0x477FF000,
                       0x477FF001, 0x47800000, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
                       0x7FC00000, 0x7F800001, 0xFFC00001, 0x7F802000, 0x00000001,
                       0x807FFFFF, 0xC77FF000, 0xB3800000], dtype=np.uint32)


#: float32 bits: the exponent field, and 2^15 (from where a value may round
#: past fp16's largest finite value, or is an infinity or a NaN: those blocks go by bits)
_EXP_BITS, _BIG16_BITS = np.uint32(0x7F800000), 0x47000000
_TINY16 = np.float32(2.0 ** -14)  # fp16's smallest normal: its spacing holds below it


def _round_fp16_into(flat_x: np.ndarray, flat_out: np.ndarray) -> None:
    """`round_fp16` of the flat float32 array ``flat_x`` into ``flat_out``, a block at a
    time (its few passes stay in the cache), by the float32 adder (see `round_fp16`)."""
    size = min(ROUND_BLOCK, flat_x.size)
    magic, sign = np.empty(size, dtype=np.float32), np.empty(size, dtype=np.uint32)
    # in place, each block is rounded in a temporary (the rounding reads x to the end)
    temp = np.empty(size, dtype=np.float32) if np.may_share_memory(flat_x, flat_out) else None
    for s in range(0, flat_x.size, ROUND_BLOCK):
        xs, ob = flat_x[s:s + ROUND_BLOCK], flat_out[s:s + ROUND_BLOCK]
        k = len(xs)
        m, sg = magic[:k], sign[:k]
        a = ob if temp is None else temp[:k]
        np.abs(xs, out=a)
        np.bitwise_and(a.view(np.uint32), _EXP_BITS, out=m.view(np.uint32))  # 2^e <= |x|
        if m.view(np.uint32).max() >= _BIG16_BITS:
            _round_fp16_bits(xs, ob)
            continue
        np.bitwise_xor(xs.view(np.uint32), a.view(np.uint32), out=sg)  # the sign bits
        np.maximum(m, _TINY16, out=m)
        m *= np.float32(2.0 ** 13)
        a += m  # rounded to nearest even on fp16's spacing
        a -= m  # exact
        np.bitwise_or(a.view(np.uint32), sg, out=ob.view(np.uint32))


def _round_fp16_bits(flat_x: np.ndarray, flat_out: np.ndarray) -> None:
    """`round_fp16` of the flat float32 array ``flat_x`` into ``flat_out`` by bit
    arithmetic, a block at a time: in fp16's normal range rounding to nearest even drops the
    13 low mantissa bits (a carry may raise the exponent, exactly as IEEE rounding does);
    below it every value is a multiple of 2^-24, which ``rint(x * 2^24) * 2^-24`` gives
    exactly; from 65520 up the result is an infinity of the value's sign; NaNs take numpy's
    cast (its payload rule)."""
    mag = np.empty(min(ROUND_BLOCK, flat_x.size), dtype=np.float32)
    low = np.empty(len(mag), dtype=np.uint32)
    # in place, each block is rounded into a copy of itself (the rounding reads x to the end)
    inplace = np.may_share_memory(flat_x, flat_out)
    copy = np.empty(len(mag), dtype=np.float32) if inplace else mag
    with np.errstate(over="ignore", invalid="ignore"):  # large and NaN lanes are redone
        for s in range(0, flat_x.size, ROUND_BLOCK):
            xs, ob = flat_x[s:s + ROUND_BLOCK], flat_out[s:s + ROUND_BLOCK]
            a, below = mag[:len(xs)], low[:len(xs)]
            if inplace:
                xs = copy[:len(xs)]
                np.copyto(xs, ob)
            u, o = xs.view(np.uint32), ob.view(np.uint32)
            np.right_shift(u, 13, out=o)
            o &= np.uint32(1)  # the kept mantissa's last bit: ties go to even
            o += np.uint32(0xFFF)
            o += u
            o &= np.uint32(0xFFFFE000)
            np.abs(xs, out=a)
            # |x| - 1 ulp as bits, wrapping at zero: below fp16's normals and not zero
            np.subtract(a.view(np.uint32), np.uint32(1), out=below)
            if below.min() < _TINY16_BITS:
                small = below < _TINY16_BITS
                np.copyto(ob, np.rint(xs * np.float32(2.0 ** 24)) * np.float32(2.0 ** -24),
                          where=small)
            if not a.max() < _HUGE16:  # past fp16's range, or a NaN
                over = ~(a < _HUGE16)
                np.copyto(ob, np.copysign(np.float32(np.inf), xs), where=over)
                nan = np.isnan(xs)
                if nan.any():
                    ob[nan] = xs[nan].astype(np.float16).astype(np.float32)
