"""`t10c explain`: one op's Pareto front of rTensor plans, as a table."""

from __future__ import annotations

from dataclasses import dataclass

from t10c.chips import Chip
from t10c.ir import Graph, TensorExpr
from t10c.partition import OpPlan, SearchOptions, search_op_front


@dataclass(frozen=True)
class Explanation:
    op: TensorExpr
    front: list[OpPlan]
    enumerated: int
    search_s: float


class OpNotFoundError(LookupError):
    pass


def find_op(graph: Graph, name: str) -> TensorExpr:
    """The op called ``name``, or the only op whose name contains it."""
    exact = [op for op in graph.ops if op.name == name]
    if exact:
        return exact[0]
    partial = [op for op in graph.ops if name in op.name]
    if len(partial) == 1:
        return partial[0]
    names = [op.name for op in (partial or graph.ops)]
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    what = "matches several ops" if partial else "matches no op"
    raise OpNotFoundError(f"--op {name!r} {what}: {shown}")


def explain_op(graph: Graph, op: TensorExpr, chip: Chip, dtype: str,
               opts: SearchOptions = SearchOptions()) -> Explanation:
    found = search_op_front(graph, op, chip, dtype, opts)
    return Explanation(op, found.front, found.enumerated, found.wall_s)


def format_explanation(e: Explanation, chip: Chip, dtype: str) -> str:
    op = e.op
    axes = " ".join(f"{a}={n}" for a, n in op.axes)
    roles = [f"in{i}={o.tensor}" for i, o in enumerate(op.inputs)] + [f"out={op.output.tensor}"]
    lines = [f"op {op.name} ({op.kind}, {op.source or 'synthetic'}): {axes}",
             f"operands: {', '.join(roles)}",
             f"{e.enumerated} plans enumerated in {e.search_s:.3f} s on {chip.name} ({dtype}); "
             f"Pareto front in (hot bytes, cycles): {len(e.front)} plans, fastest first"]
    if not e.front:
        lines.append(f"no plan fits {chip.sram_bytes_per_core} bytes per core")
        return "\n".join(lines)
    lines += plan_table(op, e.front)
    best = e.front[0]
    lines.append(f"fastest plan that fits: #0, {best.cycles.total} cycles = "
                 f"{chip.cycles_to_s(best.cycles.total) * 1e6:.2f} us, "
                 f"{best.hot_bytes_per_core} bytes per core on {best_cores(best)} cores")
    if chip.is_mesh:
        from t10c.partition.place import describe

        lines.append(f"placement on the {chip.rows} x {chip.cols} {chip.topology}: "
                     f"{describe(best.embed, best_cores(best))}")
    return "\n".join(lines)


def best_cores(p: OpPlan) -> int:
    n = 1
    for f in p.F:
        n *= f
    return n


def plan_table(op: TensorExpr, plans: list[OpPlan], first: int = 0) -> list[str]:
    """Plans of ``op`` as table lines: factors, temporal factors, cycles by phase, bytes."""
    header = ("#", "F_op", "f_t", "steps", "compute", "shift", "sync", "reduce", "total",
              "hot B/core", "idle B/core")
    rows = [header]
    for n, p in enumerate(plans, first):
        F = ",".join(f"{a}={f}" for a, f in zip(op.axis_names, p.F) if f > 1) or "1"
        ft = []
        for i in range(len(op.operands)):
            role = "out" if i == len(op.inputs) else f"in{i}"
            parts = [f"{a}/{f}" for a, f in p.f_t(op, i).items() if f > 1]
            ft.append(f"{role}:{'.'.join(parts) or '1'}")
        c = p.cycles
        rows.append((str(n), F, " ".join(ft), str(p.steps), str(c.compute), str(c.shift),
                     str(c.sync), str(c.reduce), str(c.total), str(p.hot_bytes_per_core),
                     str(p.cold_bytes_per_core) + (" (warmed up)" if p.home else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _same(p: OpPlan, q: OpPlan) -> bool:
    return (p.F, p.T, p.rot, p.chain, p.home) == (q.F, q.T, q.rot, q.chain, q.home)


def against_front(front: list[OpPlan], p: OpPlan) -> str:
    """Where plan ``p`` sits against the op's (unconstrained) front, in one sentence."""
    if not front:
        return "the op has no front to compare with (no unconstrained plan fits)"
    fastest = front[0].cycles.total
    ratio = f"{p.cycles.total / max(fastest, 1):.2f}x the fastest plan's {fastest} cycles"
    for n, f in enumerate(front):
        if _same(f, p):
            return f"it is front plan #{n} ({ratio})"
    beaters = [(n, f) for n, f in enumerate(front)
               if f.cycles.total <= p.cycles.total and
               f.hot_bytes_per_core <= p.hot_bytes_per_core and
               (f.cycles.total, f.hot_bytes_per_core) != (p.cycles.total, p.hot_bytes_per_core)]
    if beaters:
        n, f = min(beaters, key=lambda b: b[1].cycles.total)
        idle = (" (its weights are warmed up: fewer idle bytes, which the front does not "
                "weigh)" if p.home and not f.home else "")
        return (f"behind the front ({ratio}): front plan #{n} beats it, {f.cycles.total} "
                f"cycles and {f.hot_bytes_per_core} bytes per core against {p.cycles.total} "
                f"and {p.hot_bytes_per_core}{idle}")
    smaller = [n for n, f in enumerate(front) if f.hot_bytes_per_core > p.hot_bytes_per_core]
    where = ("smaller than every front plan" if len(smaller) == len(front) else
             "faster than every front plan with as few bytes" if not smaller else
             f"between front plans #{smaller[-1]} and #{smaller[-1] + 1}")
    return f"off the front but beaten by none of it ({ratio}; {where})"


def format_given(op: TensorExpr, front: list[OpPlan], given: list[OpPlan], what: str) -> str:
    """The plans ``--plan FILE`` gives one op (``what`` says how), and where the fastest of
    them sits against the op's front."""
    lines = [f"{what}: {len(given)} plan{'s' if len(given) != 1 else ''}, fastest first"]
    lines += plan_table(op, given)
    lines.append(f"its fastest, {given[0].cycles.total} cycles with "
                 f"{given[0].hot_bytes_per_core} bytes per core: {against_front(front, given[0])}")
    return "\n".join(lines)
