"""The plan space of a strategy, and why the t10 strategy's contains the baselines'.

A strategy's plan space is, per op, the list of plans the whole-graph solve may choose from:

- no-rotation (``max_rot_axes=0``): the Pareto front (hot bytes, cycles) of the plans without
  rotation (all f_t = 1, every shared sub-tensor replicated), and for an op with weights the
  warm-up twin of its fastest plan (the weights kept in the compact idle layout, spread over
  all cores, and fetched into the plan's layout before the op runs);
- vgm (``weights_home``): the front of the no-rotation plans priced with every op fetching its
  weights from that idle layout, all of a weighted op's plans warmed up (an op without
  weights has nothing to fetch: its plans are the no-rotation ones);
- t10: its own front (rotation allowed) and the no-rotation front, each with the twin of
  EVERY plan on it, united with the no-rotation space and the vgm space exactly as those
  strategies build them (`union`).

Why t10's plan is never slower than a baseline that fits (predicted cycles, by construction):
the solve's model (`solve.py`) depends on a plan only through its own figures (cycles, cold,
hot and output bytes) and on pairs of plans only through the re-layout cost of an edge, which
`transitions.edge_cost` computes pair by pair. A baseline's whole-graph choice is therefore,
mapped plan by plan into the union, a feasible assignment of the t10 model with the same
memory terms and the same objective value. `plan_graph` solves each baseline's own model
first (the same model, options and seed as the baseline's own compile, so the same choice),
maps its choice into t10's space, and gives the best of those and the greedy to CP-SAT as its
hint; `solve.choose_plans` returns the best of the solver's answer and every such start, so
t10's objective is at most each baseline's.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass

from t10c import forked
from t10c.chips import Chip
from t10c.dtypes import IntTensors, on_chip_dtype
from t10c.ir import Graph, TensorExpr

from .cost import plan_cost
from .plan import Cycles, OpPlan, geometry, operand_shapes
from .search import SearchOptions, SearchResult, search_front


def no_rotation_options(s: SearchOptions) -> SearchOptions:
    """The no-rotation baseline's search: every shared sub-tensor replicated (all f_t = 1)."""
    return dataclasses.replace(s, max_rot_axes=0)


def vgm_options(s: SearchOptions) -> SearchOptions:
    """The vgm baseline's search: nothing rotates, every op fetches its weights from home."""
    return dataclasses.replace(s, max_rot_axes=0, weights_home=True)


def baseline_options(s: SearchOptions) -> tuple[SearchOptions, ...]:
    """The baselines whose spaces the strategy searched with ``s`` contains: no-rotation and
    vgm for a strategy that rotates (t10, all-to-all); none for a baseline itself."""
    if s.max_rot_axes == 0 or s.weights_home:
        return ()
    return (no_rotation_options(s), vgm_options(s))


@dataclass(frozen=True)
class Space:
    """Per op: the plans the solve may choose (non-warmed-up plans first, fastest first), the
    plan with the fewest hot bytes (for diagnoses) and the fewest resident bytes of any plan."""

    fronts: tuple[tuple[OpPlan, ...], ...]
    smallest: tuple[OpPlan | None, ...]
    least_cold: tuple[int, ...]


def tensor_sets(graph: Graph) -> tuple[IntTensors, frozenset[str]]:
    """The integer tensors (with their types on chip) and the constant (weight) tensors of
    ``graph``."""
    ints = IntTensors({n: on_chip_dtype(t.dtype, "fp32") for n, t in graph.tensors.items()
                       if t.dtype != "float32"})
    consts = frozenset(n for n in graph.tensors if graph.root(n) in graph.constants)
    return ints, consts


def op_keys(graph: Graph) -> list[tuple]:
    """A key per op under which identical ops (repeated layers) share searches and edges."""
    ints, consts = tensor_sets(graph)
    return [(op.signature(), tuple(o.tensor in consts for o in op.reads),
             tuple(ints.get(o.tensor) for o in op.reads)) for op in graph.ops]


def space_of(graph: Graph, chip: Chip, dtype: str, search: SearchOptions, front_limit: int,
             tick: Callable[[], None] | None = None, every_twin: bool = False) -> Space:
    """One strategy's plan space (searched once per distinct op); ``tick`` after each op.

    A baseline's own space has the warm-up twin of each weighted op's fastest plan only (what
    its compile solves: with a twin of every replicated plan its solve would balance a knapsack
    of identical layers, slowly); ``every_twin`` gives every front plan its twin."""
    ints, consts = tensor_sets(graph)
    cache: dict[tuple, tuple[list[OpPlan], OpPlan | None, int]] = {}
    fronts, smallest, least_cold = [], [], []
    for op, key in zip(graph.ops, op_keys(graph)):
        if key not in cache:
            shapes = operand_shapes(graph, op)
            found = searched(op, chip, dtype, shapes, ints, consts, search, front_limit)
            plans = [p.named(op.name) for p in found.front]
            weighted = any(o.tensor in consts for o in op.inputs)
            if search.weights_home and weighted:  # an op without weights has none to fetch
                plans = [dataclasses.replace(p, home=True) for p in plans]
            else:
                plans += warm_up_twins(graph, op, plans if every_twin else plans[:1], chip,
                                       dtype, ints, consts)
            cold = min([found.least_cold, *(p.cold_bytes_per_core for p in plans)])
            cache[key] = (plans, found.smallest, cold)
        plans, least, cold = cache[key]
        fronts.append(tuple(p.named(op.name) for p in plans))
        smallest.append(None if least is None else least.named(op.name))
        least_cold.append(cold)
        if tick:
            tick()
    return Space(tuple(fronts), tuple(smallest), tuple(least_cold))


#: searches done in this process: a t10 compile searches the no-rotation space twice (with
#: every twin and as that baseline builds it), and `t10c bench`, `compare` and `sweep` compile
#: one model under several strategies; a search is deterministic, so a repeat is a look-up
_FOUND: dict[tuple, SearchResult] = {}
_FOUND_LIMIT = 4096


def _found_key(op: TensorExpr, chip: Chip, dtype: str, shapes: dict[str, tuple[int, ...]],
               ints: IntTensors, consts: frozenset[str], search: SearchOptions,
               limit: int) -> tuple:
    """What `search.search_front` reads: its memo's key (`_FOUND`)."""
    return (repr(chip), dtype, op.signature(), op.name,
            tuple((o.tensor, shapes[o.tensor], ints.get(o.tensor), o.tensor in consts)
                  for o in op.operands), search, limit)


def prefetch(graph: Graph, chip: Chip, dtype: str, searches: list[SearchOptions],
             limit: int) -> None:
    """Search the distinct ops of every space ``searches`` will build (`space_of`), into
    `_FOUND`, in forked processes too where the chip is large enough for that to pay
    (`t10c.forked.jobs_for`: a wafer's searches take seconds each); elsewhere `space_of`
    searches as it goes. The same fronts either way."""
    ints, consts = tensor_sets(graph)
    todo: dict[tuple, tuple[TensorExpr, dict[str, tuple[int, ...]], SearchOptions]] = {}
    keys = op_keys(graph)
    for search in dict.fromkeys(searches):
        seen: set[tuple] = set()
        for op, key in zip(graph.ops, keys):
            if key in seen:
                continue
            seen.add(key)
            shapes = operand_shapes(graph, op)
            found = _found_key(op, chip, dtype, shapes, ints, consts, search, limit)
            if found not in _FOUND and found not in todo:
                todo[found] = (op, shapes, search)
    jobs = forked.jobs_for(chip.cores * len(todo))
    if jobs < 2:
        return
    pieces = list(todo.values())
    # (a search's work grows with the op's axes: each is factored over the cores)
    fronts = forked.map_forked(
        lambda piece: search_front(piece[0], chip, dtype, piece[1], ints, consts, piece[2],
                                   limit),
        pieces, [len(op.axis_names) for op, _, _ in pieces], jobs)
    if len(_FOUND) + len(todo) > _FOUND_LIMIT:
        _FOUND.clear()
    _FOUND.update(zip(todo, fronts))


def searched(op: TensorExpr, chip: Chip, dtype: str, shapes: dict[str, tuple[int, ...]],
             ints: IntTensors, consts: frozenset[str], search: SearchOptions,
             limit: int) -> SearchResult:
    """`search.search_front`, remembered under everything it reads (plans are renamed by
    the caller)."""
    key = _found_key(op, chip, dtype, shapes, ints, consts, search, limit)
    if key not in _FOUND:
        if len(_FOUND) >= _FOUND_LIMIT:
            _FOUND.clear()
        _FOUND[key] = search_front(op, chip, dtype, shapes, ints, consts, search, limit)
    return _FOUND[key]


def warm_up_twins(graph: Graph, op: TensorExpr, front: list[OpPlan], chip: Chip, dtype: str,
                  ints: IntTensors, consts: frozenset[str]) -> list[OpPlan]:
    """For an op with weights, every plan of its front again with the weights kept in the
    compact idle layout and warmed up before each run: fewer resident bytes for some fetch
    time (what vgm does for every op). Twins that would save nothing are left out."""
    if not any(o.tensor in consts for o in op.inputs):
        return []
    twins = []
    for p in front:
        cycles, hot, cold, out = plan_cost(geometry(graph, op, p), chip, dtype, ints, consts,
                                           weights_home=True)
        if cold < p.cold_bytes_per_core:
            twins.append(dataclasses.replace(p, cycles=cycles, hot_bytes_per_core=hot,
                                             cold_bytes_per_core=cold,
                                             out_bytes_per_core=out, home=True))
    return twins


#: a plan's cycles as a tuple of its phases (`dataclasses.astuple` without its deep copies)
_CYCLES = operator.attrgetter(*(f.name for f in dataclasses.fields(Cycles)))


def _order(p: OpPlan) -> tuple:
    """Warmed-up plans last (the greedy walks the others), each part fastest first; the rest
    of the key makes the order total over every field (the union is built from sets, whose
    order varies with string hashing from run to run)."""
    return (p.home, p.cycles.total, p.hot_bytes_per_core, p.cold_bytes_per_core,
            p.out_bytes_per_core, p.F, p.T, p.rot, p.chain, p.drivers, repr(p.embed),
            repr(p.cores), p.aligned, _CYCLES(p.cycles), p.op)


def union(spaces: list[Space]) -> tuple[Space, list[list[list[int]]]]:
    """The union of several strategies' spaces, and for each space and op where each of its
    plans is in the union (so that a choice in a space is a choice in the union)."""
    fronts, where = [], []
    for per_op in zip(*(s.fronts for s in spaces)):
        plans = sorted({p for front in per_op for p in front}, key=_order)
        index = {p: k for k, p in enumerate(plans)}
        fronts.append(tuple(plans))
        where.append([[index[p] for p in front] for front in per_op])
    smallest = []
    for candidates in zip(*(s.smallest for s in spaces)):
        known = [p for p in candidates if p is not None]
        smallest.append(min(known, key=lambda p: p.hot_bytes_per_core) if known else None)
    least_cold = tuple(min(c) for c in zip(*(s.least_cold for s in spaces)))
    maps = [[where[i][n] for i in range(len(fronts))] for n in range(len(spaces))]
    return Space(tuple(fronts), tuple(smallest), least_cold), maps
