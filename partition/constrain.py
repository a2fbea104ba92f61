"""Plans a researcher gives back (``t10c compile --plan FILE``), applied to the partition stage.

Two kinds, both checked against the graph and chip before anything is generated:

- a `Constraint` names ops (exactly or by glob) and fixes some of their ``F_op`` (per axis),
  ``f_t`` (per operand and axis) and warm-up; `constrain_fronts` replaces each named op's front
  by the plans that obey it, enumerated afresh (also plans the search's pruning dropped or the
  front left out), and the solver chooses the rest as usual;
- a whole `Plan` read back from ``plan.json``: `check_replay` re-derives every op's costs and
  every re-layout from the geometry and refuses a plan that does not belong to this graph and
  chip.

Reading the files is the application's (`t10c.planfile`); this module sees only parsed values.
It builds on the search's own enumeration steps (`search.py`), restricted by the constraints
before anything is costed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from dataclasses import dataclass

import numpy as np

from t10c.chips import Chip
from t10c.dtypes import IntTensors
from t10c.ir import Graph, TensorExpr

from .chosen import Plan, PlanError
from .cost import plan_cost
from .plan import OpPlan, geometry, operand_shapes
from .search import SearchOptions, _factor_grids, _feasible, _plan, _templates
from .transitions import Views, kept_restores, pod_fetches, relayout_cycles, route_fetches
from .vcost import CostArrays, costs_for

WEIGHTS = ("resident", "warmed-up")


class ConstraintError(PlanError):
    """A constraint that names no op, an unknown axis or operand, or asks for no legal plan."""


@dataclass(frozen=True)
class Constraint:
    """What a user fixes about the ops whose name matches ``pattern`` (`fnmatch` glob)."""

    pattern: str
    F: tuple[tuple[str, int], ...] = ()  # (axis, factor)
    #: (operand, axis, f_t); operand is "in0", "in1", ..., "out", or a tensor name
    f_t: tuple[tuple[str, str, int], ...] = ()
    weights: str | None = None  # "resident", "warmed-up", or None: the planner chooses

    def describe(self) -> str:
        """The constraint in the words of the file, for messages."""
        parts = [f"F_op[{a}]={f}" for a, f in self.F]
        parts += [f"f_t[{o}][{a}]={v}" for o, a, v in self.f_t]
        parts += [f"weights={self.weights}"] if self.weights else []
        return ", ".join(parts) or "no constraint"


def match_ops(graph: Graph, constraints: tuple[Constraint, ...]) -> list[Constraint | None]:
    """Per op of ``graph``, the constraint naming it (None: unconstrained).

    A pattern that names no op, or an op named by two patterns, is an error."""
    found: list[Constraint | None] = [None] * len(graph.ops)
    for c in constraints:
        hits = [i for i, op in enumerate(graph.ops)
                if op.name == c.pattern or fnmatch.fnmatchcase(op.name, c.pattern)]
        if not hits:
            close = [op.name for op in graph.ops
                     if c.pattern.split("*")[0] and op.name.startswith(c.pattern.split("*")[0])]
            hint = f" (ops starting alike: {', '.join(close[:5])})" if close else \
                " (`t10c explain MODEL --op NAME` lists names; plan.json has them all)"
            raise ConstraintError(f"op {c.pattern!r} matches no op of {graph.name}{hint}")
        for i in hits:
            other = found[i]
            if other is not None:
                raise ConstraintError(f"op {graph.ops[i].name} is named by two constraints "
                                      f"({other.pattern!r} and {c.pattern!r}): give it one")
            found[i] = c
    return found


def _operand(op: TensorExpr, key: str) -> int:
    names = [f"in{i}" for i in range(len(op.inputs))] + ["out"]
    if key in names:
        return names.index(key)
    tensors = [o.tensor for o in op.operands]
    if key in tensors:
        return tensors.index(key)
    raise ConstraintError(f"op {op.name}: no operand {key!r} (its operands: "
                          + ", ".join(f"{n}={t}" for n, t in zip(names, tensors)) + ")")


def check_constraint(op: TensorExpr, c: Constraint, chip: Chip, has_weights: bool,
                     weights_home: bool) -> None:
    """Refuse what no plan can obey, naming the op and what is wrong."""
    axes = dict(op.axes)
    where = f"op {op.name}"
    for a, f in c.F:
        if a not in axes:
            raise ConstraintError(f"{where}: F_op names axis {a!r}; its axes are "
                                  f"{', '.join(op.axis_names)}")
        if f < 1 or f > chip.cores:
            raise ConstraintError(f"{where}: F_op[{a}]={f} must be 1 to the chip's "
                                  f"{chip.cores} cores")
        if axes[a] % f:
            raise ConstraintError(f"{where}: F_op[{a}]={f} does not divide the axis' extent "
                                  f"{axes[a]}")
    used = math.prod(f for _, f in c.F)
    if used > chip.cores:
        raise ConstraintError(f"{where}: F_op uses {used} cores, {chip.name} has {chip.cores}")
    fixed = dict(c.F)
    rotating: dict[int, str] = {}
    for key, a, v in c.f_t:
        i = _operand(op, key)
        operand = op.operands[i]
        if a not in operand.plain_axes:
            raise ConstraintError(f"{where}: operand {key} has no axis {a!r} to rotate along "
                                  f"(its axes: {', '.join(operand.plain_axes) or 'none'})")
        if v < 1:
            raise ConstraintError(f"{where}: f_t[{key}][{a}]={v} must be at least 1")
        if v == 1:
            continue
        if i in rotating and rotating[i] != a:
            raise ConstraintError(f"{where}: operand {key} rotates along one axis at most "
                                  f"(f_t > 1 along {rotating[i]} and {a})")
        rotating[i] = a
        if v > axes[a]:
            raise ConstraintError(f"{where}: f_t[{key}][{a}]={v} exceeds the axis' extent "
                                  f"{axes[a]}")
        lacks = [b for b in op.axis_names if b not in operand.axis_set]
        rings = [fixed.get(b) for b in lacks]
        if not lacks or all(r is not None and r % v for r in rings):
            told = ", ".join(f"F_op[{b}]={fixed[b]}" for b in lacks if b in fixed)
            raise ConstraintError(
                f"{where}: f_t[{key}][{a}]={v} does not divide its ring: operand {key} "
                "rotates along an axis it lacks whose F_op is a multiple of f_t"
                + (f" ({told})" if told else " (it lacks none)"))
    if c.weights is not None:
        if not has_weights:
            raise ConstraintError(f"{where}: has no weights to keep {c.weights}")
        if weights_home and c.weights == "resident":
            raise ConstraintError(f"{where}: weights = \"resident\" under a strategy that "
                                  "warms every op's weights up (vgm); use --strategy t10")


@dataclass(frozen=True)
class Constrained:
    """One constrained op's new front, with the search's other figures for it."""

    front: list[OpPlan]
    smallest: OpPlan
    least_cold: int
    enumerated: int


def _template_ok(op: TensorExpr, tpl, want: dict[tuple[int, str], int]) -> bool:
    for (i, a), v in want.items():
        have = tpl.chain[i] if a in tpl.rot[i] else 1
        if have != v:
            return False
    return True


def constrained_front(graph: Graph, op: TensorExpr, c: Constraint, chip: Chip, dtype: str,
                      opts: SearchOptions, limit: int, ints: IntTensors,
                      consts: frozenset[str]) -> Constrained:
    """Every plan of ``op`` obeying ``c`` (the search's pruning relaxed), reduced to its Pareto
    front in (hot bytes, cycles); raises `ConstraintError` if none exists or none fits."""
    has_weights = any(o.tensor in consts for o in op.inputs)
    check_constraint(op, c, chip, has_weights, opts.weights_home)
    want = {(_operand(op, k), a): v for k, a, v in c.f_t}
    rot_axes = {a for (_, a), v in want.items() if v > 1}
    paces: dict[str, set[int]] = {}
    for (_, a), v in want.items():
        if v > 1:
            paces.setdefault(a, set()).add(v)
    relaxed = dataclasses.replace(
        opts, min_util=0.0, max_pad=math.inf,
        max_rot_axes=max(opts.max_rot_axes, len(rot_axes)),
        max_steps=max(opts.max_steps, math.prod(max(p) for p in paces.values()) if paces else 1),
        chains=opts.chains or any(len(p) > 1 for p in paces.values()))
    home = opts.weights_home or c.weights == "warmed-up"
    shapes = operand_shapes(graph, op)
    extents = tuple(e for _, e in op.axes)
    grid = _factor_grids(extents, [True] * len(extents), chip.cores, relaxed,
                         [a in op.output.axes for a in op.axis_names])
    for a, f in c.F:
        grid = grid[grid[:, op.axis_names.index(a)] == f]
    mesh = chip.is_mesh and opts.mesh_aware
    parts = []
    for tpl, combo in _templates(op, grid, relaxed):
        if not _template_ok(op, tpl, want):
            continue
        rows = grid[_feasible(op, combo, grid)]
        if not len(rows):
            continue
        costs = costs_for(op, tpl, rows, chip, dtype, shapes, ints, consts, home, mesh)
        if mesh and not costs.placeable.all():
            keep = costs.placeable
            rows = rows[keep]
            costs = CostArrays(*(getattr(costs, f.name)[keep]
                                 for f in dataclasses.fields(costs)))
        if len(rows):
            parts.append((tpl, combo, rows, costs))
    if not parts:
        raise ConstraintError(f"op {op.name}: no legal plan has {c.describe()} (a rotation "
                              "needs a ring: an axis the operand lacks, split a multiple of "
                              "f_t times, and at least f_t elements per block)")
    total = np.concatenate([k.total for *_, k in parts])
    hot = np.concatenate([k.hot for *_, k in parts])
    part = np.concatenate([np.full(len(rows), n) for n, (_, _, rows, _) in enumerate(parts)])
    row = np.concatenate([np.arange(len(rows)) for _, _, rows, _ in parts])

    def make(n: int) -> OpPlan:
        tpl, combo, rows, costs = parts[part[n]]
        p = _plan(op, tpl, combo, rows[row[n]], costs, row[n], chip, mesh)
        return dataclasses.replace(p, home=True) if home else p

    smallest = make(int(np.lexsort((row, part, total, hot))[0]))
    fits = np.flatnonzero(hot <= chip.sram_bytes_per_core)
    if not len(fits):
        raise ConstraintError(f"op {op.name}: no plan with {c.describe()} fits the SRAM: the "
                              f"smallest needs {smallest.hot_bytes_per_core} bytes per core, "
                              f"{chip.name} has {chip.sram_bytes_per_core}")
    order = fits[np.lexsort((row[fits], part[fits], hot[fits], total[fits]))]
    best_before = np.minimum.accumulate(np.concatenate([[np.iinfo(np.int64).max], hot[order]]))
    on_front = order[hot[order] < best_before[:-1]]
    if len(on_front) > limit:
        picks = sorted({round(i * (len(on_front) - 1) / max(limit - 1, 1))
                        for i in range(limit)})
        on_front = on_front[picks]
    front = [make(int(n)) for n in on_front]
    if has_weights and c.weights is None and not home:  # as the planner does: a warm-up twin
        p = front[0]
        cycles, hot_b, cold, out = plan_cost(geometry(graph, op, p), chip, dtype, ints, consts,
                                             weights_home=True)
        if cold < p.cold_bytes_per_core:
            front.append(dataclasses.replace(p, cycles=cycles, hot_bytes_per_core=hot_b,
                                             cold_bytes_per_core=cold, out_bytes_per_core=out,
                                             home=True))
    cold_all = np.concatenate([k.cold for *_, k in parts])
    least_cold = min(int(cold_all.min()), *(p.cold_bytes_per_core for p in front))
    return Constrained(front, smallest, least_cold, len(total))


@dataclass(frozen=True)
class Replay:
    """A plan read back from plan.json, with what the file says it was made for."""

    plan: Plan
    #: per op, its axes and their extents as the file has them (`TensorExpr.axes`)
    axes: tuple[tuple[tuple[str, int], ...], ...]
    cores: int
    sram_bytes_per_core: int
    #: the model's matmul weights were stored so (``--quantize``), or None
    quantize: str | None = None


def check_replay(graph: Graph, replay: Replay, chip: Chip, dtype: str, ints: IntTensors,
                 consts: frozenset[str], quantize: str | None = None) -> None:
    """Refuse a plan read back from plan.json that was not made for this graph, chip, dtype
    and weight type (``quantize``): its ops and their axes are compared, every cost it
    predicts and every re-layout are re-derived. Each refusal is one line saying which."""
    plan = replay.plan
    if replay.quantize != quantize:  # another graph: said before its ops disagree
        fix = f"with --quantize {replay.quantize}" if replay.quantize else "without --quantize"
        made = fix if replay.quantize else "with float weights"
        raise PlanError(f"the plan was made {made}: compile {fix} or without --plan")
    if plan.dtype != dtype:
        raise PlanError(f"the plan was made for dtype {plan.dtype}, not {dtype}: add "
                        f"--dtype {plan.dtype} or compile without --plan")
    if plan.chip != chip.name:
        raise PlanError(f"the plan was made for chip {plan.chip}, not {chip.name}: compile "
                        f"with --chip {plan.chip} or without --plan")
    if (replay.cores, replay.sram_bytes_per_core) != (chip.cores, chip.sram_bytes_per_core):
        raise PlanError(f"the plan was made for a chip {chip.name} of {replay.cores} cores and "
                        f"{replay.sram_bytes_per_core} bytes of SRAM per core; this one has "
                        f"{chip.cores} and {chip.sram_bytes_per_core}: another chip file")
    model = f"model {plan.model}" + ("" if plan.model == graph.name else
                                     f", not {graph.name}")
    if len(plan.ops) != len(graph.ops) or len(replay.axes) != len(graph.ops):
        raise PlanError(f"the plan was made for another model ({model}: {len(plan.ops)} ops, "
                        f"this one has {len(graph.ops)})")
    for n, (op, p, axes) in enumerate(zip(graph.ops, plan.ops, replay.axes)):
        if p.op != op.name or len(p.F) != len(op.axes):
            raise PlanError(f"the plan was made for another model ({model}): its op {n} is "
                            f"{p.op}, here it is {op.name}")
        if tuple(axes) != tuple(op.axes):
            there = ", ".join(f"{a}={e}" for a, e in axes)
            here = ", ".join(f"{a}={e}" for a, e in op.axes)
            raise PlanError(f"the plan was made for another shape of {graph.name}: op "
                            f"{op.name} has axes {there} there, {here} here (--seq-len, "
                            "--batch, --shape)")
    cache: dict[tuple, tuple] = {}
    derived = []
    for op, p in zip(graph.ops, plan.ops):
        if p.home and not any(o.tensor in consts for o in op.inputs):
            raise PlanError(f"op {op.name}: the plan warms up weights it does not have")
        if math.prod(p.F) > chip.cores or any(f < 1 for f in p.F):
            raise PlanError(f"op {op.name}: the plan uses {math.prod(p.F)} cores, "
                            f"{chip.name} has {chip.cores}")
        key = (op.signature(), p.unnamed)
        if key not in cache:
            cache[key] = plan_cost(geometry(graph, op, p), chip, dtype, ints, consts,
                                   weights_home=p.home)
        cycles, hot, cold, out = cache[key]
        derived.append(dataclasses.replace(p, cycles=cycles, hot_bytes_per_core=hot,
                                           cold_bytes_per_core=cold, out_bytes_per_core=out))
    # priced as the planner prices a chosen plan: all of an op's inputs in one phase, on a
    # mesh the weight fetches routed (their estimate out of the plans' cycles), on a pod
    # their crossings counted
    routed = route_fetches(graph, tuple(derived), chip, dtype, ints)
    if routed is None:
        relayout = relayout_cycles(graph, derived, chip, dtype, ints)
    else:
        derived, relayout = list(routed[0]), routed[1]
    derived = list(pod_fetches(graph, kept_restores(graph, tuple(derived), chip, dtype, ints),
                               chip, dtype, ints, Views(graph)))
    for op, p, d in zip(graph.ops, plan.ops, derived):
        if (d.cycles, d.hot_bytes_per_core, d.cold_bytes_per_core, d.out_bytes_per_core) != (
                p.cycles, p.hot_bytes_per_core, p.cold_bytes_per_core, p.out_bytes_per_core):
            raise PlanError(
                f"op {op.name}: the plan predicts {p.cycles.total} cycles and "
                f"{p.hot_bytes_per_core} bytes per core, this model on {chip.name} gives "
                f"{d.cycles.total} and {d.hot_bytes_per_core}: it was made for another shape "
                "(--seq-len, --batch, --shape), chip file or t10c version; compile without "
                "--plan")
    for op, want, have in zip(graph.ops, relayout, plan.relayout_cycles):
        if want != have:
            raise PlanError(f"op {op.name}: the plan's re-layout takes {have} cycles, this "
                            f"model on {chip.name} gives {want}; compile without --plan")


def apply_constraints(graph: Graph, chip: Chip, dtype: str, opts: SearchOptions, limit: int,
                      constraints: tuple[Constraint, ...], fronts: list[list[OpPlan]],
                      smallest: list[OpPlan | None], least_cold: list[int], keys: list[tuple],
                      ints: IntTensors, consts: frozenset[str]) -> None:
    """Replace, in place, the front (and smallest plan, least resident bytes and search key)
    of every op a constraint names; repeated layers under the same constraint share the work.
    The key gains the constraint, so that re-layout costs are not shared with unconstrained
    twins of the op."""
    cache: dict[tuple, Constrained] = {}
    for n, c in enumerate(match_ops(graph, constraints)):
        if c is None:
            continue
        key = (*keys[n], c)
        if key not in cache:
            cache[key] = constrained_front(graph, graph.ops[n], c, chip, dtype, opts, limit,
                                           ints, consts)
        got = cache[key]
        name = graph.ops[n].name
        fronts[n] = [p.named(name) for p in got.front]
        smallest[n] = got.smallest.named(name)
        least_cold[n] = got.least_cold
        keys[n] = key
