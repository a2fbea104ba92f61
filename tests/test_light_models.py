"""The classic CNNs that ship inside the onnx package (``onnx/backend/test/data/light``: AlexNet,
DenseNet-121, Inception v1 and v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512, each
at its own opset, weights made by ConstantOfShape), compiled for the IPU MK2 and checked against
onnxruntime on seeded inputs (`t10c.driver.run_compiled`).

Their weights are all 0.02, so activations grow layer by layer: in six of them some activation
exceeds float16's largest value (65504), and fp16 storage cannot hold it, as
`test_fp16_overflow_is_the_models` checks with onnxruntime. Those run with fp32 storage; the
other three with t10c's default fp16.

ResNet-50's logits come out near 9.7e18, all equal in exact arithmetic: float32 sums in another
order (t10c's, over cores) agree to 6e-7 relative, which is 6.6e12 absolute, and the final
Softmax of values that far apart is no longer uniform. Inception v1's, SqueezeNet's and
ZFNet-512's logits are as large (their activations reach 8e20, 9e9 and 1e12): t10c's logits
agree with onnxruntime's to 2e-7 to 2e-6 relative while their Softmax outputs differ by 10x to
100x (these three failed so since at least 2026-12-04's main; the slow tests are not in the
default run). The tests of all four compare the logits (the model without that Softmax), where
the ill-conditioning has not happened yet (`LOGITS`).
"""

from __future__ import annotations

import os
import time

import numpy as np
import onnx
import pytest

from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model, run_compiled

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
CHIP = PRESETS["ipu-mk2"]
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
          "shufflenet", "squeezenet", "vgg19", "zfnet512"]
FP16_MAX = 65504.0

#: model -> the largest activation onnxruntime computes on the seeded input (as measured;
#: `test_fp16_overflow_is_the_models` checks the order of magnitude): beyond float16
OVERFLOWS_FP16 = {"bvlc_alexnet": 7.9e11, "inception_v1": 8.3e20, "resnet50": 9.7e18,
                  "squeezenet": 9.0e9, "vgg19": 2.6e31, "zfnet512": 1.3e12}


#: models whose final Softmax is compared by its input, the logits (see above)
LOGITS = {"inception_v1", "resnet50", "squeezenet", "zfnet512"}


def _model(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))


def _logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without its final Softmax, the logits its output."""
    last = model.graph.node[-1]
    assert last.op_type == "Softmax" and last.output[0] == model.graph.output[0].name
    model.graph.node.remove(last)
    del model.graph.output[:]
    model.graph.output.append(onnx.ValueInfoProto(name=last.input[0]))
    return onnx.shape_inference.infer_shapes(model)


def _largest_activation(model: onnx.ModelProto) -> float:
    import onnxruntime as ort

    seen = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for out in node.output:
            if out and out not in seen and node.op_type != "ConstantOfShape":
                model.graph.output.append(onnx.ValueInfoProto(name=out))
                seen.add(out)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options)
    feed = session.get_inputs()[0]
    x = np.random.default_rng(0).standard_normal(feed.shape).astype(np.float32)
    values = session.run(None, {feed.name: x})
    return max(float(np.abs(v).max()) for v in values if v.dtype == np.float32 and v.size)


def test_the_onnx_package_has_the_models() -> None:
    assert sorted(f[6:-5] for f in os.listdir(LIGHT) if f.endswith(".onnx")) == MODELS


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_fp16_overflow_is_the_models(name: str) -> None:
    largest = _largest_activation(_model(name))
    if name in OVERFLOWS_FP16:
        assert largest > FP16_MAX and 0.5 < largest / OVERFLOWS_FP16[name] < 2, largest
    else:
        assert largest < FP16_MAX, largest


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_onnxruntime(name: str) -> None:
    dtype = "fp32" if name in OVERFLOWS_FP16 else "fp16"
    start = time.perf_counter()
    model = _logits(_model(name)) if name in LOGITS else _model(name)
    compiled = compile_model(model, CHIP, CompileOptions(dtype=dtype))
    seconds = time.perf_counter() - start
    result = run_compiled(compiled)
    print(f"\n{name} ({dtype}): compiled in {seconds:.0f} s, {len(compiled.graph.ops)} ops, "
          f"max relative error {result.max_rel_err:.2e} (tolerance {result.tolerance:g})")
    assert result.ok, f"{name}: max relative error {result.max_rel_err:.3g}"
