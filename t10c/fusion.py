"""The fusion modes (``--fuse``): one table read by the CLI's help and choices and by the
driver, which asks the frontend for what each mode names (`frontend.to_graph`'s ``fuse``,
``epilogues``, ``prologues`` and ``siblings``; the rules are `frontend/fuse.py`'s and
`frontend.rewrite.fuse_sibling_matmuls`'). ``best`` is no mode of its own: it compiles under
each of `BEST_OF` and keeps the plan the planner predicts fastest (`driver._best_fusion`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fusion:
    """What one ``--fuse`` mode asks of the frontend, and its line of the CLI's help."""

    description: str
    inline: bool = True
    epilogues: bool = True
    prologues: bool = False
    siblings: bool = False


FUSIONS: dict[str, Fusion] = {
    "all": Fusion("elementwise chains inlined, elementwise consumers folded into the matmul "
                  "or reduction before them as epilogues, and the matmuls that read one "
                  "activation with weights of their own (q, k, v; gate, up) made one",
                  siblings=True),
    "epilogues": Fusion("all but those matmuls kept apart"),
    "prologues": Fusion("all, and Softmax's and LayerNorm's tails folded into the matmuls "
                        "that read them", prologues=True, siblings=True),
    "inline": Fusion("no epilogues (nor sibling matmuls made one)", epilogues=False),
    "none": Fusion("no fusion, one op per lowered node", inline=False, epilogues=False),
}

#: the modes ``--fuse best`` compiles under, the first kept among equals
BEST_OF = ("all", "epilogues", "prologues")

#: every ``--fuse`` value, the default first: the modes ``best`` tries, ``best``, the others
FUSE_CHOICES = (*BEST_OF, "best", *(m for m in FUSIONS if m not in BEST_OF))


def fuse_help() -> str:
    """``--fuse``'s help: each mode and what it does, the default first."""
    modes = [f"{name}{' (default)' if name == FUSE_CHOICES[0] else ''}: "
             + (FUSIONS[name].description if name in FUSIONS else
                f"whichever of {', '.join(BEST_OF[:-1])} and {BEST_OF[-1]} the planner "
                f"predicts faster (compiles {len(BEST_OF)} times)")
             for name in FUSE_CHOICES]
    return "; ".join(modes)
