"""The ``t10c`` command line.

Exit codes: 0 success; 1 the model cannot be compiled or run, the emulator disagrees with
onnxruntime, or an output cannot be written; 2 bad usage (unknown flag or value, bad chip
file, unknown model, an output path that cannot be used); 130 interrupted (Ctrl-C).
Every error is one line on stderr, ``t10c: error: ...``; an unexpected exception is reported
as an internal error (``T10C_DEBUG=1`` shows its traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

try:
    from t10c import __version__, forked
    from t10c.args import (
        MESH_ROWS,
        Parser,
        chip_arg,
        dims_arg,
        float_in,
        int_at_least,
        list_of,
        mesh_row_arg,
        model_arg,
        model_args,
        new_file_arg,
        out_dir_arg,
        search_options,
        strategy_arg,
    )
    from t10c.chips import PRESETS, ChipError, describe, load_chip
    from t10c.fusion import FUSE_CHOICES, fuse_help
    from t10c.models import ZOO_NAMES as ZOO
    from t10c.outputs import OutputError
    from t10c.partition.refine import adaptive, trials_for
    from t10c.partition.solve import CHOICES
    from t10c.progress import StageProgress
    from t10c.strategies import DEFAULT_STRATEGIES, STRATEGIES
    from t10c.strategies import help_text as strategies_help
except KeyboardInterrupt:  # Ctrl-C while numpy, onnx and OR-Tools load: the same as later
    print("t10c: interrupted", file=sys.stderr)
    sys.exit(130)

EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; bad values are refused here, before any work."""
    parser = Parser(
        prog="t10c", description="Compile ONNX models for inter-core-connected AI chips.")
    parser.add_argument("--version", action="version", version=f"t10c {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile a model (and optionally emulate it)",
                       description="Compile MODEL (a zoo name or an .onnx file) for CHIP.")
    c.add_argument("model", type=model_arg, help="zoo name (see `t10c compile --help`: "
                   f"{', '.join(ZOO)}, matmul-MxKxN) or path to an .onnx file")
    c.add_argument("--chip", type=chip_arg, default="ipu-mk2",
                   help="preset name or chip .toml file (default: ipu-mk2)")
    c.add_argument("-o", "--out", type=out_dir_arg, metavar="DIR",
                   help="write plan.json, compile.json, program.json/.npz and run.json into "
                        "this directory (replaced as a whole)")
    c.add_argument("--run", action="store_true", help="emulate on seeded random inputs and "
                                                      "check against onnxruntime")
    c.add_argument("--timing-only", action="store_true",
                   help="emulate the timing without data (no onnxruntime check): for chips too "
                        "large to emulate functionally, such as wse2; the program is streamed "
                        "into the emulator, not kept")
    c.add_argument("--check", action="store_true",
                   help="also run the verifiers between stages: the graph's after the "
                        "frontend and the program's (against the chip) after codegen (the "
                        "plan's runs always)")
    c.add_argument("--trace", type=new_file_arg, metavar="FILE",
                   help="with --run or --timing-only, write the timeline as a Chrome trace "
                        "(Perfetto opens it)")
    model_args(c)
    fuse_arg(c)
    c.add_argument("--no-fuse", dest="fuse", action="store_const", const="none",
                   help="the same as --fuse none")
    c.add_argument("--emit", choices=("asm",), help="print the program of one core")
    c.add_argument("--core", type=int_at_least(0),
                   help="core for --emit asm (default: 0)")
    c.add_argument("--seed", type=int_at_least(0), default=0,
                   help="seed of the random inputs (default: 0)")
    c.add_argument("--time-limit", type=float_in(0.0, low_open=True), default=30.0,
                   help="CP-SAT time limit in seconds (default: 30)")
    c.add_argument("--no-early-stop", dest="early_stop", action="store_false",
                   help="search CP-SAT's whole --time-limit, even once the search stalls "
                        "(default: stop after a stretch of deterministic time whose second "
                        "half found no better plan)")
    c.add_argument("--workers", type=int_at_least(1), default=1,
                   help="CP-SAT workers; 1 keeps the plan deterministic (default: 1)")
    c.add_argument("--strategy", type=strategy_arg, default="t10",
                   metavar="{" + ",".join(STRATEGIES) + "}",
                   help=f"what to compile: {strategies_help()}")
    c.add_argument("--planner", choices=("cp-sat", "greedy"), default="cp-sat",
                   help="whole-graph choice: CP-SAT (warm-started by the greedy) or T10's "
                        "greedy memory reconciliation alone (default: cp-sat)")
    c.add_argument("--choice", choices=("best", *CHOICES), default="best",
                   help="on a chip with DRAM, the whole-graph choice to keep: the fastest "
                        "under the preload schedule, or by name the solver's, the greedy's "
                        "or one of ELK's inductive ones, to time it as a baseline "
                        "(default: best)")
    c.add_argument("--gap", type=float_in(0.0, 1.0), default=0.001,
                   help="stop CP-SAT once within this fraction of the optimum, 0 to 1 "
                        "(default: 0.001)")
    c.add_argument("--front", type=int_at_least(1), default=16,
                   help="plans kept per op on its Pareto front (default: 16)")
    c.add_argument("--refine", type=int_at_least(0), default=None, metavar="TRIALS",
                   help="after the solve, try plans off the fronts op by op, each move "
                        "priced exactly (routed on a mesh), at most TRIALS pricings: slower "
                        "compiles, faster plans; 0 for none (default: 1 on a mesh chip "
                        "without DRAM, 0 elsewhere)")
    c.add_argument("--no-table", action="store_true", help="do not print the per-op table")
    c.add_argument("--plan", type=Path, metavar="FILE",
                   help="a plan.json to replay (the same plans, checked against the model and "
                        "chip), or a TOML/JSON file constraining named ops' F_op, f_t and "
                        "weights (the planner chooses the rest; README: Giving plans back)")

    e = sub.add_parser("explain", help="print one op's Pareto front of plans",
                       description="Search every plan of one op of MODEL and print its Pareto "
                                   "front: cycles by phase, hot and idle bytes per core.")
    e.add_argument("model", type=model_arg, help="zoo name (also matmul-MxKxN) or .onnx file")
    e.add_argument("--op", required=True, help="op name, or a part of it that is unique")
    e.add_argument("--chip", type=chip_arg, default="ipu-mk2",
                   help="preset name or chip .toml file")
    e.add_argument("--plan", type=Path, metavar="FILE",
                   help="also show the plans FILE gives the op (a constraints file: the front "
                        "obeying it; a plan.json: its plan) and where they sit against the front")
    model_args(e)
    fuse_arg(e)

    cp = sub.add_parser("compare", help="compare strategies and chips on one model",
                        description="Compile and emulate MODEL under each strategy on each chip "
                                    "and report latency, roofline, speedups, SRAM and compile "
                                    "time.")
    cp.add_argument("model", type=model_arg)
    cp.add_argument("--chip", type=chip_arg, default="ipu-mk2", help="chip (default: ipu-mk2)")
    cp.add_argument("--chips", type=list_of(chip_arg), help="comma-separated chips, instead "
                                                            "of --chip")
    cp.add_argument("--strategies", type=list_of(strategy_arg),
                    default=list(DEFAULT_STRATEGIES),
                    help=f"comma-separated, of {', '.join(STRATEGIES)} (default: "
                         f"{','.join(DEFAULT_STRATEGIES)})")
    cp.add_argument("-o", "--out", type=new_file_arg, metavar="FILE",
                    help="write the report here (default: stdout)")
    cp.add_argument("--format", choices=("html", "md", "json"),
                    help="report format (default: html for -o FILE.html, else md)")
    model_args(cp)
    fuse_arg(cp)

    b = sub.add_parser("bench", help="the benchmark matrix: models x chips x strategies",
                       description="Compile time, emulated latency per strategy, speedups over "
                                   "the baselines, fraction of the roofline, and emulation wall "
                                   "time next to onnxruntime's, as a Markdown table.")
    b.add_argument("--models", type=list_of(model_arg), default=["mlp", "bert-mini"],
                   help="comma-separated (default: mlp,bert-mini)")
    b.add_argument("--chips", type=list_of(chip_arg), default=["ipu-mk2"],
                   help="comma-separated (default: ipu-mk2)")
    b.add_argument("--json", type=new_file_arg, metavar="FILE",
                   help="also write the rows as JSON")
    b.add_argument("--timing-only", action="store_true",
                   help="time every plan without data (no onnxruntime check): for models too "
                        "large to emulate functionally, such as bert-large at batch 8")
    model_args(b, batches=True)
    fuse_arg(b)

    sw = sub.add_parser("sweep", help="a design-space sweep: models x chip fields x strategies",
                        description="Compile every point of SPEC's grid (see t10c/sweep.py "
                                    "and the README) and write results.json, results.csv and "
                                    "pareto.png; finished points are kept and not run again.")
    sw.add_argument("spec", type=Path, metavar="SPEC.toml")
    sw.add_argument("-o", "--out", type=Path, metavar="DIR",
                    help="results folder (default: SPEC without .toml, beside it)")
    sw.add_argument("--workers", type=int_at_least(1), default=os.cpu_count() or 1,
                    help="local worker processes (default: one per CPU)")
    sw.add_argument("--ray", metavar="ADDRESS",
                    help="run on Ray instead: auto (the cluster `ray start` began here), "
                         "local (start one in this process) or a cluster address; needs "
                         "pip install 't10c[sweep]'")

    mc = sub.add_parser("mesh-compare",
                        help="mesh-aware plans against the all-to-all assumption on a mesh",
                        description="Compile a prefill GEMM, a decode GEMV and a model twice "
                                    "for one mesh chip, mesh-aware (t10) and under the "
                                    "all-to-all assumption (T10 as published), emulate both "
                                    "on the mesh and print the ratio.")
    mc.add_argument("--chip", type=chip_arg, default="wse2",
                    help="a mesh or torus chip (default: wse2)")
    mc.add_argument("--gemm", type=dims_arg(3, "2048x4096x4096"), default=(2048, 4096, 4096),
                    metavar="MxKxN", help="the prefill GEMM (default: 2048x4096x4096)")
    mc.add_argument("--gemv", type=dims_arg(2, "4096x4096"), default=(4096, 4096),
                    metavar="KxN", help="the decode GEMV, one row (default: 4096x4096)")
    mc.add_argument("--model", type=model_arg, default="bert-base",
                    help="the whole model (default: bert-base)")
    mc.add_argument("--decode", type=model_arg, default="llama-decode",
                    help="a decode step, its row in tokens/s (default: llama-decode; the "
                         "wafer papers' is llama3-8b-decode --cache-len 4096)")
    mc.add_argument("--cache-len", type=int_at_least(1), metavar="N",
                    help="the decode step's KV cache (default: the model's)")
    mc.add_argument("--rows", type=list_of(mesh_row_arg), default=list(MESH_ROWS),
                    metavar="LIST", help="the rows to run, comma-separated, of "
                    f"{', '.join(MESH_ROWS)} (default: all, in that order)")
    mode = mc.add_mutually_exclusive_group()
    mode.add_argument("--timing-only", dest="timing_only", action="store_true", default=None,
                      help="time without data (the default above 16,384 cores)")
    mode.add_argument("--functional", dest="timing_only", action="store_false",
                      help="run on data and check against onnxruntime")
    model_args(mc)
    fuse_arg(mc)

    r = sub.add_parser("run", help="emulate a compiled directory (compile -o DIR) again",
                       description="Load DIR's program, emulate it on seeded random inputs, "
                                   "check it against onnxruntime and write DIR/run.json.")
    r.add_argument("dir", type=Path)
    r.add_argument("--seed", type=int_at_least(0), default=0)
    r.add_argument("--trace", type=new_file_arg, metavar="FILE", help="write a Chrome trace")

    from t10c.check import add_check_parser
    add_check_parser(sub)

    ch = sub.add_parser("chips", help="list the built-in chips and their figures")
    ch.add_argument("chip", nargs="?", type=chip_arg,
                    help="show one chip (preset or .toml) with sources")
    ch.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code. Every failure is one line on stderr."""
    try:
        args = build_parser().parse_args(argv)
        forked.jobs()  # a bad T10C_JOBS is said before any work
        _plain_pages()
        return _dispatch(args)
    except SystemExit as exc:  # argparse: --help, --version, or a usage error it reported
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        print("\nt10c: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ChipError, forked.JobsError) as exc:
        return _error(str(exc), EXIT_USAGE)
    except OutputError as exc:
        return _error(str(exc), EXIT_FAIL)
    except BrokenPipeError:  # `t10c chips | head`: the reader left; nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAIL
    except MemoryError as exc:  # a refusal says what it needs (`multicast.check_pairs`)
        return _error(str(exc).splitlines()[0] if str(exc) else
                      "out of memory: the model (or the chip) is too large for this machine; "
                      "a smaller --batch or --seq-len, or compile --timing-only, needs less",
                      EXIT_FAIL)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return _error(f"{where}{exc.strerror or exc}", EXIT_FAIL)
    except Exception as exc:  # the last resort: a bug in t10c, said in one line
        if os.environ.get("T10C_DEBUG"):
            raise
        first = (str(exc).splitlines() or [""])[0]
        return _error(f"internal error: {type(exc).__name__}: {first} (this is a bug in "
                      "t10c; run again with T10C_DEBUG=1 to see the traceback)", EXIT_FAIL)


def _plain_pages() -> None:
    """Ask numpy not to advise the kernel to back its large arrays with huge pages, unless
    ``NUMPY_MADVISE_HUGEPAGE`` says otherwise. A compile makes and drops arrays of a wafer's
    cores by the thousand; where the kernel compacts memory to find a huge page when a page
    is first touched (transparent huge pages with ``defrag`` on ``madvise``, a common
    default), each waits for that: up to a quarter of a wafer compile's CPU time (README:
    Performance, Compile speed and memory, has the figures). Results do not change: only
    where the memory comes from."""
    switch = hugepage_switch()
    if switch is not None and "NUMPY_MADVISE_HUGEPAGE" not in os.environ:
        switch(False)


def hugepage_switch() -> Callable[[bool], bool] | None:
    """numpy's switch of its huge-page advice (it returns the setting before), or None for
    a numpy without one: numpy 2 keeps it in ``np._core``, numpy 1 in ``np.core``."""
    import numpy as np

    core = getattr(np, "_core", None) or getattr(np, "core", None)
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


def _error(message: str, code: int) -> int:
    print(f"t10c: error: {message}", file=sys.stderr)
    return code


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "chips":
        return cmd_chips(args)
    if args.command == "explain":
        return cmd_explain(args)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "check":
        from t10c.check import cmd_check
        return cmd_check(args)
    if args.command == "compare":
        return cmd_compare(args)
    if args.command == "bench":
        return cmd_bench(args)
    if args.command == "mesh-compare":
        return cmd_mesh_compare(args)
    if args.command == "sweep":
        from t10c.sweep import cmd_sweep
        return cmd_sweep(args)
    return cmd_compile(args)


def cmd_chips(args: argparse.Namespace) -> int:
    chips = [load_chip(args.chip)] if args.chip else list(PRESETS.values())
    if args.json:
        import dataclasses
        print(json.dumps([dataclasses.asdict(c) for c in chips], indent=1))
        return 0
    for chip in chips:
        print(f"{chip.name}: {chip.description}")
        for key, value in describe(chip):
            print(f"  {key:<17} {value}")
        if args.chip:
            print("  sources:")
            for key, src in sorted(chip.sources.items()):
                print(f"    {key}: {src}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from t10c import frontend, models
    from t10c.driver import chip_graph, load_source
    from t10c.explain import OpNotFoundError, explain_op, find_op, format_explanation
    from t10c.strategies import search_options as strategy_search

    chip = load_chip(args.chip)
    try:
        # explain plans one op: shapes are all it needs, so zoo weights are not drawn
        model = load_source(args.model, seq_len=args.seq_len, batch=args.batch, weights=False,
                            quantize=args.quantize)
        # (`best` is a choice between two whole compiles: one op is shown as `all` has it)
        graph = chip_graph(model, chip, dict(args.shape), dtype=args.dtype,
                           fuse="all" if args.fuse == "best" else args.fuse)
    except (models.UnknownModelError, frontend.ModelNotFoundError) as exc:
        return _error(str(exc), EXIT_USAGE)
    except frontend.FrontendError as exc:
        return _error(str(exc), EXIT_FAIL)
    try:
        op = find_op(graph, args.op)
    except OpNotFoundError as exc:
        return _error(str(exc), EXIT_USAGE)
    opts = strategy_search("t10", search_options(args))
    given = None
    if args.plan is not None:
        given = _given_plans(args, graph, op, chip, opts)
        if isinstance(given, int):
            return given
    explanation = explain_op(graph, op, chip, args.dtype, opts)
    print(format_explanation(explanation, chip, args.dtype))
    if given is not None:
        from t10c.explain import format_given

        print(format_given(op, explanation.front, *given))
    return 0 if explanation.front else EXIT_FAIL


def _given_plans(args: argparse.Namespace, graph, op, chip, opts):
    """(plans, what) that ``explain --plan FILE`` shows for ``op``, or an exit code."""
    from t10c.partition import PlanError, match_ops, search_op_constrained
    from t10c.planfile import PlanFileError, load_plan_arg

    try:
        given = load_plan_arg(args.plan)
    except PlanFileError as exc:
        return _error(str(exc), EXIT_USAGE)
    if not isinstance(given, tuple):
        mine = [p for p in given.plan.ops if p.op == op.name]
        if not mine or given.plan.chip != chip.name or given.plan.dtype != args.dtype:
            return _error(f"{args.plan} has no plan of {op.name} for {chip.name} "
                          f"({args.dtype}): it was made for {given.plan.model} on "
                          f"{given.plan.chip} ({given.plan.dtype})", EXIT_FAIL)
        return mine[:1], f"the plan {args.plan} gives {op.name}"
    try:
        c = match_ops(graph, given)[graph.ops.index(op)]
        if c is None:
            return _error(f"{args.plan} does not constrain {op.name}", EXIT_USAGE)
        plans = search_op_constrained(graph, op, chip, args.dtype, c, opts)
    except PlanError as exc:
        return _error(str(exc), EXIT_FAIL)
    return plans, f"obeying {c.pattern} ({c.describe()})"


def fuse_arg(p: argparse.ArgumentParser) -> None:
    """``--fuse``, for every command that compiles a model (`t10c.fusion`)."""
    p.add_argument("--fuse", choices=FUSE_CHOICES, default=FUSE_CHOICES[0], help=fuse_help())


def _base_options(args: argparse.Namespace):
    from t10c.driver import CompileOptions

    timing_only = bool(getattr(args, "timing_only", False))
    return CompileOptions(dtype=args.dtype, seq_len=args.seq_len, batch=args.batch,
                          quantize=args.quantize, pinned=dict(args.shape),
                          search=search_options(args), fuse=args.fuse,
                          timing_only=timing_only, weights=not timing_only)


def _entries(models: list[str], chips: list[str], strategies: list[str],
             args: argparse.Namespace, slim: bool = False):
    from t10c.compare import run_entry

    loaded = [load_chip(c) for c in chips]
    entries = []
    for model in models:
        for chip in loaded:
            for strategy in strategies:
                print(f"[{model} on {chip.name}: {strategy}]", file=sys.stderr)
                with StageProgress() as progress:
                    entry = run_entry(model, chip, strategy, _base_options(args),
                                      progress=progress)
                entries.append(entry.slim() if slim else entry)
    return entries


def _wall_line(wall: float, ref_wall: float, prepare_s: float, session_s: float) -> str:
    """The run's wall times, the emulator's and onnxruntime's, each with what came before
    its clock (the program's tables; the session)."""
    return (f"emulation wall time {wall:.2f} s (its tables made in {prepare_s:.2f} s before); "
            f"onnxruntime {ref_wall:.3f} s (its session made in {session_s:.2f} s before)")


def cmd_run(args: argparse.Namespace) -> int:
    """Emulate a program directory again: its program, weights and input specs come from DIR
    (no frontend runs), and onnxruntime checks it on DIR's model.onnx."""
    from t10c.chips import chip_from_dict
    from t10c.codegen.program import ProgramError
    from t10c.codegen.verify import verify_program
    from t10c.driver import TOLERANCE, max_rel_err, prepare_run, reference
    from t10c.emulator import EmulatorError, emulate
    from t10c.planfile import write_json
    from t10c.rundir import RunDirError, draw_inputs, load_run_dir

    meta_path = args.dir / "compile.json"
    if not meta_path.is_file():
        if (args.dir / "program.json").is_file():  # a compiled directory that lost a file
            print(f"t10c: error: {meta_path} is missing; write the directory again with "
                  f"t10c compile MODEL -o {args.dir}", file=sys.stderr)
            return EXIT_FAIL
        print(f"t10c: error: {args.dir} has no compile.json; write one with "
              f"t10c compile MODEL -o {args.dir}", file=sys.stderr)
        return EXIT_USAGE
    try:
        meta = json.loads(meta_path.read_text())
        chip_doc, model_name = dict(meta["chip"]), str(meta["model"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        print(f"t10c: error: {meta_path} is not a readable compile.json ({exc}); write the "
              f"directory again with t10c compile MODEL -o {args.dir}", file=sys.stderr)
        return EXIT_FAIL
    chip = chip_from_dict(chip_doc, origin=str(meta_path))
    try:
        run = load_run_dir(args.dir)
        verify_program(run.program, chip)
    except (RunDirError, ProgramError) as exc:
        print(f"t10c: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    program = run.program
    inputs = draw_inputs(run.inputs, args.seed)
    try:
        prepared, prepare_s = prepare_run(program, chip)
        outputs, tl, wall = emulate(program, chip, inputs, run.weights, prepared=prepared)
    except EmulatorError as exc:
        print(f"t10c: error: emulation failed: {exc}", file=sys.stderr)
        return EXIT_FAIL
    try:
        ref, ref_wall, session_s = reference(run.model, inputs, args.dir / "model.onnx")
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own kinds
        print(f"t10c: error: onnxruntime cannot run {args.dir / 'model.onnx'}: "
              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return EXIT_FAIL
    err = max_rel_err(outputs, ref)
    tol = TOLERANCE[program.dtype]
    print(f"emulated latency {tl.cycles} cycles = {tl.latency_s * 1e6:.1f} us; peak SRAM "
          f"{tl.peak_sram_bytes_per_core} bytes per core")
    print(f"max relative error vs onnxruntime {err:.2e} (tolerance {tol:.0e}): "
          f"{'OK' if err <= tol else 'MISMATCH'}")
    print(_wall_line(wall, ref_wall, prepare_s, session_s))
    write_json(args.dir / "run.json", {
        "format": "t10c-run/1", "model": model_name, "chip": chip.name,
        "dtype": program.dtype, "seed": args.seed, "cycles": tl.cycles,
        "latency_s": tl.latency_s, "predicted_cycles": _predicted_cycles(args.dir),
        "max_rel_err": err, "tolerance": tol, "ok": err <= tol,
        "peak_sram_bytes_per_core": tl.peak_sram_bytes_per_core, "host_bytes": tl.host_bytes,
        "emulate_wall_s": wall, "reference_wall_s": ref_wall, "emulate_prepare_s": prepare_s,
        "reference_session_s": session_s, "ops": tl.by_op()})
    if args.trace:
        from t10c.emulator.trace import write_trace
        write_trace(tl, args.trace, f"{model_name} on {chip.name}")
        print(f"wrote trace {args.trace}")
    return 0 if err <= tol else EXIT_FAIL


def _predicted_cycles(directory: Path) -> int | None:
    """The plan's predicted latency, from DIR/plan.json (None if it cannot be read)."""
    try:
        value = json.loads((directory / "plan.json").read_text())["total_cycles"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return value if type(value) is int else None


def _save_program_dir(compiled, out: Path, copied: bool) -> None:
    """The program and what `cmd_run` needs to run it alone: weights, input specs, and the
    model (written here for a zoo model or a quantized one; a file model as it is is copied
    by `cmd_compile`: ``copied``)."""
    from t10c import frontend
    from t10c.rundir import save_run_files

    compiled.program.save(out)
    if frontend.has_weights(compiled.graph):  # shape-only: nothing to run, nothing to save
        save_run_files(out, compiled.program, compiled.graph,
                       None if copied else compiled.model, compiled.weights)


def cmd_compare(args: argparse.Namespace) -> int:
    from t10c import report
    from t10c.outputs import write_text

    chips = args.chips or [args.chip]
    fmt = args.format or ("html" if args.out and args.out.suffix == ".html" else "md")
    if fmt == "html":
        try:  # before any work: the page cannot be drawn without it
            import matplotlib  # noqa: F401
        except ImportError:
            return _error("the HTML report needs matplotlib: pip install 't10c[report]' (or "
                          "ask for --format md or json)", EXIT_FAIL)
    entries = _entries([args.model], chips, args.strategies, args)
    if fmt == "html":
        text = report.to_html(entries)
    else:
        text = report.to_json(entries) if fmt == "json" else report.to_markdown(entries)
    if args.out:
        write_text(args.out, text + "\n")
        print(f"wrote {args.out}")
    else:
        print(text)
    bad = [e for e in entries if e.result is not None and not e.result.ok]
    return EXIT_FAIL if bad else 0


def cmd_mesh_compare(args: argparse.Namespace) -> int:
    from t10c.codegen import CodegenError
    from t10c.emulator import EmulatorError
    from t10c.frontend import FrontendError
    from t10c.meshcompare import Failed, mesh_compare, table
    from t10c.partition import PlanError

    chip = load_chip(args.chip)
    gemm, gemv = "x".join(map(str, args.gemm)), "x".join(map(str, args.gemv))
    cache = f" (cache {args.cache_len})" if args.cache_len else ""
    workloads = {"gemm": ("prefill GEMM", f"matmul-{gemm}", None),
                 "gemv": ("decode GEMV", f"matmul-1x{gemv}", None),
                 "model": ("model", args.model, None),
                 "decode": (f"decode step{cache}", args.decode, args.cache_len)}
    try:
        rows = mesh_compare([workloads[r] for r in MESH_ROWS if r in args.rows], chip,
                            _base_options(args),
                            args.timing_only, log=lambda m: print(m, file=sys.stderr),
                            progress=StageProgress)
    except (FrontendError, PlanError, CodegenError, EmulatorError, ValueError) as exc:
        return _error(str(exc).splitlines()[0], EXIT_FAIL)
    failed = [x for r in rows for x in (r.aware, r.assumed) if isinstance(x, Failed)]
    if len(failed) == 2 * len(rows):  # nothing to compare: the first reason is the answer
        return _error(failed[0].reason, EXIT_FAIL)
    print(f"{chip.name}: {chip.rows} x {chip.cols} {chip.topology}; ratio = all-to-all-"
          "assumption latency / mesh-aware latency, both emulated on the mesh")
    print(table(rows, chip))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import math

    from t10c.compare import Entry, largest_batches, speedup
    from t10c.outputs import write_text

    batches = args.batch or [None]
    entries = []
    for model in args.models:
        for batch in batches:
            entries += _entries([model], args.chips, list(DEFAULT_STRATEGIES),
                                argparse.Namespace(**{**vars(args), "batch": batch}), slim=True)
    base = [s for s in DEFAULT_STRATEGIES if s != "t10"]  # the baselines
    head = ["model", "batch", "chip", "compile (s)", *(f"{s} (us)" for s in DEFAULT_STRATEGIES),
            *(f"vs {s}" for s in base), "of roofline", "of ideal", "of exchange bound",
            "emulation (s)", "onnxruntime (s)", "matches"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    groups: dict[tuple[str, int | None, str], dict[str, Entry]] = {}
    for e in entries:
        groups.setdefault((e.model, e.batch, e.chip.name), {})[e.strategy] = e
    for (model, batch, chip), by in groups.items():
        t10 = by["t10"]

        def us(e: Entry) -> str:
            return f"{e.latency_s * 1e6:.1f}" if e.result else "does not fit"

        def x(v: float) -> str:
            return "-" if math.isnan(v) else f"{v:.2f}x"

        def checked(e: Entry) -> bool:
            return e.result is not None and not e.result.timing_only

        ok = all(e.result is None or e.result.ok for e in by.values())
        row = [model, "-" if batch is None else str(batch), chip,
               "-" if math.isnan(t10.compile_s) else f"{t10.compile_s:.2f}",
               *(us(by[s]) for s in DEFAULT_STRATEGIES),
               *(x(speedup(entries, t10, s)) for s in base),
               f"{100 * t10.roofline_fraction:.1f}%" if t10.result else "-",
               f"{100 * t10.ideal_fraction:.1f}%" if t10.result else "-",
               "-" if math.isnan(t10.exchange_fraction) else
               f"{100 * t10.exchange_fraction:.1f}%",
               f"{t10.result.emulate_wall_s:.2f}" if checked(t10) else "-",
               f"{t10.result.reference_wall_s:.3f}" if checked(t10) else "-",
               "timing only" if args.timing_only else "yes" if ok else "NO"]
        lines.append("| " + " | ".join(row) + " |")
        rows.append(dict(zip(head, row)))
    print("\n".join(lines))
    capacity = largest_batches(entries, list(DEFAULT_STRATEGIES)) if len(batches) > 1 else []
    if capacity:
        print(f"\nLargest batch that fits, of {', '.join(map(str, batches))}, and its "
              "throughput:\n")
        cap_head = ["model", "chip", *(f"{s}: batch, samples/s" for s in DEFAULT_STRATEGIES),
                    *(f"t10 vs {s}" for s in base)]
        print("| " + " | ".join(cap_head) + " |\n|" + "---|" * len(cap_head))
        for c in capacity:
            cells = [c.model, c.chip,
                     *(f"{c.batch[s]}, {c.throughput[s]:,.0f}" if c.batch[s] else "none"
                       for s in DEFAULT_STRATEGIES),
                     *(x(c.gain("t10", s)) for s in base)]
            print("| " + " | ".join(cells) + " |")
    if args.json:
        from t10c import report

        write_text(args.json, json.dumps({"format": "t10c-bench/1", "table": rows,
                                          "largest_batch": [c.as_dict() for c in capacity],
                                          "runs": json.loads(report.to_json(entries))["rows"]},
                                         indent=1) + "\n")
    bad = [e for e in entries if e.result is not None and not e.result.ok]
    return EXIT_FAIL if bad else 0


def _check_compile_args(args: argparse.Namespace) -> str | None:
    """What is wrong with a combination of compile's flags, or None."""
    if args.timing_only and (args.run or args.emit):
        return ("--timing-only runs without data and keeps no program: it cannot be combined "
                "with --run or --emit")
    if args.trace and not (args.run or args.timing_only):
        return "--trace writes the timeline of a run: add --run or --timing-only"
    if args.core is not None and args.emit is None:
        return "--core picks the core of --emit asm: add --emit asm"
    if args.out is not None and args.trace is not None and \
            args.trace.resolve().is_relative_to(args.out.resolve()):
        return "--trace cannot go inside the -o directory, which is replaced as a whole"
    return None


def cmd_compile(args: argparse.Namespace) -> int:
    from t10c import models
    from t10c.codegen import CodegenError
    from t10c.driver import CompileOptions, compile_model, run_compiled
    from t10c.emulator import EmulatorError
    from t10c.frontend import FrontendError, ModelNotFoundError
    from t10c.partition import PlanError, Replay, SolverOptions
    from t10c.planfile import (
        PlanFileError,
        load_plan_arg,
        run_document,
        timing_run_document,
        write_json,
    )
    from t10c.strategies import search_options as strategy_search

    problem = _check_compile_args(args)
    if problem:
        return _error(problem, EXIT_USAGE)
    given = None
    if args.plan is not None:
        try:
            given = load_plan_arg(args.plan)
        except PlanFileError as exc:
            return _error(str(exc), EXIT_USAGE)
    chip = load_chip(args.chip)
    if args.choice != "best" and not chip.has_dram:
        return _error(f"--choice {args.choice} applies to chips with off-chip memory; "
                      f"{chip.name} has none (its solve keeps the solver's choice)", EXIT_USAGE)
    if args.choice != "best" and (args.planner == "greedy" or args.plan is not None):
        return _error(f"--choice {args.choice} picks among the solve's whole-graph choices: "
                      "drop it, or drop --planner greedy and --plan", EXIT_USAGE)
    if args.refine and (chip.has_dram or args.planner == "greedy"
                        or isinstance(given, Replay)):
        return _error("--refine searches after the solve (constrained ops keep their plans): "
                      "drop it, or drop --planner greedy and the plan.json replayed"
                      if not chip.has_dram else
                      f"--refine applies to chips without off-chip memory; {chip.name} has "
                      "some (its preload schedule is chosen after the plans): drop --refine",
                      EXIT_USAGE)
    if args.core is not None and args.core >= chip.cores:
        return _error(f"core {args.core} does not exist (the chip has {chip.cores} cores: "
                      f"0 to {chip.cores - 1})", EXIT_USAGE)
    options = CompileOptions(
        dtype=args.dtype, quantize=args.quantize, seq_len=args.seq_len, batch=args.batch,
        pinned=dict(args.shape),
        search=strategy_search(args.strategy, search_options(args)),
        solver=SolverOptions(time_limit_s=args.time_limit, workers=args.workers,
                             planner=args.planner, relative_gap=args.gap,
                             early_stop=args.early_stop, choice=args.choice,
                             refine=args.refine),
        # zoo weights are drawn only when the program will run, here or from -o DIR
        weights=args.run or (args.out is not None and not args.timing_only),
        front_limit=args.front, timing_only=args.timing_only, fuse=args.fuse,
        check=args.check, replay=given if isinstance(given, Replay) else None,
        constraints=given if isinstance(given, tuple) else ())
    progress = StageProgress()
    try:
        try:
            compiled = compile_model(args.model, chip, options, progress)
        except models.ModelTooLargeError as exc:
            if args.run:
                raise
            # -o wanted weights for `t10c run`; a model past protobuf's limit has none to give
            print(f"t10c: note: {exc.name}'s weights are past protobuf's 2 GB limit: "
                  f"{args.out} holds the plan and program without weights (t10c run cannot "
                  "run it)", file=sys.stderr)
            options = dataclasses.replace(options, weights=False)
            compiled = compile_model(args.model, chip, options, progress)
    except (models.UnknownModelError, ModelNotFoundError) as exc:
        return _error(str(exc), EXIT_USAGE)
    except (FrontendError, PlanError, CodegenError, ValueError) as exc:
        return _error(str(exc), EXIT_FAIL)
    finally:
        progress.close()

    if args.emit == "asm":
        core = args.core or 0
        try:
            lines = compiled.program.for_core(core)
        except ValueError as exc:
            return _error(str(exc), EXIT_USAGE)
        print(f"; core {core} of {chip.cores}: {compiled.name} on {chip.name} "
              f"({compiled.plan.dtype})")
        print("\n".join(lines))

    if not args.no_table and args.emit is None:
        print_table(compiled)
    _print_summary(compiled, args.timing_only)
    if compiled.timeline is not None and args.trace:
        _write_trace(compiled.timeline, args.trace,
                     f"{compiled.name} on {chip.name} (timing only)")
    wrote = ""
    if args.out:
        wrote = f" in {_write_compile(compiled, args):.2f} s"
        if compiled.timeline is not None:  # read like a functional run's run.json
            write_json(args.out / "run.json", timing_run_document(compiled))
    status = 0
    if args.run:
        with StageProgress() as progress:
            try:
                result = run_compiled(compiled, args.seed, progress)
            except EmulatorError as exc:
                return _error(f"emulation failed: {exc}", EXIT_FAIL)
        tl = result.timeline
        print(f"emulated latency {tl.cycles} cycles = {tl.latency_s * 1e6:.1f} us; peak SRAM "
              f"{tl.peak_sram_bytes_per_core} bytes per core")
        print(_bounds_line(compiled.plan, tl.cycles))
        if chip.is_mesh:
            print(_mesh_summary(tl))
        print(f"max relative error vs onnxruntime {result.max_rel_err:.2e} "
              f"(tolerance {result.tolerance:.0e}): {'OK' if result.ok else 'MISMATCH'}")
        print(_wall_line(result.emulate_wall_s, result.reference_wall_s,
                         result.emulate_prepare_s, result.reference_session_s))
        if args.out:  # one more file in the compile's directory, itself written atomically
            write_json(args.out / "run.json", run_document(compiled, result, args.seed))
        if args.trace:
            _write_trace(tl, args.trace, f"{compiled.name} on {chip.name}")
        if not result.ok:
            print("t10c: error: the emulator's outputs differ from onnxruntime's beyond the "
                  "tolerance", file=sys.stderr)
            status = EXIT_FAIL
    if args.out:
        print(f"wrote {args.out}{wrote}: "
              f"{', '.join(sorted(p.name for p in args.out.iterdir()))}")
    return status


def _print_summary(compiled, timing_only: bool) -> None:
    """The compile's figures: stages' times, the solver, latency and SRAM."""
    chip, plan, t = compiled.chip, compiled.plan, compiled.timings
    print(f"model {compiled.name}: {len(compiled.graph.ops)} ops, "
          f"{compiled.graph.flops() / 1e9:.2f} GFLOP; chip {chip.name}; dtype {plan.dtype}")
    stage = "codegen with timing-only emulation" if timing_only else "codegen"
    print(f"compile time {t['total_s']:.2f} s (frontend {t['frontend_s']:.2f} s, search "
          f"{t['search_s']:.2f} s, solve {t['solve_s']:.2f} s, planner passes "
          f"{t['passes_s']:.2f} s, {stage} {t['codegen_s']:.2f} s)")
    s = plan.solver
    options = compiled.options
    if options.replay is not None:  # no search and no solve: the account is the original's
        print(f"plan replayed (checked against the model and chip), as {s.name} chose it: "
              f"objective {s.objective_cycles} cycles")
    elif s.name == "greedy":
        print(f"planner greedy: objective {s.objective_cycles} cycles")
    else:
        how = f" ({s.method})" if s.method else ""
        print(f"solver {s.status}{how}: objective {s.objective_cycles} cycles, bound "
              f"{s.bound_cycles} (gap {100 * s.gap:.2f}%), greedy "
              f"{s.greedy_objective_cycles} cycles, {s.wall_s} s; deterministic time "
              f"{s.deterministic_s} s over the compile's solves")
        if s.choices:
            print(_choices_line(s.choices))
        if s.refined:
            trials, saved = s.refined
            asked = (f"(the default on a mesh: the costliest op's moves, at most "
                     f"{trials_for(options.solver, chip)})" if adaptive(options.solver)
                     else f"of --refine {options.solver.refine}")
            print(f"refined: {trials} trial(s) {asked} saved {saved} cycles")
    if options.constraints:
        print(f"{len(options.constraints)} plan constraint(s) from --plan obeyed")
    prog = compiled.program
    frag = max(prog.peak_sram_bytes_per_core / max(prog.live_sram_bytes_per_core, 1) - 1, 0.0)
    layout = prog.sram_layout if not prog.live_sram_bytes_per_core else \
        f"{prog.sram_layout}, {100 * frag:.1f}% fragmentation"
    print(f"predicted latency {plan.total_cycles} cycles = "
          f"{chip.cycles_to_s(plan.total_cycles) * 1e6:.1f} us; peak SRAM "
          f"{prog.peak_sram_bytes_per_core} of {chip.sram_bytes_per_core} bytes per core "
          f"({layout})")
    if compiled.timeline is not None:
        tl = compiled.timeline
        print(f"emulated latency (timing only) {tl.cycles} cycles = {tl.latency_s * 1e6:.1f} us; "
              f"peak SRAM {tl.peak_sram_bytes_per_core} bytes per core")
        print(_bounds_line(plan, tl.cycles))
        if chip.is_mesh:
            print(_mesh_summary(tl))


def _choices_line(choices: tuple[tuple[str, int, int], ...]) -> str:
    """The whole-graph choices compared under the preload schedule, the kept one first: each
    one's predicted step within the solve's SRAM reserve and within twice it (the fallback
    of a streamed run whose layout overflows); the sum judges."""
    from t10c.partition.solve import CHOICES

    (kept, a, b), *others = choices
    line = (f"choice kept: {CHOICES.get(kept, kept)}, predicted step {a} cycles ({b} "
            "within twice the SRAM reserve)")
    if others:
        line += "; against " + ", ".join(f"{CHOICES.get(n, n)} {x} ({y})"
                                         for n, x, y in others)
    return line


def _bounds_line(plan, cycles: int) -> str:
    """The emulated latency against the plan's lower bounds (`partition.bounds`)."""
    b = plan.bounds
    if b is None:
        return "bounds: none (a plan made by hand)"
    roof, ideal = b.fractions(cycles)
    dram = " or its DRAM time" if b.dram_roofline_cycles else ""
    line = (f"bounds: {100 * roof:.1f}% of the compute roofline ({b.roofline_cycles} cycles), "
            f"{100 * ideal:.1f}% of the ideal ({b.ideal_cycles} cycles: every op at its "
            f"fastest plan{dram}, no memory limit, no re-layout)")
    if b.exchange_cycles:
        line += (f", {100 * b.of_exchange(cycles):.1f}% of the exchange bound "
                 f"({b.exchange_cycles} cycles: the ideal with what weight contractions must "
                 "receive and their weights' SRAM)")
    return line


def _write_compile(compiled, args: argparse.Namespace) -> float:
    """Fill ``args.out`` with the compile: written in a temporary sibling directory and swapped
    in at the end, so that the directory holds the old compile, the new one, or nothing.
    Returns the write's wall time (compile.json, written last, says that of the files before
    it as ``write_s``)."""
    import shutil
    import time

    from t10c import models, outputs
    from t10c.planfile import compile_document, plan_document, write_json

    # keep the model next to its program: a file as it is, else the model compiled (a zoo
    # model's is rebuilt, a quantized one's has the int8 weights)
    keep_model = not models.is_zoo_name(args.model) and args.quantize is None
    steps = 2 + (compiled.timeline is None) + keep_model
    start = time.perf_counter()
    with StageProgress() as progress, outputs.directory(args.out) as tmp:
        progress("write", 0, steps)
        write_json(tmp / "plan.json", plan_document(compiled))
        done = 1
        progress("write", done, steps)
        if compiled.timeline is None:
            _save_program_dir(compiled, tmp, keep_model)
            done += 1
            progress("write", done, steps)
        model_file = None
        if keep_model:
            model_file = "model.onnx"
            shutil.copyfile(args.model, tmp / model_file)
            done += 1
            progress("write", done, steps)
        write_json(tmp / "compile.json", compile_document(
            compiled, args.model, args.seq_len, args.batch, dict(args.shape), model_file,
            write_s=time.perf_counter() - start))
        progress("write", steps, steps)
    return time.perf_counter() - start


def _write_trace(timeline, path: Path, name: str) -> None:
    from t10c import outputs
    from t10c.emulator.trace import write_trace

    with outputs.replacing(path) as tmp:
        write_trace(timeline, tmp, name)
    print(f"wrote trace {path}")


def _mesh_summary(tl) -> str:
    """Where the time went on a mesh: the longest route and the busiest link."""
    moved = [r for r in tl.records if r.phase in ("shift", "relayout", "fetch", "reduce")]
    by_phase: dict[str, int] = {}
    for r in tl.records:
        by_phase[r.phase] = by_phase.get(r.phase, 0) + r.cycles
    shares = ", ".join(f"{k} {100 * v / max(tl.cycles, 1):.0f}%" for k, v in by_phase.items())
    worst = max((r.hops for r in moved if r.phase == "shift"), default=0)
    busiest = max((r.bytes_per_core for r in moved), default=0)
    total = int(tl.link_bytes.sum()) if tl.link_bytes is not None else 0
    return (f"mesh: longest shift route {worst} hop{'' if worst == 1 else 's'}; busiest link "
            f"{busiest} bytes in one phase; "
            f"{total} bytes crossed links in all; time by phase: {shares}")


def _ft(op, p) -> str:
    parts = []
    for i in range(len(op.operands)):
        for axis, f in p.f_t(op, i).items():
            if f > 1:
                role = "out" if i == len(op.inputs) else f"in{i}"
                parts.append(f"{role}:{axis}/{f}")
    return " ".join(parts) or "-"


def print_table(c) -> None:
    rows = [("op", "kind", "F_op", "f_t", "steps", "cycles", "bytes/core")]
    for op, p, r in zip(c.graph.ops, c.plan.ops, c.plan.relayout_cycles):
        F = ",".join(f"{a}={f}" for a, f in zip(op.axis_names, p.F) if f > 1) or "1"
        rows.append((op.name, op.kind, F, _ft(op, p), str(p.steps), str(p.cycles.total + r),
                     str(p.hot_bytes_per_core)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(w) if i < 4 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
