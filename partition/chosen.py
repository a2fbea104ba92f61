"""The partition stage's result: the chosen `Plan` of a whole graph and the solver's account.

Kept apart from `partition/__init__.py` (which builds plans) so that the verifier, codegen and
the file formats can use the type without importing the search and the solver: nothing here
imports another module of the stage except `plan.py` and `bounds.py`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .bounds import Bounds
from .plan import OpPlan


class PlanError(ValueError):
    """A plan that is illegal or does not fit."""


class DoesNotFitError(PlanError):
    """No choice of plans fits the chip's SRAM; the message says by how much and where."""


@dataclass(frozen=True)
class SolverReport:
    """How the whole-graph choice was made and how good it is known to be."""

    name: str  # the planner: "cp-sat" or "greedy"
    status: str  # CP-SAT's status (OPTIMAL: proven within ``gap``; FEASIBLE: limit reached)
    objective_cycles: int
    bound_cycles: int  # no choice of plans from the fronts is faster than this
    gap: float  # (objective - bound) / objective, rounded to 6 digits
    greedy_objective_cycles: int | None  # the warm start's objective (None: greedy found none)
    wall_s: float  # wall time of the choice; varies run to run, so kept out of plan.json
    workers: int
    seed: int
    time_limit_s: float  # CP-SAT's deterministic limit (work units, about seconds)
    #: CP-SAT's deterministic time over the compile's solves (the baselines' own, the tied
    #: and full models, the aligned second solve); kept out of plan.json beside ``wall_s``
    deterministic_s: float = 0.0
    #: which models made the choice (`solve._choose`): "full model", "grouped layers, ..."
    method: str = ""
    #: on a chip with DRAM, the whole-graph choices compared on the DMA queue (the solver's,
    #: the greedy's, ELK's inductive ones: `partition._best_streamed`), the kept one first,
    #: each with its predicted steps under ELK's preload schedule within the solve's SRAM
    #: reserve and within twice it (judged by their sum); empty elsewhere
    choices: tuple[tuple[str, int, int], ...] = ()
    #: with `--refine` (`refine.py`): the exact pricings spent and the cycles they saved;
    #: empty (and not in plan.json) without
    refined: tuple[int, int] | tuple[()] = ()

    def document(self) -> dict[str, object]:
        """The fields plan.json stores (all but ``wall_s`` and ``deterministic_s``, and
        ``refined`` where empty)."""
        doc = asdict(self)
        del doc["wall_s"], doc["deterministic_s"]
        if not self.refined:
            del doc["refined"]
        return doc

    @staticmethod
    def from_document(doc: dict, wall_s: float = 0.0) -> SolverReport:
        """The inverse of `document` (``wall_s`` is not stored there)."""
        return SolverReport(
            name=str(doc["name"]), status=str(doc["status"]),
            objective_cycles=int(doc["objective_cycles"]), bound_cycles=int(doc["bound_cycles"]),
            gap=float(doc["gap"]),
            greedy_objective_cycles=(None if doc["greedy_objective_cycles"] is None
                                     else int(doc["greedy_objective_cycles"])),
            wall_s=wall_s, workers=int(doc["workers"]), seed=int(doc["seed"]),
            time_limit_s=float(doc["time_limit_s"]), method=str(doc.get("method", "")),
            choices=tuple((str(name), int(a), int(b)) for name, a, b in doc.get("choices", ())),
            refined=_refined(doc.get("refined", ())))


def _refined(stored: object) -> tuple[int, int] | tuple[()]:
    """`SolverReport.refined` read back from plan.json."""
    if not isinstance(stored, (list, tuple)) or len(stored) != 2:
        return ()
    return int(stored[0]), int(stored[1])


#: the report of a plan put together by hand (tests, tools), not chosen by a solver
HAND_MADE = SolverReport("hand", "GIVEN", 0, 0, 0.0, None, 0.0, 1, 0, 0.0)


@dataclass(frozen=True)
class Plan:
    """The chosen plan of every op of a graph, with the solver's account of the choice."""

    model: str
    chip: str
    dtype: str
    ops: tuple[OpPlan, ...]
    relayout_cycles: tuple[int, ...]  # predicted re-layout cycles before each op
    front_sizes: tuple[int, ...]
    solver: SolverReport = HAND_MADE
    search_wall_s: float = 0.0
    #: the roofline and ideal lower bounds (`partition.bounds`); None for a hand-made plan
    bounds: Bounds | None = None
    #: chips with DRAM (`partition/dram.py`): the schedule ("elk", "static" or "basic"), and
    #: per op the op at whose start its DRAM loads are issued (-1: none) and the cycles it
    #: waits for them; empty on chips without DRAM
    dram_schedule: str = ""
    dram_issue: tuple[int, ...] = ()
    dram_stall_cycles: tuple[int, ...] = ()
    #: per op, the op at whose start the cores wait for its write-backs to DRAM (len(ops):
    #: the end of the step; -1: none); empty: each at the earliest (`dram.store_waits`)
    dram_store_wait: tuple[int, ...] = ()
    #: on a chip with DRAM, the whole-graph choice's other candidates, finished and scheduled,
    #: in the order the judge ranks them (not in plan.json): a timing-only run tries them
    #: where the kept one runs slower than predicted (`t10c.driver.time_only`)
    alternatives: tuple[Plan, ...] = field(default=(), compare=False, repr=False)

    @property
    def total_cycles(self) -> int:
        return (sum(p.cycles.total for p in self.ops) + sum(self.relayout_cycles)
                + sum(self.dram_stall_cycles))
