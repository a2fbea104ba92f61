"""Elementwise fusion: elementwise ops are inlined into the ops that read them.

The producer's body replaces the consumer's ``("in", k)`` leaf, with the producer's axes renamed
to the consumer's through the operand that read it (windows in the producer's own operands are
renamed term by term), and its inputs appended to the consumer's (identical operands merged).
The intermediate tensor then never exists on chip: GELU written as five ONNX nodes becomes one
expression, a LayerNorm or RMSNorm written as ReduceMean, Sub, Pow, Sqrt and Div becomes a
reduce, a reduce and one elementwise step, and a Slice or Concat read by an elementwise op
becomes windows in that op's operands.

An elementwise producer P is inlined into its reader C (which must read P point by point, not
through a window, and must not be an embedding lookup) when:

1. P has one reader and C's iteration space is P's (no point computed twice); or
2. P is a pure copy (a Slice, Expand, Split piece: body ``in0``): an index map costs nothing
   to compose, so it folds into any reader, a matmul included (its source takes the slot P
   had, so that a matmul stays input 0 times input 1); or
3. P is cheap and C is not a contraction: C may be wider than P (a row statistic such as
   ``1/sqrt(var + eps)`` recomputed for every element of the row, as the LayerNormalization
   lowering does), and P may have several such readers when it is a normalising step, i.e. it
   reads a computed tensor broadcast along some of its axes (``x - mean``, ``exp(x - max)``);
   each reader then recomputes it instead of P being materialised;
4. C reads P through shifts (one-axis, unit-stride windows: a Concat's pieces), P is cheap, has
   C as its only reader and gives zero on zeros, and every input of P is read along each
   shifted dimension by a shift too, such that wherever C's read leaves P's output (and reads
   its zero padding) the composed read leaves that input as well (`_shifted_read_exact`): the
   windows compose (`_rename`) and C computes the same values. rotate_half's Slice and Neg
   (LLaMA's rotary embedding) thus fold into the rotary Add, one op instead of three.

5. P is cheap and an epilogue reads it as an extra operand (a decode step's
   ``exp(s_new - max)``, which the Softmax's sum adds in its epilogue and the new token's
   context scales by): every reader computes P itself, the epilogues of reductions on their
   output's tiles as in rule iv below (where that adds at most one extra operand: each is
   laid out like the result, which for a reduction is its rows' statistics, few points; a
   contraction's result is as large as P, and GPT-2's embedding sum recomputed in the first
   residual epilogue made it slower), the others (no contractions) inlining it as if they
   were its only reader. P's op, barrier and re-layout are gone, and the ops around it
   become neighbours (the Softmax's max and sum, which then read one copy of the scores:
   on the LLaMA-3-8B decode step on wse2, with `partition._share_layouts`, 442,890 to
   426,352 cycles).

A producer that is not cheap is not inlined where the reader's body reads it several times
(``where(isnan(p), 0, p)``): the body has no shared subexpressions. Never into a contraction
otherwise: that would recompute P for every point of the extra axes and
take the matmul off the matrix unit.

Epilogues. An elementwise op C is folded into the reduction or contraction P whose result it
reads (`fuse_epilogue`), as P's ``epilogue`` (`t10c.ir.TensorExpr`), when:

a. P's result has no other reader (and is no graph output nor read through a view);
b. C's iteration space is P's output space, read point by point (no window, no axis twice);
c. C's other inputs are read by plain axes only (a bias, a scale, a mask, a residual); they
   become P's ``extra`` operands, which the planner lays out like P's result.

The fused op takes C's place in the op order (C's inputs all exist there) and writes C's
output. Epilogues compose, so a bias, a scale and a GELU after one matmul become one op.
This is tried before inlining at every round, so that a row statistic such as
``1/sqrt(var + eps)`` is computed once per row by its reduction rather than recomputed for
every element by its reader.

Prologues. What neither rule takes, an elementwise op P read by contractions (Softmax's
``exp(x - max) / sum`` before the context MatMul, LayerNorm's ``(x - mean) * rsqrt(var + eps)
* g + b`` before q, k and v), is folded into each of its readers C (`fuse_prologue`), as a
prologue of the operand that read it (`t10c.ir.TensorExpr.prologue`), when:

i. C is a contraction reading P point by point as one of its two operands, with no prologue
   there yet, and P's body does not read C's other operand;
ii. P has an input spanning all of the operand's axes (``x``), which becomes the stored
    operand; P's other inputs (max, sum, mean, var, scale, bias) index subsets of them and
    become C's inputs past the first two, planned and re-laid out like any other input;
iii. P has one reader, or several that each recompute it where that is cheap (at most
     `RECOMPUTE_OPS` vector operations per point): every reader a contraction as in (i) or a
     fused op whose epilogue reads P as an extra operand (iv), at least one a contraction;
iv. an epilogue reading P (the next layer's residual add) takes P's body in its place, P's
    inputs becoming extra operands aligned with its output (rule c).

P is then never materialised: its op, its barrier and its re-layout are gone, and its work
is done on each reader's tiles (once per compute step: on a replicated operand tile, as many
times as the tile has copies). That pays where tiles are small and barriers dear: emulated on
IPU-MK2, bert-mini is 6% faster with prologues and bert-base 22% slower (its 768-wide rows are
transformed by every copy of the tile). Prologues are therefore asked for
(``prologues=True``, ``--fuse prologues``), not the default.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np

from t10c.elementwise import FNS, body_cost
from t10c.ir import Body, Dim, Graph, Operand, TensorExpr, Window, is_contraction, prologue_of

#: vector operations per point up to which a producer counts as cheap (rule 3)
CHEAP_OPS = 8
#: vector operations per point up to which a prologue is recomputed by each of several readers
#: (rule iii: LayerNorm's normalise, 9, by q, k, v and the residual)
RECOMPUTE_OPS = 12


def _reindex(body: Body, mapping: dict[int, Body]) -> Body:
    if body[0] == "in":
        return mapping[body[1]]
    if body[0] == "const":
        return body
    return (body[0], *(_reindex(arg, mapping) for arg in body[1:]))


def _uses(body: Body, slot: int) -> int:
    if body[0] == "in":
        return int(body[1] == slot)
    if body[0] == "const":
        return 0
    return sum(_uses(arg, slot) for arg in body[1:])


def _rename(d: Dim, rename: dict[str, Dim]) -> Dim:
    """Dimension ``d`` of a producer's operand in its reader's axes (``rename``: each producer
    output axis as the reader indexes it, a plain axis or a window): windows compose, their
    terms and offsets substituted."""
    if not isinstance(d, Window):
        return rename[d]
    coefs: dict[str, int] = {}
    offset = d.offset
    for a, c in d.terms:
        r = rename[a]
        for b, cb in (r.terms if isinstance(r, Window) else ((r, 1),)):
            coefs[b] = coefs.get(b, 0) + c * cb
        offset += c * r.offset if isinstance(r, Window) else 0
    return Window(tuple(coefs.items()), offset)


def _shift(d: Dim) -> tuple[str, int] | None:
    """(axis, offset) of a plain axis or a one-axis unit-stride window; None otherwise."""
    if not isinstance(d, Window):
        return d, 0
    if len(d.terms) == 1 and d.terms[0][1] == 1:
        return d.terms[0][0], d.offset
    return None


def _zero_preserving(body: Body) -> bool:
    """Whether the body gives 0 where every input reads 0 (the padding of a window)."""
    def at_zero(node: Body) -> float:
        if node[0] == "in":
            return 0.0
        if node[0] == "const":
            return float(node[1])
        return float(FNS[node[0]].numpy(*(np.float64(at_zero(a)) for a in node[1:])))

    with np.errstate(all="ignore"):  # (a take is never inlined: its producer is skipped)
        return at_zero(body) == 0.0


def _shifted_read_exact(producer: TensorExpr, consumer: TensorExpr, slot: int,
                        shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether the consumer's shifted (windowed) read of an elementwise producer may read the
    producer's inputs through the composed windows instead (`_inline`): every windowed
    dimension is a unit shift of one axis, and where the read leaves the producer's output
    (reading the padding, zero: a Concat's pieces are such reads) the composed reads leave
    every input of the producer too, whose body gives zero on zeros. A rotate-half (Slice,
    Neg, Concat) then costs its reader nothing."""
    read = consumer.inputs[slot]
    if not _zero_preserving(producer.body):
        return False
    for k, d in enumerate(read.axes):
        s = _shift(d)
        if s is None:
            return False
        axis, offset = s
        lo, hi = offset, offset + consumer.extents[axis] - 1  # positions read of dimension k
        pa = str(producer.output.axes[k])  # (output dimensions are plain axes)
        extent = producer.extents[pa]
        if 0 <= lo and hi < extent:
            continue  # within the producer's output: nothing read from the padding
        for o in producer.inputs:
            at = [j for j, e in enumerate(o.axes) if pa in (e.axes if isinstance(e, Window)
                                                            else (e,))]
            if len(at) != 1:
                return False  # broadcast along it (no padding to read), or read twice
            t = _shift(o.axes[at[0]])
            if t is None or t[0] != pa:
                return False
            size = shapes[o.tensor][at[0]]
            if lo < 0 and not (t[1] - 1 < 0 or lo + t[1] >= size):
                return False  # reads before the output that would land inside the input
            if hi >= extent and not (extent + t[1] >= size or hi + t[1] < 0):
                return False  # reads past the output that would land inside the input
    return True


def _inline(producer: TensorExpr, consumer: TensorExpr, slot: int) -> TensorExpr:
    """``consumer`` computing ``producer``'s body in place of its input ``slot``. A copy's
    source takes the slot's place among the inputs (a matmul whose operand was a Slice stays
    a matmul of input 0 by input 1: `t10c.ir.is_contraction`); other producers' inputs come
    after the consumer's own."""
    read = consumer.inputs[slot]
    rename: dict[str, Dim] = {str(a): d for a, d in zip(producer.output.axes, read.axes)}
    inputs = [o for k, o in enumerate(consumer.inputs) if k != slot]
    leaves: dict[int, Body] = {}
    for k, o in enumerate(producer.inputs):
        moved = Operand(o.tensor, tuple(_rename(d, rename) for d in o.axes))
        if moved not in inputs:
            inputs.insert(slot, moved) if _is_copy(producer) else inputs.append(moved)
        leaves[k] = ("in", inputs.index(moved))
    inlined = _reindex(producer.body, leaves)
    mapping: dict[int, Body] = {}
    for k, o in enumerate(consumer.inputs):
        mapping[k] = inlined if k == slot else ("in", inputs.index(o))
    return replace(consumer, inputs=tuple(inputs), body=_reindex(consumer.body, mapping))


def _is_copy(op: TensorExpr) -> bool:
    return op.body == ("in", 0) and len(op.inputs) == 1


def _normalising(op: TensorExpr, computed: set[str]) -> bool:
    """Reads a computed tensor along fewer axes than it has (``x - mean``)."""
    return any(o.tensor in computed and len(o.axis_set) < len(op.axes) for o in op.inputs)


def _may_inline(producer: TensorExpr, consumer: TensorExpr, slot: int, readers: int,
                computed: set[str], max_inputs: int, shapes: dict[str, tuple[int, ...]]
                ) -> bool:
    read = consumer.inputs[slot]
    if consumer.body[0] == "take":
        return False
    if not all(isinstance(d, str) for d in read.axes):
        # read through a window: inlining would recompute the halo, but for a cheap producer
        # read by one op through shifts (rule 4 of the module doc)
        if (readers != 1 or is_contraction(consumer) or body_cost(producer.body) > CHEAP_OPS
                or not _shifted_read_exact(producer, consumer, slot, shapes)):
            return False
    if consumer.prologue:
        return False  # its inputs are a prologue's as well as the body's
    if len(set(read.axes)) != len(read.axes):
        return False
    if len(consumer.inputs) - 1 + len(producer.inputs) > max_inputs:
        return False
    if _is_copy(producer):
        return True
    if _uses(consumer.body, slot) > 1 and body_cost(producer.body) > 2:
        return False  # read several times in one body: each read would recompute it
    same_space = set(read.axes) == set(consumer.axis_names)
    if readers == 1 and same_space:
        return True
    if is_contraction(consumer) or body_cost(producer.body) > CHEAP_OPS:
        return False
    return readers == 1 or _normalising(producer, computed)


def _epilogue_leaves(body: Body, slots: dict[int, Body]) -> Body:
    """C's body as an epilogue: P's result becomes ``("acc",)``, other inputs extra leaves."""
    if body[0] == "in":
        return slots[body[1]]
    if body[0] == "const":
        return body
    return (body[0], *(_epilogue_leaves(arg, slots) for arg in body[1:]))


def _fold(producer: TensorExpr, consumer: TensorExpr, slots: list[int],
          shapes: dict[str, tuple[int, ...]], max_extra: int) -> TensorExpr | None:
    """P with C as its epilogue (rules a-c of the module doc), or None where they fail."""
    if consumer.combine is not None or consumer.body[0] == "take":
        return None
    read = consumer.inputs[slots[0]]
    if any(consumer.inputs[k] != read for k in slots):
        return None  # read at two different points
    plain = all(isinstance(d, str) for d in read.axes) and len(set(read.axes)) == len(read.axes)
    if not plain or set(read.axes) != set(consumer.axis_names):
        return None
    rename = dict(zip(read.axes, producer.output.axes))
    extra = list(producer.extra)
    leaves: dict[int, Body] = {}
    for k, o in enumerate(consumer.inputs):
        if k in slots:
            leaves[k] = ("acc",)
            continue
        plain = all(isinstance(d, str) and d in rename for d in o.axes)
        if not plain or len(set(o.axes)) != len(o.axes):
            return None
        if tuple(shapes[o.tensor]) != tuple(consumer.extents[str(d)] for d in o.axes):
            return None  # a broadcast or partial read: not an output-aligned operand
        moved = Operand(o.tensor, tuple(rename[str(d)] for d in o.axes))
        if moved not in extra:
            extra.append(moved)
        leaves[k] = ("in", extra.index(moved))
    if len(extra) > max_extra:
        return None
    epilogue = _epilogue_leaves(consumer.body, leaves)
    if producer.epilogue is not None:  # compose: C applies to what P's epilogue gave
        epilogue = _substitute_acc(epilogue, producer.epilogue)
    output = Operand(consumer.output.tensor,
                     tuple(rename[str(d)] for d in consumer.output.axes))
    return replace(producer, output=output, epilogue=epilogue, extra=tuple(extra),
                   source=f"{producer.source} + {consumer.source}".strip(" +"))


def _substitute_acc(body: Body, value: Body) -> Body:
    if body == ("acc",):
        return value
    if body[0] in ("in", "const"):
        return body
    return (body[0], *(_substitute_acc(arg, value) for arg in body[1:]))


class _Ops:
    """The ops being fused, in order, with what each pass of `fuse_elementwise` asks of them
    kept in step instead of rebuilt: who reads each tensor (``sites``, in op then slot
    order) and which tensors are computed. A folded op leaves a hole (None), so the others
    keep their indices; the holes go at the end (`fused`)."""

    def __init__(self, graph: Graph) -> None:
        self.ops: list[TensorExpr | None] = list(graph.ops)
        self._reads: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for ci, op in enumerate(graph.ops):
            self._enter(ci, op)
        roots = {v: graph.root(v) for v in graph.views}
        self._views: dict[str, list[str]] = defaultdict(list)
        for v, root in roots.items():
            self._views[root].append(v)
        produced = {op.output.tensor for op in graph.ops}
        # computed tensors, views of them included (constants and inputs are not)
        self.computed = produced | {v for v, root in roots.items() if root in produced}

    def _enter(self, ci: int, op: TensorExpr) -> None:
        for slot, o in enumerate(op.reads):
            self._reads[o.tensor].append((ci, slot))

    def live(self) -> list[tuple[int, TensorExpr]]:
        return [(i, op) for i, op in enumerate(self.ops) if op is not None]

    def op(self, i: int) -> TensorExpr:
        op = self.ops[i]
        assert op is not None
        return op

    def sites(self, tensor: str) -> list[tuple[int, int]]:
        """The (op, read slot) pairs that read ``tensor``."""
        return sorted(self._reads.get(tensor, ()))

    def replace(self, ci: int, op: TensorExpr | None) -> None:
        for t in {o.tensor for o in self.op(ci).reads}:
            self._reads[t] = [s for s in self._reads[t] if s[0] != ci]
        self.ops[ci] = op
        if op is not None:
            self._enter(ci, op)

    def fold(self, pi: int, into: dict[int, TensorExpr]) -> None:
        """Op ``pi`` is gone, its readers replaced by ``into``: nothing reads its result
        any more (a tensor read through a view is never folded)."""
        for ci, op in into.items():
            self.replace(ci, op)
        out = self.op(pi).output.tensor
        self.replace(pi, None)
        self.computed.discard(out)
        self.computed.difference_update(self._views.get(out, ()))

    def fused(self) -> tuple[TensorExpr, ...]:
        return tuple(op for op in self.ops if op is not None)


def fuse_epilogue(ops: _Ops, keep: set[str], shapes: dict[str, tuple[int, ...]],
                  max_extra: int = 4) -> bool:
    """Fold one elementwise op into the reduction before it (module doc, rules a-c), in
    place; True if one was folded."""
    for pi, producer in ops.live():
        out = producer.output.tensor
        if producer.combine is None or producer.body[0] == "take" or out in keep:
            continue
        sites = ops.sites(out)
        readers = {ci for ci, _ in sites}
        if len(readers) != 1:
            continue
        ci = readers.pop()
        slots = [slot for _, slot in sites]
        if any(slot >= len(ops.op(ci).inputs) for slot in slots):
            continue  # read as another op's extra operand
        fused = _fold(producer, ops.op(ci), slots, shapes, max_extra)
        if fused is None:
            continue
        ops.fold(pi, {ci: fused})
        return True
    return False


def _as_prologue(producer: TensorExpr, consumer: TensorExpr, slot: int) -> TensorExpr | None:
    """Contraction C reading P's body in place of input ``slot`` (rules i-iii of the module
    doc), or None where they fail."""
    read = consumer.inputs[slot]
    if (not is_contraction(consumer) or slot > 1 or prologue_of(consumer, slot) is not None
            or not all(isinstance(d, str) for d in read.axes)
            or len(set(read.axes)) != len(read.axes)
            or len(read.axes) != len(producer.output.axes)):
        return None
    rename = dict(zip(producer.output.axes, read.axes))
    moved = []
    for o in producer.inputs:
        if not all(isinstance(d, str) for d in o.axes):
            return None  # a windowed read (a Slice): the tile would need a halo
        moved.append(Operand(o.tensor, tuple(rename[str(d)] for d in o.axes)))
    # the stored operand: the first input that spans the whole operand (x of x - mean)
    base = next((o for o in moved if set(o.axes) == set(read.axes)
                 and len(set(o.axes)) == len(o.axes)), None)
    if base is None:
        return None
    inputs = list(consumer.inputs)
    inputs[slot] = base
    leaves: dict[int, Body] = {}
    for k, o in enumerate(moved):
        if o not in inputs:
            inputs.append(o)
        leaves[k] = ("in", inputs.index(o))
    body = _reindex(producer.body, leaves)
    if any(j != slot and j < 2 and _uses(body, j) for j in range(2)):
        return None  # reads the other matmul operand: not a transform of this one's tile
    return replace(consumer, inputs=tuple(inputs),
                   prologue=tuple(sorted((*consumer.prologue, (slot, body)))),
                   source=f"{producer.source} + {consumer.source}".strip(" +"))


def _leaf_into_epilogue(body: Body, k: int, value: Body, old: dict[int, int]) -> Body:
    """An epilogue with extra leaf k replaced by ``value`` and the other extra leaves renumbered
    through ``old``."""
    if body[0] == "in":
        return value if body[1] == k else ("in", old[body[1]])
    if body[0] in ("const", "acc"):
        return body
    return (body[0], *(_leaf_into_epilogue(arg, k, value, old) for arg in body[1:]))


def _recomputed(producer: TensorExpr, ops: _Ops, sites: list[tuple[int, int]],
                max_inputs: int, shapes: dict[str, tuple[int, ...]]
                ) -> dict[int, TensorExpr] | None:
    """P's readers each computing it (rule 5 of the module doc), by reader; None where that
    rule does not apply."""
    if body_cost(producer.body) > CHEAP_OPS \
            or all(slot < len(ops.op(ci).inputs) for ci, slot in sites):
        return None
    out: dict[int, TensorExpr] = {}
    for ci, slot in sites:
        reader = ops.op(ci)
        if slot >= len(reader.inputs):
            folded = None if is_contraction(reader) else _recompute_in_epilogue(
                producer, reader, slot - len(reader.inputs), shapes)
            if folded is not None and len(folded.extra) > len(reader.extra) + 1:
                folded = None  # each added extra is one more input laid out like the result
        elif not is_contraction(reader) and _may_inline(producer, reader, slot, 1,
                                                        ops.computed, max_inputs, shapes):
            folded = _inline(producer, reader, slot)
        else:
            folded = None
        if folded is None:
            return None
        out[ci] = folded
    return out


def _recompute_in_epilogue(producer: TensorExpr, consumer: TensorExpr, k: int,
                           shapes: dict[str, tuple[int, ...]]) -> TensorExpr | None:
    """C whose epilogue reads P's body in place of ``extra[k]`` (rule iv of the module doc),
    or None where it fails."""
    read = consumer.extra[k]
    if consumer.epilogue is None or len(read.axes) != len(producer.output.axes):
        return None
    rename = dict(zip(producer.output.axes, read.axes))
    kept = [o for j, o in enumerate(consumer.extra) if j != k]
    old = {j: kept.index(o) for j, o in enumerate(consumer.extra) if j != k}
    leaves: dict[int, Body] = {}
    for j, o in enumerate(producer.inputs):
        if not all(isinstance(d, str) for d in o.axes) or len(set(o.axes)) != len(o.axes):
            return None
        moved = Operand(o.tensor, tuple(rename[str(d)] for d in o.axes))
        if tuple(shapes[o.tensor]) != tuple(consumer.extents[str(d)] for d in moved.axes):
            return None  # a broadcast read: not an output-aligned operand (rule c)
        if moved not in kept:
            kept.append(moved)
        leaves[j] = ("in", kept.index(moved))
    value = _reindex(producer.body, leaves)
    return replace(consumer, extra=tuple(kept),
                   epilogue=_leaf_into_epilogue(consumer.epilogue, k, value, old),
                   source=f"{producer.source} + {consumer.source}".strip(" +"))


def fuse_prologue(ops: _Ops, keep: set[str], shapes: dict[str, tuple[int, ...]]) -> bool:
    """Fold one elementwise op into the contractions that read it, as their prologue (module
    doc, rules i-iii), in place; True if one was folded."""
    for pi, producer in ops.live():
        out = producer.output.tensor
        if (producer.combine is not None or producer.body[0] == "take" or out in keep
                or _is_copy(producer)):
            continue
        sites = ops.sites(out)
        if not sites or len({ci for ci, _ in sites}) != len(sites):
            continue
        if len(sites) > 1 and body_cost(producer.body) > RECOMPUTE_OPS:
            continue  # each reader recomputes it: only where that is cheap
        fused = [_as_prologue(producer, ops.op(ci), slot) if slot < len(ops.op(ci).inputs)
                 else _recompute_in_epilogue(producer, ops.op(ci),
                                             slot - len(ops.op(ci).inputs), shapes)
                 for ci, slot in sites]
        if any(f is None for f in fused) or not any(
                slot < len(ops.op(ci).inputs) for ci, slot in sites):
            continue  # (an op read only by epilogues is left to epilogue fusion)
        ops.fold(pi, {ci: f for (ci, _), f in zip(sites, fused)})  # type: ignore[misc]
        return True
    return False


def fuse_elementwise(graph: Graph, max_inputs: int = 6, epilogues: bool = True,
                     prologues: bool = False) -> Graph:
    """Inline elementwise producers into their readers and, with ``epilogues``, fold
    elementwise consumers into reductions, and, with ``prologues`` too, elementwise producers
    into the contractions that read them (rules in the module doc), repeatedly."""
    # tensors read through a view (or output through one) must exist as they are
    viewed = {o.tensor for op in graph.ops for o in op.reads if o.tensor in graph.views}
    keep = {graph.root(t) for t in (*graph.outputs, *viewed)}
    shapes = {name: t.shape for name, t in graph.tensors.items()}
    ops = _Ops(graph)
    changed = True
    while changed:
        changed = epilogues and fuse_epilogue(ops, keep, shapes)
        if changed:
            continue
        for pi, producer in ops.live():
            out = producer.output.tensor
            if producer.combine is not None or producer.body[0] == "take" or out in keep:
                continue
            sites = ops.sites(out)
            if not sites or len({ci for ci, _ in sites}) != len(sites):
                continue  # one reader reading it twice
            if all(slot < len(ops.op(ci).inputs)
                   and _may_inline(producer, ops.op(ci), slot, len(sites), ops.computed,
                                   max_inputs, shapes)
                   for ci, slot in sites):
                ops.fold(pi, {ci: _inline(producer, ops.op(ci), slot) for ci, slot in sites})
                changed = True
                break
            recomputed = _recomputed(producer, ops, sites, max_inputs, shapes) \
                if epilogues else None
            if recomputed is not None:
                ops.fold(pi, recomputed)
                changed = True
                break
        if not changed and epilogues and prologues:  # what is left: tails read by matmuls
            changed = fuse_prologue(ops, keep, shapes)
    return prune(replace(graph, ops=ops.fused()))


def prune(graph: Graph) -> Graph:
    """Drop the views and tensors that no op reads and no output is (chains included)."""
    used = {o.tensor for op in graph.ops for o in (*op.operands, *op.extra)}
    used |= set(graph.outputs)
    used |= set(graph.inputs)
    frontier = [t for t in used if t in graph.views]
    while frontier:
        source = graph.views[frontier.pop()].source
        if source not in used:
            used.add(source)
            if source in graph.views:
                frontier.append(source)
    return replace(graph, tensors={k: v for k, v in graph.tensors.items() if k in used},
                   views={k: v for k, v in graph.views.items() if k in used},
                   constants={k: v for k, v in graph.constants.items() if k in used})
