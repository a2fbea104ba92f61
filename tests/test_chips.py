"""Chip files: every wrong field at once in one `ChipError` line (exit 2 from the CLI), and
files that are not UTF-8 TOML, not regular files or directories refused the same way."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t10c import cli
from t10c.chips import PRESETS, ChipError, chip_from_dict, load_chip

NUMERIC = ["cores", "sram_bytes_per_core", "link_bytes_per_cycle", "compute_overhead_cycles",
           "hop_latency_cycles", "sync_cycles", "routes_per_core", "clock_hz"]
#: fields for which zero is a meaningful value (no overhead, no latency, no route limit)
ZERO_OK = {"compute_overhead_cycles", "hop_latency_cycles", "sync_cycles", "routes_per_core"}


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


@pytest.mark.parametrize("field", NUMERIC)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0, -1, True, 1.5, "4",
                                   10**30])
def test_every_numeric_field_refuses_non_numbers(tmp_path: Path, field: str,
                                                 value: object) -> None:
    if value == 0 and not isinstance(value, bool) and field in ZERO_OK:
        pytest.skip("zero is legal here")
    if value == 1.5 and field == "clock_hz":
        pytest.skip("a fractional clock is legal")
    path = tmp_path / "chip.toml"
    path.write_text(f'base = "test16"\n{field} = {toml_value(value)}\n')
    with pytest.raises(ChipError, match=f"{field}: expected") as info:
        load_chip(str(path))
    assert "\n" not in str(info.value)


def test_every_wrong_field_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "chip.toml"
    path.write_text('name = "bad"\nbase = "test16"\nclock_hz = nan\ncores = 0\n'
                    'sources = "datasheet"\noverlap = 1\nmatmul_unit = [16, true]\n'
                    'vector_ops_per_cycle = { fp16 = inf, fp32 = 2 }\ncolour = "red"\n')
    with pytest.raises(ChipError) as info:
        load_chip(str(path))
    text = str(info.value)
    for field in ("clock_hz", "cores", "sources", "overlap", "matmul_unit",
                  "vector_ops_per_cycle", "colour"):
        assert f"{field}:" in text, field
    assert "\n" not in text


def test_missing_fields_and_wrong_ones_together() -> None:
    with pytest.raises(ChipError) as info:
        chip_from_dict({"name": "x", "cores": -4, "clock_hz": math.inf})
    text = str(info.value)
    assert "missing topology, " in text and "cores: expected" in text and "clock_hz:" in text


@pytest.mark.parametrize("base", [["ipu-mk2"], 3, {"a": 1}])
def test_base_of_the_wrong_type(base: object) -> None:
    with pytest.raises(ChipError, match="base: unknown preset"):
        chip_from_dict({"base": base})


def test_files_that_are_not_chip_files(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('base = "test16"\nname = "puce-\xe9"\n'.encode("latin-1"))
    junk = tmp_path / "junk.toml"
    junk.write_text("cores = = 3\n")
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    for path, expect in ((latin1, "not UTF-8"), (junk, "not valid TOML"),
                         (tmp_path, "is a directory"), (big, "too large"),
                         (fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file"),
                         (tmp_path / "absent.toml", "does not exist")):
        with pytest.raises(ChipError, match=expect):
            load_chip(str(path))


def test_a_good_chip_file_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "half.toml"
    path.write_text('name = "ipu-half"\nbase = "ipu-mk2"\ncores = 736\nclock_hz = 1.0e9\n'
                    '[sources]\ncores = "half an MK2"\n')
    chip = load_chip(str(path))
    assert (chip.cores, chip.clock_hz, chip.sources["cores"]) == (736, 1e9, "half an MK2")
    assert chip.matmul_macs_per_cycle == PRESETS["ipu-mk2"].matmul_macs_per_cycle


def test_misspelt_preset_gets_did_you_mean() -> None:
    with pytest.raises(ChipError, match="did you mean 'ipu-mk2'"):
        load_chip("ipu-mk3")


def test_cli_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nan.toml"
    path.write_text('base = "test16"\nclock_hz = nan\nsources = "x"\n')
    for argv in (["chips", str(path)], ["compile", "mlp", "--chip", str(path)],
                 ["check", "mlp", "--chip", str(path)], ["chips", str(tmp_path)]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("t10c: error: chip file") and err.count("\n") == 1, err


# -- fuzzing: any TOML value in any field loads or gets a ChipError, nothing else ----------

TOML_VALUES = st.recursive(
    st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=6)
FIELD_NAMES = st.sampled_from(["base", "name", "description", "cores", "topology", "grid",
                               "sram_bytes_per_core", "clock_hz", "matmul_macs_per_cycle",
                               "matmul_unit", "vector_ops_per_cycle", "compute_overhead_cycles",
                               "link_bytes_per_cycle", "hop_latency_cycles", "sync_cycles",
                               "overlap", "routes_per_core", "sources", "colour"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(FIELD_NAMES, TOML_VALUES, max_size=5), st.booleans())
def test_fuzz_chip_fields(fields: dict[str, object], from_base: bool) -> None:
    data = ({"base": "wse2"} if from_base else {}) | fields
    try:
        chip = chip_from_dict(data)
    except ChipError as exc:
        assert "\n" not in str(exc)
        return
    assert chip.cores >= 1 and math.isfinite(chip.clock_hz) and chip.clock_hz > 0
