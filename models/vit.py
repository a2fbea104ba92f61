"""A Vision Transformer classifier written op by op, shaped like an export of HF
ViTForImageClassification.

Graph: ``pixel_values`` float32 [batch, 3, image, image] -> ``logits`` [batch, classes]::

    patches     Conv(k=patch, stride=patch) -> Reshape [B, H, N] -> Transpose [B, N, H]
                Concat(Expand(cls), patches) + position embeddings
    layer i     x = x + attention(LayerNorm(x)); x = x + gelu(LayerNorm(x) @ W1 + b1) @ W2 + b2
    head        Gather(LayerNorm(x), 0, axis=1) @ Wc + bc          (the CLS token)

GELU is exact (Erf), as in ``transformers``' ViT. The CLS token's Expand folds at compile time;
the Concat of it with the patches and the Gather of the CLS row are copies through windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx

from ._builder import GraphBuilder, draw, weight_rng
from ._layers import (
    attention_core,
    gelu_constants,
    gelu_erf,
    ints,
    layer_norm,
    linear,
    merge_heads,
    split_heads,
)


@dataclass(frozen=True)
class ViTSize:
    hidden: int
    layers: int
    heads: int
    mlp: int
    image: int
    patch: int
    classes: int


VIT_SIZES: MappingProxyType[str, ViTSize] = MappingProxyType({
    "vit-tiny": ViTSize(hidden=128, layers=2, heads=2, mlp=512, image=32, patch=8, classes=10),
    # ViT-B/16 at 224 x 224 (86M parameters)
    "vit-base": ViTSize(hidden=768, layers=12, heads=12, mlp=3072, image=224, patch=16,
                        classes=1000),
})

EPSILON = 1e-12


def build_vit(hidden: int, layers: int, heads: int, mlp: int, *, image: int = 224,
              patch: int = 16, classes: int = 1000, channels: int = 3, batch: int = 1,
              seed: int = 0, name: str = "vit", weights: bool = True) -> onnx.ModelProto:
    """Build a ViT (module doc); every weight N(0, 0.02^2), LayerNorm scales N(1, 0.02^2).

    >>> m = build_vit(32, 1, 2, 64, image=16, patch=8, classes=5)
    >>> [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    [1, 5]
    """
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    if image % patch:
        raise ValueError(f"image ({image}) must be divisible by patch ({patch})")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    grid = image // patch
    tokens = grid * grid + 1
    d = hidden // heads
    rng = weight_rng(seed, weights)
    b = GraphBuilder(materialize=weights)
    pixels = b.graph_input("pixel_values", onnx.TensorProto.FLOAT,
                           [batch, channels, image, image])
    c = gelu_constants(b)
    split_shape = b.initializer("attn.split_heads.shape", ints(batch, tokens, heads, d))
    merge_shape = b.initializer("attn.merge_heads.shape", ints(batch, tokens, hidden))

    w = b.initializer("patch.weight", draw(rng, (hidden, channels, patch, patch), 0.02))
    bias = b.initializer("patch.bias", draw(rng, (hidden,), 0.02))
    x = b.node("Conv", [pixels, w, bias], "patch/Conv", kernel_shape=[patch, patch],
               strides=[patch, patch])
    x = b.node("Reshape", [x, b.initializer("patch.flat", ints(batch, hidden, grid * grid))],
               "patch/Reshape")
    x = b.node("Transpose", [x], "patch/Transpose", perm=[0, 2, 1])
    cls = b.initializer("cls_token", draw(rng, (1, 1, hidden), 0.02))
    cls = b.node("Expand", [cls, b.initializer("cls.shape", ints(batch, 1, hidden))],
                 "cls/Expand")
    x = b.node("Concat", [cls, x], "embeddings/Concat", axis=1)
    pos = b.initializer("position_embeddings", draw(rng, (1, tokens, hidden), 0.02))
    x = b.node("Add", [x, pos], "embeddings/Add")
    for i in range(layers):
        s = f"layer{i}"
        h = layer_norm(b, rng, f"{s}/ln_before", x, hidden, EPSILON)
        heads_of = {}
        for part in ("q", "k", "v"):
            y = linear(b, rng, f"{s}/attn/{part}", h, hidden, hidden, 0.02)
            heads_of[part] = split_heads(b, f"{s}/attn/{part}", y, split_shape,
                                         transpose_k=part == "k")
        ctx = attention_core(b, f"{s}/attn", heads_of["q"], heads_of["k"], heads_of["v"], d)
        ctx = merge_heads(b, f"{s}/attn/merge", ctx, merge_shape)
        out = linear(b, rng, f"{s}/attn/out", ctx, hidden, hidden, 0.02)
        x = b.node("Add", [out, x], f"{s}/attn/residual/Add")
        h = layer_norm(b, rng, f"{s}/ln_after", x, hidden, EPSILON)
        u = linear(b, rng, f"{s}/mlp/fc1", h, hidden, mlp, 0.02)
        g = gelu_erf(b, f"{s}/mlp/gelu", u, c)
        out = linear(b, rng, f"{s}/mlp/fc2", g, mlp, hidden, 0.02)
        x = b.node("Add", [out, x], f"{s}/mlp/residual/Add")
    x = layer_norm(b, rng, "ln", x, hidden, EPSILON)
    first = b.initializer("cls.index", np.array(0, np.int64))
    x = b.node("Gather", [x, first], "cls/Gather", axis=1)
    w = b.initializer("classifier.weight", draw(rng, (hidden, classes), 0.02))
    bias = b.initializer("classifier.bias", draw(rng, (classes,), 0.02))
    x = b.node("MatMul", [x, w], "classifier/MatMul")
    b.node("Add", [x, bias], "classifier/Add", output="logits")
    b.graph_output("logits", onnx.TensorProto.FLOAT, [batch, classes])
    return b.finish(name, doc=f"t10c zoo {name}: hidden={hidden} layers={layers} heads={heads}"
                              f" image={image} patch={patch} seed={seed}")
