"""The elementwise functions of expression bodies, and the combines of reductions: one table.

Every fact about a body function lives here: its arity, its numpy implementation (what the
emulator and the reference executor compute), and its vector-unit cost (what the planner and
the emulator charge, and what fusion weighs). The IR (`t10c.ir`), the kernels, the cost model,
fusion and the program verifier all read this table, so adding a function is one line.

Comparisons and logic give 1.0 for true and 0.0 for false and read any nonzero value as true.
Implementations take and return float32 arrays (the kernels cast their results to float32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


def erf(x: np.ndarray) -> np.ndarray:
    """Error function (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7, and float32's
    rounding), in float32: the polynomial's passes in place, on one temporary each."""
    x = np.asarray(x, dtype=np.float32)
    a, t, poly = np.abs(x, out=np.empty_like(x)), np.empty_like(x), np.empty_like(x)
    np.multiply(a, np.float32(0.3275911), out=t)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    np.multiply(t, np.float32(1.061405429), out=poly)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(c)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(np.float32(1.0), poly, out=poly)
    return np.copysign(poly, x, out=poly)


@dataclass(frozen=True)
class Fn:
    """One body function: ``(name, arg, ...)`` with ``arity`` arguments."""

    name: str
    arity: int
    numpy: Callable[..., Any]
    #: vector-unit operations per evaluation; transcendental functions are software sequences
    #: on these cores (t10c modelling assumption)
    ops: int = 1


def _table(*fns: Fn) -> dict[str, Fn]:
    return {f.name: f for f in fns}


FNS: dict[str, Fn] = _table(
    # unary
    Fn("neg", 1, np.negative),
    Fn("exp", 1, np.exp, 4),
    Fn("log", 1, np.log, 4),
    Fn("sqrt", 1, np.sqrt, 4),
    Fn("rsqrt", 1, lambda x: 1.0 / np.sqrt(x), 4),
    Fn("recip", 1, lambda x: 1.0 / x, 2),
    Fn("erf", 1, erf, 8),
    Fn("tanh", 1, np.tanh, 8),
    Fn("relu", 1, lambda x: np.maximum(x, 0)),
    Fn("sigmoid", 1, lambda x: 1.0 / (1.0 + np.exp(-x)), 6),
    Fn("abs", 1, np.abs),
    Fn("square", 1, np.square),
    Fn("sin", 1, np.sin, 8),
    Fn("cos", 1, np.cos, 8),
    Fn("not", 1, lambda x: x == 0),
    Fn("floor", 1, np.floor),
    # binary
    Fn("add", 2, np.add),
    Fn("sub", 2, np.subtract),
    Fn("mul", 2, np.multiply),
    Fn("div", 2, np.divide, 2),
    Fn("max", 2, np.maximum),
    Fn("min", 2, np.minimum),
    Fn("pow", 2, np.power, 8),
    Fn("eq", 2, np.equal),
    Fn("lt", 2, np.less),
    Fn("le", 2, np.less_equal),
    Fn("gt", 2, np.greater),
    Fn("ge", 2, np.greater_equal),
    Fn("and", 2, lambda a, b: (a != 0) & (b != 0)),
    Fn("or", 2, lambda a, b: (a != 0) | (b != 0)),
    # ternary
    Fn("where", 3, lambda c, a, b: np.where(c != 0, a, b)),
)


@dataclass(frozen=True)
class Combine:
    """How a reduction folds values: its identity (padding, initial accumulator) and ufunc."""

    name: str
    identity: float
    ufunc: np.ufunc


COMBINES: dict[str, Combine] = {c.name: c for c in (Combine("sum", 0.0, np.add),
                                                    Combine("max", -np.inf, np.maximum))}


def fn_ops(name: str) -> int:
    """Vector operations of one evaluation of body function ``name``."""
    return FNS[name].ops


def body_cost(body: tuple[Any, ...]) -> int:
    """Vector operations of one evaluation of a body tree (leaves, an epilogue's ``("acc",)``
    included, are free; a ``take`` is one lookup)."""
    head = body[0]
    if head in ("in", "const", "acc"):
        return 0
    if head == "take":
        return 1
    return FNS[head].ops + sum(body_cost(arg) for arg in body[1:])


def body_inputs(body: tuple[Any, ...]) -> set[int]:
    """The inputs a body reads (``("in", k)`` leaves)."""
    if body[0] == "in":
        return {int(body[1])}
    if body[0] == "const":
        return set()
    return set().union(*(body_inputs(arg) for arg in body[1:]))


def check_body(body: object, inputs: int) -> str | None:
    """Why ``body`` is not a well-formed body over ``inputs`` inputs, or None if it is."""
    if not isinstance(body, tuple) or not body:
        return f"body node {body!r} is not a non-empty tuple"
    head = body[0]
    if head == "in":
        ok = len(body) == 2 and type(body[1]) is int and 0 <= body[1] < inputs
        return None if ok else f"body leaf {body!r} does not name one of {inputs} inputs"
    if head == "const":
        ok = len(body) == 2 and isinstance(body[1], int | float) and not isinstance(body[1], bool)
        return None if ok else f"body constant {body!r} is not a number"
    if head == "take":
        ok = (len(body) == 3 and all(type(i) is int and 0 <= i < inputs for i in body[1:])
              and body[1] != body[2])
        return None if ok else f"lookup {body!r} does not name two of {inputs} inputs"
    fn = FNS.get(head) if isinstance(head, str) else None
    if fn is None:
        return f"unknown body function {head!r}"
    if len(body) != fn.arity + 1:
        return f"{head} takes {fn.arity} arguments, the body gives it {len(body) - 1}"
    for arg in body[1:]:
        why = check_body(arg, inputs)
        if why is not None:
            return why
    return None
