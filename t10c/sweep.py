"""Design-space sweeps: `t10c sweep SPEC.toml` compiles (and times) a grid of points, each a
model on a chip with some of its fields changed, under a strategy.

A spec (TOML)::

    models = ["bert-base"]             # zoo names or .onnx files (relative to the spec)
    strategies = ["t10"]               # default: ["t10"]
    chip = "ipu-mk2"                   # a preset or a chip .toml file (relative to the spec)
    timing_only = true                 # default: true (false: emulate and check on data)
    dtype = "fp16"                     # optional, as for compile: seq_len, batch too
    quantize = "int8"                  # optional: int8 matmul weights (compile's --quantize)

    [grid]                             # any field of the chip file, each with its values
    sram_bytes_per_core = [327680, 655360]
    link_bytes_per_cycle = [4, 8]

The points are models x the grid's product x strategies. Each point has a canonical description
(the model, and its file's digest for a file; the whole chip after the changes; the options; the
t10c version) whose digest is its key. Finished points are appended to ``points.jsonl`` in the
output folder as they finish, so an interrupted or extended sweep recomputes nothing it has.
At the end ``results.json``, ``results.csv`` (grid order; no wall times, so they are the same
files from run to run) and ``pareto.png`` (latency against total SRAM, or against cores when
cores are swept) are written.

Points run in local worker processes (``--workers N``) or, with ``--ray``, as Ray tasks (the
optional extra ``t10c[sweep]``): ``auto`` joins the cluster ``ray start`` began on this machine,
``local`` starts one in this process, anything else is a cluster's address.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import io
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t10c import __version__
from t10c.chips import PRESETS, Chip, ChipError, chip_from_dict
from t10c.models.quantize import QUANTIZED_TYPES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FORMAT = "t10c-sweep/1"
SPEC_KEYS = {"models", "strategies", "chip", "timing_only", "dtype", "quantize", "seq_len",
             "batch", "grid"}
#: the figures of a point, as results.json and results.csv name them
FIGURES = ("latency_us", "cycles", "roofline_fraction", "ideal_fraction",
           "peak_sram_bytes_per_core", "matches_onnxruntime", "error")


class SweepError(ValueError):
    """A spec that cannot be swept; the message names the file and what to change."""


@dataclass(frozen=True)
class Point:
    """One compile of the sweep: its place in the grid and its canonical description."""

    index: int
    model: str
    strategy: str
    changes: tuple[tuple[str, Any], ...]  # the chip fields the grid set, in the grid's order
    description: dict[str, Any]


def point_key(description: dict[str, Any]) -> str:
    """The digest of a point's canonical description: equal descriptions, equal keys."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Spec:
    path: Path
    points: tuple[Point, ...]
    grid_fields: tuple[str, ...]
    base_chip: str


def _chip_doc(chip: Chip) -> dict[str, Any]:
    """A chip as the fields that price a plan (not its name, description or sources)."""
    doc = dataclasses.asdict(chip)
    for k in ("name", "description", "sources"):
        doc.pop(k, None)
    doc["grid"] = list(doc["grid"])
    return doc


def _model_ref(model: str, root: Path) -> tuple[str, dict[str, Any]]:
    """A model as the worker loads it, and as the point's description names it."""
    from t10c.models import is_zoo_name

    if is_zoo_name(model):
        return model, {"zoo": model}
    path = (root / model).resolve()
    if not path.is_file():
        raise SweepError(f"model {model!r} is neither a zoo model nor a file (looked for {path})")
    return str(path), {"file": path.name,
                       "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def load_spec(path: Path) -> Spec:
    """Read and check a spec; every point's chip is built (and refused) here, before any work."""
    from t10c.strategies import STRATEGIES

    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SweepError(f"{path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SweepError(f"{path} is not TOML: {exc}") from None
    unknown = sorted(set(data) - SPEC_KEYS)
    if unknown:
        raise SweepError(f"{path}: unknown key {', '.join(unknown)} (valid: "
                         f"{', '.join(sorted(SPEC_KEYS))})")
    models = data.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise SweepError(f"{path}: models must be a non-empty list of names, such as "
                         "models = [\"bert-base\"]")
    strategies = data.get("strategies", ["t10"])
    if not isinstance(strategies, list) or not strategies or \
            not all(isinstance(s, str) and s in STRATEGIES for s in strategies):
        raise SweepError(f"{path}: strategies must be a non-empty list of "
                         f"{', '.join(STRATEGIES)}")
    grid = data.get("grid", {})
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise SweepError(f"{path}: [grid] must give each chip field a non-empty list of values, "
                         "such as sram_bytes_per_core = [327680, 655360]")
    chip_name = data.get("chip", "ipu-mk2")
    if not isinstance(chip_name, str):
        raise SweepError(f"{path}: chip must be a preset name or a chip .toml file")
    root = path.parent
    if chip_name in PRESETS:
        base: dict[str, Any] = {"base": chip_name}
    else:
        chip_path = root / chip_name
        try:
            base = tomllib.loads(chip_path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SweepError(f"{path}: chip {chip_name!r} is no preset ({', '.join(PRESETS)}) "
                             f"and {chip_path} cannot be read as TOML ({exc})") from None
    options = {"dtype": data.get("dtype", "fp16"), "seq_len": data.get("seq_len"),
               "batch": data.get("batch"), "timing_only": data.get("timing_only", True)}
    if options["dtype"] not in ("fp16", "fp32") or not isinstance(options["timing_only"], bool) \
            or any(options[k] is not None and (not isinstance(options[k], int)
                                               or isinstance(options[k], bool) or options[k] < 1)
                   for k in ("seq_len", "batch")):
        raise SweepError(f"{path}: dtype is fp16 or fp32, timing_only true or false, seq_len "
                         "and batch positive integers")
    if "quantize" in data:  # (only then in the points' descriptions: older keys still hold)
        if data["quantize"] not in QUANTIZED_TYPES:
            raise SweepError(f"{path}: quantize is one of {', '.join(QUANTIZED_TYPES)} (or "
                             f"left out for float weights), not {data['quantize']!r}")
        options["quantize"] = data["quantize"]
    points: list[Point] = []
    refs = [_model_ref(m, root) for m in models]
    for (model, ref), values in itertools.product(refs, itertools.product(*grid.values())):
        changes = tuple(zip(grid, values))
        try:
            chip = chip_from_dict({**base, **dict(changes)}, origin=f"{path} [grid] {changes}")
        except ChipError as exc:
            raise SweepError(str(exc)) from None
        for strategy in strategies:
            description = {"model": ref, "strategy": strategy, "chip": _chip_doc(chip),
                           "options": options, "t10c": __version__}
            points.append(Point(len(points), model, strategy, changes,
                                {**description, "load": {"model": model, "name": chip.name}}))
    return Spec(path, tuple(points), tuple(grid), chip_name)


def _canonical(point: Point) -> dict[str, Any]:
    """The description without how the worker finds things (paths differ between machines)."""
    return {k: v for k, v in point.description.items() if k != "load"}


def run_point(description: dict[str, Any]) -> dict[str, Any]:
    """Compile (and time, or emulate) one point; a failure is a result, not an exception.
    Runs in a worker process or a Ray task: it takes and returns plain data."""
    from t10c.compare import run_entry
    from t10c.driver import CompileOptions

    chip = chip_from_dict({**description["chip"], "name": description["load"]["name"],
                           "description": "a sweep's point"}, origin="sweep point")
    o = description["options"]
    options = CompileOptions(dtype=o["dtype"], quantize=o.get("quantize"), seq_len=o["seq_len"],
                             batch=o["batch"], timing_only=o["timing_only"],
                             weights=not o["timing_only"])
    start = time.perf_counter()
    entry = run_entry(description["load"]["model"], chip, description["strategy"], options)
    figures: dict[str, Any] = {"error": entry.error}
    if entry.result is not None:
        figures.update({
            "latency_us": round(entry.latency_s * 1e6, 3),
            "cycles": entry.result.timeline.cycles,
            "roofline_fraction": _finite(entry.roofline_fraction),
            "ideal_fraction": _finite(entry.ideal_fraction),
            "peak_sram_bytes_per_core": entry.result.timeline.peak_sram_bytes_per_core,
            "matches_onnxruntime": None if entry.result.timing_only else entry.result.ok})
    return {"figures": figures, "wall_s": round(time.perf_counter() - start, 3)}


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 5)


def read_done(store: Path) -> dict[str, dict[str, Any]]:
    """The finished points of earlier runs, by key (a line cut short by a kill is skipped)."""
    done: dict[str, dict[str, Any]] = {}
    if store.is_file():
        for line in store.read_text().splitlines():
            try:
                row = json.loads(line)
                done[row["key"]] = row
            except (ValueError, KeyError, TypeError):
                continue
    return done


Progress = Callable[[str, int, int], None]


def run_point_alone(description: dict[str, Any]) -> dict[str, Any]:
    """`run_point` in a worker beside others (a local pool's, a Ray task's): the sweep shares
    the cores among its points, so a point's compile keeps to its own process
    (``T10C_JOBS=1``, `t10c.forked`). The worker is the sweep's, so its environment is too."""
    os.environ["T10C_JOBS"] = "1"
    return run_point(description)


def _local(todo: list[Point], workers: int) -> Iterator[tuple[Point, dict[str, Any]]]:
    """The points' results as they finish, from ``workers`` processes (inline for one)."""
    if workers == 1:
        for p in todo:
            yield p, run_point(p.description)
        return
    import concurrent.futures as cf
    import multiprocessing

    # spawn, not fork: a worker must not inherit the solver's threads in a forked state
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_point_alone, p.description): p for p in todo}
        try:
            for f in cf.as_completed(futures):
                yield futures[f], f.result()
        finally:
            for f in futures:
                f.cancel()


def _ray(todo: list[Point], address: str) -> Iterator[tuple[Point, dict[str, Any]]]:
    """The points' results as they finish, as tasks on a Ray cluster."""
    try:
        import ray
    except ImportError:
        raise SweepError("--ray needs Ray: pip install 't10c[sweep]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1)(run_point_alone)
        refs = {task.remote(p.description): p for p in todo}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield refs[ready[0]], ray.get(ready[0])
    finally:
        if started:
            ray.shutdown()


def run_sweep(spec: Spec, out: Path, workers: int = 1, ray: str | None = None,
              progress: Progress | None = None,
              log: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Run every point of ``spec`` not already in ``out/points.jsonl``, appending each as it
    finishes; then write the results files. Returns the rows in grid order."""
    out.mkdir(parents=True, exist_ok=True)
    store = out / "points.jsonl"
    done = read_done(store)
    keys = [point_key(_canonical(p)) for p in spec.points]
    todo = sorted((p for p, k in zip(spec.points, keys) if k not in done), key=_reuse_order)
    total = len(spec.points)
    log(f"{total} points, {total - len(todo)} already done, {len(todo)} to run "
        f"({'Ray at ' + ray if ray else f'{workers} local worker(s)'})")
    if progress:
        progress("sweep", total - len(todo), total)
    if todo:
        results = _ray(todo, ray) if ray else _local(todo, workers)
        with store.open("a") as f:
            if store.stat().st_size and not store.read_bytes().endswith(b"\n"):
                f.write("\n")  # a line a kill cut short stays alone (and is skipped)
            for n, (p, result) in enumerate(results, total - len(todo) + 1):
                row = {"key": point_key(_canonical(p)), "point": _canonical(p), **result}
                f.write(json.dumps(row, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
                done[row["key"]] = row
                fig = result["figures"]
                what = f"{fig['latency_us']} us" if "latency_us" in fig else fig["error"]
                log(f"[{n}/{total}] {_name(p)}: {what} ({result['wall_s']:.1f} s)")
                if progress:
                    progress("sweep", n, total)
    rows = [_row(p, done[k]["figures"]) for p, k in zip(spec.points, keys)]
    write_results(spec, rows, out)
    return rows


#: chip fields that only decide which plans fit: points that differ in them alone share each
#: op's enumeration and costing in a worker (`partition.search`) and most re-layout counts
#: (`partition.transitions`); every other field (link rate, cores, clock, ...) changes costs
FITS_ONLY = frozenset({"sram_bytes_per_core"})


def _reuse_order(p: Point) -> tuple:
    """Points that can reuse each other's work run one after the other: by model, strategy
    and every swept field but those in `FITS_ONLY`, then in grid order."""
    rest = tuple((k, repr(v)) for k, v in p.changes if k not in FITS_ONLY)
    return (p.model, p.strategy, rest, p.index)


def _name(p: Point) -> str:
    changes = ", ".join(f"{k}={v}" for k, v in p.changes)
    return f"{p.model} [{changes}] {p.strategy}" if changes else f"{p.model} {p.strategy}"


def _row(p: Point, figures: dict[str, Any]) -> dict[str, Any]:
    chip = p.description["chip"]
    row: dict[str, Any] = {"key": point_key(_canonical(p)), "model": p.model,
                           "strategy": p.strategy, **dict(p.changes),
                           "cores": chip["cores"],
                           "total_sram_bytes": chip["cores"] * chip["sram_bytes_per_core"]}
    row.update({k: figures.get(k) for k in FIGURES})
    return row


def write_results(spec: Spec, rows: list[dict[str, Any]], out: Path) -> None:
    """results.json, results.csv and (with matplotlib) pareto.png, each written atomically."""
    from t10c.outputs import replacing, write_text

    write_text(out / "results.json", json.dumps(
        {"format": FORMAT, "spec": spec.path.name, "chip": spec.base_chip,
         "grid": list(spec.grid_fields), "rows": rows}, indent=1) + "\n")
    buf = io.StringIO()
    columns = list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if r.get(k) is None else r[k] for k in columns} for r in rows)
    write_text(out / "results.csv", buf.getvalue())
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    with replacing(out / "pareto.png") as tmp:
        pareto_figure(spec, rows).savefig(tmp, format="png", dpi=90,
                                          metadata={"Software": None})


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other beats in both (resource, latency): least resource first."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def pareto_figure(spec: Spec, rows: list[dict[str, Any]]):
    """Latency against total SRAM (or against cores, when the grid sweeps cores): every point,
    and per model and strategy the front of the points no other beats on both."""
    import matplotlib.pyplot as plt

    by_cores = "cores" in spec.grid_fields
    fig, ax = plt.subplots(figsize=(8, 5))
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("latency_us") is not None:
            x = r["cores"] if by_cores else r["total_sram_bytes"] / 2**20
            groups.setdefault((r["model"], r["strategy"]), []).append((x, r["latency_us"]))
    for i, ((model, strategy), pts) in enumerate(groups.items()):
        xs, ys = zip(*pts)
        ax.plot(xs, ys, "o", color=f"C{i % 10}", alpha=0.35, markersize=5)
        front = pareto_front(pts)
        ax.step(*zip(*front), where="post", color=f"C{i % 10}", marker="o",
                label=f"{model} {strategy}: front ({len(front)} of {len(pts)})")
    ax.set_xlabel("cores" if by_cores else "total SRAM (MiB)")
    ax.set_ylabel("latency (µs, emulated)")
    ax.set_title(f"{spec.path.name}: {spec.base_chip} over {', '.join(spec.grid_fields) or '-'}",
                 fontsize=10)
    if groups:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def cmd_sweep(args: argparse.Namespace) -> int:
    """`t10c sweep SPEC.toml`: 0 when the sweep ran (points that do not fit say so in their
    rows), 1 when a functional point disagrees with onnxruntime, 2 for a bad spec."""
    from t10c.progress import StageProgress

    try:
        spec = load_spec(args.spec)
    except SweepError as exc:
        print(f"t10c: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.spec.with_suffix("")
    if out == args.spec:
        out = args.spec.with_name(args.spec.name + ".results")
    try:
        with StageProgress() as progress:
            rows = run_sweep(spec, out, args.workers, args.ray, progress,
                             log=lambda m: print(m, file=sys.stderr))
    except SweepError as exc:
        print(f"t10c: error: {exc}", file=sys.stderr)
        return 2
    ran = [r for r in rows if r["latency_us"] is not None]
    plot = f" and {out / 'pareto.png'}" if (out / "pareto.png").is_file() else \
        " (no pareto.png: it needs matplotlib, pip install 't10c[report]')"
    print(f"wrote {out / 'results.json'}, {out / 'results.csv'}{plot}: {len(ran)} of "
          f"{len(rows)} points ran (the others say why in their error column)")
    # a point that does not fit is an answer; a functional run that disagrees is a failure
    return 1 if any(r["matches_onnxruntime"] is False for r in rows) else 0
