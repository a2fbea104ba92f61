"""The t10c model zoo: deterministic ONNX models built in code, with seeded weights.

>>> from t10c.models import build
>>> model = build("bert-tiny", seq_len=16)   # onnx.ModelProto, opset 17, IR version 8

Every model is checked with ``onnx.checker.check_model`` and runs on onnxruntime.
Building the same name with the same arguments gives a byte-identical
``SerializeToString()``, so a zoo model needs no file on disk to be reproducible.
"""

from __future__ import annotations

from types import MappingProxyType

import onnx

from .bert import BERT_SIZES, BertSize, build_bert
from .matmul import build_matmul, parse_matmul
from .mlp import build_mlp

__all__ = [
    "BERT_SIZES",
    "DEFAULT_BATCH",
    "ZOO_NAMES",
    "BertSize",
    "UnknownModelError",
    "build",
    "build_bert",
    "build_mlp",
    "is_zoo_name",
]

ZOO_NAMES: tuple[str, ...] = (
    "mlp",
    "bert-tiny",
    "bert-mini",
    "bert-base",
    "bert-large",
)
"""Every name `build` accepts, smallest first."""

DEFAULT_BATCH: MappingProxyType[str, int] = MappingProxyType(
    {"mlp": 16} | {name: 1 for name in BERT_SIZES}
)
"""Batch size `build` uses when the caller passes ``batch=None``."""


class UnknownModelError(ValueError):
    """Raised by `build` for a name that is not in `ZOO_NAMES`."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"unknown model {name!r}; known models: {', '.join(ZOO_NAMES)}, "
            "matmul-MxKxN"
        )
        self.name = name


def is_zoo_name(name: str) -> bool:
    """Tell whether `build` knows ``name`` (as opposed to, say, an .onnx path).

    Besides `ZOO_NAMES`, single-op models ``matmul-MxKxN`` are built on demand.
    """
    return name in ZOO_NAMES or parse_matmul(name) is not None


def build(
    name: str, *, seq_len: int = 128, batch: int | None = None, seed: int = 0
) -> onnx.ModelProto:
    """Build the zoo model ``name`` with weights drawn from ``default_rng(seed)``.

    ``batch=None`` picks the model's default (`DEFAULT_BATCH`: 16 for mlp, 1 for BERT).
    ``seq_len`` applies to the BERT models only; the mlp ignores it.

    Raises:
        UnknownModelError: ``name`` is not in `ZOO_NAMES`; the message lists them.
    """
    if not is_zoo_name(name):
        raise UnknownModelError(name)
    dims = parse_matmul(name)
    if dims is not None:
        return build_matmul(*dims, seed=seed)
    batch = DEFAULT_BATCH[name] if batch is None else batch
    if name == "mlp":
        return build_mlp(batch=batch, seed=seed)
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
    )
