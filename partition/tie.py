"""Tied layers: ops of identical layers that the whole-graph solve first gives one choice.

A transformer repeats one layer many times (bert-large: 24), so the whole-graph model holds
the same sub-model many times over. Ops whose fronts hold the same plans (up to the op's
name), whose cycles are the same, and whose neighbourhoods look the same (the same inputs
from the same kinds of producers over the same re-layout costs, and the same consumers) for
``rounds`` steps of colour refinement get one *tie class*. The solver (`solve.py`) first
solves the tied model, in which an op chooses its class's plan, then gives that choice to the
full model as its start.

A choice of the tied model is a choice of the full model (every op gets a plan of its own
front, under every op's own memory constraint, with the same objective terms), so the tied
solve can only supply a start, never exclude a plan: where memory forbids identical layers
(the knapsack of which layers warm their weights up, say), the tied model may be infeasible
or worse, and the full model, which unties every op, finds the mix.

Refinement stops after a few rounds on purpose: refined to the end, the colours tell every
layer from the next (by its distance to the embeddings), and nothing would be tied.
"""

from __future__ import annotations

import dataclasses
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
    colour = [table.setdefault((tuple(dataclasses.replace(p, op="") for p in f), tuple(c)),
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
