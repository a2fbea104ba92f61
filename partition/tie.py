"""Tied layers: ops of identical layers that the whole-graph solve first gives one choice.

A transformer repeats one layer many times (bert-large: 24), so the whole-graph model holds
the same sub-model many times over. Ops whose fronts hold the same plans (up to the op's
name), whose cycles are the same, and whose neighbourhoods look the same (the same inputs
from the same kinds of producers over the same re-layout costs, and the same consumers) for
``rounds`` steps of colour refinement get one *tie class*. `grouped` splits the classes by
groups of consecutive copies of the layer, so that a few layers can choose other plans than
the rest; the solver (`solve.py`) solves that reduced model, in which an op chooses its
grouped class's plan, then bounds and polishes its choice in the full model.

A choice of the reduced model is a choice of the full model (every op gets a plan of its own
front, under every op's own memory constraint, with the same objective terms), so it can only
supply a choice, never exclude a plan, and its bound is not the full model's.

Refinement stops after a few rounds on purpose: refined to the end, the colours tell every
layer from the next (by its distance to the embeddings), and nothing would be tied.
"""

from __future__ import annotations

from collections.abc import Sequence

from .plan import OpPlan

#: colour-refinement rounds: an op and its neighbours' neighbours look alike
ROUNDS = 2


def tie_classes(fronts: Sequence[Sequence[OpPlan]], cycles: Sequence[Sequence[int]],
                edges: Sequence[tuple[int, int, int, tuple]], rounds: int = ROUNDS
                ) -> list[int]:
    """Per op, its tie class (numbered in order of first appearance, so op order decides and
    the numbering is deterministic). ``edges`` are (src, dst, slot, cost matrix)."""
    table: dict[tuple, int] = {}
    colour = [table.setdefault((tuple(p.unnamed for p in f), tuple(c)),
                               len(table)) for f, c in zip(fronts, cycles)]
    costs: dict[tuple, int] = {}
    wired = [(s, d, slot, costs.setdefault(cost, len(costs))) for s, d, slot, cost in edges]
    for _ in range(rounds):
        ins: list[list[tuple]] = [[] for _ in colour]
        outs: list[list[tuple]] = [[] for _ in colour]
        for s, d, slot, k in wired:
            ins[d].append((slot, colour[s], k))
            outs[s].append((slot, colour[d], k))
        table = {}
        colour = [table.setdefault((colour[i], tuple(sorted(ins[i])), tuple(sorted(outs[i]))),
                                   len(table)) for i in range(len(colour))]
    return colour


def copies(tie: Sequence[int]) -> list[int]:
    """Per op, which copy of the repeated block it belongs to: the class with the most
    members (the first such) anchors the copies, its k-th member starting copy k (ops before
    the first member belong to copy 0). One copy per op when nothing repeats."""
    members: dict[int, list[int]] = {}
    for i, c in enumerate(tie):
        members.setdefault(c, []).append(i)
    anchor = max(members.values(), key=len)  # max keeps the first of equal lengths
    copy, k = [], 0
    for i in range(len(tie)):
        while k + 1 < len(anchor) and anchor[k + 1] <= i:
            k += 1
        copy.append(k)
    return copy


def group_sizes(n: int) -> list[int]:
    """Sizes 1, 2, 4, ... and the remainder, summing to ``n``: every count from 0 to ``n`` is
    the sum of some of them (so groups of copies tied within can mix variants in any
    proportion)."""
    sizes: list[int] = []
    size = 1
    while sum(sizes) + size <= n:
        sizes.append(size)
        size *= 2
    rest = n - sum(sizes)  # at most the next power of two: the counts stay contiguous
    return sizes + ([rest] if rest else [])


def grouped(tie: Sequence[int]) -> list[int]:
    """The tie classes split by groups of consecutive copies (`copies`, `group_sizes`): ops
    tie only within a group, so the tied model can give a few layers other plans than the
    rest (where memory binds, which layers keep their weights resident is a knapsack, and
    identical layers cannot solve it). Numbered in order of first appearance."""
    copy = copies(tie)
    group: list[int] = []
    for g, size in enumerate(group_sizes(max(copy) + 1)):
        group += [g] * size
    table: dict[tuple[int, int], int] = {}
    return [table.setdefault((c, group[k]), len(table)) for c, k in zip(tie, copy)]
