"""A LLaMA causal language model written op by op, shaped like an export of HF LlamaForCausalLM.

Two graphs share the layer code below. Prefill (`build_llama`): ``input_ids`` int64
[batch, seq] -> ``logits`` float32 [batch, seq, vocab]::

    tables      positions = Cast(Range(0, seq)); freqs = positions x inv_freq
                cos, sin = Cos, Sin of Concat(freqs, freqs)             (RoPE, folded)
    layer i     h = RMSNorm(x)                 (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul)
                q, k, v = h @ Wq, h @ Wk, h @ Wv -> heads (k and v with fewer heads)
                q, k = q*cos + rotate_half(q)*sin, ...    (rotate_half: Slice, Neg, Concat)
                k, v repeated to every query head (Unsqueeze, Expand, Reshape)
                x = x + softmax(Where(causal, q @ k^T / sqrt(d), min)) @ v @ Wo
                h = RMSNorm(x); x = x + (silu(h @ Wg) * (h @ Wu)) @ Wd          (SwiGLU)
    head        logits = RMSNorm(x) @ Wlm    (tied to the embedding for the small sizes)

Decode (`build_llama_decode`): one step of generation with the KV cache as graph inputs and
outputs, named as HF optimum exports them. Inputs ``input_ids`` int64 [batch, 1] and, per layer
i, ``past_key_values.{i}.key`` / ``.value`` float32 [batch, kv_heads, past, head_dim]; outputs
``logits`` [batch, 1, vocab] and ``present.{i}.key`` / ``.value`` [batch, kv_heads, past + 1,
head_dim]. The new token sits at position ``past`` (static, so its RoPE row folds): Range(past,
past + 1). Its k (after RoPE) and v are concatenated to the cache along axis 2 (Concat); the
present k and v are repeated to the query heads as in prefill, and no mask is needed since the
one query sees every key. With the same seed both graphs draw the same weights, so a decode
step on the cache of a prefill over ``past`` tokens continues that prefill exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import onnx

from ._builder import GraphBuilder, draw, weight_rng
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
    # the models the wafer-scale and off-chip papers run (WaferLLM, ELK), after the published
    # configurations (Meta's config.json files for Llama-3-8B, Llama-2-13B and Llama-2-70B):
    # untied output heads; too large to build with weights, so they are planned shape-only
    "llama3-8b": LlamaSize(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                           vocab=128256, rope_theta=500000.0, tied=False),
    "llama2-13b": LlamaSize(hidden=5120, layers=40, heads=40, kv_heads=40, intermediate=13824,
                            vocab=32000, tied=False),
    "llama2-70b": LlamaSize(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672,
                            vocab=32000, tied=False),
})

LLAMA_DECODE_SIZES: MappingProxyType[str, LlamaSize] = MappingProxyType(
    {f"{name}-decode": size for name, size in LLAMA_SIZES.items()})
"""The decode-step twins of `LLAMA_SIZES` (`build_llama_decode`), same shapes and weights."""

EPSILON = 1e-5


@dataclass(frozen=True)
class _Dims:
    """The shapes one graph is built for: ``seq`` new tokens after ``past`` cached ones
    (``past`` is None for prefill, which has no cache inputs; a decode step has ``seq`` 1,
    which is why it needs no causal mask)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    batch: int
    seq: int
    past: int | None

    @property
    def d(self) -> int:
        return self.hidden // self.heads

    @property
    def keys(self) -> int:
        """How many keys each query attends over."""
        return self.seq + (self.past or 0)


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


def _check(hidden: int, heads: int, kv_heads: int, seq_len: int, batch: int,
           seq_name: str = "seq_len") -> None:
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads}), and heads "
                         f"by kv_heads ({kv_heads})")
    if seq_len < 1 or batch < 1:
        raise ValueError(f"{seq_name} and batch must be >= 1, got {seq_len} and {batch}")
    if (hidden // heads) % 2:
        raise ValueError(f"the head size ({hidden // heads}) must be even for rotary embeddings")


def _rope_tables(b: GraphBuilder, dims: _Dims, rope_theta: float) -> tuple[str, str]:
    """cos and sin [S, D] of the positions past .. past + seq - 1, computed in the graph from
    the positions as exports do (they fold at compile time)."""
    d, start = dims.d, dims.past or 0
    inv_freq = 1.0 / rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    pos = b.node("Range", [b.initializer("rope.start", np.array(start, np.int64)),
                           b.initializer("rope.limit", np.array(start + dims.seq, np.int64)),
                           b.initializer("rope.delta", np.array(1, np.int64))], "rope/Range")
    pos = b.node("Cast", [pos], "rope/Cast", to=onnx.TensorProto.FLOAT)
    pos = b.node("Unsqueeze", [pos, b.initializer("rope.axes", ints(1))], "rope/Unsqueeze")
    freqs = b.node("Mul", [pos, b.initializer("rope.inv_freq", inv_freq.astype(np.float32))],
                   "rope/Mul")
    emb = b.node("Concat", [freqs, freqs], "rope/Concat", axis=-1)
    return b.node("Cos", [emb], "rope/Cos"), b.node("Sin", [emb], "rope/Sin")


def _attention(b: GraphBuilder, rng: np.random.Generator, s: str, h: str, dims: _Dims,
               tables: dict[str, str], i: int) -> str:
    """Layer i's self-attention on the normed ``h``, up to and including o_proj. With a cache
    (decode) it reads ``past_key_values.{i}.*`` and writes ``present.{i}.*``."""
    d, kv_heads, rep = dims.d, dims.kv_heads, dims.heads // dims.kv_heads
    heads_of = {}
    for part, n in (("q", dims.heads), ("k", kv_heads), ("v", kv_heads)):
        y = linear(b, rng, f"{s}/attn/{part}_proj", h, dims.hidden, n * d, 0.02, bias=False)
        y = b.node("Reshape", [y, tables[f"shape{n}"]], f"{s}/attn/{part}/Reshape")
        heads_of[part] = b.node("Transpose", [y], f"{s}/attn/{part}/Transpose",
                                perm=[0, 2, 1, 3])
    cos, sin = tables["cos"], tables["sin"]
    q = _rope(b, f"{s}/attn/q_rope", heads_of["q"], cos, sin, d // 2)
    k = _rope(b, f"{s}/attn/k_rope", heads_of["k"], cos, sin, d // 2)
    v = heads_of["v"]
    if dims.past is not None:  # the new token's k and v join the cache
        k = b.node("Concat", [f"past_key_values.{i}.key", k], f"{s}/attn/k_cache/Concat",
                   output=f"present.{i}.key", axis=2)
        v = b.node("Concat", [f"past_key_values.{i}.value", v], f"{s}/attn/v_cache/Concat",
                   output=f"present.{i}.value", axis=2)
    k = _repeat_kv(b, f"{s}/attn/k_repeat", k, dims.batch, kv_heads, rep, dims.keys, d)
    v = _repeat_kv(b, f"{s}/attn/v_repeat", v, dims.batch, kv_heads, rep, dims.keys, d)
    k_t = b.node("Transpose", [k], f"{s}/attn/k/Transpose_1", perm=[0, 1, 3, 2])
    ctx = attention_core(b, f"{s}/attn", q, k_t, v, d, tables.get("mask"), tables.get("fill"))
    ctx = merge_heads(b, f"{s}/attn/merge", ctx, tables["merge"])
    return linear(b, rng, f"{s}/attn/o_proj", ctx, dims.hidden, dims.hidden, 0.02, bias=False)


def _mlp(b: GraphBuilder, rng: np.random.Generator, s: str, h: str, dims: _Dims) -> str:
    """SwiGLU: ``(silu(h @ Wg) * (h @ Wu)) @ Wd``."""
    hidden, inter = dims.hidden, dims.intermediate
    gate = linear(b, rng, f"{s}/mlp/gate_proj", h, hidden, inter, 0.02, bias=False)
    up = linear(b, rng, f"{s}/mlp/up_proj", h, hidden, inter, 0.02, bias=False)
    act = b.node("Mul", [gate, b.node("Sigmoid", [gate], f"{s}/mlp/Sigmoid")],
                 f"{s}/mlp/silu/Mul")
    act = b.node("Mul", [act, up], f"{s}/mlp/Mul")
    return linear(b, rng, f"{s}/mlp/down_proj", act, inter, hidden,
                  0.02 / math.sqrt(2 * dims.layers), bias=False)


def _llama_graph(dims: _Dims, *, vocab: int, rope_theta: float, tied: bool, seed: int,
                 weights: bool) -> GraphBuilder:
    """Every node of a LLaMA graph (prefill when ``dims.past`` is None, else one decode step),
    its inputs and outputs; the caller finishes the builder. Weights are drawn in the same
    order for both, so the same seed gives the same weights."""
    rng = weight_rng(seed, weights)
    b = GraphBuilder(materialize=weights)
    batch, seq, d, hidden = dims.batch, dims.seq, dims.d, dims.hidden
    ids = b.graph_input("input_ids", onnx.TensorProto.INT64, [batch, seq])
    cache = [] if dims.past is None else [
        f"past_key_values.{i}.{kv}" for i in range(dims.layers) for kv in ("key", "value")]
    for name in cache:
        b.graph_input(name, onnx.TensorProto.FLOAT, [batch, dims.kv_heads, dims.past, d])
    embed = b.initializer("embed_tokens.weight", draw(rng, (vocab, hidden), 0.02))

    tables: dict[str, str] = {}
    tables["cos"], tables["sin"] = _rope_tables(b, dims, rope_theta)
    if dims.past is None:  # decode needs no mask: its one query sees every key
        tables["mask"] = causal_mask(b, seq)
        tables["fill"] = b.initializer("attn.mask_value",
                                       scalar(float(np.finfo(np.float32).min)))
    for part, n in (("q", dims.heads), ("kv", dims.kv_heads)):
        tables[f"shape{n}"] = b.initializer(f"attn.{part}.shape", ints(batch, seq, n, d))
    tables["merge"] = b.initializer("attn.merge_heads.shape", ints(batch, seq, hidden))
    x = b.node("Gather", [embed, ids], "embed_tokens/Gather")
    for i in range(dims.layers):
        s = f"layers{i}"
        h = rms_norm(b, rng, f"{s}/input_norm", x, hidden, EPSILON)
        x = b.node("Add", [x, _attention(b, rng, s, h, dims, tables, i)],
                   f"{s}/attn/residual/Add")
        h = rms_norm(b, rng, f"{s}/post_norm", x, hidden, EPSILON)
        x = b.node("Add", [x, _mlp(b, rng, s, h, dims)], f"{s}/mlp/residual/Add")
    h = rms_norm(b, rng, "norm", x, hidden, EPSILON)
    if tied:
        head = b.node("Transpose", [embed], "lm_head/Transpose", perm=[1, 0])
    else:
        head = b.initializer("lm_head.weight", draw(rng, (hidden, vocab), 0.02))
    b.node("MatMul", [h, head], "lm_head/MatMul", output="logits")
    b.graph_output("logits", onnx.TensorProto.FLOAT, [batch, seq, vocab])
    for name in cache:
        b.graph_output(name.replace("past_key_values", "present"), onnx.TensorProto.FLOAT,
                       [batch, dims.kv_heads, dims.keys, d])
    return b


def build_llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, *,
                vocab: int = 32000, rope_theta: float = 10000.0, tied: bool = True,
                seq_len: int = 128, batch: int = 1, seed: int = 0,
                name: str = "llama", weights: bool = True) -> onnx.ModelProto:
    """Build a LLaMA prefill (module doc); weights N(0, 0.02^2), norm weights N(1, 0.02^2).

    >>> m = build_llama(32, 1, 4, 2, 64, vocab=50, seq_len=8)
    >>> [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    [1, 8, 50]
    """
    _check(hidden, heads, kv_heads, seq_len, batch)
    dims = _Dims(hidden, layers, heads, kv_heads, intermediate, batch, seq_len, None)
    b = _llama_graph(dims, vocab=vocab, rope_theta=rope_theta, tied=tied, seed=seed,
                     weights=weights)
    return b.finish(name, doc=f"t10c zoo {name}: hidden={hidden} layers={layers} heads={heads}"
                              f" kv_heads={kv_heads} intermediate={intermediate} seed={seed}")


def build_llama_decode(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                       *, vocab: int = 32000, rope_theta: float = 10000.0, tied: bool = True,
                       past_len: int = 128, batch: int = 1, seed: int = 0,
                       name: str = "llama-decode", weights: bool = True) -> onnx.ModelProto:
    """Build one LLaMA decode step after ``past_len`` cached tokens (module doc); the weights
    are those `build_llama` draws with the same seed.

    >>> m = build_llama_decode(32, 1, 4, 2, 64, vocab=50, past_len=8)
    >>> [(o.name, [d.dim_value for d in o.type.tensor_type.shape.dim]) for o in m.graph.output]
    [('logits', [1, 1, 50]), ('present.0.key', [1, 2, 9, 8]), ('present.0.value', [1, 2, 9, 8])]
    """
    _check(hidden, heads, kv_heads, past_len, batch, "past_len")
    dims = _Dims(hidden, layers, heads, kv_heads, intermediate, batch, 1, past_len)
    b = _llama_graph(dims, vocab=vocab, rope_theta=rope_theta, tied=tied, seed=seed,
                     weights=weights)
    return b.finish(name, doc=f"t10c zoo {name}: hidden={hidden} layers={layers} heads={heads}"
                              f" kv_heads={kv_heads} intermediate={intermediate}"
                              f" past_len={past_len} seed={seed}")
