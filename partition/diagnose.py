"""Why a model does not fit, in numbers that agree with each other, and what would help.

Every figure is one the planner's memory constraint (C2 in `solve.py`) uses, so a diagnosis
never names a need below the usable SRAM: either the resident weights alone exceed it (their
least replicated layouts, summed), or the least peak over every choice of plans (a CP-SAT
solve of its own, `solve.least_peak`) is shown where it occurs: the op, its working buffers,
the resident weights and the live activations. Advice is given only when it changes something
(more than 1x the cores, more than one chip). Weights are counted once each, by their root
(a transposed view of a tied embedding is the embedding).
"""

from __future__ import annotations

import numpy as np

try:  # numpy >= 2
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]

from t10c.chips import Chip
from t10c.dtypes import ceil_div, fmt_bytes, on_chip_dtype
from t10c.ir import Graph

from .bounds import tensor_bytes
from .chosen import DoesNotFitError
from .plan import OpPlan
from .solve import SolverOptions, least_peak


def _exact(n: int) -> str:
    """A need or a capacity, rounded and exact: the two may differ by a few bytes only."""
    return f"{fmt_bytes(n)} ({n:,} bytes)"


def check_fit(graph: Graph, chip: Chip, fronts: list[list[OpPlan]],
              smallest: list[OpPlan | None]) -> None:
    """Raise `DoesNotFitError` naming the ops that have no plan within one core's SRAM."""
    empty = [(op, s) for op, f, s in zip(graph.ops, fronts, smallest) if not f]
    if empty:
        lines = []
        for op, s in empty[:10]:
            need = f"needs at least {fmt_bytes(s.hot_bytes_per_core)} per core" if s else \
                "has no legal plan"
            lines.append(f"  {op.name} ({op.source or op.kind}): {need}")
        raise DoesNotFitError(
            f"{len(empty)} op(s) cannot run within {fmt_bytes(chip.sram_bytes_per_core)} of "
            f"SRAM per core on {chip.name}:\n" + "\n".join(lines) +
            "\nUse a chip with more SRAM per core or more cores, or a smaller model.")


def weight_roots(graph: Graph) -> list[tuple[int, str]]:
    """(elements, name) of every distinct weight, largest first. A view counts as its root,
    and constants that are the same array in memory count once, under the first name: the
    frontend folds ``Transpose(wte)`` of a tied embedding into a transposed numpy view of
    ``wte``, not a copy. A table that no op reads (only a DMA gather, `dram.gather_by_dma`)
    is not among them."""
    read = graph.read_roots()
    seen: dict[tuple, str] = {}
    for t in graph.constants:
        root = graph.root(t)
        if root not in graph.tensors or root not in graph.constants or root not in read:
            continue
        data = np.asarray(graph.constants[root])
        seen.setdefault((byte_bounds(data), data.size, data.dtype.str), root)
    return sorted(((graph.tensors[r].numel, r) for r in set(seen.values())), reverse=True)


def diagnose(graph: Graph, chip: Chip, fronts: list[list[OpPlan]], least_cold: list[int],
             status: str, opts: SolverOptions, dtype: str) -> str:
    """Why nothing fits (``status`` "RESIDENT": the weights alone; "INFEASIBLE": proven by the
    solver), what dominates, and what would help."""
    if status not in ("INFEASIBLE", "MODEL_INVALID", "RESIDENT"):
        return (f"the solver found no plan within its limit of {opts.time_limit_s:g} "
                f"(deterministic seconds; status {status}) and the greedy found none either; "
                "raise --time-limit")
    sram = chip.sram_bytes_per_core
    cap = int(sram * (1 - opts.reserve_fraction))
    resident = sum(least_cold)
    usable = f"{_exact(cap)} of {fmt_bytes(sram)} per core are usable"
    working = 0  # bytes that stay on one core whatever the number of chips
    if status == "RESIDENT":
        need = resident
        lines = [f"the model does not fit on {chip.name}: its weights alone need "
                 f"{_exact(resident)} per core in their least replicated layouts, and "
                 f"{usable}."]
    else:
        peak = least_peak(graph, fronts, opts, write_back=chip.has_dram)
        if peak is None or peak.peak <= cap:  # pragma: no cover - the solver proved otherwise
            return (f"the model does not fit on {chip.name}: the solver proved that no choice "
                    f"of plans fits ({usable}), but found no smallest choice to show; raise "
                    "--time-limit for details")
        op = graph.ops[peak.at]
        if peak.proven:
            least = f"the least memory any choice of plans needs is {_exact(peak.peak)} per core"
        else:  # the limit stopped the search for the least peak: say what is known
            least = (f"the best choice of plans found needs {_exact(peak.peak)} per core (none "
                     f"needs less than {fmt_bytes(max(peak.bound, cap + 1))})")
        need, working = peak.peak, peak.working + peak.live
        resident = peak.resident
        lines = [f"the model does not fit on {chip.name}: {least}, at op {op.name} "
                 f"({op.source or op.kind}, step {peak.at + 1} of "
                 f"{len(graph.ops)}): {fmt_bytes(peak.resident)} of resident weights, "
                 f"{fmt_bytes(peak.working)} of its working buffers and {fmt_bytes(peak.live)} "
                 f"for {peak.live_tensors} live activation(s); {usable}."]
    weights = weight_roots(graph)
    total_weight_bytes = sum(tensor_bytes(graph, name, dtype) for _, name in weights)
    stored = " and ".join(sorted({on_chip_dtype(graph.tensors[name].dtype, dtype)
                                  for _, name in weights})) or dtype
    heavy = sorted(zip(least_cold, (op.name for op in graph.ops)), reverse=True)[:5]
    lines += [
        f"the weights alone are {total_weight_bytes / 1e6:.1f} MB in {stored}; the chip has "
        f"{chip.total_sram_bytes / 1e6:.1f} MB of SRAM in all.",
        "ops with the most resident bytes per core:"]
    lines += [f"  {name}: {fmt_bytes(b)}" for b, name in heavy]
    lines.append("largest weight tensors:")
    lines += [f"  {name}: {tensor_bytes(graph, name, dtype) / 1e6:.1f} MB"
              for _, name in weights[:5]]
    lines.append("What would help: " + "; ".join(_advice(need, resident, working, cap, opts,
                                                          dtype, chip)) + ".")
    return "\n".join(lines)


def _advice(need: int, resident: int, working: int, cap: int, opts: SolverOptions,
            dtype: str, chip: Chip | None = None) -> list[str]:
    """Only advice that changes something: ``need > cap`` here, so every factor is >= 2."""
    assert need > cap
    helps = []
    if dtype == "fp32":
        helps.append("--dtype fp16 (halves every byte)")
    helps.append(f"a chip with at least {fmt_bytes(need / (1 - opts.reserve_fraction))} of "
                 f"SRAM per core or about {ceil_div(need, cap)}x the cores")
    # splitting the layers over k chips divides the resident weights, not one op's working set
    if resident and working < cap:
        k = max(2, ceil_div(resident, cap - working))
        helps.append(f"splitting the layers over {k} chips")
    # on a DRAM chip the weights may stream already: what stays is activations and outputs
    if chip is not None and chip.has_dram:
        helps.append("a smaller --batch or --seq-len (graph outputs, such as a decode step's "
                     "new KV cache, stay in SRAM to the end: they are not written back to DRAM)")
    else:
        helps.append("a chip with off-chip memory for the weights (`t10c chips`: "
                     "wormhole-n150, blackhole-p150, elk-pod4, ipu-pod4)")
    return helps


__all__ = ["check_fit", "diagnose", "fmt_bytes", "weight_roots", "DoesNotFitError"]
