"""Lower bounds a plan is judged against: the compute roofline, the ideal and, on the IPU,
the exchange bound.

- ``roofline_cycles``: the graph's FLOPs (`Graph.flops`, the one count every command uses) at
  the chip's peak matrix rate in the storage dtype, over all cores. No plan can beat it.
- ``ideal_cycles``: every op at the fastest plan the search found for it (one that fits a
  core's SRAM on its own), as if nothing else had to be resident and no tensor ever had to
  change layout between ops (the "Ideal" of the T10 and ELK papers).
  It prices what the per-op plan space can reach; the gap between it and a plan's latency is
  what memory pressure, re-layouts and barriers between ops cost.

On a chip with DRAM (after ELK's Ideal), an op's ideal is the larger of its fastest plan and
its graph inputs' DRAM bytes (they live in DRAM: a decode step's KV cache) at the chip's whole
DRAM bandwidth; and the graph's ideal is at least the DRAM roofline
(``dram_roofline_cycles``): the bytes that must stream every run, the inputs and the weights
beyond what all of SRAM could hold, at that bandwidth. (ELK's Ideal charges every op for all
of its weights; a plan that keeps some resident, as on llama-tiny-decode, would beat that.)

- ``exchange_cycles`` (chips whose exchange and compute alternate: all-to-all, no DRAM; 0
  elsewhere): the ideal, with the bytes no plan of a weight contraction can avoid receiving
  and the SRAM its resident weights need (`exchange_cycles` gives the argument). It says how
  far the ideal is out of reach when memory and exchanges are counted; the gap between it
  and a plan's latency is what the plan could still gain.

A plan's quality is its emulated latency as a fraction of each: ``bound / latency``, so 1.0 is
the bound reached.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import IntTensors, ceil_div, dtype_bytes, on_chip_dtype
from t10c.ir import INDIRECT, Graph, TensorExpr, is_contraction

from .cost import element_bytes
from .plan import OpPlan, operand_shapes
from .vcost import Template, costs_for


@dataclass(frozen=True)
class Bounds:
    """The two lower bounds of one graph on one chip, in cycles."""

    roofline_cycles: int
    ideal_cycles: int
    #: chips with DRAM: the bytes that must stream every run at the chip's whole DRAM
    #: bandwidth (`dram_roofline_cycles`); 0 without DRAM
    dram_roofline_cycles: int = 0
    #: the ideal with weight contractions' unavoidable exchanges and resident weights
    #: (`exchange_cycles`); 0 where it is not computed
    exchange_cycles: int = 0

    def fractions(self, cycles: int) -> tuple[float, float]:
        """(roofline, ideal) as fractions of a latency of ``cycles``: 1.0 reaches the bound."""
        if cycles <= 0:
            return math.nan, math.nan
        return self.roofline_cycles / cycles, self.ideal_cycles / cycles

    def of_exchange(self, cycles: int) -> float:
        """The exchange bound as a fraction of a latency of ``cycles`` (NaN where there is
        none)."""
        if cycles <= 0 or not self.exchange_cycles:
            return math.nan
        return self.exchange_cycles / cycles

    def as_dict(self) -> dict[str, int]:
        doc = {"roofline_cycles": self.roofline_cycles, "ideal_cycles": self.ideal_cycles}
        if self.dram_roofline_cycles:
            doc["dram_roofline_cycles"] = self.dram_roofline_cycles
        if self.exchange_cycles:
            doc["exchange_cycles"] = self.exchange_cycles
        return doc


def roofline_cycles(graph: Graph, chip: Chip, dtype: str) -> int:
    """The graph's FLOPs at the chip's peak matrix rate (whole cycles, rounded up)."""
    flops_per_cycle = chip.peak_flops(dtype) / chip.clock_hz
    return math.ceil(graph.flops() / flops_per_cycle)


def ideal_cycles(fronts: Sequence[Sequence[OpPlan]],
                 dram: Sequence[int] | None = None) -> int:
    """Every op at its fastest searched plan, or at its DRAM time (``dram[i]``) if that is
    longer; memory limits and re-layouts ignored."""
    per_op = op_ideals(fronts)
    if dram is not None:
        per_op = [max(c, d) for c, d in zip(per_op, dram)]
    return sum(per_op)


def op_ideals(fronts: Sequence[Sequence[OpPlan]]) -> list[int]:
    """Each op's fastest searched plan's cycles (0 for an op with no plan)."""
    return [min(p.cycles.total for p in front) if front else 0 for front in fronts]


def tensor_bytes(graph: Graph, name: str, dtype: str) -> int:
    """Bytes of a tensor on chip: floats in the storage dtype, integers in theirs
    (`on_chip_dtype`)."""
    t = graph.tensors[name]
    return t.numel * dtype_bytes(on_chip_dtype(t.dtype, dtype))


def dram_ideal_cycles(graph: Graph, chip: Chip, dtype: str) -> list[int]:
    """Per op: its graph inputs' bytes (each tensor once) over the chip's whole DRAM
    bandwidth; all zero on a chip without DRAM."""
    if not chip.has_dram:
        return [0] * len(graph.ops)
    rate = chip.dram_peak_bytes_per_cycle
    out = []
    for op in graph.ops:
        roots = {graph.root(o.tensor) for o in op.inputs}
        out.append(math.ceil(sum(tensor_bytes(graph, r, dtype) for r in roots
                                 if r in graph.inputs) / rate))
    return out


def dram_roofline_cycles(graph: Graph, chip: Chip, dtype: str) -> int:
    """The bytes that must come from DRAM every run (graph inputs, and the weights ops read
    beyond the chip's whole SRAM) over its whole DRAM bandwidth; 0 without DRAM. A table
    that only a DMA gather reads (`dram.gather_by_dma`) counts by its gathered rows, which
    are an input."""
    if not chip.has_dram:
        return 0
    read = graph.read_roots()
    weights = sum(tensor_bytes(graph, c, dtype) for c in graph.constants if c in read)
    inputs = sum(tensor_bytes(graph, t, dtype) for t in graph.inputs)
    must = inputs + max(weights - chip.total_sram_bytes, 0)
    return math.ceil(must / chip.dram_peak_bytes_per_cycle)


def bounds(graph: Graph, chip: Chip, dtype: str, fronts: Sequence[Sequence[OpPlan]]) -> Bounds:
    """The bounds of ``graph`` on ``chip``; ``fronts`` are the ops' searched plans."""
    if not chip.has_dram:
        return Bounds(roofline_cycles(graph, chip, dtype), ideal_cycles(fronts),
                      exchange_cycles=exchange_cycles(graph, chip, dtype, fronts))
    roof = dram_roofline_cycles(graph, chip, dtype)
    ideal = ideal_cycles(fronts, dram_ideal_cycles(graph, chip, dtype))
    return Bounds(roofline_cycles(graph, chip, dtype), max(ideal, roof), roof)


#: multipliers tried for the weights' SRAM (cycles per byte, `exchange_cycles`): any one gives
#: a lower bound, the best of them is kept; a byte of SRAM is never worth more than the cycles
#: its receipt would take (1 / link rate), so the grid spans up to that
_MULTIPLIERS = 96


@dataclass(frozen=True)
class _Cuts:
    """Every cut ``F`` of one weight contraction (one row each), as `exchange_cycles` prices
    it: with its weight held once, the least cycles (``base``), each further copy's saving
    (``per_copy``, cycles) and SRAM (``copy_bytes``, per core), and the most copies worth
    holding (``copies``, one per core that needs the weight)."""

    base: np.ndarray
    per_copy: float
    copy_bytes: float
    copies: np.ndarray


def _cut_grid(extents: Sequence[int], cores: int) -> np.ndarray:
    """Every cut of axes of ``extents`` over at most ``cores`` cores, one per distinct block
    shape (the fewest cores giving it: more only idle), as an (n, axes) array."""
    per_axis = []
    for e in extents:
        blocks = np.unique(ceil_div(e, np.arange(1, min(e, cores) + 1)))
        per_axis.append(np.unique(ceil_div(e, blocks)))
    grid = np.stack([g.ravel() for g in np.meshgrid(*per_axis, indexing="ij")], axis=1)
    return grid[grid.prod(axis=1) <= cores]


def _weight_slot(graph: Graph, op: TensorExpr, consts: frozenset[str],
                 readers: Counter[str]) -> int | None:
    """The input slot of ``op``'s weight, where ``op`` is a contraction of one activation by
    one weight that no other op reads, every operand indexed by plain axes; else None."""
    if not is_contraction(op) or len(op.inputs) != 2:
        return None
    names = set(op.axis_names)
    if any(not (isinstance(d, str) and d != INDIRECT and d in names)
           for o in op.operands for d in o.axes):
        return None
    weights = [i for i, o in enumerate(op.inputs) if o.tensor in consts]
    if len(weights) != 1 or readers[graph.root(op.inputs[weights[0]].tensor)] != 1:
        return None
    return weights[0]


def _cuts(graph: Graph, op: TensorExpr, slot: int, chip: Chip, dtype: str, ints: IntTensors,
          consts: frozenset[str], share: float) -> _Cuts:
    """`_Cuts` of ``op`` (its weight in input ``slot``); ``share``: the part of its
    activation's copies charged to it (the activation's other weight readers take the rest;
    0 for an activation the host loads)."""
    axes = op.axis_names
    extents = [e for _, e in op.axes]
    F = _cut_grid(extents, chip.cores)
    nops = len(op.operands)
    # one step per core (rotation only divides a core's blocks over more steps, each with
    # its own overhead and padding): the least compute of each cut
    none = Template((1,) * len(axes), ((),) * nops, (1,) * nops)
    compute = costs_for(op, none, F, chip, dtype, operand_shapes(graph, op), ints,
                        consts).compute.astype(np.float64)
    blocks = ceil_div(np.asarray(extents), ceil_div(np.asarray(extents), F))  # non-empty

    def needing(operand: int) -> np.ndarray:  # cores that need each element of an operand
        have = set(op.operands[operand].axis_set)
        return np.prod(blocks[:, [j for j, a in enumerate(axes) if a not in have]], axis=1)

    def total_bytes(operand: int) -> int:
        o = op.operands[operand]
        return math.prod(op.extents[a] for a in o.axis_set) * element_bytes(op, operand, dtype,
                                                                         ints)

    act, out = 1 - slot, nops - 1
    weight = total_bytes(slot)
    group = needing(out)  # the blocks along reduced axes: partial sums of each element
    arriving = (share * (needing(act) - 1) * total_bytes(act)
                + (group - 1) * total_bytes(out) + (needing(slot) - 1) * weight)
    rate = chip.link_bytes_per_cycle * chip.cores
    base = compute + arriving / rate
    return _Cuts(base, weight / rate, weight / chip.cores, needing(slot).astype(np.float64))


def _least(cuts: _Cuts, ideal: int, multiplier: float) -> float:
    """The least over cuts and copies r (1 <= r <= copies, relaxed to real numbers) of
    ``max(base - per_copy (r - 1), ideal) + multiplier * copy_bytes * r``: convex in r, so at
    r = 1, at the most copies, or where the first term meets ``ideal``."""
    line = cuts.base + cuts.per_copy  # the first term's line at r = 0
    meet = np.clip((line - ideal) / cuts.per_copy if cuts.per_copy else 1.0, 1.0, cuts.copies)
    best = np.full(len(line), np.inf)
    for r in (np.ones_like(cuts.copies), cuts.copies, meet):
        best = np.minimum(best, np.maximum(line - cuts.per_copy * r, ideal)
                          + multiplier * cuts.copy_bytes * r)
    return float(best.min())


def exchange_cycles(graph: Graph, chip: Chip, dtype: str,
                    fronts: Sequence[Sequence[OpPlan]]) -> int:
    """A lower bound on the latency of every plan whose ops' own phases are priced as the
    search prices them, counting what the ideal leaves out for weight contractions: the bytes
    their cores must receive and the SRAM their resident weights take. 0 on a chip where it
    does not hold as argued here: a mesh (routes), a chip that overlaps transfers with compute
    or has DRAM.

    On such a chip compute and exchange phases alternate, and an exchange phase takes at
    least the bytes its busiest core receives over the link rate (`Chip.transfer_cycles`):
    the phases take at least all the bytes received over (cores x rate). Take a contraction
    of an activation by a weight that no other op reads, cut by ``F`` (`_cut_grid`; one
    step per core gives each cut its least compute, `costs_for`). An element of an operand
    is needed by the cores of every block along the axes it lacks (``L`` of them):

    - each activation element is held once before the op (an op writes each element of its
      result on one core), so ``L - 1`` copies of the activation must arrive (of a graph
      input, none: the host may load it anywhere); an activation that several weight
      contractions read has those copies charged to them in equal shares (what arrives for
      one may serve another, so together they need at least the largest);
    - the weight held ``r`` times resident (``1 <= r <= L``) takes ``r`` x its bytes / cores
      of every core's SRAM at least, and ``L - r`` copies of it must arrive each run;
    - where ``G`` blocks cut the reduced axes, ``G - 1`` partial sums (fp32) of every output
      element must arrive (whether a reduction gathers them or the output rotates through
      them; rotating, it adds them in its products, so the additions are not counted).

    So the op takes at least its cut's compute plus those bytes over (cores x rate), and at
    least its ideal (its fastest searched plan); every other op its ideal. The copies
    resident must fit one core's SRAM beside the other weights, each held once at least (on
    average over the cores; the rest of what is resident is left out, which only lowers the
    bound). The least sum under that cap is bounded below by its Lagrangian relaxation: for
    any multiplier ``m >= 0``, the sum over ops of each one's least ``cost + m x SRAM it
    takes``, less ``m x SRAM``. The best of a fixed grid of multipliers is taken (no search,
    so the bound is the same on every run)."""
    if chip.is_mesh or chip.overlap or chip.has_dram or chip.cores == 1:
        return 0
    from .space import tensor_sets  # (space imports the search, which is heavier than this)

    ints, consts = tensor_sets(graph)
    readers = Counter(graph.root(o.tensor) for op in graph.ops for o in op.reads)
    ideal = op_ideals(fronts)
    slots = [_weight_slot(graph, op, consts, readers) for op in graph.ops]
    sharing = Counter(graph.root(op.inputs[1 - s].tensor)
                      for op, s in zip(graph.ops, slots) if s is not None)
    fixed = 0
    groups: Counter[tuple] = Counter()
    cuts: dict[tuple, _Cuts] = {}
    for i, (op, s) in enumerate(zip(graph.ops, slots)):
        if s is None:
            fixed += ideal[i]
            continue
        act = graph.root(op.inputs[1 - s].tensor)
        share = 0.0 if act in graph.inputs or act in graph.constants else 1 / sharing[act]
        key = (op.signature(), s, share, tuple(ints.get(o.tensor) for o in op.reads))
        if key not in cuts:
            cuts[key] = _cuts(graph, op, s, chip, dtype, ints, consts, share)
        groups[(key, ideal[i])] += 1
    if not groups:  # every op at its ideal
        return fixed
    # every other weight is resident somewhere too (no DRAM): at least its bytes over the
    # cores, on average, of every core's SRAM
    weights = {graph.root(op.inputs[s].tensor) for op, s in zip(graph.ops, slots)
               if s is not None}
    others = sum(tensor_bytes(graph, c, dtype) for c in graph.read_roots()
                 if c in graph.constants and c not in weights)
    sram = chip.sram_bytes_per_core - others / chip.cores
    top = 1.0 / chip.link_bytes_per_cycle
    best = 0.0
    for m in [0.0, *np.geomspace(top * 1e-6, top, _MULTIPLIERS - 1)]:
        total = sum(n * _least(cuts[key], ideal_i, float(m))
                    for (key, ideal_i), n in groups.items()) - m * sram
        best = max(best, total)
    return fixed + math.floor(best)
