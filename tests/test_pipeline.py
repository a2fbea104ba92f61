"""End to end: zoo models compiled, emulated and checked against onnxruntime."""

from __future__ import annotations

import json

import pytest

from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.planfile import plan_document

MK2 = PRESETS["ipu-mk2"]
TEST16 = PRESETS["test16"]


@pytest.mark.parametrize("name,chip,dtype", [
    ("mlp", MK2, "fp16"),
    ("mlp", MK2, "fp32"),
    ("bert-mini", MK2, "fp16"),
    ("bert-tiny", MK2, "fp32"),
])
def test_zoo_model_matches_onnxruntime(name: str, chip, dtype: str) -> None:
    compiled = compile_model(name, chip, CompileOptions(dtype=dtype))
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err
    assert result.timeline.cycles > 0
    assert result.timeline.peak_sram_bytes_per_core <= chip.sram_bytes_per_core
    assert result.timeline.peak_sram_bytes_per_core == compiled.program.peak_sram_bytes_per_core


def test_bert_tiny_rotates_weights_on_the_small_chip() -> None:
    compiled = compile_model("bert-tiny", TEST16, CompileOptions(dtype="fp16"))
    graph, plan = compiled.graph, compiled.plan
    consts = set(graph.constants)
    # a weight matmul (one with a constant input) has some operand with f_t > 1
    rotating = [
        op.name for op, p in zip(graph.ops, plan.ops)
        if op.kind == "contraction" and any(graph.root(o.tensor) in consts for o in op.inputs)
        and any(f > 1 for i in range(len(op.operands)) for f in p.f_t(op, i).values())
    ]
    assert rotating, "expected some weight matmul to rotate on the 16-core chip"
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err


@pytest.mark.slow
def test_bert_base_on_mk2() -> None:
    compiled = compile_model("bert-base", MK2, CompileOptions(dtype="fp16"))
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err


def test_compile_is_deterministic() -> None:
    docs, programs = [], []
    for _ in range(2):
        c = compile_model("bert-tiny", TEST16, CompileOptions(dtype="fp16", seq_len=16))
        docs.append(json.dumps(plan_document(c), sort_keys=True))
        programs.append([(type(i).__name__, i.op, i.phase) for i in c.program.instrs])
        programs[-1].append(tuple((b.name, b.elems, b.offset) for b in c.program.buffers))
    assert docs[0] == docs[1]
    assert programs[0] == programs[1]


@pytest.mark.parametrize("cores", [13, 1472])
def test_bert_tiny_on_prime_and_full_core_counts(cores: int) -> None:
    """Every op of bert-tiny gets a legal plan (verified before codegen) whose emulation
    matches onnxruntime, on a prime core count and on all of an MK2's tiles."""
    import dataclasses

    chip = dataclasses.replace(TEST16, name=f"test{cores}", cores=cores, grid=(1, cores),
                               sram_bytes_per_core=4 * 1024 * 1024)
    compiled = compile_model("bert-tiny", chip, CompileOptions(dtype="fp32", seq_len=32))
    assert all(1 <= p.steps and max(p.F) >= 1 for p in compiled.plan.ops)
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err


def test_a_model_that_cannot_fit_gets_a_diagnosis() -> None:
    import dataclasses

    from t10c.partition import DoesNotFitError

    chip = dataclasses.replace(TEST16, name="mid", sram_bytes_per_core=1_100_000)
    with pytest.raises(DoesNotFitError) as err:
        compile_model("bert-tiny", chip, CompileOptions(dtype="fp32", seq_len=16))
    text = str(err.value)
    assert "does not fit on mid" in text and "per core" in text
    assert "word_embeddings" in text and "What would help" in text and "--dtype fp16" in text


@pytest.mark.parametrize("strategy", ["t10", "no-rotation", "vgm"])
def test_every_strategy_matches_onnxruntime(strategy: str) -> None:
    """The baselines are compiled and emulated like t10c's own plans, and checked the same."""
    from t10c.partition import SearchOptions

    search = SearchOptions(max_rot_axes=2 if strategy == "t10" else 0,
                           weights_home=strategy == "vgm")
    import dataclasses

    chip = dataclasses.replace(TEST16, sram_bytes_per_core=2 * 1024 * 1024)  # vgm keeps 2 copies
    compiled = compile_model("bert-tiny", chip, CompileOptions(seq_len=16, search=search))
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err
    if strategy != "t10":
        assert all(not any(p.rot) for p in compiled.plan.ops)
    if strategy == "vgm":
        phases = {r.phase for r in result.timeline.records}
        assert "fetch" in phases


def test_same_compile_same_files(tmp_path) -> None:
    """Two compiles of the same model, chip and options write identical plan and program."""
    from t10c.cli import main

    for name in ("a", "b"):
        assert main(["compile", "bert-tiny", "--chip", "test16", "--seq-len", "16", "-o",
                     str(tmp_path / name), "--no-table"]) == 0
    for f in ("plan.json", "program.json", "program.npz"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_gpt2_xl_gets_a_diagnosis(capsys) -> None:
    """1.5B parameters do not fit one MK2; the zoo builds it shape-only and the planner says
    by how much, without a solver dump."""
    from t10c.cli import main

    assert main(["compile", "gpt2-xl", "--chip", "ipu-mk2", "--no-table"]) == 1
    err = capsys.readouterr().err
    assert "does not fit on ipu-mk2" in err and "What would help" in err
    # the tied embedding is one weight: lm_head reads a transposed view of wte
    assert "  wte: 160.8 MB" in err and "lm_head/Transpose_output_0" not in err
    assert "the weights alone are 3113.9 MB" in err  # 1.557 G parameters, once each


def test_weights_can_be_warmed_up_from_the_idle_layout() -> None:
    """Where SRAM is short, t10c may keep an op's weights in the compact idle layout and warm
    them up before the op; such programs compute the same result."""
    compiled = compile_model("bert-tiny", TEST16, CompileOptions(dtype="fp16"))
    warmed = [p for p in compiled.plan.ops if p.home]
    assert warmed
    result = run_compiled(compiled)
    assert result.ok, result.max_rel_err
    assert "fetch" in {r.phase for r in result.timeline.records}


def _diagnosis(strategy: str, sram_kb: int) -> str:
    import dataclasses

    from t10c.partition import DoesNotFitError, SearchOptions

    chip = dataclasses.replace(TEST16, name="mid", sram_bytes_per_core=sram_kb * 1000)
    search = SearchOptions(max_rot_axes=2 if strategy == "t10" else 0)
    with pytest.raises(DoesNotFitError) as err:
        # the chip sizes are calibrated without epilogues, whose weights (biases) are
        # held expanded to each core's share of the result
        compile_model("bert-tiny", chip, CompileOptions(dtype="fp32", seq_len=64, search=search,
                                                        weights=False, fuse="inline"))
    return str(err.value)


def _need_and_usable(text: str) -> tuple[int, int]:
    import re

    first = text.splitlines()[0]
    need = re.search(r"needs is [\d.]+ KiB \(([\d,]+) bytes\) per core", first)
    usable = re.search(r"; [\d.]+ KiB \(([\d,]+) bytes\) of [\d.]+ KiB per core are usable",
                       first)
    assert need and usable, first
    return int(need[1].replace(",", "")), int(usable[1].replace(",", ""))


def test_a_diagnosis_names_what_does_not_fit() -> None:
    """The weights fit (1.03 MiB of 1.05 MiB usable) but no choice of plans does: the
    diagnosis names the op where the least peak is, and that peak exceeds the usable SRAM."""
    text = _diagnosis("t10", 1160)
    need, usable = _need_and_usable(text)
    assert need > usable
    assert "at op layer0/ffn/gelu/Mul_half" in text and "resident weights" in text
    assert "about 2x the cores" in text and "splitting the layers over 2 chips" in text
    assert "1x" not in text and " 1 chips" not in text


def test_advice_changes_something() -> None:
    """Every factor advised is at least 2 (never "1x the cores" or "1 chips")."""
    import re

    text = _diagnosis("no-rotation", 1170)
    need, usable = _need_and_usable(text)
    assert need > usable and "layer0/ffn/down/MatMul" in text
    factors = [int(k) for k in re.findall(r"about (\d+)x the cores|over (\d+) chips", text)
               for k in k if k]
    assert factors and min(factors) >= 2, text


def test_splitting_is_advised_only_when_it_helps() -> None:
    from t10c.partition.diagnose import _advice
    from t10c.partition.solve import SolverOptions

    opts = SolverOptions()
    # one op's working set (650) exceeds the usable 600 whatever the resident weights
    helps = _advice(need=1100, resident=450, working=650, cap=600, opts=opts, dtype="fp16")
    assert not any("splitting" in h for h in helps) and any("2x the cores" in h for h in helps)
    # resident weights dominate: over 2 chips each holds 250 + 100 working <= 600
    helps = _advice(need=600 + 1, resident=501, working=100, cap=600, opts=opts, dtype="fp16")
    assert "splitting the layers over 2 chips" in helps
    helps = _advice(need=2100, resident=2000, working=100, cap=600, opts=opts, dtype="fp32")
    assert helps[0].startswith("--dtype fp16") and "splitting the layers over 4 chips" in helps
