"""SRAM layout: buffers alive at the same time never share an address."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from t10c.codegen.memory import Rect, best_fit, layout, max_live, repair

RECTS = st.lists(st.tuples(st.integers(0, 20), st.integers(1, 8), st.integers(1, 12)),
                 min_size=1, max_size=25).map(
    lambda xs: [Rect(s, s + d, 8 * z) for s, d, z in xs])


def valid(rects: list[Rect], offsets: tuple[int, ...]) -> bool:
    for i, a in enumerate(rects):
        for j, b in enumerate(rects[:i]):
            if a.start < b.end and b.start < a.end:
                if offsets[i] < offsets[j] + b.size and offsets[j] < offsets[i] + a.size:
                    return False
    return all(o >= 0 for o in offsets)


@settings(max_examples=60, deadline=None)
@given(rects=RECTS)
def test_best_fit_is_valid_and_bounded(rects: list[Rect]) -> None:
    offsets = best_fit(rects)
    assert valid(rects, offsets)
    peak = max(o + r.size for o, r in zip(offsets, rects))
    assert peak >= max_live(rects)


@settings(max_examples=15, deadline=None)
@given(rects=RECTS)
def test_cp_sat_repair_is_valid(rects: list[Rect]) -> None:
    hint = best_fit(rects)
    peak = max(o + r.size for o, r in zip(hint, rects))
    fixed = repair(rects, hint, peak, time_limit_s=5)
    assert fixed is not None and valid(rects, fixed)
    assert max(o + r.size for o, r in zip(fixed, rects)) <= peak


def test_layout_reports_fragmentation() -> None:
    # two long buffers and a short one that must go above both
    rects = [Rect(0, 10, 16), Rect(0, 5, 8), Rect(5, 10, 8), Rect(2, 8, 8)]
    result = layout(rects, capacity=1024)
    assert valid(rects, result.offsets)
    assert result.live == 32 and result.peak >= 32
