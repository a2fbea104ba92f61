"""Real exported models: Hugging Face BERT, GPT-2, ViT, LLaMA and ResNet with random weights,
exported by ``torch.onnx.export`` (``python -m t10c.models.export tests/fixtures --fixtures``)
and committed, so that these tests need no PyTorch. Each compiles for the IPU MK2 (fp16) and
the 16-core test chip (fp32), and the emulator matches onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from t10c.chips import PRESETS
from t10c.driver import CompileOptions, compile_model, run_compiled
from t10c.frontend import FrontendError
from t10c.models import export

FIXTURES = Path(__file__).parent / "fixtures"
PINNED = {"gpt2-hf-dynamic.onnx": {"input_ids": (1, 16)},
          "llama-hf-mask-dynamic.onnx": {"input_ids": (2, 16), "attention_mask": (2, 16)}}


def test_every_fixture_is_there_and_small() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.onnx")) == sorted(export.FIXTURES)
    for path in FIXTURES.glob("*.onnx"):
        assert path.stat().st_size < 2_000_000, path.name


@pytest.mark.parametrize("chip,dtype", [("ipu-mk2", "fp16"), ("test16", "fp32")])
@pytest.mark.parametrize("name", sorted(export.FIXTURES))
def test_fixture_matches_onnxruntime(name: str, chip: str, dtype: str) -> None:
    options = CompileOptions(dtype=dtype, pinned=PINNED.get(name, {}))
    compiled = compile_model(str(FIXTURES / name), PRESETS[chip], options)
    result = run_compiled(compiled)
    assert result.ok, f"{name} on {chip} ({dtype}): max_rel_err {result.max_rel_err:.3g}"


def test_dynamic_fixture_needs_shape() -> None:
    with pytest.raises(FrontendError, match=r"input_ids.*--shape input_ids=1xN"):
        compile_model(str(FIXTURES / "gpt2-hf-dynamic.onnx"), PRESETS["test16"])


def test_export_skips_without_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(export, "missing", lambda: ["torch", "transformers"])
    assert export.main([str(tmp_path)]) == 0
    assert "skipping" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())
