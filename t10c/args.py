"""Command-line argument types and shared argument groups (used by `t10c.cli` and
`t10c.check`).

Every argument is validated where argparse reads it, so that a bad value is one line naming
the flag, what was given and what is expected, with exit code 2, before any work starts.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn, TypeVar

from t10c.chips import PRESETS
from t10c.models import ALIASES, ZOO_NAMES, is_zoo_name
from t10c.models.quantize import QUANTIZED_TYPES
from t10c.partition.search import SearchOptions
from t10c.strategies import STRATEGIES

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``t10c: error: ...``, and exit 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("t10c").strip()
        where = f"{command}: " if command else ""
        print(f"t10c: error: {where}{message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``known`` to ``word``, or an empty string."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _number(kind: Callable[[str], float], text: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        value = int(_number(int, text))
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def float_in(low: float, high: float = math.inf, low_open: bool = False
             ) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (or (low, high] with ``low_open``)."""
    def parse(text: str) -> float:
        value = float(_number(float, text))
        if value < low or (low_open and value == low) or value > high:
            lo = f"{'above' if low_open else 'at least'} {low:g}"
            span = lo if high == math.inf else f"{lo} and at most {high:g}"
            raise argparse.ArgumentTypeError(f"must be {span}, got {text}")
        return value
    parse.__name__ = "number"
    return parse


def dims_arg(count: int, example: str) -> Callable[[str], tuple[int, ...]]:
    """An argparse type: ``count`` positive integers joined by x (``MxKxN``)."""
    def parse(text: str) -> tuple[int, ...]:
        parts = text.lower().split("x")
        if len(parts) != count or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(
                f"expected {count} positive integers joined by x, e.g. {example}, got {text!r}")
        return tuple(int(p) for p in parts)
    parse.__name__ = "dimensions"
    return parse


def shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """An argparse type: ``NAME=DxDx...`` with positive dimensions."""
    name, sep, dims = text.partition("=")
    parts = dims.lower().split("x")
    if not sep or not name or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected NAME=DxDx... with positive dimensions, "
                                         f"e.g. input_ids=1x128, got {text!r}")
    return name, tuple(int(p) for p in parts)


def model_arg(text: str) -> str:
    """An argparse type: a zoo name, or the path of something that exists (the frontend says
    what is wrong with a file)."""
    if is_zoo_name(text) or Path(text).exists():
        return text
    if text.endswith(".onnx") or "/" in text:
        raise argparse.ArgumentTypeError(f"model file {text} does not exist")
    raise argparse.ArgumentTypeError(
        f"unknown model {text!r}{did_you_mean(text, [*ZOO_NAMES, *ALIASES])}; known models: "
        f"{', '.join(ZOO_NAMES)}, matmul-MxKxN, or an .onnx file")


def chip_arg(text: str) -> str:
    """An argparse type: a preset name or a path (`t10c.chips.load_chip` reads the file)."""
    if text in PRESETS or text.endswith(".toml") or "/" in text or Path(text).exists():
        return text
    raise argparse.ArgumentTypeError(
        f"unknown chip {text!r}{did_you_mean(text, PRESETS)}; presets: {', '.join(PRESETS)}, "
        "or give a chip .toml file")


def strategy_arg(text: str) -> str:
    """An argparse type: a strategy of `t10c.strategies.STRATEGIES`."""
    if text in STRATEGIES:
        return text
    raise argparse.ArgumentTypeError(
        f"unknown strategy {text!r}{did_you_mean(text, STRATEGIES)}; use "
        f"{', '.join(STRATEGIES)}")


#: `t10c mesh-compare`'s rows, in the order they run: the prefill GEMM, the decode GEMV, the
#: whole model and the decode step
MESH_ROWS = ("gemm", "gemv", "model", "decode")


def mesh_row_arg(text: str) -> str:
    """An argparse type: a row of `t10c mesh-compare` (`MESH_ROWS`)."""
    if text in MESH_ROWS:
        return text
    raise argparse.ArgumentTypeError(
        f"unknown row {text!r}{did_you_mean(text, MESH_ROWS)}; use {', '.join(MESH_ROWS)}")


T = TypeVar("T")


def list_of(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """An argparse type: a comma-separated list, every element checked by ``item``."""
    def parse(text: str) -> list[T]:
        parts = [p.strip() for p in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return [item(p) for p in parts]
    parse.__name__ = "list"
    return parse


def new_file_arg(text: str) -> Path:
    """An argparse type: a file to write, whose folder exists; an existing file is replaced,
    an existing directory is refused."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    _check_parent(path)
    return path


def out_dir_arg(text: str) -> Path:
    """An argparse type: a directory to fill with a compile, whose parent exists. An existing
    one must be empty or hold a previous compile (it is replaced as a whole)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    if path.exists() and Path.cwd().resolve().is_relative_to(path.resolve()):
        raise argparse.ArgumentTypeError(
            f"{text} holds the current directory, and an output directory is replaced as a "
            "whole: give a directory below it, such as out")
    if path.is_dir() and any(path.iterdir()) and not (path / "compile.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{text} is not empty and holds no compile (no compile.json): t10c replaces an "
            "output directory as a whole, so give a new or empty directory")
    _check_parent(path)
    return path


def _check_parent(path: Path) -> None:
    import os

    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {parent} is not writable")


def model_args(p: argparse.ArgumentParser, batches: bool = False) -> None:
    """The options that size a model and prune the per-op search (compile, explain, compare,
    bench, mesh-compare); with ``batches``, ``--batch`` takes a list (bench: a row each)."""
    p.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16",
                   help="storage dtype for memory, timing and numerics (default: fp16)")
    p.add_argument("--quantize", choices=QUANTIZED_TYPES,
                   help="store the model's matmul weights as int8, a scale per output column "
                        "(weight-only; the model gains DequantizeLinear nodes, which "
                        "onnxruntime checks as they are)")
    p.add_argument("--seq-len", type=int_at_least(1),
                   help="sequence length of zoo transformers (128)")
    if batches:
        p.add_argument("--batch", type=list_of(int_at_least(1)), metavar="B[,B...]",
                       help="batch sizes of zoo models, comma-separated: a row each, and the "
                            "largest that fits under each strategy")
    else:
        p.add_argument("--batch", type=int_at_least(1), help="batch size of zoo models")
    p.add_argument("--shape", type=shape_arg, action="append", default=[],
                   metavar="NAME=DxD", help="pin a dynamic input shape (repeatable)")
    d = SearchOptions()
    p.add_argument("--min-util", type=float_in(0.0, 1.0), default=d.min_util,
                   help=f"keep plans using at least this share of the cores, 0 to 1 (default: "
                        f"{d.min_util})")
    p.add_argument("--max-pad", type=float_in(0.0), default=d.max_pad,
                   help=f"keep plans padding the iteration space by at most this share "
                        f"(default: {d.max_pad})")
    p.add_argument("--max-steps", type=int_at_least(1), default=d.max_steps,
                   help=f"at most this many compute steps per op (default: {d.max_steps})")
    p.add_argument("--chains", action="store_true",
                   help="also enumerate inputs rotating slower than their axis' steps "
                        "(legal, but dominated under bulk-synchronous timing)")


def search_options(args: argparse.Namespace) -> SearchOptions:
    """The user's search options (before a strategy changes them)."""
    return SearchOptions(min_util=args.min_util, max_pad=args.max_pad,
                         max_steps=args.max_steps, chains=args.chains)
