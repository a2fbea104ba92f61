"""What an exchange's bytes cost on a pod: the bytes that cross from one chip to another.

A pod (`Chip.chips` > 1) is planned as one all-to-all machine; chip k holds cores
``[k * cores_per_chip, (k + 1) * cores_per_chip)``. An exchange phase costs the larger of the
per-core bound and the busiest chip's bytes over its inter-chip links, in or out
(`Chip.exchange_cycles`); the emulator counts those bytes from the program's transfers, the
planner from the plan's geometry with the functions here:

- a ring shift (`ring_cross`): exact, from each core's ring source;
- a reduce-scatter (`group_cross`): exact for groups of cores that share the output block
  (every member gathers its chunk from every other member);
- a re-layout after the solve (`transitions.relayout_cycles`): exact, element by element
  (`element_cross`): each element a chip's cores want from a core on another chip crosses
  to it once and is fanned out there over the chip's own exchange, as the emulator counts;
- an exchange whose sources the plan does not fix (a re-layout priced for the solver, a
  weight fetched from its idle layout): `spread_cross`, the estimate that the sources are
  spread evenly over the pod, so that ``(chips - 1) / chips`` of each core's bytes cross;
  for a re-layout, at most that share of the distinct elements a chip's cores want
  (`chip_wanted`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import ceil_div


def ring_cross(chip: Chip, phys: np.ndarray, src: np.ndarray) -> np.ndarray:
    """(chips,): per chip, how many of its cores receive from a core on another chip when
    logical core c (on physical core ``phys[c]``) receives from logical core ``src[c]``; on a
    ring each such chip is left by as many, so this is its bytes in and out per byte moved."""
    dst_chip = chip.chip_of(phys)
    far = chip.chip_of(phys[src]) != dst_chip
    return np.bincount(dst_chip[far], minlength=chip.chips).astype(np.int64)


def ring_cross_row(chip: Chip, F: tuple[int, ...], k: int, t: int) -> tuple[int, ...]:
    """`ring_cross` of a plan on cores 0 .. prod(F) - 1 whose ring of ``t`` cores runs along
    axis ``k`` of the core grid ``F`` (`Geometry.ring_source`'s rule), as a tuple."""
    return _ring_row(chip.chips, chip.cores_per_chip, F, k, t)


@lru_cache(maxsize=8192)
def _ring_row(chips: int, per_chip: int, F: tuple[int, ...], k: int, t: int
              ) -> tuple[int, ...]:
    ncores = int(np.prod(F))
    if k < 0 or t <= 1:  # no ring
        return (0,) * chips
    c = np.arange(ncores, dtype=np.int64)
    stride = int(np.prod(F[k + 1:]))
    coord = (c // stride) % F[k]
    pos = coord % t
    src = c + ((pos + 1) % t - pos) * stride
    far = src // per_chip != c // per_chip
    return tuple(int(x) for x in np.bincount(c[far] // per_chip, minlength=chips))


def group_cross(chip: Chip, phys: np.ndarray, key: np.ndarray) -> np.ndarray:
    """(chips,): per chip, how many (member, other member) pairs of a reduce-scatter have the
    other member on another chip, where logical cores with equal ``key`` form a group and
    every member gathers one chunk from every other member."""
    return _group_far(chip.chip_of(phys), key, chip.chips)


def _group_far(on: np.ndarray, key: np.ndarray, chips: int) -> np.ndarray:
    """(chips,): the pairs of `group_cross`, cores on chips ``on`` in groups ``key``."""
    groups = int(key.max(initial=-1)) + 1
    size = np.bincount(key, minlength=groups)
    same = np.bincount(key * chips + on, minlength=groups * chips)
    far = size[key] - same[key * chips + on]
    return np.bincount(on, weights=far, minlength=chips).astype(np.int64)


def group_cross_row(chip: Chip, F: tuple[int, ...], reduction: tuple[int, ...],
                    ring: tuple[int, int] | None = None) -> tuple[int, ...]:
    """`group_cross` of a plan on cores 0 .. prod(F) - 1 whose groups are the cores that
    differ only along the ``reduction`` axes of the core grid ``F`` and, for an output that
    rotates on a ring of ``t`` cores along axis ``k`` (``ring`` = (k, t)), hold the same
    partition of it after the last step (the same coordinate ``k`` modulo ``t``)."""
    return _group_row(chip.chips, chip.cores_per_chip, F, reduction, ring)


def group_keys(F: tuple[int, ...], reduction: tuple[int, ...],
               ring: tuple[int, int] | None = None) -> np.ndarray:
    """(prod(F),): the reduce-scatter group of every logical core (`group_cross_row`)."""
    ncores = int(np.prod(F))
    coords = np.stack(np.unravel_index(np.arange(ncores), F), axis=1)
    keep = [j for j in range(len(F)) if j not in reduction]
    key = (np.ravel_multi_index(tuple(coords[:, keep].T), tuple(F[j] for j in keep))
           if keep else np.zeros(ncores, dtype=np.int64)).astype(np.int64)
    if ring is not None:
        k, t = ring
        key = key * t + coords[:, k] % t
    return key


@lru_cache(maxsize=8192)
def _group_row(chips: int, per_chip: int, F: tuple[int, ...], reduction: tuple[int, ...],
               ring: tuple[int, int] | None) -> tuple[int, ...]:
    c = np.arange(int(np.prod(F)), dtype=np.int64)
    return tuple(int(x) for x in _group_far(c // per_chip, group_keys(F, reduction, ring),
                                            chips))


def spread_cross(chip: Chip, ncores: int, bytes_per_core: int, wanted: int | None = None
                 ) -> int:
    """The busiest chip's inter-chip bytes when each of cores 0 .. ncores - 1 receives
    ``bytes_per_core`` from sources spread evenly over the pod (an estimate); at most
    those of ``wanted`` bytes, the most distinct bytes a chip's cores want (`chip_wanted`):
    an element crosses to a chip once and is fanned out there."""
    if not chip.is_pod or bytes_per_core <= 0:
        return 0
    cores = chip.busiest_chip_cores(ncores) * bytes_per_core
    return ceil_div(min(cores, cores if wanted is None else wanted) * (chip.chips - 1),
                    chip.chips)


def chip_wanted(chip: Chip, origin: np.ndarray, shape: np.ndarray, phys: np.ndarray,
                extent: np.ndarray) -> np.ndarray:
    """(chips,): the elements of a tensor of ``extent`` that the cores of each chip want
    when logical core c (on ``phys[c]``) wants the box of ``shape`` at ``origin[c]``, each
    distinct box of a chip once (replicas on one chip share what crosses to it)."""
    if not chip.is_pod or not len(origin):
        return np.zeros(max(chip.chips, 1), dtype=np.int64)
    boxes = np.unique(np.column_stack([chip.chip_of(np.asarray(phys, dtype=np.int64)),
                                       np.asarray(origin, dtype=np.int64)]), axis=0)
    lo = np.maximum(boxes[:, 1:], 0)
    hi = np.minimum(boxes[:, 1:] + np.asarray(shape, dtype=np.int64), extent)
    size = np.prod(np.maximum(hi - lo, 0), axis=1)
    return np.bincount(boxes[:, 0], weights=size, minlength=chip.chips).astype(np.int64)


def reduce_pairs(chip: Chip, F: tuple[int, ...], reduction: tuple[int, ...], group: int,
                 ring: tuple[int, int] | None = None, phys: np.ndarray | None = None) -> int:
    """The busiest chip's (member, other member) pairs across chips of a reduce-scatter of
    ``group`` members (`group_cross`, groups as `group_cross_row`) on cores 0 .. prod(F) - 1,
    or on ``phys``."""
    if group <= 1 or not reduction or not chip.is_pod:
        return 0
    if phys is None:
        return max(group_cross_row(chip, F, reduction, ring))
    return int(group_cross(chip, phys, group_keys(F, reduction, ring)).max())


def element_cross(chip: Chip, dst_chip: np.ndarray, elems: np.ndarray,
                  owner: np.ndarray | Callable[[np.ndarray], np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(in, out) per chip: the elements that cross between chips when chip ``dst_chip[k]``
    wants root element ``elems[k]`` (-1: none), each from its owning physical core
    (``owner[e]``, or ``owner(elements)`` for a spread that is not worth making whole; -1:
    no owner): each element once per chip that wants it, from another (fanned out on the
    chip), as the emulator counts an exchange's transfers (exact, for a re-layout priced
    element by element, where `spread_cross` estimates)."""
    ins = np.zeros(chip.chips, dtype=np.int64)
    outs = np.zeros(chip.chips, dtype=np.int64)
    keep = elems >= 0
    for k in range(chip.chips):
        want = elems[keep & (dst_chip == k)]
        if not len(want):
            continue
        if isinstance(owner, np.ndarray):  # distinct by a mark per element
            seen = np.zeros(len(owner), dtype=bool)
            seen[want] = True
            want = np.flatnonzero(seen)
            cores = owner[want]
        else:
            want = np.unique(want)
            cores = owner(want)
        src = chip.chip_of(cores[cores >= 0].astype(np.int64))
        far = src[src != k]
        ins[k] = len(far)
        outs += np.bincount(far, minlength=chip.chips)
    return ins, outs
