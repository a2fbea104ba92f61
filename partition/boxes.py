"""Sets of boxes per core: where a producer leaves its result, carried through views.

A re-layout is priced by the elements each consumer core lacks (`transitions.remote_counts`):
its wanted box less what the producer left on the same physical core. A producer leaves one
box per core, unless it reduce-scatters (each member keeps a row-major chunk of its tile) or its
result is read through a reshape that splits or merges dimensions (heads out of a hidden
dimension): then a core holds a union of boxes. Counting that union box by box costs a few
operations per core, where counting element by element costs the tensor's size per pair of
layouts (bert-base's edges spent a quarter of its compile doing so).

A `BoxSet` holds ``K`` boxes per core as ``lo`` and ``size`` arrays of shape ``(K, cores,
ndim)``, clipped to the tensor (a box outside it, or past its end, is empty: some size 0); a
core's boxes are disjoint. Row-major flat order is what a reshape keeps, so a box crosses a
reshape as the flat ranges it covers, each cut back into boxes of the new shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from t10c.ir import last_product


@dataclass(frozen=True)
class BoxSet:
    """``K`` disjoint boxes per core: ``lo`` and ``size``, ``(K, cores, ndim)``."""

    lo: np.ndarray
    size: np.ndarray

    @property
    def count(self) -> int:
        return self.lo.shape[0]


def clipped(lo: np.ndarray, size: np.ndarray, shape: Sequence[int]) -> BoxSet:
    """Boxes ``(K, cores, ndim)`` cut to a tensor of ``shape``: what lies outside holds no
    element (a box wholly outside is empty, at the origin)."""
    extent = np.asarray(shape, dtype=np.int64)
    a = np.clip(lo, 0, extent)
    b = np.clip(lo + size, 0, extent)
    n = np.maximum(b - a, 0)
    empty = (n == 0).any(axis=-1, keepdims=True)
    return BoxSet(np.where(empty, 0, a), np.where(empty, 0, n))


def range_boxes(a: np.ndarray, b: np.ndarray, shape: Sequence[int]
                ) -> tuple[np.ndarray, np.ndarray]:
    """The flat row-major range ``[a, b)`` (per core, ``0 <= a <= b <= prod(shape)``) of a
    tensor of ``shape`` as ``2 ** ndim - 1`` disjoint boxes, (lo, size) each ``(K, cores,
    ndim)``; those not needed are empty."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if len(shape) == 1:
        return a[None, :, None], np.maximum(b - a, 0)[None, :, None]
    inner = math.prod(shape[1:])
    a0, ar = np.divmod(a, inner)
    b0, br = np.divmod(b, inner)
    same = a0 == b0
    empty = a >= b
    # the first outer index: from ar to its end, or to br if the range ends there too
    head_lo, head_n = range_boxes(np.where(empty, 0, ar), np.where(empty, 0, np.where(
        same, br, inner)), shape[1:])
    # the whole outer indices between
    mid = np.where(same | empty, 0, np.maximum(b0 - a0 - 1, 0))
    # the last outer index, up to br
    tail_lo, tail_n = range_boxes(np.zeros_like(a), np.where(same | empty, 0, br), shape[1:])
    cores = a.shape[0]

    def prefix(outer: np.ndarray, n: np.ndarray, lo: np.ndarray, size: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        o = np.broadcast_to(outer[None, :, None], (lo.shape[0], cores, 1))
        c = np.broadcast_to(n[None, :, None], (lo.shape[0], cores, 1))
        return np.concatenate([o, lo], axis=2), np.concatenate([c, size], axis=2)

    one = np.ones(cores, dtype=np.int64)
    h = prefix(a0, one, head_lo, head_n)
    t = prefix(b0, one, tail_lo, tail_n)
    m_lo = np.zeros((1, cores, len(shape)), dtype=np.int64)
    m_n = np.zeros((1, cores, len(shape)), dtype=np.int64)
    m_lo[0, :, 0] = a0 + 1
    m_n[0, :, 0] = mid
    m_n[0, :, 1:] = np.asarray(shape[1:], dtype=np.int64)
    lo = np.concatenate([h[0], m_lo, t[0]])
    size = np.concatenate([h[1], m_n, t[1]])
    size = np.where((size == 0).any(axis=-1, keepdims=True), 0, size)
    return lo, size


def chunk_boxes(origin: np.ndarray, tile: Sequence[int], pos: np.ndarray, chunk: int,
                shape: Sequence[int]) -> BoxSet:
    """What each core keeps of its ``tile`` at ``origin`` after a reduce-scatter: elements
    ``[pos x chunk, (pos + 1) x chunk)`` of the tile in row-major order
    (`collectives.chunk_elements`), as boxes of the tensor of ``shape``."""
    elems = math.prod(tile)
    a = np.minimum(pos.astype(np.int64) * chunk, elems)
    b = np.minimum(a + chunk, elems)
    lo, size = range_boxes(a, b, tile)
    return clipped(lo + origin[None].astype(np.int64), size, shape)


def _groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[range, range]]:
    """The dimension groups a reshape maps onto each other: consecutive source and
    destination dimensions with equal products (unit dimensions join a neighbour)."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        si, dj, ps, pd = i, j, 1, 1
        if i < len(src):
            ps, i = ps * src[i], i + 1
        if j < len(dst):
            pd, j = pd * dst[j], j + 1
        while ps != pd:
            if ps < pd and i < len(src):
                ps, i = ps * src[i], i + 1
            elif j < len(dst):
                pd, j = pd * dst[j], j + 1
            else:
                ps, i = ps * src[i], i + 1
        while i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            i += 1  # a trailing unit dimension of the source joins this group
        while j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            j += 1
        groups.append((range(si, i), range(dj, j)))
    return groups


def reshaped(boxes: BoxSet, src: Sequence[int], dst: Sequence[int], limit: int
             ) -> BoxSet | None:
    """``boxes`` of a tensor of shape ``src`` as boxes of its reshape to ``dst`` (the same
    elements in row-major order), or None if that takes more than ``limit`` box entries
    (boxes times cores)."""
    lo, size = boxes.lo, boxes.size
    cores = lo.shape[1]
    parts: list[tuple[np.ndarray, np.ndarray]] = []  # per group, (K, cores, len(group dst))
    for s_dims, d_dims in _groups(src, dst):
        s_shape = [src[d] for d in s_dims]
        d_shape = [dst[d] for d in d_dims]
        g_lo = lo[:, :, s_dims.start:s_dims.stop]
        g_n = size[:, :, s_dims.start:s_dims.stop]
        if [n for n in s_shape if n != 1] == [n for n in d_shape if n != 1]:
            # the same dimensions, give or take unit ones: kept as they are
            keep = [k for k, n in enumerate(s_shape) if n != 1]
            out_lo = np.zeros(g_lo.shape[:2] + (len(d_shape),), dtype=np.int64)
            out_n = np.ones_like(out_lo)
            for k, d in zip(keep, [k for k, n in enumerate(d_shape) if n != 1]):
                out_lo[:, :, d] = g_lo[:, :, k]
                out_n[:, :, d] = g_n[:, :, k]
            parts.append((out_lo, out_n))
            continue
        # the box as flat ranges: the dimensions after the last one that is not whole on
        # every core fold into each range; the ones before it are enumerated
        full = (g_lo == 0) & (g_n == np.asarray(s_shape)) | (g_n == 0)
        r = len(s_shape) - 1
        while r > 0 and full[:, :, r].all():
            r -= 1
        inner = math.prod(s_shape[r + 1:])
        steps = [int(g_n[:, :, k].max(initial=0)) for k in range(r)]
        ranges = math.prod(steps) if steps else 1
        if boxes.count * ranges * (2 ** len(d_shape) - 1) * cores > limit:
            return None
        strides = [math.prod(s_shape[k + 1:]) for k in range(len(s_shape))]
        starts, ends = [], []
        for combo in np.ndindex(*steps):
            inside = np.ones(g_lo.shape[:2], dtype=bool)
            flat_lo = np.zeros(g_lo.shape[:2], dtype=np.int64)
            for k, step in enumerate(combo):
                inside &= step < g_n[:, :, k]
                flat_lo += (g_lo[:, :, k] + step) * strides[k]
            flat_lo += g_lo[:, :, r] * strides[r]
            n = np.where(inside & (g_n > 0).all(axis=2), g_n[:, :, r] * inner, 0)
            starts.append(flat_lo)
            ends.append(flat_lo + n)
        a = np.stack(starts)  # (ranges, K, cores)
        b = np.stack(ends)
        r_lo, r_n = range_boxes(a.reshape(-1), b.reshape(-1), d_shape)
        kk = r_lo.shape[0]
        # (kk, ranges * K * cores, nd) -> (kk * ranges, K, cores, nd) -> (K, kk * ranges, ...)
        r_lo = r_lo.reshape(kk * len(starts), boxes.count, cores, len(d_shape))
        r_n = r_n.reshape(kk * len(starts), boxes.count, cores, len(d_shape))
        parts.append((r_lo.transpose(1, 0, 2, 3), r_n.transpose(1, 0, 2, 3)))
    # every group's boxes combine with every other's: (K, k_1, k_2, ..., cores, ndim)
    cat_lo: list[np.ndarray] = []
    cat_n: list[np.ndarray] = []
    sub = [p[0].shape[1] if p[0].ndim == 4 else 1 for p in parts]
    k0 = boxes.count
    for g, (p_lo, p_n) in enumerate(parts):
        if p_lo.ndim == 3:
            p_lo, p_n = p_lo[:, None], p_n[:, None]
        shape = [k0] + [1] * len(parts) + [cores, p_lo.shape[-1]]
        shape[1 + g] = p_lo.shape[1]
        full = [k0, *sub, cores, p_lo.shape[-1]]
        cat_lo.append(np.broadcast_to(p_lo.reshape(shape), full))
        cat_n.append(np.broadcast_to(p_n.reshape(shape), full))
    total = k0 * math.prod(sub)
    if total * cores > limit:
        return None
    lo2 = np.concatenate(cat_lo, axis=-1).reshape(total, cores, len(dst))
    n2 = np.concatenate(cat_n, axis=-1).reshape(total, cores, len(dst))
    empty = (n2 == 0).any(axis=-1, keepdims=True)
    lo2, n2 = np.where(empty, 0, lo2), np.where(empty, 0, n2)
    keep = ~empty[:, :, 0].all(axis=1)  # boxes empty on every core are dropped
    if not keep.any():
        keep[0] = True
    return BoxSet(lo2[keep], n2[keep])


def transposed(boxes: BoxSet, perm: Sequence[int]) -> BoxSet:
    """``boxes`` of the tensor ``src`` as boxes of ``src.transpose(perm)``."""
    idx = list(perm)
    return BoxSet(boxes.lo[:, :, idx], boxes.size[:, :, idx])


def local_counts(boxes: BoxSet, want_lo: np.ndarray, want_size: np.ndarray,
                 shape: Sequence[int] | np.ndarray) -> np.ndarray:
    """Per core, the elements of its wanted box (``want_lo`` (cores, ndim), one
    ``want_size``, clipped to ``shape``) that its own boxes hold."""
    extent = np.asarray(shape, dtype=np.int64)
    w_lo = np.clip(want_lo, 0, extent)
    w_hi = np.clip(want_lo + want_size, 0, extent)
    return overlap(boxes.lo.copy(), boxes.size.copy(), w_lo, w_hi)


def overlap(lo: np.ndarray, size: np.ndarray, w_lo: np.ndarray, w_hi: np.ndarray
            ) -> np.ndarray:
    """Per core, the elements its boxes (``lo``, ``size``: (K, cores, ndim), overwritten)
    share with its wanted box ``[w_lo, w_hi)`` (cores, ndim), within the tensor. In place: a
    wafer's cores make these the planner's largest arrays."""
    hi = size
    hi += lo
    np.minimum(hi, w_hi, out=hi)
    np.maximum(lo, w_lo, out=lo)
    hi -= lo
    np.maximum(hi, 0, out=hi)
    return last_product(hi).sum(axis=0)
