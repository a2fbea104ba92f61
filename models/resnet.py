"""A ResNet classifier with bottleneck blocks, written op by op like a training-mode export:
every convolution is followed by its own BatchNormalization node (the frontend folds them).

Graph: ``pixel_values`` float32 [batch, 3, image, image] -> ``logits`` [batch, classes]::

    stem        Conv 7x7 stride 2 -> BatchNorm -> Relu -> MaxPool 3x3 stride 2 pad 1
    block       Conv 1x1 -> BN -> Relu -> Conv 3x3 (stride) -> BN -> Relu -> Conv 1x1 -> BN
                + shortcut (Conv 1x1 stride -> BN when the shape changes) -> Relu
    head        GlobalAveragePool -> Flatten -> Gemm (transB)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx

from ._builder import GraphBuilder, draw, weight_rng


@dataclass(frozen=True)
class ResNetSize:
    depths: tuple[int, ...]
    widths: tuple[int, ...]
    stem: int
    image: int
    classes: int


RESNET_SIZES: MappingProxyType[str, ResNetSize] = MappingProxyType({
    "resnet-tiny": ResNetSize(depths=(1, 1, 1), widths=(8, 16, 32), stem=16, image=64,
                              classes=10),
    # ResNet-50 at 224 x 224 (25.6M parameters)
    "resnet50": ResNetSize(depths=(3, 4, 6, 3), widths=(64, 128, 256, 512), stem=64,
                           image=224, classes=1000),
})

EXPANSION = 4


def _conv_bn(b: GraphBuilder, rng: np.random.Generator, scope: str, x: str, cin: int,
             cout: int, k: int, stride: int = 1, relu: bool = True,
             gamma: float = 1.0) -> str:
    """Conv (no bias, He-initialised) -> BatchNormalization (random inference statistics)."""
    std = math.sqrt(2 / (cin * k * k))
    w = b.initializer(f"{scope}.weight", draw(rng, (cout, cin, k, k), std))
    y = b.node("Conv", [x, w], f"{scope}/Conv", kernel_shape=[k, k], strides=[stride, stride],
               pads=[k // 2] * 4)
    scale = b.initializer(f"{scope}.bn.weight", draw(rng, (cout,), 0.1 * gamma, mean=gamma))
    bias = b.initializer(f"{scope}.bn.bias", draw(rng, (cout,), 0.1))
    mean = b.initializer(f"{scope}.bn.running_mean", draw(rng, (cout,), 0.1))
    var = b.initializer(f"{scope}.bn.running_var",
                        rng.uniform(0.5, 1.5, cout).astype(np.float32))
    y = b.node("BatchNormalization", [y, scale, bias, mean, var], f"{scope}/BatchNormalization",
               epsilon=1e-5)
    return b.node("Relu", [y], f"{scope}/Relu") if relu else y


def build_resnet(depths: tuple[int, ...], widths: tuple[int, ...], *, stem: int = 64,
                 image: int = 224, classes: int = 1000, batch: int = 1, seed: int = 0,
                 name: str = "resnet", weights: bool = True) -> onnx.ModelProto:
    """Build a bottleneck ResNet (module doc).

    >>> m = build_resnet((1,), (4,), stem=8, image=32, classes=3)
    >>> [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    [1, 3]
    """
    if len(depths) != len(widths) or min(depths) < 1:
        raise ValueError("depths and widths must have the same length, depths at least 1")
    if image < 32 or batch < 1:
        raise ValueError(f"image must be >= 32 and batch >= 1, got {image} and {batch}")
    rng = weight_rng(seed, weights)
    b = GraphBuilder(materialize=weights)
    x = b.graph_input("pixel_values", onnx.TensorProto.FLOAT, [batch, 3, image, image])
    x = _conv_bn(b, rng, "stem", x, 3, stem, 7, stride=2)
    x = b.node("MaxPool", [x], "stem/MaxPool", kernel_shape=[3, 3], strides=[2, 2],
               pads=[1, 1, 1, 1])
    cin = stem
    for si, (depth, width) in enumerate(zip(depths, widths)):
        for bi in range(depth):
            s = f"stage{si}/block{bi}"
            stride = 2 if si > 0 and bi == 0 else 1
            cout = width * EXPANSION
            y = _conv_bn(b, rng, f"{s}/conv1", x, cin, width, 1)
            y = _conv_bn(b, rng, f"{s}/conv2", y, width, width, 3, stride=stride)
            # a small last scale keeps the residual sums near unit size through the stages
            y = _conv_bn(b, rng, f"{s}/conv3", y, width, cout, 1, relu=False, gamma=0.2)
            shortcut = x
            if stride != 1 or cin != cout:
                shortcut = _conv_bn(b, rng, f"{s}/shortcut", x, cin, cout, 1, stride=stride,
                                    relu=False)
            x = b.node("Relu", [b.node("Add", [y, shortcut], f"{s}/Add")], f"{s}/Relu")
            cin = cout
    x = b.node("GlobalAveragePool", [x], "pool/GlobalAveragePool")
    x = b.node("Flatten", [x], "pool/Flatten", axis=1)
    w = b.initializer("fc.weight", draw(rng, (classes, cin), 1 / math.sqrt(cin)))
    bias = b.initializer("fc.bias", draw(rng, (classes,), 0.02))
    b.node("Gemm", [x, w, bias], "fc/Gemm", transB=1, output="logits")
    b.graph_output("logits", onnx.TensorProto.FLOAT, [batch, classes])
    return b.finish(name, doc=f"t10c zoo {name}: depths={depths} widths={widths} "
                              f"image={image} seed={seed}")
