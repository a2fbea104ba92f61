"""The strategies t10c can compile a model under: one table read by the CLI, compare, bench and
mesh-compare.

Each strategy is a name, a one-line description (the CLI's help) and the change it makes to
the search options the user gave; everything else (planner, solver, codegen, emulator) is the
same for all of them, so their runs compare like with like.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from t10c.partition.search import SearchOptions
from t10c.partition.space import no_rotation_options, vgm_options


@dataclass(frozen=True)
class Strategy:
    """One way of compiling: what it is called, what it is, and the search options it sets."""

    name: str
    description: str
    #: the user's search options -> this strategy's
    search: Callable[[SearchOptions], SearchOptions]
    #: part of the default comparison (`t10c compare`, `t10c bench`); the others matter only
    #: on some chips and are asked for by name
    default: bool = True


def _t10(s: SearchOptions) -> SearchOptions:
    return s


def _all_to_all(s: SearchOptions) -> SearchOptions:
    return dataclasses.replace(s, mesh_aware=False)


def _basic(s: SearchOptions) -> SearchOptions:
    # DRAM chips: every op loads its DRAM data, then runs (nothing overlaps the loads)
    return dataclasses.replace(s, dram_schedule="basic")


def _static(s: SearchOptions) -> SearchOptions:
    # DRAM chips: every op's loads issued one fixed number of ops ahead
    return dataclasses.replace(s, dram_schedule="static")


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    # t10 (and all-to-all) plan from their own space united with the two baselines'
    # (`partition/space.py`), so that their plan is never slower than a baseline's that fits
    Strategy("t10", "compute-shift plans: operands rotate around rings of cores (default)",
             _t10),
    Strategy("no-rotation", "the baseline that replicates every shared sub-tensor "
             "(all f_t = 1)", no_rotation_options),
    Strategy("vgm", "virtual global memory: weights spread over all cores and fetched by "
             "every op before it computes", vgm_options),
    Strategy("all-to-all", "t10 planned as if every ring were one hop, cores numbered "
             "row-major (T10 as published; differs from t10 on meshes only)", _all_to_all,
             default=False),
    Strategy("basic", "t10 on a chip with DRAM, each op loading its DRAM data and then "
             "executing, no overlap (ELK's baseline; as t10 on chips without DRAM)", _basic,
             default=False),
    Strategy("static", "t10 on a chip with DRAM, every op's DRAM loads issued one fixed "
             "number of ops ahead (ELK's static preload; as t10 on chips without DRAM)",
             _static, default=False),
)}

#: the strategies `t10c compare` and `t10c bench` run unless told otherwise
DEFAULT_STRATEGIES: tuple[str, ...] = tuple(n for n, s in STRATEGIES.items() if s.default)


def search_options(strategy: str, base: SearchOptions = SearchOptions()) -> SearchOptions:
    """The search options of ``strategy`` given the user's ``base`` options.

    >>> search_options("no-rotation").max_rot_axes
    0
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: use {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy].search(base)


def help_text() -> str:
    """Every strategy with its description, for ``--help``."""
    return "; ".join(f"{s.name}: {s.description}" for s in STRATEGIES.values())
