"""GPT-2 (causal language model) written op by op, shaped like an export of HF GPT2LMHeadModel.

Graph: ``input_ids`` int64 [batch, seq] -> ``logits`` float32 [batch, seq, vocab]::

    embeddings  Gather(wte, input_ids) + Gather(wpe, Range(0, seq))
    layer i     h = LayerNorm(x); qkv = h @ c_attn + b -> Split into q, k, v -> heads
                scores = (q @ k) * 1/sqrt(d) -> Where(causal, scores, min) -> Softmax -> @ v
                x = x + merge(heads) @ c_proj + b
                h = LayerNorm(x); x = x + gelu_tanh(h @ c_fc + b) @ c_proj + b
    head        logits = LayerNorm(x) @ Transpose(wte)      (tied weights)

The causal mask (ConstantOfShape, Trilu, Cast), the positions (Range) and the transposed
embedding depend only on constants and fold at compile time. GELU is the tanh approximation
written as Pow, Mul, Add, Tanh (HF's ``gelu_new``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx

from ._builder import GraphBuilder, draw, weight_rng
from ._layers import attention_core, causal_mask, ints, layer_norm, linear, merge_heads, scalar


@dataclass(frozen=True)
class GPT2Size:
    hidden: int
    layers: int
    heads: int
    vocab: int = 50257
    positions: int = 1024


GPT2_SIZES: MappingProxyType[str, GPT2Size] = MappingProxyType({
    "gpt2-tiny": GPT2Size(hidden=128, layers=2, heads=2),
    "gpt2": GPT2Size(hidden=768, layers=12, heads=12),  # 124M parameters
    "gpt2-medium": GPT2Size(hidden=1024, layers=24, heads=16),  # 355M parameters
    "gpt2-xl": GPT2Size(hidden=1600, layers=48, heads=25),  # 1.5B parameters: build it shape-only
})

EPSILON = 1e-5


def _gelu_tanh(b: GraphBuilder, scope: str, x: str, c: dict[str, str]) -> str:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``, node by node."""
    half = b.node("Mul", [x, c["half"]], f"{scope}/Mul")
    cube = b.node("Pow", [x, c["three"]], f"{scope}/Pow")
    inner = b.node("Add", [x, b.node("Mul", [cube, c["coef"]], f"{scope}/Mul_1")],
                   f"{scope}/Add")
    inner = b.node("Mul", [inner, c["sqrt_2_pi"]], f"{scope}/Mul_2")
    t = b.node("Add", [b.node("Tanh", [inner], f"{scope}/Tanh"), c["one"]], f"{scope}/Add_1")
    return b.node("Mul", [half, t], f"{scope}/Mul_3")


def build_gpt2(hidden: int, layers: int, heads: int, *, vocab: int = 50257,
               positions: int = 1024, seq_len: int = 128, batch: int = 1, seed: int = 0,
               name: str = "gpt2", weights: bool = True) -> onnx.ModelProto:
    """Build GPT-2 (module doc); weights N(0, 0.02^2), position embeddings N(0, 0.01^2),
    output projections N(0, (0.02 / sqrt(2 * layers))^2), as HF initialises them.

    >>> m = build_gpt2(32, 1, 2, vocab=50, positions=16, seq_len=8)
    >>> [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    [1, 8, 50]
    """
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    if not 1 <= seq_len <= positions:
        raise ValueError(f"seq_len must be in [1, positions={positions}], got {seq_len}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    d = hidden // heads
    rng = weight_rng(seed, weights)
    b = GraphBuilder(materialize=weights)
    ids = b.graph_input("input_ids", onnx.TensorProto.INT64, [batch, seq_len])
    wte = b.initializer("wte", draw(rng, (vocab, hidden), 0.02))
    wpe = b.initializer("wpe", draw(rng, (positions, hidden), 0.01))
    c = {"half": b.initializer("gelu.half", scalar(0.5)),
         "three": b.initializer("gelu.three", scalar(3.0)),
         "coef": b.initializer("gelu.coef", scalar(0.044715)),
         "sqrt_2_pi": b.initializer("gelu.sqrt_2_pi", scalar(math.sqrt(2 / math.pi))),
         "one": b.initializer("gelu.one", scalar(1.0))}
    split_shape = b.initializer("attn.split_heads.shape", ints(batch, seq_len, heads, d))
    merge_shape = b.initializer("attn.merge_heads.shape", ints(batch, seq_len, hidden))
    qkv_split = b.initializer("attn.qkv.split", ints(hidden, hidden, hidden))
    fill = b.initializer("attn.mask_value", scalar(float(np.finfo(np.float32).min)))
    mask = causal_mask(b, seq_len)

    pos = b.node("Range", [b.initializer("positions.start", np.array(0, np.int64)),
                           b.initializer("positions.limit", np.array(seq_len, np.int64)),
                           b.initializer("positions.delta", np.array(1, np.int64))],
                 "positions/Range")
    x = b.node("Add", [b.node("Gather", [wte, ids], "wte/Gather"),
                       b.node("Gather", [wpe, pos], "wpe/Gather")], "embeddings/Add")
    proj_std = 0.02 / math.sqrt(2 * layers)
    for i in range(layers):
        s = f"h{i}"
        h = layer_norm(b, rng, f"{s}/ln_1", x, hidden, EPSILON)
        qkv = linear(b, rng, f"{s}/attn/c_attn", h, hidden, 3 * hidden, 0.02)
        q, k, v = b.node_outputs("Split", [qkv, qkv_split], f"{s}/attn/Split", 3, axis=-1)
        heads_of = {}
        for part, t, perm in (("q", q, [0, 2, 1, 3]), ("k", k, [0, 2, 3, 1]),
                              ("v", v, [0, 2, 1, 3])):
            y = b.node("Reshape", [t, split_shape], f"{s}/attn/{part}/Reshape")
            heads_of[part] = b.node("Transpose", [y], f"{s}/attn/{part}/Transpose", perm=perm)
        ctx = attention_core(b, f"{s}/attn", heads_of["q"], heads_of["k"], heads_of["v"], d,
                             mask, fill)
        ctx = merge_heads(b, f"{s}/attn/merge", ctx, merge_shape)
        out = linear(b, rng, f"{s}/attn/c_proj", ctx, hidden, hidden, proj_std)
        x = b.node("Add", [x, out], f"{s}/attn/residual/Add")
        h = layer_norm(b, rng, f"{s}/ln_2", x, hidden, EPSILON)
        u = linear(b, rng, f"{s}/mlp/c_fc", h, hidden, 4 * hidden, 0.02)
        g = _gelu_tanh(b, f"{s}/mlp/gelu", u, c)
        out = linear(b, rng, f"{s}/mlp/c_proj", g, 4 * hidden, hidden, proj_std)
        x = b.node("Add", [x, out], f"{s}/mlp/residual/Add")
    h = layer_norm(b, rng, "ln_f", x, hidden, EPSILON)
    head = b.node("Transpose", [wte], "lm_head/Transpose", perm=[1, 0])
    b.node("MatMul", [h, head], "lm_head/MatMul", output="logits")
    b.graph_output("logits", onnx.TensorProto.FLOAT, [batch, seq_len, vocab])
    return b.finish(name, doc=f"t10c zoo {name}: hidden={hidden} layers={layers} "
                              f"heads={heads} vocab={vocab} seed={seed}")
