"""Lower bounds a plan is judged against: the compute roofline and the ideal.

- ``roofline_cycles``: the graph's FLOPs (`Graph.flops`, the one count every command uses) at
  the chip's peak matrix rate in the storage dtype, over all cores. No plan can beat it.
- ``ideal_cycles``: every op at the fastest plan the search found for it (one that fits a
  core's SRAM on its own), as if nothing else had to be resident and no tensor ever had to
  change layout between ops (the "Ideal" of the T10 and ELK papers).
  It prices what the per-op plan space can reach; the gap between it and a plan's latency is
  what memory pressure, re-layouts and barriers between ops cost.

A plan's quality is its emulated latency as a fraction of each: ``bound / latency``, so 1.0 is
the bound reached.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from t10c.chips import Chip
from t10c.ir import Graph

from .plan import OpPlan


@dataclass(frozen=True)
class Bounds:
    """The two lower bounds of one graph on one chip, in cycles."""

    roofline_cycles: int
    ideal_cycles: int

    def fractions(self, cycles: int) -> tuple[float, float]:
        """(roofline, ideal) as fractions of a latency of ``cycles``: 1.0 reaches the bound."""
        if cycles <= 0:
            return math.nan, math.nan
        return self.roofline_cycles / cycles, self.ideal_cycles / cycles

    def as_dict(self) -> dict[str, int]:
        return {"roofline_cycles": self.roofline_cycles, "ideal_cycles": self.ideal_cycles}


def roofline_cycles(graph: Graph, chip: Chip, dtype: str) -> int:
    """The graph's FLOPs at the chip's peak matrix rate (whole cycles, rounded up)."""
    flops_per_cycle = chip.peak_flops(dtype) / chip.clock_hz
    return math.ceil(graph.flops() / flops_per_cycle)


def ideal_cycles(fronts: Sequence[Sequence[OpPlan]]) -> int:
    """Every op at its fastest searched plan; memory limits and re-layouts ignored."""
    return sum(min(p.cycles.total for p in front) for front in fronts if front)


def bounds(graph: Graph, chip: Chip, dtype: str, fronts: Sequence[Sequence[OpPlan]]) -> Bounds:
    """Both bounds of ``graph`` on ``chip``; ``fronts`` are the ops' searched plans."""
    return Bounds(roofline_cycles(graph, chip, dtype), ideal_cycles(fronts))
