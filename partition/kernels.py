"""Compiled kernels of the re-layout pricing: per-core and per-element loops over a chip's
cores and a tensor's elements, compiled with numba.

Each was a chain of whole-array numpy passes over a wafer's 750,000 cores or a tensor's
elements, with a temporary per pass and, for the element-wise counts, a wafer-sized
`np.bincount` and gather per producer layout (bert-large on wse2, one process: the counts
3.0 s, the wanted elements 1.5 s, the result owners' chunks 1.7 s of 60 s). Here each is one
pass. They compute what the numpy passes did, integer for integer (`tests/test_relayout.py`
checks each against its definition in numpy).

numba compiles a kernel at its first call and keeps the machine code in ``__pycache__``
beside this file (``cache=True``). The pricing imports this module only for chips of
`plan.KERNEL_CORES` cores or more.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def as_int64(a: object) -> np.ndarray:
    """``a`` as a contiguous int64 array, as the kernels take their integer arrays (one
    compiled version of each)."""
    return np.ascontiguousarray(a, dtype=np.int64)


@njit(cache=True, nogil=True)
def wanted_elements(origin: np.ndarray, shape: np.ndarray, extent: np.ndarray) -> np.ndarray:
    """Each core's box of ``shape`` at ``origin[core]`` (int64, (cores, ndim)) cut to a
    tensor of ``extent``: the elements in it."""
    out = np.empty(origin.shape[0], dtype=np.int64)
    for c in range(origin.shape[0]):
        n = 1
        for d in range(origin.shape[1]):
            lo = max(origin[c, d], 0)
            hi = min(origin[c, d] + shape[d], extent[d])
            n *= max(hi - lo, 0)
        out[c] = n
    return out


@njit(cache=True, nogil=True)
def local_counts(owner: np.ndarray, coords: np.ndarray, consumer: np.ndarray,
                 origin: np.ndarray, shape: np.ndarray, ncores: int) -> np.ndarray:
    """Per consumer core, the elements of its box it already holds: element e (multi-index
    ``coords[:, e]``) is local where its owner, physical core ``owner[e]`` (-1: none), runs
    consumer core ``consumer[owner[e] + 1]`` (-1: none) whose box of ``shape`` at
    ``origin[that core]`` holds it."""
    out = np.zeros(ncores, dtype=np.int64)
    for e in range(owner.shape[0]):
        c = consumer[owner[e] + 1]
        if c < 0:
            continue
        inside = True
        for d in range(coords.shape[0]):
            at = coords[d, e] - origin[c, d]
            if at < 0 or at >= shape[d]:
                inside = False
                break
        if inside:
            out[c] += 1
    return out


@njit(cache=True, nogil=True)
def chunk_owner(origin: np.ndarray, tile: np.ndarray, extent: np.ndarray, pos: np.ndarray,
                chunk: int, phys: np.ndarray, numel: int) -> np.ndarray:
    """(numel,) int32: the physical core ``phys[c]`` holding each element of a tensor of
    ``extent`` (-1: none), where core c keeps elements ``[pos[c] x chunk, (pos[c] + 1) x
    chunk)`` of its ``tile`` at ``origin[c]`` in row-major order (the whole tile: ``pos``
    0 and ``chunk`` the tile's size). Padding past the tile or the tensor is held by none;
    an element two cores keep is the later core's."""
    owner = np.full(numel, -1, dtype=np.int32)
    ndim = tile.shape[0]
    elems = 1
    for d in range(ndim):
        elems *= tile[d]
    for c in range(origin.shape[0]):
        first = pos[c] * chunk
        for local in range(first, min(first + chunk, elems)):
            flat, stride, rest, inside = 0, 1, local, True
            for d in range(ndim - 1, -1, -1):
                coord = origin[c, d] + rest % tile[d]
                rest //= tile[d]
                if coord < 0 or coord >= extent[d]:
                    inside = False
                    break
                flat += coord * stride
                stride *= extent[d]
            if inside:
                owner[flat] = phys[c]
    return owner


@njit(cache=True, nogil=True)
def most_remote_boxes(have_origin: np.ndarray, have_shape: np.ndarray,
                      want_origin: np.ndarray, want_shape: np.ndarray,
                      extent: np.ndarray) -> int:
    """The most elements any core must receive to go from holding the box of ``have_shape``
    at ``have_origin[core]`` to the box of ``want_shape`` at ``want_origin[core]``, both cut
    to a tensor of ``extent`` (int64; cores past the holders' hold nothing)."""
    held = min(have_origin.shape[0], want_origin.shape[0])
    most = 0
    for c in range(want_origin.shape[0]):
        wanted = 1
        local = 1 if c < held else 0
        for d in range(want_origin.shape[1]):
            w_lo, w_hi = want_origin[c, d], want_origin[c, d] + want_shape[d]
            wanted *= max(min(w_hi, extent[d]) - max(w_lo, 0), 0)
            if c < held:
                lo = max(have_origin[c, d], w_lo)
                hi = max(min(have_origin[c, d] + have_shape[d], w_hi), lo)
                local *= max(min(hi, extent[d]) - max(lo, 0), 0)
        most = max(most, wanted - local)
    return most


def load() -> None:
    """Load every kernel here now (numba's cached machine code, or compiled at the first
    run), each through a call on one core, with the argument types the pricing passes (the
    contiguous int64 of `as_int64`, int32 owners and coordinates). A process about to fork
    workers that price re-layouts calls it first: the workers then inherit the kernels
    loaded, where each would otherwise import numba and load them itself."""
    box, one = np.zeros((1, 1), dtype=np.int64), np.ones(1, dtype=np.int64)
    wanted_elements(box, one, one)
    local_counts(np.zeros(1, dtype=np.int32), np.zeros((1, 1), dtype=np.int32),
                 np.full(2, -1, dtype=np.int64), box, one, 1)
    chunk_owner(box, one, one, one - 1, 1, one - 1, 1)
    most_remote_boxes(box, one, box, one, one)
