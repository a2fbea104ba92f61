"""The t10c model zoo: deterministic ONNX models built in code, with seeded weights.

>>> from t10c.models import build
>>> model = build("bert-tiny", seq_len=16)   # onnx.ModelProto, opset 17, IR version 8

Families: ``mlp``; BERT encoders; GPT-2 and LLaMA causal language models (``seq_len`` sizes
them), and LLaMA decode steps (``llama-*-decode``: one new token after a KV cache of
``seq_len`` tokens, the cache being graph inputs and outputs); ViT and ResNet image
classifiers (their image size is part of the name's size). Each family has a tiny size for
tests and its standard small size. Nothing is ever downloaded.

Every model is checked with ``onnx.checker.check_model`` and runs on onnxruntime.
Building the same name with the same arguments gives a byte-identical
``SerializeToString()``, so a zoo model needs no file on disk to be reproducible.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from t10c.shape_only import is_shape_only

from ._builder import weights_apart
from .bert import BERT_SIZES, BertSize, build_bert
from .gpt2 import GPT2_SIZES, build_gpt2
from .llama import LLAMA_DECODE_SIZES, LLAMA_SIZES, build_llama, build_llama_decode
from .matmul import build_matmul, parse_matmul
from .mlp import build_mlp
from .resnet import RESNET_SIZES, build_resnet
from .vit import VIT_SIZES, build_vit

__all__ = [
    "BERT_SIZES",
    "DEFAULT_BATCH",
    "GPT2_SIZES",
    "LLAMA_DECODE_SIZES",
    "LLAMA_SIZES",
    "RESNET_SIZES",
    "VIT_SIZES",
    "ZOO_NAMES",
    "BertSize",
    "ModelTooLargeError",
    "UnknownModelError",
    "build",
    "build_apart",
    "build_bert",
    "build_gpt2",
    "build_llama",
    "build_llama_decode",
    "build_mlp",
    "build_resnet",
    "build_vit",
    "is_zoo_name",
    "suggest",
    "with_weights",
]

ZOO_NAMES: tuple[str, ...] = (
    "mlp",
    "bert-tiny",
    "bert-mini",
    "bert-base",
    "bert-large",
    "gpt2-tiny",
    "gpt2",
    "gpt2-medium",
    "gpt2-xl",
    "vit-tiny",
    "vit-base",
    "llama-tiny",
    "llama-135m",
    "llama-360m",
    "llama3-8b",
    "llama2-13b",
    "llama2-70b",
    "llama-tiny-decode",
    "llama-135m-decode",
    "llama-360m-decode",
    "llama3-8b-decode",
    "llama2-13b-decode",
    "llama2-70b-decode",
    "resnet-tiny",
    "resnet50",
)
"""Every name `build` accepts, smallest first within each family."""

ALIASES: MappingProxyType[str, str] = MappingProxyType({
    "resnet": "resnet50", "vit": "vit-base", "llama": "llama-135m",
    "llama-decode": "llama-135m-decode"})
"""Family names that stand for the family's standard size."""

DEFAULT_BATCH: MappingProxyType[str, int] = MappingProxyType(
    {"mlp": 16} | {name: 1 for name in ZOO_NAMES if name != "mlp"}
)
"""Batch size `build` uses when the caller passes ``batch=None``."""


#: protobuf serialises no message of 2 GiB or more, so a ModelProto with weights stays below
MAX_WEIGHT_BYTES = 2**31 - 1


class ModelTooLargeError(ValueError):
    """Raised by `build` for weights that no ModelProto can hold: plan such models shape-only."""

    def __init__(self, name: str, nbytes: int) -> None:
        super().__init__(
            f"{name} has {nbytes / 1e9:.1f} GB of float32 weights, past protobuf's 2 GB limit "
            f"for one ONNX model, so it is built shape-only: compile it without --run (or "
            f"with --timing-only) to plan and time it")
        self.name, self.nbytes = name, nbytes


class UnknownModelError(ValueError):
    """Raised by `build` for a name that is not in `ZOO_NAMES`.

    ``suggestions`` holds the closest known names (`suggest`), best first; the message says
    "did you mean" with them, then lists the zoo.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.suggestions = suggest(name)
        first, *others = self.suggestions or ("",)
        also = f" (or {', '.join(repr(s) for s in others)})" if others else ""
        hint = f"did you mean {first!r}{also}? " if first else ""
        super().__init__(
            f"unknown model {name!r}; {hint}known models: {', '.join(ZOO_NAMES)}, "
            "matmul-MxKxN"
        )


def suggest(name: str) -> tuple[str, ...]:
    """Up to three zoo names (or aliases) close to a misspelt ``name``, closest first."""
    known = [*ZOO_NAMES, *ALIASES]
    lowered = name.strip().lower()
    if lowered != name and is_zoo_name(lowered):
        return (lowered,)
    if lowered.startswith("matmul"):
        return ("matmul-MxKxN",)
    return tuple(difflib.get_close_matches(lowered, known, n=3, cutoff=0.6))


def is_zoo_name(name: str) -> bool:
    """Tell whether `build` knows ``name`` (as opposed to, say, an .onnx path).

    Besides `ZOO_NAMES`, single-op models ``matmul-MxKxN`` are built on demand.
    """
    return name in ZOO_NAMES or name in ALIASES or parse_matmul(name) is not None


def build(
    name: str, *, seq_len: int = 128, batch: int | None = None, seed: int = 0,
    weights: bool = True,
) -> onnx.ModelProto:
    """Build the zoo model ``name`` with weights drawn from ``default_rng(seed)``.

    With ``weights=False`` large weights are shape-only (`NoWeights`): enough to plan and
    generate code, and the only way to build models past ONNX's 2 GB limit (gpt2-xl).
    ``batch=None`` picks the model's default (`DEFAULT_BATCH`: 16 for mlp, 1 for the others).
    ``seq_len`` applies to the BERT, GPT-2 and LLaMA models; the others ignore it. For the
    LLaMA decode steps (``llama-*-decode``) it is the length of the KV cache (``past_len``):
    the step takes one new token at position ``seq_len`` and returns a cache one longer.

    Raises:
        UnknownModelError: ``name`` is not in `ZOO_NAMES`; the message lists them.
        ModelTooLargeError: weights were asked for a model whose float32 weights exceed
            protobuf's 2 GB limit (llama3-8b, gpt2-xl, ...): build it shape-only instead.
    """
    if weights:  # a shape-only build costs milliseconds and says how large the weights are
        skeleton = _build(name, seq_len=seq_len, batch=batch, seed=seed, weights=False)
        nbytes = weight_bytes(skeleton)
        if nbytes > MAX_WEIGHT_BYTES:
            raise ModelTooLargeError(name, nbytes)
    return _build(name, seq_len=seq_len, batch=batch, seed=seed, weights=weights)


def build_apart(name: str, **kwargs: Any) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """`build` with weights, its large initializers shape-only and their values beside it, by
    name: held once (the frontend takes them as they are, `t10c.frontend.to_graph`'s
    ``weights``), not also as the model's bytes. `with_weights` puts them back."""
    with weights_apart() as apart:
        model = build(name, **{**kwargs, "weights": True})
    return model, apart


def with_weights(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose shape-only initializers named in ``weights`` hold those
    values: the model `build` gives for what `build_apart` gave."""
    full = onnx.ModelProto()
    full.CopyFrom(model)
    for t in full.graph.initializer:
        if t.name in weights and is_shape_only(t):
            t.CopyFrom(numpy_helper.from_array(weights[t.name], name=t.name))
    return full


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the model's initializers as float32 (shape-only ones counted by shape)."""
    return sum(4 * math.prod(t.dims) for t in model.graph.initializer)


def _build(name: str, *, seq_len: int, batch: int | None, seed: int, weights: bool
           ) -> onnx.ModelProto:
    if not is_zoo_name(name):
        raise UnknownModelError(name)
    dims = parse_matmul(name)
    if dims is not None:
        return build_matmul(*dims, seed=seed, weights=weights)
    name = ALIASES.get(name, name)
    batch = DEFAULT_BATCH[name] if batch is None else batch
    if name == "mlp":
        return build_mlp(batch=batch, seed=seed, weights=weights)
    common = {"batch": batch, "seed": seed, "name": name, "weights": weights}
    if name in GPT2_SIZES:
        g = GPT2_SIZES[name]
        return build_gpt2(g.hidden, g.layers, g.heads, vocab=g.vocab, positions=g.positions,
                          seq_len=seq_len, **common)
    if name in LLAMA_SIZES or name in LLAMA_DECODE_SIZES:
        # a decode step's seq_len is the length of its KV cache
        builder, length = ((build_llama, {"seq_len": seq_len}) if name in LLAMA_SIZES
                           else (build_llama_decode, {"past_len": seq_len}))
        ll = LLAMA_SIZES.get(name) or LLAMA_DECODE_SIZES[name]
        return builder(ll.hidden, ll.layers, ll.heads, ll.kv_heads, ll.intermediate,
                       vocab=ll.vocab, rope_theta=ll.rope_theta, tied=ll.tied, **length,
                       **common)
    if name in VIT_SIZES:
        v = VIT_SIZES[name]
        return build_vit(v.hidden, v.layers, v.heads, v.mlp, image=v.image, patch=v.patch,
                         classes=v.classes, **common)
    if name in RESNET_SIZES:
        r = RESNET_SIZES[name]
        return build_resnet(r.depths, r.widths, stem=r.stem, image=r.image, classes=r.classes,
                            **common)
    size = BERT_SIZES[name]
    return build_bert(
        size.hidden,
        size.layers,
        size.heads,
        size.intermediate,
        seq_len=seq_len,
        batch=batch,
        seed=seed,
        name=name,
        weights=weights,
    )
