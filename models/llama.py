"""A LLaMA causal language model written op by op, shaped like an export of HF LlamaForCausalLM.

Graph: ``input_ids`` int64 [batch, seq] -> ``logits`` float32 [batch, seq, vocab]::

    tables      positions = Cast(Range(0, seq)); freqs = positions x inv_freq
                cos, sin = Cos, Sin of Concat(freqs, freqs)             (RoPE, folded)
    layer i     h = RMSNorm(x)                 (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul)
                q, k, v = h @ Wq, h @ Wk, h @ Wv -> heads (k and v with fewer heads)
                q, k = q*cos + rotate_half(q)*sin, ...    (rotate_half: Slice, Neg, Concat)
                k, v repeated to every query head (Unsqueeze, Expand, Reshape)
                x = x + softmax(Where(causal, q @ k^T / sqrt(d), min)) @ v @ Wo
                h = RMSNorm(x); x = x + (silu(h @ Wg) * (h @ Wu)) @ Wd          (SwiGLU)
    head        logits = RMSNorm(x) @ Wlm    (tied to the embedding for the small sizes)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx

from ._builder import GraphBuilder, normal, weight_rng
from ._layers import attention_core, causal_mask, ints, linear, merge_heads, rms_norm, scalar


@dataclass(frozen=True)
class LlamaSize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 10000.0
    tied: bool = True


LLAMA_SIZES: MappingProxyType[str, LlamaSize] = MappingProxyType({
    "llama-tiny": LlamaSize(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=352,
                            vocab=32000),
    # the shapes of SmolLM2-135M and -360M (LLaMA architectures with grouped-query attention
    # and tied embeddings); a 1B model is over protobuf's 2 GB limit as one float32 ModelProto
    "llama-135m": LlamaSize(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536,
                            vocab=49152, rope_theta=100000.0),
    "llama-360m": LlamaSize(hidden=960, layers=32, heads=15, kv_heads=5, intermediate=2560,
                            vocab=49152, rope_theta=100000.0),
})

EPSILON = 1e-5


def _rope(b: GraphBuilder, scope: str, x: str, cos: str, sin: str, half: int) -> str:
    """``x * cos + rotate_half(x) * sin`` on [B, H, S, D] with rotate_half(x) = [-x2, x1]."""
    starts = b.initializer(f"{scope}.starts", ints(0))
    mid = b.initializer(f"{scope}.mid", ints(half))
    end = b.initializer(f"{scope}.end", ints(2 * half))
    axis = b.initializer(f"{scope}.axis", ints(-1))
    x1 = b.node("Slice", [x, starts, mid, axis], f"{scope}/Slice")
    x2 = b.node("Slice", [x, mid, end, axis], f"{scope}/Slice_1")
    rotated = b.node("Concat", [b.node("Neg", [x2], f"{scope}/Neg"), x1], f"{scope}/Concat",
                     axis=-1)
    return b.node("Add", [b.node("Mul", [x, cos], f"{scope}/Mul"),
                          b.node("Mul", [rotated, sin], f"{scope}/Mul_1")], f"{scope}/Add")


def _repeat_kv(b: GraphBuilder, scope: str, x: str, batch: int, kv: int, rep: int, seq: int,
               d: int) -> str:
    """[B, kv, S, D] -> [B, kv * rep, S, D], each key/value head serving ``rep`` query heads."""
    if rep == 1:
        return x
    y = b.node("Unsqueeze", [x, b.initializer(f"{scope}.axes", ints(2))], f"{scope}/Unsqueeze")
    y = b.node("Expand", [y, b.initializer(f"{scope}.shape", ints(batch, kv, rep, seq, d))],
               f"{scope}/Expand")
    return b.node("Reshape", [y, b.initializer(f"{scope}.heads", ints(batch, kv * rep, seq, d))],
                  f"{scope}/Reshape")


def build_llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, *,
                vocab: int = 32000, rope_theta: float = 10000.0, tied: bool = True,
                seq_len: int = 128, batch: int = 1, seed: int = 0,
                name: str = "llama", weights: bool = True) -> onnx.ModelProto:
    """Build a LLaMA (module doc); weights N(0, 0.02^2), norm weights N(1, 0.02^2).

    >>> m = build_llama(32, 1, 4, 2, 64, vocab=50, seq_len=8)
    >>> [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    [1, 8, 50]
    """
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads}), and heads "
                         f"by kv_heads ({kv_heads})")
    if seq_len < 1 or batch < 1:
        raise ValueError(f"seq_len and batch must be >= 1, got {seq_len} and {batch}")
    d = hidden // heads
    if d % 2:
        raise ValueError(f"the head size ({d}) must be even for rotary embeddings")
    rep = heads // kv_heads
    rng = weight_rng(seed, weights)
    b = GraphBuilder(materialize=weights)
    ids = b.graph_input("input_ids", onnx.TensorProto.INT64, [batch, seq_len])
    embed = b.initializer("embed_tokens.weight", normal(rng, (vocab, hidden), 0.02))

    # the rotary tables, computed in the graph from the positions as exports do
    inv_freq = 1.0 / rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    pos = b.node("Range", [b.initializer("rope.start", np.array(0, np.int64)),
                           b.initializer("rope.limit", np.array(seq_len, np.int64)),
                           b.initializer("rope.delta", np.array(1, np.int64))], "rope/Range")
    pos = b.node("Cast", [pos], "rope/Cast", to=onnx.TensorProto.FLOAT)
    pos = b.node("Unsqueeze", [pos, b.initializer("rope.axes", ints(1))], "rope/Unsqueeze")
    freqs = b.node("Mul", [pos, b.initializer("rope.inv_freq", inv_freq.astype(np.float32))],
                   "rope/Mul")
    emb = b.node("Concat", [freqs, freqs], "rope/Concat", axis=-1)
    cos = b.node("Cos", [emb], "rope/Cos")
    sin = b.node("Sin", [emb], "rope/Sin")

    mask = causal_mask(b, seq_len)
    fill = b.initializer("attn.mask_value", scalar(float(np.finfo(np.float32).min)))
    shapes = {n: b.initializer(f"attn.{part}.shape", ints(batch, seq_len, n, d))
              for part, n in (("q", heads), ("kv", kv_heads))}
    merge_shape = b.initializer("attn.merge_heads.shape", ints(batch, seq_len, hidden))
    x = b.node("Gather", [embed, ids], "embed_tokens/Gather")
    for i in range(layers):
        s = f"layers{i}"
        h = rms_norm(b, rng, f"{s}/input_norm", x, hidden, EPSILON)
        heads_of = {}
        for part, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            y = linear(b, rng, f"{s}/attn/{part}_proj", h, hidden, n * d, 0.02, bias=False)
            y = b.node("Reshape", [y, shapes[n]], f"{s}/attn/{part}/Reshape")
            heads_of[part] = b.node("Transpose", [y], f"{s}/attn/{part}/Transpose",
                                    perm=[0, 2, 1, 3])
        q = _rope(b, f"{s}/attn/q_rope", heads_of["q"], cos, sin, d // 2)
        k = _rope(b, f"{s}/attn/k_rope", heads_of["k"], cos, sin, d // 2)
        k = _repeat_kv(b, f"{s}/attn/k_repeat", k, batch, kv_heads, rep, seq_len, d)
        v = _repeat_kv(b, f"{s}/attn/v_repeat", heads_of["v"], batch, kv_heads, rep, seq_len, d)
        k_t = b.node("Transpose", [k], f"{s}/attn/k/Transpose_1", perm=[0, 1, 3, 2])
        ctx = attention_core(b, f"{s}/attn", q, k_t, v, d, mask, fill)
        ctx = merge_heads(b, f"{s}/attn/merge", ctx, merge_shape)
        out = linear(b, rng, f"{s}/attn/o_proj", ctx, hidden, hidden, 0.02, bias=False)
        x = b.node("Add", [x, out], f"{s}/attn/residual/Add")
        h = rms_norm(b, rng, f"{s}/post_norm", x, hidden, EPSILON)
        gate = linear(b, rng, f"{s}/mlp/gate_proj", h, hidden, intermediate, 0.02, bias=False)
        up = linear(b, rng, f"{s}/mlp/up_proj", h, hidden, intermediate, 0.02, bias=False)
        act = b.node("Mul", [gate, b.node("Sigmoid", [gate], f"{s}/mlp/Sigmoid")],
                     f"{s}/mlp/silu/Mul")
        act = b.node("Mul", [act, up], f"{s}/mlp/Mul")
        out = linear(b, rng, f"{s}/mlp/down_proj", act, intermediate, hidden,
                     0.02 / math.sqrt(2 * layers), bias=False)
        x = b.node("Add", [x, out], f"{s}/mlp/residual/Add")
    h = rms_norm(b, rng, "norm", x, hidden, EPSILON)
    if tied:
        head = b.node("Transpose", [embed], "lm_head/Transpose", perm=[1, 0])
    else:
        head = b.initializer("lm_head.weight", normal(rng, (hidden, vocab), 0.02))
    b.node("MatMul", [h, head], "lm_head/MatMul", output="logits")
    b.graph_output("logits", onnx.TensorProto.FLOAT, [batch, seq_len, vocab])
    return b.finish(name, doc=f"t10c zoo {name}: hidden={hidden} layers={layers} heads={heads}"
                              f" kv_heads={kv_heads} intermediate={intermediate} seed={seed}")
