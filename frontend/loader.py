"""Loading ONNX models from a file or a ModelProto: read safely, checked and shape-inferred.

The frontend reads ONNX only; zoo names are the driver's business (`t10c.driver.load_source`).

What `load_model` refuses, each with one `FrontendError` line (the CLI exits 1):

- a path that is a directory, a device, a pipe or anything but a regular file, and a file of
  2 GiB or more (protobuf cannot parse it; such models keep their weights as external data),
  before reading a byte of it;
- bytes that are not an ONNX model;
- an opset of the default domain newer than the installed onnx package knows: its checker,
  shape inference and reference evaluator (which folds constants) would guess at semantics
  they do not have. Re-export at an older opset. (Any opset the onnx package knows compiles;
  an onnxruntime older than that package only matters to ``--run``, which needs it.)
- external data outside the model's folder (an absolute location, a ``..`` component, a
  symlink that leads out), missing, not a regular file, or shorter than the tensor it holds.
  External data is read relative to the model file, never the working directory;
- weights whose data does not match their type and shape, and floating-point weights that
  hold NaN or infinity (the initializer is named). A ModelProto given in memory is taken as
  built: only its opset and external data are checked.

Shape-only weights. An initializer may carry its shape without its values: data location
``EXTERNAL`` with the external-data entry ``location`` equal to `SHAPE_ONLY_LOCATION`
(`is_shape_only` tests for it). Planning and code generation need only shapes; emulation
refuses such a graph (`has_weights`). The zoo builds models past protobuf's 2 GB limit
(gpt2-xl) this way; any producer may use the same convention.
"""

from __future__ import annotations

import math
import stat
from pathlib import Path, PurePath

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from onnx import numpy_helper

from t10c.shape_only import is_shape_only

#: protobuf refuses to parse a message of 2 GiB or more
MAX_MODEL_BYTES = 2**31 - 1

_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
           onnx.TensorProto.BFLOAT16}


class FrontendError(ValueError):
    """A model t10c cannot read or compile; the message says what to do."""


class ModelNotFoundError(FrontendError):
    """The model path does not exist (a usage error)."""


def load_model(source: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """An ONNX model from an ``.onnx`` path (external data read from the model's folder, every
    weight checked against its shape and for NaN and infinity) or a ModelProto (taken as
    built; it must not refer to external data, having no folder to read it from).

    Raises `ModelNotFoundError` for a missing path, `FrontendError` for anything else that is
    wrong with the model (see the module doc).
    """
    if isinstance(source, onnx.ModelProto):
        # taken as built (the zoo checks its models when it builds them): scanning every
        # weight would cost a second per 100M parameters on each compile
        name = source.graph.name or "the model"
        _check_opset(source, name)
        _load_external(_tensors(source), None, name)
        return source
    path = Path(source)
    name = str(source)
    model = _parse(path, _read(path))
    _check_opset(model, name)
    tensors = _tensors(model)
    _load_external(tensors, path.parent, name)
    _check_values(tensors, name)
    return model


def _read(path: Path) -> bytes:
    try:
        st = path.stat()
    except (FileNotFoundError, ValueError):  # ValueError: a NUL in the path
        raise ModelNotFoundError(f"{path}: no such file (give an .onnx file or a zoo name; "
                                 "`t10c compile --help` lists the zoo)") from None
    except OSError as exc:
        raise FrontendError(f"{path}: cannot read it ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise FrontendError(f"{path} is a directory; give the path of an .onnx file")
    if not stat.S_ISREG(st.st_mode):
        raise FrontendError(f"{path} is not a regular file (a device, pipe or socket); give "
                            "the path of an .onnx file")
    if st.st_size > MAX_MODEL_BYTES:
        raise FrontendError(f"{path} is {st.st_size / 1e9:.1f} GB: an ONNX file holds at most "
                            "2 GB (protobuf's limit); save the weights as external data "
                            "(onnx.save(model, path, save_as_external_data=True))")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise FrontendError(f"{path}: cannot read it ({exc.strerror})") from None


def _parse(path: Path, data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's parsers raise DecodeError, RuntimeError and more
        raise FrontendError(f"{path}: not an ONNX model (protobuf parse failed: {exc})"
                            ) from None
    if not model.graph.node and not model.graph.output or model.ir_version <= 0:
        raise FrontendError(f"{path}: not an ONNX model (no graph or no IR version in the file)")
    try:
        _touch_strings(model)
    except UnicodeDecodeError:
        raise FrontendError(f"{path}: not an ONNX model (a name or string in it is not "
                            "UTF-8)") from None
    return model


def _touch_strings(message: Message) -> None:
    """Decode every string field once: ONNX's proto2 strings are not checked by the parser,
    and a byte that is not UTF-8 would otherwise fail wherever a name is first read."""
    if isinstance(message, onnx.TensorProto):  # never copy the weights' bytes
        _utf8([message.name, message.doc_string])
        for entry in message.external_data:
            _touch_strings(entry)
        return
    for field, value in message.ListFields():
        repeated = (field.is_repeated if hasattr(field, "is_repeated")  # protobuf >= 6.31
                    else field.label == FieldDescriptor.LABEL_REPEATED)
        items = list(value) if repeated else [value]
        if field.type == FieldDescriptor.TYPE_STRING:
            _utf8(items)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in items:
                _touch_strings(item)


def _utf8(values: list[str | bytes]) -> None:
    # protobuf (upb) hands back a proto2 string that is not UTF-8 as bytes, or raises
    for value in values:
        if isinstance(value, bytes):
            value.decode("utf-8")


def _check_opset(model: onnx.ModelProto, name: str) -> None:
    known = onnx.defs.onnx_opset_version()
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version > known:
            raise FrontendError(
                f"{name} uses opset {imp.version} of ai.onnx; the installed onnx "
                f"{onnx.__version__} knows opsets up to {known}: re-export the model at opset "
                f"{known} or lower, or upgrade onnx")


def _tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The initializers and the tensors of Constant nodes (the only weights t10c reads)."""
    tensors = list(model.graph.initializer)
    for node in model.graph.node:
        tensors += [a.t for a in node.attribute if a.type == onnx.AttributeProto.TENSOR]
    return tensors


def _load_external(tensors: list[onnx.TensorProto], folder: Path | None, name: str) -> None:
    """Read every external tensor's bytes into it, from files inside ``folder`` only."""
    problems: list[str] = []
    for t in tensors:
        if t.data_location != onnx.TensorProto.EXTERNAL or is_shape_only(t):
            continue
        try:
            _read_external(t, folder)
        except FrontendError as exc:
            problems.append(str(exc))
    if problems:
        more = f" (and {len(problems) - 1} more like it)" if len(problems) > 1 else ""
        raise FrontendError(f"{name}: {problems[0]}{more}")


def _read_external(t: onnx.TensorProto, folder: Path | None) -> None:
    entry = {e.key: e.value for e in t.external_data}
    what = f"initializer {t.name!r}"
    location = entry.get("location", "")
    if folder is None:
        raise FrontendError(f"{what} keeps its data in {location!r}, but the model was given "
                            "without a file; load it from its .onnx path")
    if not location or "\0" in location:
        raise FrontendError(f"{what} is marked as external data but names no usable file "
                            f"({location!r})")
    rel = PurePath(location)
    if rel.is_absolute() or rel.drive or ".." in rel.parts:
        raise FrontendError(f"{what}: external data location {location!r} is outside the "
                            "model's folder (only relative paths below it are read)")
    target = folder / rel
    try:
        base = folder.resolve(strict=True)
        real = target.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a symlink loop
        raise FrontendError(f"{what}: its external data file {location!r} is missing (looked "
                            f"in {folder.resolve()})") from None
    if not real.is_relative_to(base):
        raise FrontendError(f"{what}: external data {location!r} leads outside the model's "
                            "folder (a symlink); copy the data next to the model")
    st = real.stat()
    if not stat.S_ISREG(st.st_mode):
        raise FrontendError(f"{what}: external data {location!r} is not a regular file")
    try:
        offset = int(entry.get("offset", "0"))
        length = int(entry["length"]) if "length" in entry else st.st_size - offset
    except ValueError:
        raise FrontendError(f"{what}: external data offset or length is not a number") from None
    itemsize = _itemsize(t)
    expected = math.prod(t.dims) * itemsize if itemsize else length
    if offset < 0 or length < 0 or offset + length > st.st_size or length != expected:
        raise FrontendError(f"{what}: external data {location!r} holds {length} bytes at offset "
                            f"{offset} of a {st.st_size}-byte file; the tensor needs "
                            f"{expected} bytes")
    with open(real, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    del t.external_data[:]
    t.data_location = onnx.TensorProto.DEFAULT
    t.raw_data = data


def _itemsize(t: onnx.TensorProto) -> int:
    """Bytes per element of ``t`` as raw data (0 for types without a fixed size)."""
    try:
        np_type = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
    except (KeyError, ValueError):
        return 0
    if np_type.kind in "OSU":
        return 0
    if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return 0
    return np_type.itemsize


def _check_values(tensors: list[onnx.TensorProto], name: str) -> None:
    """Every tensor's data must match its type and shape; NaN or infinite weights are blamed
    on the model now, not on the emulator later."""
    bad: list[str] = []
    for t in tensors:
        if is_shape_only(t):
            continue
        try:
            value = numpy_helper.to_array(t)
        except Exception as exc:  # onnx raises ValueError, TypeError, ... on malformed data
            raise FrontendError(f"{name}: initializer {t.name!r} has data that does not match "
                                f"its type and shape {list(t.dims)} ({_first_line(exc)})"
                                ) from None
        if t.data_type not in _FLOATS:
            continue
        finite = np.isfinite(value)
        if not finite.all():
            count = int(value.size - np.count_nonzero(finite))
            bad.append(f"{t.name!r} ({count} of {value.size} values)")
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise FrontendError(f"{name}: weights hold NaN or infinity: initializer {bad[0]}{more}; "
                            "fix the model (t10c computes only with finite weights)")


def check_and_infer(model: onnx.ModelProto, pinned: dict[str, tuple[int, ...]] | None = None
                    ) -> onnx.ModelProto:
    """Validate the model, pin dynamic input dimensions, and infer every tensor's shape.

    Works on a skeleton of the model in which large initializers are declared as typed inputs
    without data, so that checking and inference stay fast and below protobuf's 2 GB limit for
    the biggest models; the weights themselves are read from ``model``.
    """
    pinned = dict(pinned or {})
    model_copy = _skeleton(model)
    init_names = {t.name for t in model.graph.initializer}
    real_inputs = [i.name for i in model.graph.input if i.name not in init_names]
    unknown = set(pinned) - set(real_inputs)
    if unknown:
        raise FrontendError(f"--shape names unknown input(s) {', '.join(sorted(unknown))}; inputs "
                            f"are {', '.join(real_inputs)}")
    problems = []
    for inp in model_copy.graph.input:
        if inp.name in init_names:
            continue
        dims = inp.type.tensor_type.shape.dim
        if inp.name in pinned:
            shape = pinned[inp.name]
            if len(shape) != len(dims):
                problems.append(f"--shape {inp.name}: the input has rank {len(dims)}, "
                                f"got {len(shape)} dimensions")
                continue
            for d, n in zip(dims, shape):
                if d.HasField("dim_value") and d.dim_value != n:
                    problems.append(f"--shape {inp.name}: dimension fixed at {d.dim_value} by the "
                                    f"model, got {n}")
                d.ClearField("dim_param")
                d.dim_value = n
            continue
        dyn = [d.dim_param or "?" for d in dims if not d.HasField("dim_value")]
        if dyn:
            example = "x".join(str(d.dim_value) if d.HasField("dim_value") else "N" for d in dims)
            problems.append(f"input {inp.name!r} has dynamic dimension(s) {', '.join(dyn)}; pin "
                            f"them with --shape {inp.name}={example} (N a number)")
    if problems:
        raise FrontendError("cannot compile with these input shapes:\n  " + "\n  ".join(problems))
    # onnx's C++ checker and inference raise ValidationError, InferenceError, RuntimeError and,
    # on names that are not UTF-8, UnicodeDecodeError: all of them mean a malformed model
    try:
        onnx.checker.check_model(model_copy)
    except Exception as exc:
        raise FrontendError(f"the model is not valid ONNX: {_first_line(exc)}") from None
    try:
        return onnx.shape_inference.infer_shapes(model_copy, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise FrontendError(f"shape inference failed: {_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


LARGE_INITIALIZER = 4096  # elements; smaller ones (shapes, scalars) keep their values


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    skel = onnx.ModelProto()
    graph = model.graph
    # copy everything but the initializers, then add back only the small ones
    skel.CopyFrom(onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import,
                                  producer_name=model.producer_name, domain=model.domain,
                                  model_version=model.model_version))
    skel.graph.name = graph.name
    skel.graph.node.extend(graph.node)
    skel.graph.output.extend(graph.output)
    skel.graph.value_info.extend(graph.value_info)
    skel.graph.input.extend(graph.input)
    declared = {i.name for i in graph.input}
    for init in graph.initializer:
        if math.prod(init.dims) <= LARGE_INITIALIZER and \
                init.data_location != onnx.TensorProto.EXTERNAL:
            skel.graph.initializer.append(init)
        elif init.name not in declared:
            skel.graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
    if skel.ir_version < 4:
        skel.ir_version = 4
    return skel

