"""Lower bounds a plan is judged against: the compute roofline and the ideal.

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

A plan's quality is its emulated latency as a fraction of each: ``bound / latency``, so 1.0 is
the bound reached.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from t10c.chips import Chip
from t10c.dtypes import dtype_bytes, on_chip_dtype
from t10c.ir import Graph

from .plan import OpPlan


@dataclass(frozen=True)
class Bounds:
    """The two lower bounds of one graph on one chip, in cycles."""

    roofline_cycles: int
    ideal_cycles: int
    #: chips with DRAM: the bytes that must stream every run at the chip's whole DRAM
    #: bandwidth (`dram_roofline_cycles`); 0 without DRAM
    dram_roofline_cycles: int = 0

    def fractions(self, cycles: int) -> tuple[float, float]:
        """(roofline, ideal) as fractions of a latency of ``cycles``: 1.0 reaches the bound."""
        if cycles <= 0:
            return math.nan, math.nan
        return self.roofline_cycles / cycles, self.ideal_cycles / cycles

    def as_dict(self) -> dict[str, int]:
        doc = {"roofline_cycles": self.roofline_cycles, "ideal_cycles": self.ideal_cycles}
        if self.dram_roofline_cycles:
            doc["dram_roofline_cycles"] = self.dram_roofline_cycles
        return doc


def roofline_cycles(graph: Graph, chip: Chip, dtype: str) -> int:
    """The graph's FLOPs at the chip's peak matrix rate (whole cycles, rounded up)."""
    flops_per_cycle = chip.peak_flops(dtype) / chip.clock_hz
    return math.ceil(graph.flops() / flops_per_cycle)


def ideal_cycles(fronts: Sequence[Sequence[OpPlan]],
                 dram: Sequence[int] | None = None) -> int:
    """Every op at its fastest searched plan, or at its DRAM time (``dram[i]``) if that is
    longer; memory limits and re-layouts ignored."""
    per_op = [min(p.cycles.total for p in front) if front else 0 for front in fronts]
    if dram is not None:
        per_op = [max(c, d) for c, d in zip(per_op, dram)]
    return sum(per_op)


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
    """Both bounds of ``graph`` on ``chip``; ``fronts`` are the ops' searched plans."""
    if not chip.has_dram:
        return Bounds(roofline_cycles(graph, chip, dtype), ideal_cycles(fronts))
    roof = dram_roofline_cycles(graph, chip, dtype)
    ideal = ideal_cycles(fronts, dram_ideal_cycles(graph, chip, dtype))
    return Bounds(roofline_cycles(graph, chip, dtype), max(ideal, roof), roof)
