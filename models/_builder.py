"""An append-only helper that writes one ONNX graph with readable, unique names.

The zoo builds every model through `GraphBuilder` so that all models share the same
conventions: opset 17 of the default domain, IR version 8, node names shaped like
``layer3/attn/q/MatMul``, the output tensor of a node named ``<node name>_output_0``
(as ``torch.onnx`` does) unless the caller names it, and initializers named like
``layer3.attn.q.weight``. Names are checked for uniqueness as they are added, so a
typo in a scope fails at build time rather than producing a graph that silently
aliases two tensors.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import helper, numpy_helper

from t10c.shape_only import shape_only_tensor

OPSET = 17
"""Opset of the default ``ai.onnx`` domain used by every zoo model."""

IR_VERSION = 8
"""IR version of every zoo model; old enough for every current onnxruntime."""

PRODUCER_NAME = "t10c.models"


SHAPE_ONLY_MIN_ELEMS = 4096  # smaller tensors (shapes, scalars, norms) always carry data

#: while `weights_apart` is open: where materialised builds put their large weights' values
_APART: contextvars.ContextVar[dict[str, np.ndarray] | None] = contextvars.ContextVar(
    "weights_apart", default=None)


@contextlib.contextmanager
def weights_apart() -> Iterator[dict[str, np.ndarray]]:
    """Inside the block, models built with weights write their large initializers shape-only
    (as ``materialize=False`` does) and keep the values, by name, in the dict yielded: the
    same values, drawn the same way, held once instead of as the ModelProto's bytes too."""
    apart: dict[str, np.ndarray] = {}
    token = _APART.set(apart)
    try:
        yield apart
    finally:
        _APART.reset(token)


class NoWeights:
    """Stands in for the random generator when a model is built for planning only.

    Planning and code generation need the weights' shapes, not their values; a model like
    GPT-2 XL (1.5B parameters) does not even fit ONNX's 2 GB protobuf limit with them. Every
    draw is a zero-stride array of the right shape (no memory), and `GraphBuilder` with
    ``materialize=False`` writes large initializers as shape-only tensors: the frontend's
    public convention, external data at `t10c.shape_only.SHAPE_ONLY_LOCATION`.
    """

    def uniform(self, low: float = 0.0, high: float = 1.0, size: int | Sequence[int] = ()
                ) -> np.ndarray:
        shape = (size,) if isinstance(size, int) else tuple(size)
        return np.broadcast_to(np.float64((low + high) / 2), shape)


def weight_rng(seed: int, weights: bool) -> np.random.Generator | NoWeights:
    """The generator a builder draws its weights from (`NoWeights` when not materialising)."""
    return np.random.default_rng(seed) if weights else NoWeights()


def draw(
    rng: np.random.Generator | NoWeights, shape: Sequence[int], std: float, mean: float = 0.0
) -> np.ndarray:
    """Draw a float32 array of mean ``mean`` and standard deviation ``std``: uniform on
    ``mean +- std * sqrt(3)``. (A normal draw of the same two moments took bert-large's 334 M
    weights 5.7 s of CPU time, a uniform one takes a quarter of that; the model is seeded
    filler either way, checked against onnxruntime on the same values.)

    The caller's draw order, not the names, fixes which values each tensor gets.
    """
    if isinstance(rng, NoWeights):
        return np.broadcast_to(np.float32(mean), tuple(shape))
    sample = rng.random(tuple(shape), dtype=np.float32)
    # u in [0, 1) to [-1, 1), then to the spread: in place, one pass each
    sample *= np.float32(2.0 * math.sqrt(3.0) * std)
    sample += np.float32(mean - math.sqrt(3.0) * std)
    return sample


def side_by_side(draws: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The matrices ``draws`` (as many rows each) copied into one matrix, side by side, and
    returned as its column blocks: views, in the order given, of one buffer. Sibling
    projections of one input (BERT's q, k and v) held so are the matrix the frontend fuses
    them into (`frontend.rewrite.fuse_sibling_matmuls`), which then takes a view of that
    buffer instead of copying (bert-large: 288 MiB less at the compile's peak). (LLaMA's
    are scaled by the norm before them first, `frontend.rewrite`: copies either way.)
    Shape-only draws (zero strides, `NoWeights`) come back as they are."""
    if not draws or any(0 in d.strides for d in draws):
        return list(draws)
    rows = draws[0].shape[0]
    whole = np.empty((rows, sum(d.shape[1] for d in draws)), dtype=draws[0].dtype)
    out, start = [], 0
    for d in draws:
        part = whole[:, start:start + d.shape[1]]
        part[...] = d
        out.append(part)
        start += d.shape[1]
    return out


@dataclass
class GraphBuilder:
    """Writes the nodes and initializers of one graph straight into a ``ModelProto``.

    It is mutable on purpose and lives only inside one ``build_*`` call; `finish`
    returns the model. Tensors go into the model as they are made, never into a
    side list first, because ``make_graph`` and ``make_model`` each copy every
    initializer: for bert-large (1.3 GB of weights) that doubled peak memory.

    Example::

        b = GraphBuilder()
        x = b.graph_input("x", onnx.TensorProto.FLOAT, [2, 4])
        w = b.initializer("fc0.weight", np.ones((4, 3), np.float32))
        y = b.node("MatMul", [x, w], "fc0/MatMul", output="y")
        b.graph_output(y, onnx.TensorProto.FLOAT, [2, 3])
        model = b.finish("tiny")
    """

    model: onnx.ModelProto = field(default_factory=onnx.ModelProto)
    materialize: bool = True  # False: large initializers are written shape-only
    _node_names: set[str] = field(default_factory=set)
    _tensor_names: set[str] = field(default_factory=set)

    def _claim_tensor(self, name: str) -> None:
        if name in self._tensor_names:
            raise ValueError(f"tensor name {name!r} is already used in this graph")
        self._tensor_names.add(name)

    def graph_input(self, name: str, elem_type: int, shape: Sequence[int]) -> str:
        """Declare a graph input with a static shape; return its name."""
        self._claim_tensor(name)
        value = helper.make_tensor_value_info(name, elem_type, list(shape))
        self.model.graph.input.append(value)
        return name

    def graph_output(self, name: str, elem_type: int, shape: Sequence[int]) -> None:
        """Declare a graph output; some node must produce it (``output=name``)."""
        if name not in self._tensor_names:
            raise ValueError(f"graph output {name!r} is not produced by any node")
        value = helper.make_tensor_value_info(name, elem_type, list(shape))
        self.model.graph.output.append(value)

    def initializer(self, name: str, array: np.ndarray, copy: bool = True) -> str:
        """Add a constant tensor stored as raw little-endian bytes; return its name. With
        ``copy=False`` a value kept apart (`weights_apart`) is ``array`` itself, a view into
        the caller's buffer (`side_by_side`), not a contiguous copy of it."""
        self._claim_tensor(name)
        apart = _APART.get() if self.materialize else None
        if apart is not None and array.size >= SHAPE_ONLY_MIN_ELEMS:
            apart[name] = array if not copy else np.ascontiguousarray(array)
        if (not self.materialize or apart is not None) and array.size >= SHAPE_ONLY_MIN_ELEMS:
            self.model.graph.initializer.add().CopyFrom(
                shape_only_tensor(name, array.shape, array.dtype))
            return name
        # np.asarray keeps 0-d arrays 0-d (np.ascontiguousarray would make them [1])
        tensor = numpy_helper.from_array(np.asarray(array, order="C"), name=name)
        self.model.graph.initializer.add().CopyFrom(tensor)
        return name

    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str,
        *,
        output: str | None = None,
        **attrs: object,
    ) -> str:
        """Append a single-output node of the default domain; return its output."""
        if name in self._node_names:
            raise ValueError(f"node name {name!r} is already used in this graph")
        self._node_names.add(name)
        out = output if output is not None else f"{name}_output_0"
        self._claim_tensor(out)
        node = helper.make_node(op_type, list(inputs), [out], name=name, **attrs)
        self.model.graph.node.append(node)
        return out

    def node_outputs(self, op_type: str, inputs: Sequence[str], name: str, count: int,
                     **attrs: object) -> list[str]:
        """Append a node with ``count`` outputs (``<name>_output_<i>``); return them."""
        if name in self._node_names:
            raise ValueError(f"node name {name!r} is already used in this graph")
        self._node_names.add(name)
        outs = [f"{name}_output_{i}" for i in range(count)]
        for out in outs:
            self._claim_tensor(out)
        node = helper.make_node(op_type, list(inputs), outs, name=name, **attrs)
        self.model.graph.node.append(node)
        return outs

    def finish(self, graph_name: str, doc: str = "") -> onnx.ModelProto:
        """Stamp name, opset and IR version, run ``check_model``, return the model."""
        model = self.model
        model.graph.name = graph_name
        model.graph.doc_string = doc
        model.ir_version = IR_VERSION
        model.producer_name = PRODUCER_NAME
        model.opset_import.append(helper.make_opsetid("", OPSET))
        # the checker serialises what it is given and parses it again in C++: handed the
        # weights too, bert-large's 1.3 GB were held three times over for a check of the graph
        # (the weights are well-formed by construction: `numpy_helper.from_array`)
        onnx.checker.check_model(_checkable(model))
        return model


def _checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its large initializers (and without its shape-only ones, whose data
    the checker would look for), each declared as a typed input instead: all the checker has
    to see of them. The weights' bytes are never copied."""
    copy = onnx.ModelProto()
    _copy_fields(model, copy, skip="graph")
    _copy_fields(model.graph, copy.graph, skip="initializer")
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or \
                math.prod(t.dims) >= SHAPE_ONLY_MIN_ELEMS:
            copy.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type,
                                                                  list(t.dims)))
        else:
            copy.graph.initializer.append(t)
    return copy


def _copy_fields(source: Message, target: Message, skip: str) -> None:
    """Copy every field of ``source`` that is set into ``target``, but ``skip``."""
    for fd, value in source.ListFields():
        if fd.name == skip:
            continue
        if fd.message_type is not None or isinstance(value, Iterable) and \
                not isinstance(value, (str, bytes)):
            getattr(target, fd.name).MergeFrom(value)
        else:
            setattr(target, fd.name, value)
