"""Copy patterns: what an exchange (or an indexed load) copies, without an element table.

A per-element table says, for every core (row) and every element e of its destination buffer,
where the element comes from: ``(core[r, e], off[r, e])``, core -1 for padding (zero). Tables
of real programs are highly regular: many rows are equal (replicated operands: every core of a
replica group receives the same elements), and each row is a few long runs of consecutive
source elements on one source core (a tile cut across its producer's tiles), or of elements
at a fixed stride (a transposed read). A `Pattern`
stores exactly that:

- ``pat[r]``: the distinct row pattern of table row r;
- ``runs[start[u]:start[u + 1]]``: pattern u as runs ``(src_core, src_off, length, step)``,
  in destination order and covering the destination buffer exactly (the destination offset of
  a run is the sum of the lengths before it): element i of a run is source element
  ``src_off + i * step`` of core ``src_core`` (step 1: a block of a tile; a larger step: a
  column read through a Transpose; 0: a broadcast); a run with core -1 is padding (offset and
  step 0).

The pattern of a table is unique (maximal runs, patterns numbered in order of first use), so
equal tables give equal patterns and byte-identical program files. Everything a consumer needs
is computed from the runs: the table itself (`expand`, for the reference executor and for
small programs' assembly), a gather index per distinct pattern (the functional emulator), and
the elements each core receives from each other core (`pair_counts`, the timing machine),
without expanding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from t10c.dtypes import ceil_div
from t10c.ir import ranges
from t10c.multicast import EXPANDED_ENTRIES, check_pairs


@dataclass(frozen=True)
class Pattern:
    """A per-element copy table in compressed form (see the module docstring)."""

    pat: np.ndarray  # int32 [rows]
    start: np.ndarray  # int64 [patterns + 1]
    runs: np.ndarray  # int32 [runs, 4]: source core (-1: zero), source offset, length, step

    @property
    def rows(self) -> int:
        return len(self.pat)

    @property
    def patterns(self) -> int:
        return len(self.start) - 1

    @property
    def size(self) -> int:
        """Integers stored (what the program files hold)."""
        return self.pat.size + self.start.size + self.runs.size


#: random odd weights for row fingerprints (fixed: programs are deterministic)
_WEIGHTS = np.random.default_rng(0x9A77).integers(1, 2 ** 62, size=1 << 16, dtype=np.int64) | 1


def _chunk_rows(e: int) -> int:
    """Rows of an (n, e) table that `dedup_rows` weighs and compares at a time: about 1 M
    elements, so that its temporaries stay small beside the table (bert-large's largest
    exchange table is 8 M elements)."""
    return max(1, (1 << 20) // e)


def dedup_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse): the distinct rows of ``table`` (n, e) in order of first appearance,
    as indices of their first row, and each row's number among them.

    Rows are told apart by a random-weighted sum (one integer each, so that only n numbers
    are sorted, not n rows), and rows with equal sums are checked to be equal; should two
    different rows ever share a sum, the rows themselves are compared instead."""
    n = len(table)
    if n <= 1 or table.shape[1] == 0:
        return np.zeros(min(n, 1), dtype=np.int64), np.zeros(n, dtype=np.int64)
    e = table.shape[1]
    weights = np.resize(_WEIGHTS, e)
    key = np.empty(n, dtype=np.int64)
    step = _chunk_rows(e)
    chunks = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
    with np.errstate(over="ignore"):  # (a row's sum is the same, whatever the chunks)
        for lo, hi in chunks:
            key[lo:hi] = (table[lo:hi].astype(np.int64) * weights[None, :]).sum(axis=1)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not all((table[first[inverse[lo:hi]]] == table[lo:hi]).all() for lo, hi in chunks):
        # a collision: compare whole rows
        rows = np.ascontiguousarray(table).view(np.dtype((np.void, table.dtype.itemsize * e)))
        _, first, inverse = np.unique(rows.ravel(), return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    # renumber in order of first appearance (np.unique orders by key)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse]


def encode(core: np.ndarray, off: np.ndarray, pat: np.ndarray | None = None) -> Pattern:
    """The pattern of a table ``(core, off)`` (u, e) of distinct rows, row r of the table
    being pattern ``pat[r]`` (default: one table row each). Rows are deduplicated again, so
    that the result does not depend on how the caller found its distinct rows."""
    core = np.asarray(core)
    off = np.asarray(off)
    u, e = core.shape
    # (int32 where the tables are: codegen's are, and this is its largest temporary)
    both = np.empty((u, 2 * e), dtype=np.result_type(core.dtype, off.dtype, np.int32))
    both[:, :e] = core
    both[:, e:] = np.where(core >= 0, off, 0)
    first, inverse = dedup_rows(both)
    core, off = core[first], both[first, e:]
    pat = inverse if pat is None else inverse[np.asarray(pat, dtype=np.int64)]
    # canonical numbering: patterns in order of their first row, unused ones dropped
    used, at = np.unique(pat, return_index=True)
    order = used[np.argsort(at, kind="stable")]
    rank = np.full(len(first), -1, dtype=np.int64)
    rank[order] = np.arange(len(order))
    pat, core, off, first = rank[pat], core[order], off[order], first[order]
    u = len(first)
    # a run goes on while the core stays and the step between elements stays the step
    # before; a run's second element may take any step. Decided pairwise (not greedily), so a
    # change of step can leave a one-element run: at most twice the fewest runs
    brk = np.ones((u, e), dtype=bool)
    if e > 1:
        moved = core[:, 1:] != core[:, :-1]
        brk[:, 1:] = moved
        if e > 2:
            d = off[:, 1:] - off[:, :-1]
            brk[:, 2:] |= (d[:, 1:] != d[:, :-1]) & ~moved[:, :-1]
    r, c = np.nonzero(brk)
    flat = r.astype(np.int64) * e + c
    length = np.diff(np.append(flat, u * e))
    off_flat = off.reshape(-1)
    step = np.where(length > 1, off_flat[np.minimum(flat + 1, u * e - 1)] - off_flat[flat], 0)
    src = core.reshape(-1)[flat]
    first = off_flat[flat]
    # a step change leaves a one-element run at the junction: it starts the next run instead
    # when it lies one step before it (0 8 16 | 1 | 9 17 -> 0 8 16 | 1 9 17)
    join = np.zeros(len(flat), dtype=bool)
    join[:-1] = ((length[:-1] == 1) & (length[1:] > 1) & (r[1:] == r[:-1])
                 & (src[1:] == src[:-1]) & (first[1:] - first[:-1] == step[1:]))
    into = np.flatnonzero(join) + 1
    length[into - 1] += length[into]
    step[into - 1] = step[into]
    keep = np.ones(len(flat), dtype=bool)
    keep[into] = False
    r = r[keep]
    runs = np.stack([src[keep], first[keep], length[keep], step[keep]], axis=1)
    start = np.zeros(u + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=u), out=start[1:])
    return Pattern(pat.astype(np.int32), start, runs.astype(np.int32))


def spread_pattern(numel: int, rows: int, over: range) -> tuple[Pattern, int]:
    """(the pattern, its width) of an indexed load that spreads a tensor of ``numel`` elements
    over table rows ``over`` of ``rows``: row ``over.start + k`` holds elements ``k * chunk``
    to ``(k + 1) * chunk`` (``chunk = ceil(numel / len(over))``), padding past the end, and
    the other rows are padding. Exactly `encode`'s pattern of that table (source core 0,
    or -1), made in O(rows) instead of from a table of ``rows x chunk`` elements."""
    chunk = ceil_div(numel, len(over))
    full, tail = divmod(numel, chunk)  # rows of ``over`` full, elements in the partial row
    first = np.arange(full + (tail > 0), dtype=np.int64) * chunk
    length = np.full(len(first), chunk, dtype=np.int64)
    if tail:
        length[-1] = tail
    data = np.zeros((len(first), 4), dtype=np.int64)  # one run per row that holds data
    data[:, 1], data[:, 2] = first, length
    data[:, 3] = np.where(length > 1, 1, 0)  # a one-element run has step 0, as `encode`'s
    pad = np.array([[-1, 0, chunk, 0]], dtype=np.int64)
    row_of = np.full(rows, -1, dtype=np.int64)  # -1: the padding pattern
    row_of[over.start:over.start + len(first)] = np.arange(len(first))
    # patterns are numbered in order of their first row; the padding one may come first
    padded = bool((row_of < 0).any())
    pad_first = padded and row_of[0] < 0
    runs = [data[:-1]] if tail else [data]
    if tail:  # the partial row: its elements, then padding to the width
        runs.append(np.array([data[-1], [-1, 0, chunk - tail, 0]], dtype=np.int64))
    counts = [np.ones(len(first) - (tail > 0), dtype=np.int64)] + ([np.array([2])] if tail else [])
    if padded:
        runs.insert(0 if pad_first else len(runs), pad)
        counts.insert(0 if pad_first else len(counts), np.array([1]))
    number = np.arange(len(first)) + (1 if pad_first else 0)
    pat = np.where(row_of >= 0, number[np.maximum(row_of, 0)], 0 if pad_first else len(first))
    start = np.zeros(len(first) + padded + 1, dtype=np.int64)
    np.cumsum(np.concatenate(counts), out=start[1:])
    return Pattern(pat.astype(np.int32), start, np.concatenate(runs).astype(np.int32)), chunk


def from_table(core: np.ndarray, off: np.ndarray) -> Pattern:
    """The pattern of a full table (one row per core)."""
    return encode(core, off)


def width(p: Pattern) -> int:
    """The destination elements every row covers."""
    return int(p.runs[p.start[0]:p.start[1], 2].sum(dtype=np.int64)) if p.patterns else 0


def compact(p: Pattern, rows: int, width: int, per_element: int = 2) -> bool:
    """Whether the pattern is smaller than the table it stands for (``per_element`` integers
    an element: two for an exchange's cores and offsets, one for a load's indices); where it
    is not, the program keeps the table."""
    return p.size < per_element * rows * width


def unique_expand(p: Pattern, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(core, off), each (patterns, width): every distinct pattern's table."""
    core = np.repeat(p.runs[:, 0].astype(np.int64), p.runs[:, 2].astype(np.int64))
    return core.reshape(p.patterns, width), unique_offsets(p, width)


def unique_offsets(p: Pattern, width: int) -> np.ndarray:
    """`unique_expand`'s offsets alone, (patterns, width) int64, -1 for padding."""
    runs = p.runs.astype(np.int64)
    length, pad = runs[:, 2], runs[:, 0] < 0
    pos = ranges(0, length)  # each element's place in its run
    off = np.repeat(np.where(pad, -1, runs[:, 1]), length) \
        + np.repeat(np.where(pad, 0, runs[:, 3]), length) * pos
    return off.reshape(p.patterns, width)


def expand(p: Pattern, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The element table ``(core, off)`` (rows, width), int32, -1 for padding."""
    core, off = unique_expand(p, width)
    return core.astype(np.int32)[p.pat], off.astype(np.int32)[p.pat]


def expand_offsets(p: Pattern, width: int) -> np.ndarray:
    """`expand`'s offsets alone (a load's table of elements, whose cores say only where
    the padding is, as its offsets do)."""
    return unique_offsets(p, width).astype(np.int32)[p.pat]


def pair_counts(p: Pattern, here: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, elements) per distinct pair of cores: what row r (on core ``here[r]``)
    receives from each source core, padding left out, in O(runs + rows x sources)."""
    src, row, count = _row_pairs(p)
    return src, np.asarray(here, dtype=np.int64)[row], count


def chip_pair_counts(p: Pattern, here: np.ndarray, per_chip: int, chips: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src core, destination chip, distinct elements) of what the rows on each chip of a
    pod (core k on chip ``k // per_chip``) receive from cores on other chips, each source
    element counted once per destination chip: it crosses once and is fanned out there.
    Rows of one pattern on one chip read the same elements: each (pattern, chip) once."""
    chip_row = np.asarray(here, dtype=np.int64) // per_chip
    key = np.unique(p.pat.astype(np.int64) * chips + chip_row)
    pat_u, chip_u = key // chips, key % chips
    first = p.start[pat_u].astype(np.int64)
    lens = p.start[pat_u + 1].astype(np.int64) - first
    idx = ranges(first, lens)
    runs = p.runs[idx].astype(np.int64)
    dst = np.repeat(chip_u, lens)
    keep = (runs[:, 0] >= 0) & (runs[:, 0] // per_chip != dst)
    runs, dst = runs[keep], dst[keep]
    # intervals [lo, hi) of source offsets: a run of step 1 is one; a strided run one per
    # element; a broadcast (step 0) its one element
    block = (runs[:, 3] == 1) | (runs[:, 2] == 1)
    spread = runs[~block]
    n = np.where(spread[:, 3] == 0, 1, spread[:, 2])
    at = np.repeat(spread[:, 1], n) + ranges(0, n) * np.repeat(spread[:, 3], n)
    lo = np.concatenate([runs[block, 1], at])
    hi = np.concatenate([runs[block, 1] + runs[block, 2], at + 1])
    group = np.concatenate([dst[block] * (1 << 31) + runs[block, 0],
                            np.repeat(dst[~block] * (1 << 31) + spread[:, 0], n)])
    if not len(lo):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    order = np.lexsort((lo, group))
    lo, hi, group = lo[order], hi[order], group[order]
    # merge overlapping intervals within each (chip, source core) group: offsets shifted
    # apart by group so that one running maximum serves them all
    shift = (np.unique(group, return_inverse=True)[1].astype(np.int64)
             * (int(hi.max()) + 1))
    lo_s, hi_s = lo + shift, hi + shift
    reach = np.maximum.accumulate(hi_s)
    new = np.ones(len(lo), dtype=bool)
    new[1:] = lo_s[1:] >= reach[:-1]
    starts = np.flatnonzero(new)
    ends = np.maximum.reduceat(hi_s, starts)
    seg = ends - lo_s[starts]
    g_key, g_inv = np.unique(group[starts], return_inverse=True)
    count = np.bincount(g_inv.reshape(-1), weights=seg, minlength=len(g_key)).astype(np.int64)
    return g_key % (1 << 31), g_key // (1 << 31), count


def received(p: Pattern, here: np.ndarray) -> np.ndarray:
    """Elements row r (on core ``here[r]``) receives from other cores: padding and local
    copies left out. Its pattern's elements less those on its own core, looked up per row,
    never per (row, source core) pair (a wafer's broadcast has tens of millions)."""
    k_pat, k_src, total, _ = _pattern_sources(p)
    if not len(k_pat):  # padding only
        return np.zeros(p.rows, dtype=np.int64)
    pat = p.pat.astype(np.int64)
    here = np.asarray(here, dtype=np.int64)
    whole = np.bincount(k_pat, weights=total, minlength=p.patterns).astype(np.int64)
    base = int(max(k_src.max(), here.max(initial=0))) + 1
    keys = k_pat * base + k_src  # sorted, as `_pattern_sources` gives them
    want = pat * base + here
    at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    return whole[pat] - np.where(keys[at] == want, total[at], 0)


def tree_pairs(p: Pattern, here: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tree, src, dst, elements, group) per multicast tree and destination: the rows of one
    distinct pattern read the same elements of each of its source cores, so each (pattern,
    source core) is one tree to the cores of those rows (`t10c.multicast`), and the trees of
    a pattern are one group (`t10c.multicast.relayed`). Padding is left out; a destination
    that is its tree's source is kept (it receives nothing)."""
    return _tree_pairs(p, here, _pattern_sources(p))


def _tree_pairs(p: Pattern, here: np.ndarray, sources: _Sources
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    src, row, count, tree = _row_pairs(p, with_tree=True, sources=sources)
    return (tree, src, np.asarray(here, dtype=np.int64)[row], count,
            p.pat.astype(np.int64)[row])


def grouped_trees(p: Pattern, here: np.ndarray) -> tuple[int, tuple[np.ndarray, ...]]:
    """`tree_pairs`' exchange as its trees and their groups' destinations, not multiplied
    out: the (tree, destination) entries it would have, and (per tree its group, source core
    and elements; per row its group and core), `t10c.multicast.grouped_relay`'s arguments."""
    return _grouped_trees(p, here, _pattern_sources(p))


def _grouped_trees(p: Pattern, here: np.ndarray, sources: _Sources
                   ) -> tuple[int, tuple[np.ndarray, ...]]:
    k_pat, k_src, total, first = sources
    entries = int(np.diff(first)[p.pat.astype(np.int64)].sum())
    return entries, (k_pat, k_src, total, p.pat.astype(np.int64),
                     np.asarray(here, dtype=np.int64))


def multicast_trees(p: Pattern, here: np.ndarray
                    ) -> tuple[tuple[np.ndarray, ...] | None, tuple[np.ndarray, ...] | None]:
    """A multicast exchange by ``p`` as codegen and the emulator take it: (`tree_pairs`'
    arrays, None), or, where it would have more than `EXPANDED_ENTRIES` (tree, destination)
    entries, (None, `grouped_trees`' arrays), for it goes relayed from its groups, never
    spelt out (`t10c.multicast.grouped_relay`; the planner's rule too). The pattern's
    sources are counted once for either."""
    sources = _pattern_sources(p)
    entries, grouped = _grouped_trees(p, here, sources)
    if entries > EXPANDED_ENTRIES:
        return None, grouped
    return _tree_pairs(p, here, sources), None


#: per (pattern, source core): the pattern, the core, the elements; where each pattern's
#: pairs start (`_pattern_sources`)
_Sources = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _pattern_sources(p: Pattern) -> _Sources:
    """Per pattern and distinct source core of its runs (sorted by pattern, then core): the
    pattern, the core, the elements it takes; and where each pattern's pairs start."""
    runs = p.runs.astype(np.int64)
    owner = np.repeat(np.arange(p.patterns, dtype=np.int64), np.diff(p.start))
    keep = runs[:, 0] >= 0
    owner, src, length = owner[keep], runs[keep, 0], runs[keep, 2]
    base = int(src.max(initial=0)) + 1
    # per pattern and source core, the elements it takes (sorted by pattern, then core)
    key, inverse = np.unique(owner * base + src, return_inverse=True)
    total = np.bincount(inverse.reshape(-1), weights=length, minlength=len(key)).astype(np.int64)
    k_pat, k_src = key // base, key % base
    return k_pat, k_src, total, np.searchsorted(k_pat, np.arange(p.patterns + 1))


def _row_pairs(p: Pattern, with_tree: bool = False, sources: _Sources | None = None
               ) -> tuple[np.ndarray, ...]:
    """(source core, row, elements) per row and distinct source core of its pattern (and,
    ``with_tree``, the number of that (pattern, source core) pair); ``sources``: the
    pattern's `_pattern_sources`, if counted already."""
    _, k_src, total, first = sources if sources is not None else _pattern_sources(p)
    pat = p.pat.astype(np.int64)
    per = np.diff(first)[pat]  # pairs of each row
    check_pairs(int(per.sum()), p.rows)
    row = np.repeat(np.arange(p.rows, dtype=np.int64), per)
    idx = ranges(first[pat], per)  # the pairs of row r are its pattern's, in order
    if with_tree:
        return k_src.take(idx), row, total.take(idx), idx
    return k_src.take(idx), row, total.take(idx)


def check(p: Pattern, width: int, src_elems: int, cores: int) -> str | None:
    """What is wrong with ``p`` as a pattern of rows of ``width`` elements reading a buffer of
    ``src_elems`` elements on ``cores`` cores (None when it is sound)."""
    if p.pat.ndim != 1 or p.start.ndim != 1 or p.runs.ndim != 2 or p.runs.shape[1] != 4:
        return "its pattern arrays have the wrong shapes"
    # signed: an unsigned table's differences would wrap instead of going negative
    p = Pattern(p.pat.astype(np.int64), p.start.astype(np.int64), p.runs.astype(np.int64))
    if not len(p.start) or p.start[0] != 0 or (np.diff(p.start) < 0).any() \
            or p.start[-1] != len(p.runs):
        return "its pattern's run starts are not increasing from 0 to the number of runs"
    if len(p.pat) and (p.pat.min() < 0 or p.pat.max() >= p.patterns):
        return "a row names a pattern that does not exist"
    core, off, length, step = (p.runs[:, k].astype(np.int64) for k in range(4))
    if len(length) and length.min() <= 0:
        return "a run is empty"
    ends = np.concatenate([[0], np.cumsum(length)])
    sums = ends[p.start[1:]] - ends[p.start[:-1]]
    if p.patterns and (sums != width).any():
        return f"a pattern does not cover the {width} destination elements exactly"
    if len(core) and (core.min() < -1 or core.max() >= cores):
        bad = int(core.max()) if core.max() >= cores else int(core.min())
        return f"a run reads core {bad}, which does not exist"
    real = core >= 0
    if real.any() and np.abs(step[real]).max() > src_elems:  # also keeps the products small
        return f"a run steps further than the {src_elems} elements of its source"
    last = off + step * (length - 1)
    if real.any() and (np.minimum(off, last)[real].min() < 0
                       or np.maximum(off, last)[real].max() >= src_elems):
        return f"a run reads past the {src_elems} elements of its source"
    return None
