"""Loading ONNX models: from a file, bytes, or a zoo name; checked and shape-inferred."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from t10c import models


class FrontendError(ValueError):
    """A model t10c cannot read or compile; the message says what to do."""


class ModelNotFoundError(FrontendError):
    """The model argument names neither a file nor a zoo model (a usage error)."""


def load_model(source: str | Path | onnx.ModelProto, *, seq_len: int | None = None,
               batch: int | None = None, weights: bool = True) -> onnx.ModelProto:
    """A model from a zoo name (``bert-tiny``), an ``.onnx`` path, or a ModelProto."""
    if isinstance(source, onnx.ModelProto):
        return source
    name = str(source)
    if models.is_zoo_name(name):
        kwargs: dict = {"batch": batch, "weights": weights}
        if seq_len is not None:
            kwargs["seq_len"] = seq_len
        return models.build(name, **kwargs)
    path = Path(name)
    if not path.exists():
        raise ModelNotFoundError(f"{name!r} is neither a file nor a zoo model (zoo: "
                            f"{', '.join(models.ZOO_NAMES)})")
    if path.is_dir():
        raise FrontendError(f"{name!r} is a directory; give the path of an .onnx file")
    data = path.read_bytes()
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise FrontendError(f"{name}: not an ONNX model (protobuf parse failed: {exc})") from None
    if not model.graph.node and not model.graph.output:
        raise FrontendError(f"{name}: not an ONNX model (no graph in the file)")
    return model


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
    try:
        onnx.checker.check_model(model_copy)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise FrontendError(f"the model is not valid ONNX: {first}") from None
    try:
        return onnx.shape_inference.infer_shapes(model_copy, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise FrontendError(f"shape inference failed: {first}") from None


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
        if _numel(init.dims) <= LARGE_INITIALIZER and \
                init.data_location != onnx.TensorProto.EXTERNAL:
            skel.graph.initializer.append(init)
        elif init.name not in declared:
            skel.graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
    if skel.ir_version < 4:
        skel.ir_version = 4
    return skel


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
