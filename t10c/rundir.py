"""The self-contained program directory: what ``t10c run DIR`` needs, without the frontend.

``compile -o DIR`` writes, next to ``plan.json`` and ``compile.json``:

- ``program.json`` / ``program.npz``: the program (`codegen.program`);
- ``weights.npz``: every host tensor the program loads that is not an input (the graph's
  constants, after the frontend's folding: what the chip holds, not the ONNX initializers);
- ``inputs.json`` (format ``t10c-inputs/1``): the graph inputs in order, with shape, dtype and,
  for integer inputs, the exclusive upper bound of the seeded indices (the rows of the table
  they index), so that ``t10c run`` draws the same inputs as ``compile --run``;
- ``model.onnx``: the model with its weights, the reference onnxruntime runs (a file model is
  copied; a zoo model is written).

`load_run_dir` reads them back; every missing or malformed file is one `RunDirError`.
"""

from __future__ import annotations

import json
import zipfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from google.protobuf.message import Message

from t10c.codegen.program import Load, Program, ProgramError
from t10c.codegen.verify import load_program
from t10c.ir import Graph
from t10c.models import with_weights
from t10c.shape_only import is_shape_only

INPUTS_FORMAT = "t10c-inputs/1"


class RunDirError(ValueError):
    """A program directory that cannot be run: which file, and what is wrong."""


@dataclass(frozen=True)
class InputSpec:
    """One graph input as the seeded inputs are drawn: normal floats, or integer indices in
    ``[0, high)``."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" or "int64"
    high: int = 2


def input_specs(graph: Graph) -> list[InputSpec]:
    """The graph's inputs; an integer input that indexes tables gets the smallest table's rows."""
    limits: dict[str, int] = {}
    for op in graph.ops:
        if op.body and op.body[0] == "take":
            table, index = op.inputs[op.body[1]], op.inputs[op.body[2]]
            rows = graph.tensors[table.tensor].shape[op.take_dim()]
            root = graph.root(index.tensor)
            limits[root] = min(limits.get(root, rows), rows)
    for g in graph.gathers.values():  # ids the DMA engine looks up (`t10c.ir.Gathered`)
        rows = graph.tensors[g.table].shape[0]
        limits[g.ids] = min(limits.get(g.ids, rows), rows)
    return [InputSpec(name, tuple(graph.tensors[name].shape), graph.tensors[name].dtype,
                      limits.get(name, 2)) for name in graph.fed]


def draw_inputs(specs: list[InputSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs: normal floats; integer indices within the table they index."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for s in specs:
        if s.dtype == "float32":
            inputs[s.name] = rng.standard_normal(s.shape).astype(np.float32)
        else:
            inputs[s.name] = rng.integers(0, s.high, s.shape).astype(np.int64)
    return inputs


def save_run_files(directory: Path, program: Program, graph: Graph,
                   model: onnx.ModelProto | None,
                   apart: Mapping[str, np.ndarray] | None = None) -> None:
    """Write ``weights.npz``, ``inputs.json`` and (given ``model``) ``model.onnx``, the
    values of its shape-only initializers taken from ``apart`` (`t10c.models.build_apart`)."""
    loaded = {ins.tensor for ins in program.instrs if isinstance(ins, Load)} | {
        g.table for g in program.gathers.values()}
    weights = {k: np.asarray(v) for k, v in graph.constants.items() if k in loaded}
    with open(directory / "weights.npz", "wb") as fh:
        np.savez(fh, **weights)  # type: ignore[arg-type]  # compressing weights: not worth it
    doc = {"format": INPUTS_FORMAT,
           "inputs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype, "high": s.high}
                      for s in input_specs(graph)]}
    (directory / "inputs.json").write_text(json.dumps(doc, indent=1) + "\n")
    if model is not None:
        if not write_model(model, directory / "model.onnx", apart=apart):
            # past protobuf's 2 GB: the weights go to a file next to it
            full = with_weights(model, apart) if apart else model
            onnx.save_model(full, directory / "model.onnx", save_as_external_data=True,
                            location="model.onnx.data")


#: the largest model.onnx `write_model` writes in one file (protobuf reads no more)
MAX_MODEL_FILE = 2 ** 31 - 2 ** 20


def write_model(model: onnx.ModelProto, path: Path, limit: int = MAX_MODEL_FILE,
                apart: Mapping[str, np.ndarray] | None = None) -> bool:
    """Write ``model`` to ``path`` as ``onnx.save_model`` does, byte for byte, one initializer
    at a time: the whole model is never serialised at once (for bert-large that was another
    1.3 GB, and ``ByteSize`` a serialisation more). A shape-only initializer named in
    ``apart`` is written with those values, as ``numpy_helper.from_array`` encodes them (the
    model `t10c.models.with_weights` makes), straight from the array. False, writing nothing,
    if the file would be ``limit`` bytes or more.

    A message's encoding is its fields' in field-number order, and a repeated field's is its
    elements' one after the other; so the model is the fields before its graph, the graph
    (its fields before the initializers, each initializer, the fields after), then the rest.
    """
    graph = model.graph
    head, tail = _split(model, _MODEL_GRAPH)
    g_head, g_tail = _split(graph, _GRAPH_INITIALIZER)
    given = [_Given(t, apart[t.name]) if apart and t.name in apart and is_shape_only(t)
             else None for t in graph.initializer]
    sizes = [g.size if g else t.ByteSize() for t, g in zip(graph.initializer, given)]
    inits = sum(_tag_len(_GRAPH_INITIALIZER, n) + n for n in sizes)
    g_size = len(g_head) + inits + len(g_tail)
    total = len(head) + _tag_len(_MODEL_GRAPH, g_size) + g_size + len(tail)
    if total >= limit:
        return False
    with open(path, "wb") as fh:
        fh.write(head)
        fh.write(_tag(_MODEL_GRAPH, g_size))
        fh.write(g_head)
        for t, g, n in zip(graph.initializer, given, sizes):
            fh.write(_tag(_GRAPH_INITIALIZER, n))
            if g:
                g.write(fh)
            else:
                fh.write(t.SerializeToString())
        fh.write(g_tail)
        fh.write(tail)
    return True


_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_TENSOR_RAW_DATA = 9  # TensorProto.raw_data, the last field `numpy_helper.from_array` sets


class _Given:
    """An initializer's encoding from its values, as ``numpy_helper.from_array(value, name)``
    encodes it: its other fields (dims, data type, name: all numbered below the raw data),
    then the raw data, written from the array without a copy."""

    def __init__(self, t: onnx.TensorProto, value: np.ndarray) -> None:
        head = onnx.TensorProto(name=t.name, dims=value.shape,
                                data_type=onnx.helper.np_dtype_to_tensor_dtype(value.dtype))
        self.head = head.SerializeToString()
        self.value = value
        self.size = len(self.head) + _tag_len(_TENSOR_RAW_DATA, value.nbytes) + value.nbytes

    def write(self, fh: BinaryIO) -> None:
        # (contiguous little-endian here, one tensor at a time: a view kept apart, the zoo's
        # side-by-side q, k and v, is copied only while it is written)
        value = np.ascontiguousarray(self.value, dtype=self.value.dtype.newbyteorder("<"))
        fh.write(self.head)
        fh.write(_tag(_TENSOR_RAW_DATA, value.nbytes))
        fh.write(memoryview(value).cast("B"))


def _split(message: Message, number: int) -> tuple[bytes, bytes]:
    """The encodings of ``message``'s fields numbered below and above ``number``."""
    below, above = type(message)(), type(message)()
    for fd, value in message.ListFields():
        if fd.number == number:
            continue
        into = below if fd.number < number else above
        repeated = (fd.is_repeated if hasattr(fd, "is_repeated")  # protobuf >= 6.31
                    else fd.label == fd.LABEL_REPEATED)
        if fd.message_type is not None or repeated:
            getattr(into, fd.name).MergeFrom(value)
        else:
            setattr(into, fd.name, value)
    return below.SerializeToString(), above.SerializeToString()


def _tag(number: int, length: int) -> bytes:
    """A length-delimited field's key and length."""
    out = bytearray([number << 3 | 2])
    while True:
        byte, length = length & 0x7F, length >> 7
        out.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(out)


def _tag_len(number: int, length: int) -> int:
    return len(_tag(number, length))


@dataclass(frozen=True)
class RunDir:
    """A program directory read back: the program, its weights, its inputs and its model."""

    program: Program
    weights: dict[str, np.ndarray]
    inputs: list[InputSpec]
    model: onnx.ModelProto


def load_run_dir(directory: Path) -> RunDir:
    """Read what ``t10c run`` needs from ``directory`` (the program is verified without a
    chip by `codegen.load_program`)."""
    try:
        program = load_program(directory)
    except ProgramError as exc:
        raise RunDirError(str(exc)) from None
    weights = _weights(directory / "weights.npz")
    specs = _inputs(directory / "inputs.json")
    _match_inputs(directory / "inputs.json", specs, program)
    path = directory / "model.onnx"
    if not path.is_file():
        raise RunDirError(f"{path} is missing; write the directory again with "
                          "t10c compile MODEL -o DIR")
    try:
        model = onnx.load_model(str(path))
    except Exception as exc:  # noqa: BLE001 - protobuf and onnx raise many kinds
        raise RunDirError(f"{path} is not a readable ONNX model ({type(exc).__name__}: "
                          f"{exc})") from None
    return RunDir(program, weights, specs, model)


def _match_inputs(path: Path, specs: list[InputSpec], program: Program) -> None:
    """Refuse input specs that are not the program's inputs, by name and shape. Their order
    is the graph's, the one the seeded inputs are drawn in; ``program.json`` keeps its
    inputs by name (sorted), so the order is not compared."""
    want = {name: tuple(shape) for name, (shape, _) in program.inputs.items()}
    counts = Counter(s.name for s in specs)
    faults = []
    if missing := [name for name in want if name not in counts]:
        faults.append(f"no {', '.join(missing)}")
    if extra := [name for name in counts if name not in want]:
        faults.append(f"{', '.join(extra)}: not an input of the program")
    if twice := [name for name, k in counts.items() if k > 1]:
        faults.append(f"{', '.join(twice)} given twice")
    faults += [f"{s.name} has shape {list(s.shape)}, the program's is {list(want[s.name])}"
               for s in specs if s.name in want and s.shape != want[s.name]]
    if faults:
        raise RunDirError(f"{path} does not describe the program's inputs ({'; '.join(faults)});"
                          " write the directory again with t10c compile MODEL -o DIR")


def _weights(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise RunDirError(f"{path} is missing: the directory holds no weights to run (its "
                          "model was compiled shape-only, being past protobuf's 2 GB limit, or "
                          "the file was removed); compile a model with weights with -o again"
                          ) from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise RunDirError(f"{path} is not a readable weights file ({exc})") from None


def _inputs(path: Path) -> list[InputSpec]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunDirError(f"{path} is missing; write the directory again with "
                          "t10c compile MODEL -o DIR") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RunDirError(f"{path} is not a readable JSON file ({exc})") from None
    try:
        if doc["format"] != INPUTS_FORMAT:
            raise ValueError(f"format {doc['format']!r} is not {INPUTS_FORMAT}")
        specs = []
        for x in doc["inputs"]:
            shape = tuple(x["shape"])
            ok = (isinstance(x["name"], str) and x["dtype"] in ("float32", "int64")
                  and all(type(d) is int and d >= 0 for d in shape)
                  and type(x["high"]) is int and x["high"] >= 1)
            if not ok:
                raise ValueError(f"input {x!r} is malformed")
            specs.append(InputSpec(x["name"], shape, x["dtype"], x["high"]))
        return specs
    except (KeyError, TypeError, ValueError) as exc:
        raise RunDirError(f"{path}: {exc}") from None
