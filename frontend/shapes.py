"""Ops decided at compile time: shapes are static after pinning, so Shape and Size of any
tensor are constants, and everything computed from shapes and constants folds.

Any node whose inputs are all constant is evaluated by the ONNX reference evaluator before it
reaches a lowering (see `to_graph`); the lowerings here are what remains: Shape and Size of a
computed tensor, and clear errors for shape-producing ops whose inputs are not known at compile
time.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from .context import Context, Unsupported, register


@register("Shape", 1)
def Shape(ctx: Context, node: onnx.NodeProto, start: int = 0, end: int | None = None) -> None:
    shape = ctx.shape(node.input[0])
    ctx.constants[node.output[0]] = np.array(shape[start:end], dtype=np.int64)


@register("Size", 1)
def Size(ctx: Context, node: onnx.NodeProto) -> None:
    ctx.constants[node.output[0]] = np.array(math.prod(ctx.shape(node.input[0])), np.int64)


@register("ConstantOfShape", 9)
def ConstantOfShape(ctx: Context, node: onnx.NodeProto, value: object = None) -> None:
    raise Unsupported("the shape input must be known at compile time")


@register("Range", 11)
def Range(ctx: Context, node: onnx.NodeProto) -> None:
    raise Unsupported("start, limit and delta must be known at compile time")


@register("Constant", 1)
def Constant(ctx: Context, node: onnx.NodeProto, **value: object) -> None:
    raise Unsupported("a Constant node that could not be evaluated")  # folded before lowering
