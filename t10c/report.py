"""Reports on compared plans: Markdown and JSON for terminals and CI, and one self-contained
HTML page with plots (matplotlib, the optional extra ``t10c[report]``).

The HTML embeds every chart as a PNG data URI and carries its own styles: it opens without a
network. Sections: summary (human headers), latency by phase against the roofline and the ideal,
time per op of every strategy on one scale in program order (and the ops that differ most),
predicted against emulated per op, SRAM over time with the capacity, Pareto fronts of the
heaviest distinct ops with the SRAM per core and every strategy's choice, peak SRAM per core
(on the grid of a mesh; sorted on an all-to-all chip, which has no geometry), timeline.
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
from t10c.partition.refine import adaptive, trials_for
from t10c.strategies import DEFAULT_STRATEGIES

PHASES = ("compute", "shift", "sync", "reduce", "relayout", "fetch")
COLORS = {"compute": "#4c72b0", "shift": "#dd8452", "sync": "#8c8c8c", "reduce": "#c44e52",
          "relayout": "#55a868", "fetch": "#937860"}


def summary_rows(entries: list[Entry]) -> list[dict[str, Any]]:
    rows = []
    for e in entries:
        row: dict[str, Any] = {"model": e.model, "chip": e.chip.name, "strategy": e.strategy}
        if e.batch is not None:
            row["batch"] = e.batch
        if e.result is None:
            row["error"] = e.error
            rows.append(row)
            continue
        row.update({
            "latency_us": round(e.latency_s * 1e6, 2),
            "cycles": e.result.timeline.cycles,
            "predicted_cycles": e.compiled.plan.total_cycles if e.compiled else None,
            "roofline_fraction": round(e.roofline_fraction, 4),
            "ideal_fraction": round(e.ideal_fraction, 4),
            "exchange_fraction": (None if math.isnan(e.exchange_fraction)
                                  else round(e.exchange_fraction, 4)),
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
#
# Every chart is a function of all the compared entries, so that strategies share one scale:
# a reader compares heights, not axis labels. Charts are drawn 1350 px wide at most (15 in at
# 90 dpi) and the page is 1380 px wide, so that nothing is cut at 1400 px.

DPI = 90
WIDE = 15.0  # inches: 1350 px at DPI
MARKERS = ("*", "s", "^", "D", "o", "v", "P", "X")

#: the summary table's columns: summary_rows' key, and the header a person reads
HEADERS = {
    "model": "Model", "chip": "Chip", "strategy": "Strategy",
    "latency_us": "Latency (µs)", "cycles": "Emulated cycles",
    "predicted_cycles": "Predicted cycles", "roofline_fraction": "Of roofline",
    "ideal_fraction": "Of ideal", "speedup_over_no-rotation": "vs no-rotation",
    "speedup_over_vgm": "vs VGM", "peak_sram_bytes_per_core": "Peak SRAM per core (KiB)",
    "compile_s": "Compile (s)", "emulate_wall_s": "Emulation (s)",
    "onnxruntime_wall_s": "onnxruntime (s)", "max_rel_err": "Error vs onnxruntime",
    "matches_onnxruntime": "Matches",
}


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _label(e: Entry, entries: list[Entry]) -> str:
    """The shortest name that tells ``e`` apart: the strategy, with model and chip if several."""
    parts = [e.strategy]
    if len({x.chip.name for x in entries}) > 1:
        parts.insert(0, e.chip.name)
    if len({x.model for x in entries}) > 1:
        parts.insert(0, e.model)
    return " / ".join(parts)


def _color(i: int) -> str:
    return f"C{i % 10}"


def _position(entries: list[Entry], entry: Entry) -> int:
    """Where ``entry`` is in ``entries``, by identity (entries hold arrays: no == on them)."""
    return next(i for i, e in enumerate(entries) if e is entry)


def _op_cycles(e: Entry) -> dict[str, int]:
    """Emulated cycles per op (all phases), ops in program order."""
    return {op: sum(ph.values()) for op, ph in e.result.timeline.by_op().items()}  # type: ignore


def _predicted(e: Entry) -> dict[str, int]:
    """The planner's predicted cycles per op: its plan's phases and the re-layout before it."""
    plan = e.compiled.plan  # type: ignore[union-attr]
    return {p.op: p.cycles.total + r for p, r in zip(plan.ops, plan.relayout_cycles)}


def _latency_chart(ok: list[Entry]) -> str:
    """Latency by phase per entry, with each entry's roofline and ideal marked on its bar."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDE, 0.55 * len(ok) + 1.4))
    labels = [_label(e, ok) for e in ok]
    y = np.arange(len(ok))[::-1]
    left: np.ndarray = np.zeros(len(ok))
    for phase in PHASES:
        vals = np.array([sum(r.cycles for r in e.result.timeline.records  # type: ignore
                             if r.phase == phase) for e in ok], dtype=float)
        if vals.any():
            ax.barh(y, vals, left=left, color=COLORS[phase], label=phase, height=0.6)
            left += vals
    for yi, e in zip(y, ok):
        if e.bounds is not None:
            ax.vlines(e.bounds.roofline_cycles, yi - 0.42, yi + 0.42, colors="black",
                      linestyles="dashed", linewidth=2,
                      label="roofline" if yi == y[0] else "_nolegend_")
            ax.vlines(e.bounds.ideal_cycles, yi - 0.42, yi + 0.42, colors="#d62728",
                      linestyles="dotted", linewidth=2.5,
                      label="ideal" if yi == y[0] else "_nolegend_")
    ax.set_yticks(y, labels)
    ax.set_xlabel("cycles (emulated)")
    ax.set_title("Latency by phase; roofline (dashed) and ideal (dotted) of each plan")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


def _program_order(ok: list[Entry]) -> list[str]:
    """Every op any entry ran, in the program order of the first entry that ran it."""
    return list(dict.fromkeys(op for e in ok for op in _op_cycles(e)))


def _per_op_chart(ok: list[Entry]) -> str:
    """Emulated cycles of every op in program order, every strategy on one (log) scale."""
    import matplotlib.pyplot as plt

    order = _program_order(ok)
    fig, ax = plt.subplots(figsize=(WIDE, 4.2))
    x = np.arange(len(order))
    for i, e in enumerate(ok):
        cyc = _op_cycles(e)
        vals = np.array([cyc.get(op, np.nan) for op in order], dtype=float)
        ax.plot(x, vals, MARKERS[i % len(MARKERS)], color=_color(i), markersize=5,
                markerfacecolor="none" if i else _color(i), linestyle="-", linewidth=0.6,
                label=_label(e, ok))
    ax.set_yscale("log")
    ax.set_xlim(-0.5, len(order) - 0.5)
    ax.set_ylabel("cycles (emulated, log)")
    ax.set_xlabel("op, in program order")
    if len(order) <= 80:
        ax.set_xticks(x, order, rotation=90, fontsize=6)
    else:  # too many to name: number them; the table below names the ones that matter
        ax.set_xlabel(f"op index, in program order ({len(order)} ops)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("Time per op, every strategy on one scale")
    ax.legend(fontsize=8)
    return _png(fig)


def _differing_ops(ok: list[Entry], top: int = 12) -> list[tuple[int, str, list[int | None]]]:
    """The ops whose cycles differ most between strategies (largest max/min), in program order:
    (index, op, cycles per entry)."""
    order = _program_order(ok)
    tables = [_op_cycles(e) for e in ok]
    rows = []
    for i, op in enumerate(order):
        vals = [t.get(op) for t in tables]
        have = [v for v in vals if v]
        if len(have) >= 2:
            rows.append((max(have) / min(have), max(have) - min(have), i, op, vals))
    rows.sort(key=lambda r: (-r[1], r[2]))  # largest absolute difference: what moves latency
    return sorted(((i, op, vals) for _, _, i, op, vals in rows[:top]), key=lambda r: r[0])


def _predicted_chart(ok: list[Entry]) -> str:
    """Predicted against emulated cycles per op, one colour per strategy, with y = x."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.4, 5.2))
    lo, hi = math.inf, 0.0
    for i, e in enumerate(ok):
        pred, emu = _predicted(e), _op_cycles(e)
        ops = [op for op in pred if op in emu and pred[op] > 0 and emu[op] > 0]
        p = np.array([pred[op] for op in ops], dtype=float)
        m = np.array([emu[op] for op in ops], dtype=float)
        if len(ops):
            lo, hi = min(lo, p.min(), m.min()), max(hi, p.max(), m.max())
        ax.plot(p, m, MARKERS[i % len(MARKERS)], color=_color(i), alpha=0.7,
                markerfacecolor="none" if i else _color(i), label=_label(e, ok))
    if hi > 0:
        ax.plot([lo, hi], [lo, hi], "--", color="#777777", label="predicted = emulated")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted cycles (plan + re-layout)")
    ax.set_ylabel("emulated cycles")
    ax.set_title("Predicted against emulated, per op")
    ax.legend(fontsize=8)
    return _png(fig)


def _sram_time_chart(ok: list[Entry]) -> str:
    """Bytes per core in use over the run, every strategy on one scale, with the capacity."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.4, 5.2))
    for i, e in enumerate(ok):
        samples = e.result.timeline.sram_samples  # type: ignore[union-attr]
        if samples:
            t, b = zip(*samples)
            ax.step(t, np.array(b) / 1024, where="post", color=_color(i), label=_label(e, ok))
    _capacity_lines(ax, ok)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("cycles")
    ax.set_ylabel("KiB per core in use")
    ax.set_title("SRAM over time")
    ax.legend(fontsize=8)
    return _png(fig)


def _capacity_lines(ax: Any, entries: list[Entry]) -> None:
    """A dashed line at each chip's SRAM per core, in KiB."""
    for chip in {e.chip.name: e.chip for e in entries}.values():
        ax.axhline(chip.sram_bytes_per_core / 1024, color="#d62728", linestyle="--",
                   label=f"capacity of {chip.name}")


def _distinct_heavy_ops(base: Entry, heavy: int) -> list[tuple[int, Any]]:
    """The ``heavy`` slowest ops of ``base``'s plan that are not the same op again (a
    transformer repeats each layer's ops: their fronts are equal), with their fronts."""
    from t10c.partition import search_op_front

    c = base.compiled
    assert c is not None
    order = sorted(range(len(c.plan.ops)), key=lambda i: (-c.plan.ops[i].cycles.total, i))
    seen: set[tuple] = set()
    out = []
    for i in order[:8 * heavy]:
        op = c.graph.ops[i]
        found = search_op_front(c.graph, op, base.chip, c.plan.dtype, c.options.search)
        key = tuple((p.hot_bytes_per_core, p.cycles.total) for p in found.front)
        if key in seen:
            continue
        seen.add(key)
        out.append((i, found))
        if len(out) == heavy:
            break
    return out


def _front_charts(ok: list[Entry], heavy: int) -> list[tuple[str, str]]:
    """Per distinct heavy op of the first plan: its front, the SRAM per core, and each
    strategy's chosen plan (its own marker, so that equal choices stay visible)."""
    import matplotlib.pyplot as plt

    base = next((e for e in ok if e.compiled), None)
    if base is None:
        return []
    same = [e for e in ok if e.compiled and (e.model, e.chip.name) == (base.model, base.chip.name)]
    charts = []
    for i, found in _distinct_heavy_ops(base, heavy):
        name = base.compiled.graph.ops[i].name  # type: ignore[union-attr]
        fig, ax = plt.subplots(figsize=(4.4, 3.4))
        front = sorted(found.front, key=lambda p: p.hot_bytes_per_core)
        ax.plot([p.hot_bytes_per_core / 1024 for p in front], [p.cycles.total for p in front],
                "o-", color="#aaaaaa", markersize=4, label=f"front ({base.strategy} search)")
        ax.axvline(base.chip.sram_bytes_per_core / 1024, color="#d62728", linestyle="--",
                   label="SRAM per core")
        for k, e in enumerate(same):
            chosen = e.compiled.plan.ops[i]  # type: ignore[union-attr]
            color = _color(_position(ok, e))
            ax.plot([chosen.hot_bytes_per_core / 1024], [chosen.cycles.total],
                    MARKERS[k % len(MARKERS)], color=color,
                    markersize=16 - 3 * k, markerfacecolor="none" if k else color,
                    markeredgewidth=2, label=f"{e.strategy}'s choice")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("hot KiB per core (log)")
        ax.set_ylabel("predicted cycles (log)")
        ax.set_title(name, fontsize=8)
        ax.legend(fontsize=6)
        charts.append((name, _png(fig)))
    return charts


def _sram_cores_chart(ok: list[Entry]) -> tuple[str, str] | None:
    """Peak SRAM per core. A mesh has a geometry: one heat map per plan on the chip's grid. An
    all-to-all chip has none: every plan's cores sorted by their peak, on one scale."""
    import matplotlib.pyplot as plt

    have = [e for e in ok if e.compiled and e.compiled.program.instrs]
    if not have:
        return None  # timing-only compiles keep no program
    peaks = [sram_per_core(e.compiled) for e in have]  # type: ignore[arg-type]
    if all(e.chip.is_mesh for e in have):
        fig, axes = plt.subplots(1, len(have), figsize=(min(WIDE, 4.6 * len(have)), 3.8),
                                 squeeze=False)
        vmax = max(e.chip.sram_bytes_per_core for e in have) / 1024
        for ax, e, peak in zip(axes[0], have, peaks):
            image = ax.imshow(peak.reshape(e.chip.grid) / 1024, cmap="viridis", aspect="auto",
                              vmin=0, vmax=vmax)
            ax.set_title(_label(e, have), fontsize=9)
            ax.set_xlabel("column")
            ax.set_ylabel("row")
        fig.colorbar(image, ax=list(axes[0]), label="peak KiB in use (scale: capacity)")
        return "peak SRAM on the chip's grid", _png(fig)
    fig, ax = plt.subplots(figsize=(WIDE, 3.6))
    for e, peak in zip(have, peaks):
        ax.plot(np.sort(peak)[::-1] / 1024, color=_color(_position(ok, e)), label=_label(e, have))
    _capacity_lines(ax, have)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("cores, sorted by their peak (all-to-all: no geometry to draw)")
    ax.set_ylabel("peak KiB in use")
    ax.set_title("Peak SRAM per core")
    ax.legend(fontsize=8)
    return "peak SRAM per core, sorted", _png(fig)


def _timeline_chart(ok: list[Entry]) -> str:
    """Every plan's run as one lane coloured by phase, on one time scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDE, 0.5 * len(ok) + 1.4))
    drawn: set[str] = set()
    for lane, e in enumerate(ok):
        for phase in PHASES:
            spans = [(r.start, r.cycles) for r in e.result.timeline.records  # type: ignore
                     if r.phase == phase and r.cycles]
            if spans:
                ax.broken_barh(spans, (len(ok) - 1 - lane - 0.35, 0.7), color=COLORS[phase],
                               label=None if phase in drawn else phase)
                drawn.add(phase)
    ax.set_yticks(range(len(ok)), [_label(e, ok) for e in ok][::-1])
    ax.set_xlabel("cycles")
    ax.set_title("Timeline")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _png(fig)


STYLE = """body{font-family:sans-serif;max-width:1380px;margin:1em auto;padding:0 10px;
color:#222;box-sizing:border-box}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px}
th{background:#f0f0f0;font-weight:600}td.num{text-align:right}img{max-width:100%}
section{margin-bottom:1.6em}.row{display:flex;flex-wrap:wrap;gap:8px}.row img{flex:0 1 auto}
.sub{color:#555;font-size:14px;margin-top:-0.6em}"""


def _title(entries: list[Entry]) -> tuple[str, str]:
    """The page's title (models, chips, version) and a line of the options the runs used."""
    from t10c import __version__

    models = ", ".join(dict.fromkeys(e.model for e in entries))
    chips = ", ".join(dict.fromkeys(e.chip.name for e in entries))
    title = f"{models} on {chips}: t10c {__version__} plan comparison"
    opts = next((e.compiled.options for e in entries if e.compiled), None)
    bits = [f"strategies {', '.join(dict.fromkeys(e.strategy for e in entries))}"]
    if opts is not None:
        # (a page of several chips: the pricings after the solve may differ by chip)
        counts = {trials_for(opts.solver, e.chip) for e in entries if e.compiled}
        trials = max(counts)
        most = "up to " if adaptive(opts.solver) else ""
        then = (f", then {most}{trials} exact pricing{'s' if trials > 1 else ''}"
                + (" where the chip is a mesh" if len(counts) > 1 else "")) if trials else ""
        bits += [f"dtype {opts.dtype}" + (f", {opts.quantize} matmul weights"
                                          if opts.quantize else ""),
                 f"sequence length {opts.seq_len if opts.seq_len is not None else 'default'}",
                 f"batch {opts.batch if opts.batch is not None else 'default'}",
                 f"solver {opts.solver.planner} (limit {opts.solver.time_limit_s:g}, "
                 f"seed {opts.solver.seed}{then})"]
        if opts.pinned:
            bits.append("shapes " + ", ".join(f"{k}={v}" for k, v in opts.pinned.items()))
        bits.append("timing only (not checked against onnxruntime)" if opts.timing_only
                    else "functional emulation, checked against onnxruntime")
    return title, "; ".join(bits)


def _cell(key: str, value: Any) -> str:
    if value is None or value == "":
        return "-"
    if key in ("roofline_fraction", "ideal_fraction"):
        return "-" if math.isnan(value) else f"{100 * value:.1f}%"
    if key.startswith("speedup"):
        return f"{value:.2f}x"
    if key == "peak_sram_bytes_per_core":
        return f"{value / 1024:.1f}"
    if key in ("cycles", "predicted_cycles"):
        return f"{value:,}"
    if key == "matches_onnxruntime":
        return "yes" if value else "NO"
    return str(value)


def _summary_table(entries: list[Entry]) -> list[str]:
    rows = summary_rows(entries)
    keys = [k for k in HEADERS if any(k in r for r in rows)]
    out = ["<table><tr>" + "".join(f"<th>{html.escape(HEADERS[k])}</th>" for k in keys)
           + "</tr>"]
    for r in rows:
        if "error" in r:
            out.append("<tr>" + "".join(f"<td data-key='{k}'>{html.escape(str(r[k]))}</td>"
                                        for k in ("model", "chip", "strategy"))
                       + f"<td data-key='error' colspan='{len(keys) - 3}'>failed: "
                       f"{html.escape(r['error'])}</td></tr>")
            continue
        out.append("<tr>" + "".join(
            f"<td data-key='{k}'{'' if k in ('model', 'chip', 'strategy') else ' class=num'}>"
            f"{html.escape(_cell(k, r.get(k)))}</td>" for k in keys) + "</tr>")
    out.append("</table>")
    return out


def to_html(entries: list[Entry], heavy: int = 3) -> str:
    """The whole report as one self-contained HTML page."""
    ok = [e for e in entries if e.result]
    title, options = _title(entries)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
             f"<p class='sub'>{html.escape(options)}</p>",
             "<section id='summary'><h2>Summary</h2>", *_summary_table(entries),
             "<p>Latency is emulated chip time. The roofline is the model's FLOPs at the chip's "
             "peak matrix rate, the ideal every op at its fastest plan (or, on a chip with "
             "DRAM, its DRAM time, if longer) with nothing else "
             "resident (<code>partition/bounds.py</code>); “of roofline” is roofline / latency. "
             "Speedups compare strategies on the same model and chip. Compile times are taken "
             "after a one-time warm-up of the process, so the first strategy pays no more than "
             "the others.</p></section>"]
    if ok:
        parts.append("<section id='latency'><h2>Latency against the bounds</h2>"
                     f"<img alt='latency and bounds' src='{_latency_chart(ok)}'></section>")
        parts.append("<section id='per-op'><h2>Time per op</h2>"
                     f"<img alt='time per op' src='{_per_op_chart(ok)}'>")
        diff = _differing_ops(ok)
        if diff:
            parts.append("<p>The ops where the strategies differ most (emulated cycles), in "
                         "program order:</p><table><tr><th>#</th><th>Op</th>"
                         + "".join(f"<th>{html.escape(_label(e, ok))}</th>" for e in ok)
                         + "</tr>")
            for i, op, vals in diff:
                parts.append(f"<tr><td class=num>{i}</td><td>{html.escape(op)}</td>" + "".join(
                    f"<td class=num>{'-' if v is None else f'{v:,}'}</td>" for v in vals)
                    + "</tr>")
            parts.append("</table>")
        parts.append("</section>")
        with_plans = [e for e in ok if e.compiled]
        parts.append("<section id='predicted'><h2>Predicted against emulated</h2><div class=row>")
        if with_plans:
            parts.append(f"<img alt='predicted against emulated' "
                         f"src='{_predicted_chart(with_plans)}'>")
        parts.append(f"<img alt='sram over time' src='{_sram_time_chart(ok)}'></div></section>")
        parts.append("<section id='pareto'><h2>Pareto fronts of the heaviest distinct ops</h2>"
                     "<div class=row>")
        for name, src in _front_charts(ok, heavy):
            parts.append(f"<img alt='front {html.escape(name)}' src='{src}'>")
        parts.append("</div></section><section id='sram'><h2>SRAM per core</h2>")
        cores = _sram_cores_chart(ok)
        if cores:
            parts.append(f"<img alt='{html.escape(cores[0])}' src='{cores[1]}'>")
        else:
            parts.append("<p>Timing-only compiles keep no program: no per-core SRAM.</p>")
        parts.append("</section><section id='timeline'><h2>Timeline</h2>"
                     f"<img alt='timeline' src='{_timeline_chart(ok)}'></section>")
    parts.append("</body></html>")
    return "\n".join(parts)
