"""``t10c check MODEL [--chip CHIP]``: can this model be compiled at all, and what is in it.

Without planning anything, it lowers the model and prints, at once:

- every node t10c cannot compile (op type, node name, opset, reason);
- the device graph: ops by kind, parameters, FLOPs (of the supported part, when some nodes are
  not supported);
- whether the weights can fit on the chip at all: their bytes in the storage dtype against the
  SRAM of all cores together, each weight counted once (a necessary condition; ``t10c
  compile`` then finds out whether a plan fits next to the activations).

It is shape-only: zoo models are built without drawing their weights (gpt2-xl checks in 7
to 15 s, by the machine's load, and under 200 MB), and the FLOPs are `Graph.flops`, the
figure compile prints.

Exit codes: 0 the model can go to ``t10c compile``; 1 it cannot (unsupported nodes, weights
larger than the chip, a shape to pin, a malformed model); 2 bad usage (unknown model or chip).

The CLI wires it as ``add_check_parser(subparsers)`` and ``cmd_check(args)``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx

from t10c.chips import DTYPES, Chip, ChipError, load_chip
from t10c.dtypes import dtype_bytes, on_chip_dtype
from t10c.ir import Graph
from t10c.models.quantize import QUANTIZED_TYPES

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class CheckReport:
    """What `check_model` found; `ok` says whether the model can be compiled."""

    model: str
    opset: int
    nodes: Counter[str]
    unsupported: list[str]
    ops_by_kind: Counter[str]
    parameters: int
    flops: int
    weight_bytes: int
    chip: Chip
    dtype: str
    complete: bool
    errors: list[str] = field(default_factory=list)
    #: of `weight_bytes`, those of int8 (quantized) weights
    int8_bytes: int = 0

    @property
    def room(self) -> int:
        """Where the weights live: a chip's DRAM where it has some (each op's share is
        loaded into SRAM before it runs), else its SRAM."""
        return self.chip.dram_bytes if self.chip.has_dram else self.chip.total_sram_bytes

    @property
    def fits(self) -> bool:
        return self.weight_bytes <= self.room

    @property
    def ok(self) -> bool:
        return not self.unsupported and not self.errors and self.fits and self.complete


def _parameters(model: onnx.ModelProto) -> int:
    """Elements of the model's floating-point and int8 (quantized) initializers (shape
    constants excluded)."""
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
              onnx.TensorProto.BFLOAT16, onnx.TensorProto.INT8}
    return sum(math.prod(t.dims) for t in model.graph.initializer if t.data_type in floats)


#: ONNX ops that only re-lay out or re-type one tensor: a constant folded through them is the
#: same weight as its source (a tied LM head is the embedding table transposed)
SAME_WEIGHT_OPS = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
                             "Identity", "Cast"})


def weight_bytes(model: onnx.ModelProto, constants: dict[str, np.ndarray], dtype: str) -> int:
    """Bytes of the constants the device graph reads, each weight counted once.

    A constant folded from another by a `SAME_WEIGHT_OPS` node counts as its source (the
    larger of the two, as a Cast may widen). Floats are stored at ``dtype``; integer
    constants at their type on chip (`on_chip_dtype`: int8 weights a byte, indices 4).
    """
    produced_by = {out: node for node in model.graph.node for out in node.output}

    def source(name: str) -> str:
        seen = set()
        while name in produced_by and name not in seen:
            seen.add(name)
            node = produced_by[name]
            if node.op_type not in SAME_WEIGHT_OPS or not node.input:
                break
            name = node.input[0]
        return name

    largest: dict[str, int] = {}
    for name, value in constants.items():
        per = dtype_bytes(on_chip_dtype("float32" if value.dtype.kind == "f" else str(value.dtype),
                                        dtype))
        root = source(name)
        largest[root] = max(largest.get(root, 0), value.size * per)
    return sum(largest.values())


def check_model(source: str | onnx.ModelProto, chip: Chip, dtype: str = "fp16",
                pinned: dict[str, tuple[int, ...]] | None = None, seq_len: int | None = None,
                batch: int | None = None, quantize: str | None = None) -> CheckReport:
    """Lower ``source`` without its values and report (raises `FrontendError` for a model that
    cannot be read, `UnknownModelError`/`ModelNotFoundError` for a bad name).

    ``quantize``: as `t10c.driver.load_source`'s. Shape-only: a zoo model is built without
    drawing its weights, so the largest (gpt2-xl)
    check in well under a gigabyte. FLOPs are `Graph.flops`, the count compile prints.
    """
    from t10c import frontend
    from t10c.driver import load_source

    model = load_source(source, seq_len=seq_len, batch=batch, weights=False, quantize=quantize)
    name = source if isinstance(source, str) else (model.graph.name or "model")
    nodes = Counter(n.op_type for n in model.graph.node)
    params = _parameters(model)
    low = frontend.lower(model, pinned)
    unsupported = [str(n) for n in low.problems]
    errors: list[str] = []
    graph = None
    if not low.problems:
        try:
            graph = frontend.device_graph(low, name=str(name))
        except frontend.FrontendError as exc:
            errors.append(str(exc))
    if graph is None:
        # the supported part, before fusion: the same FLOP count over the ops lowered so far
        ctx = low.ctx
        used = {o.tensor for op in ctx.ops for o in op.operands}
        used |= {v.source for v in ctx.views.values()}
        graph = Graph(name=str(name), tensors=dict(ctx.tensors), ops=tuple(ctx.ops),
                      views=dict(ctx.views),
                      constants={k: v for k, v in ctx.constants.items() if k in used},
                      inputs=(), outputs=())
        complete = False
    else:
        complete = True
    return CheckReport(str(name), low.opset, nodes, unsupported,
                       Counter(op.kind for op in graph.ops), params, graph.flops(),
                       weight_bytes(model, graph.constants, dtype), chip, dtype, complete,
                       errors, sum(v.size for v in graph.constants.values() if v.dtype == np.int8))


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def format_report(r: CheckReport) -> str:
    lines = [f"model {r.model}: opset {r.opset}, {sum(r.nodes.values())} ONNX nodes "
             f"({', '.join(f'{k} {v}' for k, v in r.nodes.most_common())})"]
    if r.unsupported:
        lines.append(f"{len(r.unsupported)} unsupported node(s):")
        lines += [f"  {u}" for u in r.unsupported]
    else:
        lines.append("every node is supported")
    lines += [f"  {e}" for e in r.errors]
    part = "" if r.complete else " (the supported part, before fusion)"
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.ops_by_kind.items()))
    lines.append(f"device graph{part}: {sum(r.ops_by_kind.values())} ops ({kinds or 'none'}), "
                 f"{r.flops / 1e9:.3f} GFLOP")
    lines.append(f"parameters: {r.parameters:,}")
    total = r.room
    verdict = "fit in it" if r.fits else "do NOT fit"
    counted = "each counted once" + ("" if r.complete else ", of the supported part")
    stored = r.dtype + (f" ({_mb(r.int8_bytes)} of them int8)" if r.int8_bytes else "")
    sram = (f"{_mb(r.chip.total_sram_bytes)} of SRAM ({r.chip.cores} cores x "
            f"{r.chip.sram_bytes_per_core // 1024} KiB)")
    if r.chip.has_dram:
        lines.append(f"weights ({counted}): {_mb(r.weight_bytes)} at {stored} against "
                     f"{_mb(total)} of DRAM on {r.chip.name}, beside {sram}: they {verdict} "
                     f"({100 * r.weight_bytes / total:.1f}% of the DRAM; what does not stay "
                     "in SRAM is loaded before the ops that read it)")
    else:
        lines.append(f"weights on chip ({counted}): {_mb(r.weight_bytes)} at {stored} "
                     f"against {sram} on {r.chip.name}: they {verdict} "
                     f"({100 * r.weight_bytes / total:.1f}% of the chip)")
    if r.ok:
        # only necessary conditions were checked: the plan search decides the rest
        lines.append(f"result: nothing found that stops {r.model} on {r.chip.name}; whether "
                     f"each op's working set fits a core's SRAM next to the activations is "
                     f"for `t10c compile {r.model} --chip {r.chip.name}` to find out")
    else:
        why = []
        if r.unsupported:
            why.append(f"{len(r.unsupported)} unsupported node(s)")
        if r.errors:
            why.append("the model has no computation on chip")
        if not r.fits:
            why.append(f"the weights need {_mb(r.weight_bytes)}, the chip has {_mb(total)}"
                       + (" of DRAM" if r.chip.has_dram else ""))
        lines.append(f"result: cannot be compiled: {'; '.join(why)}")
    return "\n".join(lines)


def add_check_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``check`` to the CLI's subcommands."""
    p = subparsers.add_parser(
        "check", help="list unsupported nodes, summarise the model, check the weights fit",
        description="Lower MODEL without planning it: list every unsupported node, summarise "
                    "the device graph (ops by kind, parameters, FLOPs) and say whether the "
                    "weights can fit on CHIP. Exits 1 when the model cannot be compiled.")
    p.add_argument("model", help="zoo name or path to an .onnx file")
    p.add_argument("--chip", default="ipu-mk2", help="preset name or chip .toml file "
                                                      "(default: ipu-mk2)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp16",
                   help="storage dtype of the weights (default: fp16)")
    p.add_argument("--quantize", choices=QUANTIZED_TYPES,
                   help="store the matmul weights as int8, a scale per output column")
    p.add_argument("--seq-len", type=int, help="sequence length of zoo transformers")
    p.add_argument("--batch", type=int, help="batch size of zoo models")
    from t10c.args import shape_arg as _shape_arg

    p.add_argument("--shape", type=_shape_arg, action="append", default=[], metavar="NAME=DxD",
                   help="pin a dynamic input shape (repeatable)")
    return p


def cmd_check(args: argparse.Namespace) -> int:
    from t10c import frontend, models

    try:
        chip = load_chip(args.chip)
    except ChipError as exc:
        print(f"t10c: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = check_model(args.model, chip, args.dtype, dict(args.shape), args.seq_len,
                             args.batch, args.quantize)
    except (models.UnknownModelError, frontend.ModelNotFoundError) as exc:
        print(f"t10c: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (frontend.FrontendError, ValueError) as exc:
        print(f"t10c: error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print(format_report(report))
    return EXIT_OK if report.ok else EXIT_FAIL
