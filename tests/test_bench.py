"""`t10c bench` over several batch sizes: a row each, and the largest batch each strategy fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t10c.cli import main


def test_bench_rows_per_batch_and_the_largest_that_fits(capsys: pytest.CaptureFixture[str],
                                                         tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    # on test16 the mlp fits every strategy at batch 1; at 256 only t10's rotations fit
    code = main(["bench", "--models", "mlp", "--chips", "test16", "--batch", "1,256",
                 "--timing-only", "--json", str(out_json)])
    assert code == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    rows = [line for line in lines if line.startswith("| mlp | ")]
    assert [r.split(" | ")[1] for r in rows[:2]] == ["1", "256"]
    assert "does not fit" not in rows[0] and rows[1].count("does not fit") == 2
    assert "Largest batch that fits, of 1, 256" in out
    doc = json.loads(out_json.read_text())
    (cap,) = doc["largest_batch"]
    assert cap["largest_batch"] == {"t10": 256, "no-rotation": 1, "vgm": 1}
    # each figure is the batch over that strategy's latency at its largest batch
    runs = {(r["strategy"], r["batch"]): r for r in doc["runs"]}
    for strategy, batch in cap["largest_batch"].items():
        us = runs[strategy, batch]["latency_us"]  # rounded to 0.01 us
        assert batch / (us + 0.005) <= cap["samples_per_s"][strategy] * 1e-6 <= \
            batch / (us - 0.005)
    assert all("batch" in r for r in doc["runs"])

