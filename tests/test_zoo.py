"""Every zoo model at its tiny size compiles for the IPU MK2 and the emulator matches
onnxruntime; ``-m slow`` adds the standard sizes (about half a minute each, several GB)."""

from __future__ import annotations

import pytest

from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.frontend import to_graph
from t10c.models import UnknownModelError, build, suggest

MK2 = PRESETS["ipu-mk2"]
TINY = ["gpt2-tiny", "vit-tiny", "llama-tiny", "resnet-tiny"]


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("name", TINY)
def test_tiny_zoo_model_matches_onnxruntime(name: str, dtype: str) -> None:
    compiled = compile_model(name, MK2, CompileOptions(dtype=dtype, seq_len=16))
    result = run_compiled(compiled)
    assert result.ok, f"{name} ({dtype}): max_rel_err {result.max_rel_err:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "vit-base", "gpt2", "llama-135m",
                                  "llama-135m-decode"])
def test_standard_zoo_model_matches_onnxruntime(name: str) -> None:
    compiled = compile_model(name, MK2, CompileOptions(dtype="fp16"))
    result = run_compiled(compiled)
    assert result.ok, f"{name}: max_rel_err {result.max_rel_err:.3g}"


def _kinds(name: str) -> list[str]:
    return [op.kind for op in to_graph(build(name, seq_len=8)).ops]


def test_device_graphs_hold_only_real_computation() -> None:
    # masks, positions, RoPE tables and BatchNorm statistics are folded at compile time: the
    # ops left are the layers' own. Matmuls per layer: GPT-2 6 (qkv, scores, context, proj,
    # fc, proj), LLaMA 9 (q, k, v, scores, context, o, gate, up, down); plus the LM head
    gpt2, llama, resnet = _kinds("gpt2-tiny"), _kinds("llama-tiny"), _kinds("resnet-tiny")
    assert gpt2.count("contraction") == 2 * 6 + 1 and gpt2.count("gather") == 1
    assert llama.count("contraction") == 2 * 9 + 1 and llama.count("gather") == 1
    # resnet: every Conv (with its folded BatchNorm) is one contraction and one elementwise
    # step (bias, Relu, residual); the pools are reductions; the head is one more matmul
    assert resnet.count("contraction") == 1 + 3 * 4 + 1
    assert resnet.count("reduce") == 2


@pytest.mark.parametrize("typo, best", [("bert-tinny", "bert-tiny"), ("gpt2xl", "gpt2-xl"),
                                        ("BERT-TINY", "bert-tiny"), ("resnet-50", "resnet50"),
                                        ("lama", "llama"), ("matmul-4x4", "matmul-MxKxN")])
def test_misspelt_names_get_did_you_mean(typo: str, best: str) -> None:
    assert suggest(typo)[0] == best
    with pytest.raises(UnknownModelError) as info:
        build(typo)
    assert info.value.suggestions[0] == best
    assert f"did you mean {best!r}" in str(info.value)


def test_no_suggestion_for_a_name_like_nothing() -> None:
    with pytest.raises(UnknownModelError) as info:
        build("qwertyuiop")
    assert info.value.suggestions == () and "did you mean" not in str(info.value)
