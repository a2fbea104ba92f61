"""Reports on compared plans: Markdown and JSON for terminals and CI, and one self-contained
HTML page with plots (matplotlib, the optional extra ``t10c[report]``).

The HTML embeds every chart as a PNG data URI and carries its own styles: it opens without a
network. Sections: summary, time per op, Pareto fronts of the heaviest ops, SRAM per core on the
chip's grid, timeline.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from typing import Any

import numpy as np

from t10c.compare import Entry, speedup, sram_per_core
from t10c.strategies import DEFAULT_STRATEGIES

PHASES = ("compute", "shift", "sync", "reduce", "relayout", "fetch")
COLORS = {"compute": "#4c72b0", "shift": "#dd8452", "sync": "#8c8c8c", "reduce": "#c44e52",
          "relayout": "#55a868", "fetch": "#937860"}


def summary_rows(entries: list[Entry]) -> list[dict[str, Any]]:
    rows = []
    for e in entries:
        row: dict[str, Any] = {"model": e.model, "chip": e.chip.name, "strategy": e.strategy}
        if e.result is None:
            row["error"] = e.error
            rows.append(row)
            continue
        row.update({
            "latency_us": round(e.latency_s * 1e6, 2),
            "cycles": e.result.timeline.cycles,
            "roofline_fraction": round(e.roofline_fraction, 4),
            "peak_sram_bytes_per_core": e.result.timeline.peak_sram_bytes_per_core,
            "compile_s": round(e.compile_s, 2),
            "max_rel_err": float(f"{e.result.max_rel_err:.3g}"),
            "matches_onnxruntime": e.result.ok,
            "emulate_wall_s": round(e.result.emulate_wall_s, 3),
            "onnxruntime_wall_s": round(e.result.reference_wall_s, 4),
        })
        for base in DEFAULT_STRATEGIES[1:]:  # the baselines
            if e.strategy != base:
                value = speedup(entries, e, base)
                row[f"speedup_over_{base}"] = None if math.isnan(value) else round(value, 3)
        rows.append(row)
    return rows


def to_json(entries: list[Entry]) -> str:
    return json.dumps({"format": "t10c-compare/1", "rows": summary_rows(entries)}, indent=1)


def to_markdown(entries: list[Entry]) -> str:
    cols = ["model", "chip", "strategy", "latency_us", "roofline_fraction",
            "speedup_over_no-rotation", "speedup_over_vgm", "peak_sram_bytes_per_core",
            "compile_s", "max_rel_err"]
    head = ["model", "chip", "strategy", "latency (us)", "of roofline", "vs no-rotation",
            "vs vgm", "peak SRAM/core (B)", "compile (s)", "error vs ORT"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in summary_rows(entries):
        if "error" in row:
            lines.append(f"| {row['model']} | {row['chip']} | {row['strategy']} | "
                         f"failed: {row['error']} |" + " |" * (len(head) - 4))
            continue
        cells = []
        for c in cols:
            v = row.get(c)
            if c == "roofline_fraction" and v is not None:
                v = f"{100 * v:.1f}%"
            elif c.startswith("speedup") and v is not None:
                v = f"{v:.2f}x"
            cells.append("-" if v is None else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- HTML -------------------------------------------------------------------------------------

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _ops_chart(entry: Entry, top: int = 16) -> str:
    import matplotlib.pyplot as plt

    by_op = entry.result.timeline.by_op()  # type: ignore[union-attr]
    heavy = sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:top]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(heavy) + 1.2))
    names = [name for name, _ in heavy][::-1]
    left = np.zeros(len(names))
    for phase in PHASES:
        vals = np.array([by_op[n].get(phase, 0) for n in names], dtype=float)
        if vals.any():
            ax.barh(names, vals, left=left, color=COLORS[phase], label=phase)
            left += vals
    ax.set_xlabel("cycles")
    ax.set_title(f"{entry.model} on {entry.chip.name} ({entry.strategy}): heaviest ops")
    ax.legend(loc="lower right", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    return _png(fig)


def _strategy_chart(entries: list[Entry]) -> str:
    import matplotlib.pyplot as plt

    ok = [e for e in entries if e.result]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(ok) + 1.2))
    labels = [f"{e.model} / {e.chip.name} / {e.strategy}" for e in ok][::-1]
    left = np.zeros(len(ok))
    for phase in PHASES:
        vals = np.array([sum(r.cycles for r in e.result.timeline.records  # type: ignore
                             if r.phase == phase) for e in ok][::-1], dtype=float)
        if vals.any():
            ax.barh(labels, vals, left=left, color=COLORS[phase], label=phase)
            left += vals
    ax.set_xlabel("cycles")
    ax.set_title("time by phase per plan")
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def _front_charts(entries: list[Entry], heavy: int) -> list[tuple[str, str]]:
    import matplotlib.pyplot as plt

    from t10c.partition import search_op_front

    base = next((e for e in entries if e.strategy == "t10" and e.compiled), None)
    if base is None:
        return []
    c = base.compiled
    assert c is not None
    order = sorted(range(len(c.plan.ops)), key=lambda i: -c.plan.ops[i].cycles.total)[:heavy]
    charts = []
    for i in order:
        op = c.graph.ops[i]
        found = search_op_front(c.graph, op, base.chip, c.plan.dtype, c.options.search)
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot([p.hot_bytes_per_core for p in found.front],
                [p.cycles.total for p in found.front], "o-", color="#999999", label="front")
        for e in entries:
            if e.compiled and e.chip.name == base.chip.name and e.model == base.model:
                chosen = e.compiled.plan.ops[i]
                ax.plot([chosen.hot_bytes_per_core], [chosen.cycles.total], "*",
                        markersize=14, label=f"{e.strategy}'s choice")
        ax.set_xlabel("hot bytes per core")
        ax.set_ylabel("cycles")
        ax.set_title(op.name, fontsize=9)
        ax.legend(fontsize=7)
        charts.append((op.name, _png(fig)))
    return charts


def _sram_chart(entry: Entry) -> str:
    import matplotlib.pyplot as plt

    peak = sram_per_core(entry.compiled)  # type: ignore[arg-type]
    rows, cols = entry.chip.grid
    if rows == 1:  # an all-to-all chip has no geometry: lay tiles out in index order
        rows = int(math.sqrt(len(peak)))
        while len(peak) % rows:
            rows -= 1
        cols = len(peak) // rows
    fig, ax = plt.subplots(figsize=(7, 4))
    image = ax.imshow(peak.reshape(rows, cols) / 1024, cmap="viridis", aspect="auto",
                      vmin=0, vmax=entry.chip.sram_bytes_per_core / 1024)
    fig.colorbar(image, ax=ax, label="peak KiB in use")
    ax.set_title(f"SRAM per core, {entry.model} on {entry.chip.name} ({entry.strategy})")
    ax.set_xlabel("core (column)")
    ax.set_ylabel("core (row)")
    return _png(fig)


def _timeline_chart(entry: Entry) -> str:
    import matplotlib.pyplot as plt

    records = entry.result.timeline.records  # type: ignore[union-attr]
    fig, ax = plt.subplots(figsize=(10, 2.6))
    for lane, phase in enumerate(PHASES):
        spans = [(r.start, r.cycles) for r in records if r.phase == phase and r.cycles]
        if spans:
            ax.broken_barh(spans, (lane - 0.4, 0.8), color=COLORS[phase])
    ax.set_yticks(range(len(PHASES)), PHASES)
    ax.set_xlabel("cycles")
    ax.set_title(f"timeline, {entry.model} on {entry.chip.name} ({entry.strategy})")
    return _png(fig)


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#f0f0f0}img{max-width:100%}section{margin-bottom:2em}"""


def to_html(entries: list[Entry], heavy: int = 3) -> str:
    """The whole report as one self-contained HTML page."""
    ok = [e for e in entries if e.result]
    rows = summary_rows(entries)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    table = ["<table><tr>" + "".join(f"<th>{html.escape(k)}</th>" for k in keys) + "</tr>"]
    for r in rows:
        table.append("<tr>" + "".join(f"<td>{html.escape(str(r.get(k, '')))}</td>"
                                      for k in keys) + "</tr>")
    table.append("</table>")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>t10c report</title>"
             f"<style>{STYLE}</style></head><body><h1>t10c plan comparison</h1>",
             "<section id='summary'><h2>Summary</h2>", *table,
             "<p>Latency is emulated chip time; the roofline is the model's FLOPs at the chip's "
             "peak matrix rate; speedups compare strategies on the same model and chip.</p>"
             "</section>"]
    if ok:
        parts.append("<section id='per-op'><h2>Time per op</h2>")
        parts.append(f"<img alt='phases per plan' src='{_strategy_chart(ok)}'>")
        for e in ok:
            parts.append(f"<img alt='ops {html.escape(e.strategy)}' src='{_ops_chart(e)}'>")
        parts.append("</section><section id='pareto'><h2>Pareto fronts of the heaviest ops</h2>")
        for name, src in _front_charts(ok, heavy):
            parts.append(f"<img alt='front {html.escape(name)}' src='{src}'>")
        parts.append("</section><section id='sram'><h2>SRAM per core</h2>")
        for e in ok:
            parts.append(f"<img alt='sram {html.escape(e.strategy)}' src='{_sram_chart(e)}'>")
        parts.append("</section><section id='timeline'><h2>Timeline</h2>")
        for e in ok:
            parts.append(f"<img alt='timeline {html.escape(e.strategy)}' "
                         f"src='{_timeline_chart(e)}'>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)
