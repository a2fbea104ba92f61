"""The graph verifier: what the frontend promises every later stage about a `Graph`.

The planner, codegen and emulator assume, without checking again, that:

- ops come in topological order: every input is a graph input, a constant, the output of an
  earlier op, or a view of one of those, and no tensor is written twice;
- every operand names a known tensor and indexes each of its dimensions once: by an op axis
  whose extent is the dimension's size (an input may be read in part: a slice from its start
  has a shorter axis), by a window over op axes, or by data (``INDIRECT``, lookups only);
- axes are distinct with positive extents; an op with reduction axes has a combine, and a
  body is well formed over its inputs (`t10c.elementwise.check_body`);
- views keep the element count of their source, and a transpose's permutation is one;
- every graph output exists: an op's result, a view of one, or an input grown in place by
  an op's result (`t10c.ir.Append`).

`verify_graph` reports every violation at once. The driver runs it behind ``--check``; the
tests run it on every zoo model.
"""

from __future__ import annotations

import math

from t10c.elementwise import COMBINES, body_inputs, check_body
from t10c.ir import INDIRECT, Graph, TensorExpr, Window, is_contraction


class GraphError(ValueError):
    """A graph that breaks the frontend's promises; the message lists every violation."""


def verify_graph(graph: Graph) -> None:
    """Raise `GraphError` naming every op, operand or view that breaks the rules above."""
    problems = [f"view {name}: {why}" for name, why in _view_problems(graph)]
    known = set(graph.inputs) | set(graph.constants)
    for op in graph.ops:
        where = f"op {op.name} ({op.source or op.kind})"
        problems += [f"{where}: {why}" for why in _op_problems(graph, op, known)]
        if op.output.tensor in known:
            problems.append(f"{where}: writes {op.output.tensor}, which already has a value")
        known.add(op.output.tensor)
    for out in graph.outputs:
        if graph.root(graph.written(out)) not in known:
            problems.append(f"graph output {out} is never computed")
        grown = graph.appends.get(out)
        if grown is not None:
            problems += [f"graph output {out}: {why}" for why in _append_problems(graph, out)]
    for name in graph.gathers:
        problems += [f"gathered input {name}: {why}" for why in _gather_problems(graph, name)]
    if problems:
        shown = problems[:20]
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise GraphError(f"graph {graph.name} is malformed ({len(problems)} problem"
                         f"{'s' if len(problems) > 1 else ''}):\n  " + "\n  ".join(shown) + more)


def _append_problems(graph: Graph, out: str) -> list[str]:
    """What is wrong with output ``out`` grown in place (`t10c.ir.Append`): its base must be
    a graph input that begins it, its rows must fill the rest, and no op may compute it."""
    grown = graph.appends[out]
    if out not in graph.tensors:
        return ["is grown in place but is no tensor of the graph"]
    shape = graph.tensors[out].shape
    found = []
    if any(op.output.tensor == graph.root(out) for op in graph.ops):
        found.append("is grown in place and computed by an op too")
    if grown.base not in graph.inputs:
        found.append(f"grows {grown.base} in place, which is not a graph input")
    elif not 0 <= grown.axis < len(shape) or graph.tensors[grown.base].shape != tuple(
            grown.length if d == grown.axis else n for d, n in enumerate(shape)):
        found.append(f"does not begin with {grown.base} along dimension {grown.axis}")
    elif grown.rows not in graph.tensors or graph.tensors[grown.rows].numel != \
            graph.tensors[out].numel - graph.tensors[grown.base].numel:
        found.append(f"its new rows {grown.rows} do not fill it past {grown.base}")
    return found


def _gather_problems(graph: Graph, name: str) -> list[str]:
    """What is wrong with input ``name`` gathered from a table (`t10c.ir.Gathered`): a graph
    input that no op computes, a constant table, integer ids among the inputs the caller
    feeds, and one row of the table for every id."""
    g = graph.gathers[name]
    if name not in graph.inputs or name not in graph.tensors:
        return ["is gathered from a table but is no graph input"]
    found = []
    if g.table not in graph.constants or g.table not in graph.tensors:
        found.append(f"its table {g.table} is not a weight")
    if g.ids not in graph.fed or graph.tensors[g.ids].dtype == "float32":
        found.append(f"its ids {g.ids} are not an integer input the caller feeds")
    if not found:
        row = graph.tensors[g.table].numel // max(graph.tensors[g.table].shape[0], 1)
        if graph.tensors[name].numel != graph.tensors[g.ids].numel * row:
            found.append(f"holds {graph.tensors[name].numel} elements, not one row of "
                         f"{g.table} for each of the {graph.tensors[g.ids].numel} ids")
    return found


def _view_problems(graph: Graph) -> list[tuple[str, str]]:
    found = []
    for name, view in graph.views.items():
        src = graph.tensors.get(view.source)
        if src is None:
            found.append((name, f"its source {view.source} is not a tensor of the graph"))
            continue
        if math.prod(view.shape) != math.prod(src.shape):
            found.append((name, f"shape {view.shape} does not hold the {math.prod(src.shape)} "
                                f"elements of {view.source} {src.shape}"))
        if view.perm is not None and sorted(view.perm) != list(range(len(src.shape))):
            found.append((name, f"{view.perm} is not a permutation of {len(src.shape)} axes"))
    return found


def _op_problems(graph: Graph, op: TensorExpr, known: set[str]) -> list[str]:
    found = []
    names = op.axis_names
    if len(set(names)) != len(names):
        found.append(f"axes {names} repeat a name")
    found += [f"axis {a} has extent {e}" for a, e in op.axes if type(e) is not int or e < 1]
    extents = op.extents
    for k, operand in enumerate(op.operands):
        role = "output" if k == len(op.inputs) else f"input {k}"
        info = graph.tensors.get(operand.tensor)
        if info is None:
            found.append(f"{role} {operand.tensor} is not a tensor of the graph")
            continue
        if k < len(op.inputs) and graph.root(operand.tensor) not in known:
            found.append(f"{role} {operand.tensor} is read before anything computes it")
        if len(operand.axes) != len(info.shape):
            found.append(f"{role} {operand.tensor} has {len(info.shape)} dimensions, the op "
                         f"indexes {len(operand.axes)}")
            continue
        for d, size in zip(operand.axes, info.shape):
            if isinstance(d, Window):
                found += [f"{role} {operand.tensor}: window axis {a} is not an axis of the op"
                          for a in d.axes if a not in extents]
            elif d == INDIRECT:
                if k == len(op.inputs) or op.body[0] != "take":
                    found.append(f"{role} {operand.tensor}: a data-indexed dimension outside "
                                 "a lookup's table")
            elif d not in extents:
                found.append(f"{role} {operand.tensor}: {d} is not an axis of the op")
            elif extents[d] > size or (k == len(op.inputs) and extents[d] != size):
                found.append(f"{role} {operand.tensor}: axis {d} has extent {extents[d]}, the "
                             f"dimension it indexes has {size}")
    if op.combine is not None and op.combine not in COMBINES:
        found.append(f"unknown combine {op.combine!r}")
    if op.reduction_axes and op.combine is None:
        found.append(f"axes {op.reduction_axes} are not in the output but nothing combines "
                     "over them")
    why = check_body(op.body, len(op.inputs))
    if why is not None:
        found.append(why)
    found += _prologue_problems(op)
    return found


def _prologue_problems(op: TensorExpr) -> list[str]:
    """A prologue transforms one of a contraction's two operands, from inputs that index a
    subset of that operand's axes (`t10c.ir.TensorExpr.prologue`)."""
    if not op.prologue:
        return []
    if not is_contraction(op):
        return ["a prologue on an op that is not a contraction"]
    found = []
    for slot, body in op.prologue:
        if slot not in (0, 1):
            found.append(f"a prologue on input {slot}: only inputs 0 and 1 take one")
            continue
        why = check_body(body, len(op.inputs))
        if why is not None:
            found.append(f"prologue of input {slot}: {why}")
            continue
        axes = set(op.inputs[slot].axis_set)
        found += [f"prologue of input {slot} reads input {k}, whose axes are not among the "
                  f"operand's" for k in body_inputs(body)
                  if not set(op.inputs[k].axis_set) <= axes]
    if len({slot for slot, _ in op.prologue}) != len(op.prologue):
        found.append("two prologues on one input")
    return found

