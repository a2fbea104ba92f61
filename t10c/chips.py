"""Chip descriptions: built-in presets and user chips from TOML files.

A `Chip` holds the figures the cost model and the emulator use. Every preset figure carries its
source in `Chip.sources`; figures that are t10c's modelling assumptions say so.

A user chip is a TOML file with the fields of `Chip` (see ``docs`` in the README). It may start
from a preset with ``base = "ipu-mk2"`` and override any field::

    name = "ipu-half"
    base = "ipu-mk2"
    cores = 736
    [sources]
    cores = "half an MK2, for a what-if study"
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOPOLOGIES = ("all-to-all", "mesh2d", "torus2d")
DTYPES = {"fp16": 2, "fp32": 4}


class ChipError(ValueError):
    """A chip name or chip file that cannot be used; the message says what to change."""


@dataclass(frozen=True)
class Chip:
    """An inter-core-connected chip, as the planner and the emulator see it.

    Rates are per core and per cycle; bytes and cycles are integers.
    """

    name: str
    description: str
    cores: int
    topology: str
    grid: tuple[int, int]
    sram_bytes_per_core: int
    clock_hz: float
    #: multiply-accumulates per cycle of one core's matrix unit, per storage dtype
    matmul_macs_per_cycle: dict[str, int]
    #: the matrix unit works on sub-tasks padded to multiples of (k, n) (the m dimension streams)
    matmul_unit: tuple[int, int]
    #: simple elementwise operations per cycle of one core's vector unit, per storage dtype
    vector_ops_per_cycle: dict[str, int]
    #: fixed cost of starting one compute kernel (loop set-up, pointer arithmetic)
    compute_overhead_cycles: int
    #: bytes one core can receive per cycle over the interconnect
    link_bytes_per_cycle: int
    hop_latency_cycles: int
    #: cost of one bulk-synchronous barrier across the chip
    sync_cycles: int
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def total_sram_bytes(self) -> int:
        return self.cores * self.sram_bytes_per_core

    def peak_flops(self, dtype: str) -> float:
        return 2.0 * self.matmul_macs_per_cycle[dtype] * self.cores * self.clock_hz

    def cycles_to_s(self, cycles: int) -> float:
        return cycles / self.clock_hz

    # The primitive costs below are shared by the planner's cost model and the emulator's timing:
    # both price the same sub-task the same way, the emulator from the program's actual shapes.

    def matmul_cycles(self, m: int, k: int, n: int, batch: int, dtype: str) -> int:
        """Cycles for ``batch`` products of (m x k) by (k x n) on one core's matrix unit."""
        uk, un = self.matmul_unit
        macs = batch * m * (-(-k // uk) * uk) * (-(-n // un) * un)
        return self.compute_overhead_cycles + -(-macs // self.matmul_macs_per_cycle[dtype])

    def vector_cycles(self, ops: int, dtype: str) -> int:
        """Cycles for ``ops`` elementwise operations on one core's vector unit."""
        return self.compute_overhead_cycles + -(-ops // self.vector_ops_per_cycle[dtype])

    def transfer_cycles(self, bytes_per_core: int, hops: int = 1) -> int:
        """Cycles for each core to receive ``bytes_per_core`` (the exchange phase, no barrier)."""
        if bytes_per_core <= 0:
            return 0
        return self.hop_latency_cycles * hops + -(-bytes_per_core // self.link_bytes_per_cycle)


_IPU_SRC = "Graphcore IPU-M2000 / GC200 datasheet (docs.graphcore.ai); T10 (SOSP 2024)"
_ASSUMED = "t10c modelling assumption (approximate)"

PRESETS: dict[str, Chip] = {
    "ipu-mk2": Chip(
        name="ipu-mk2",
        description="Graphcore IPU MK2 (GC200): 1472 tiles, all-to-all exchange",
        cores=1472, topology="all-to-all", grid=(1, 1472),
        sram_bytes_per_core=624 * 1024, clock_hz=1.325e9,
        matmul_macs_per_cycle={"fp16": 64, "fp32": 16}, matmul_unit=(16, 4),
        vector_ops_per_cycle={"fp16": 4, "fp32": 2}, compute_overhead_cycles=32,
        link_bytes_per_cycle=4, hop_latency_cycles=16, sync_cycles=118,
        sources={
            "cores": _IPU_SRC, "sram_bytes_per_core": _IPU_SRC + " (624 KiB per tile, ~900 MB)",
            "clock_hz": _IPU_SRC,
            "matmul_macs_per_cycle": "derived: ~250 TFLOP/s fp16 and ~62 TFLOP/s fp32 over "
                                     "1472 tiles at 1.325 GHz (" + _IPU_SRC + ")",
            "link_bytes_per_cycle": "derived: ~8 TB/s exchange over 1472 tiles at 1.325 GHz, "
                                    "about 5.5 GB/s per tile (" + _IPU_SRC + ")",
            "sync_cycles": "about 118 cycles per BSP sync (T10/ELK papers)",
            "matmul_unit": _ASSUMED, "vector_ops_per_cycle": _ASSUMED,
            "compute_overhead_cycles": _ASSUMED, "hop_latency_cycles": _ASSUMED,
        },
    ),
    "test16": Chip(
        name="test16",
        description="A 16-core all-to-all test chip with 640 KiB per core, MK2-like rates",
        cores=16, topology="all-to-all", grid=(4, 4),
        sram_bytes_per_core=640 * 1024, clock_hz=1.0e9,
        matmul_macs_per_cycle={"fp16": 64, "fp32": 16}, matmul_unit=(16, 4),
        vector_ops_per_cycle={"fp16": 4, "fp32": 2}, compute_overhead_cycles=32,
        link_bytes_per_cycle=4, hop_latency_cycles=16, sync_cycles=118,
        sources={"*": "t10c test chip: rates copied from ipu-mk2; SRAM and cores chosen so that "
                      "bert-tiny's weight matmuls must rotate"},
    ),
}

_FIELD_TYPES: dict[str, type] = {f.name: f.type for f in dataclasses.fields(Chip)}  # type: ignore


def load_chip(spec: str) -> Chip:
    """A preset by name, or a chip from a TOML file path."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ChipError(f"chip file {spec!r} does not exist")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ChipError(f"chip file {spec}: not valid TOML: {exc}") from None
        return chip_from_dict(data, origin=spec)
    raise ChipError(f"unknown chip {spec!r}: use one of {', '.join(PRESETS)} "
                    "or a path to a .toml chip file (see `t10c chips`)")


def chip_from_dict(data: dict[str, Any], origin: str = "<dict>") -> Chip:
    """Build and validate a chip from TOML data; every problem is reported at once."""
    errors: list[str] = []
    data = dict(data)
    base_name = data.pop("base", None)
    values: dict[str, Any] = {}
    if base_name is not None:
        if base_name not in PRESETS:
            errors.append(f"base: unknown preset {base_name!r} (presets: {', '.join(PRESETS)})")
        else:
            values = dataclasses.asdict(PRESETS[base_name])
            values["sources"] = dict(values["sources"])
    for key in data:
        if key not in _FIELD_TYPES:
            errors.append(f"{key}: unknown field (valid fields: base, {', '.join(_FIELD_TYPES)})")
    sources = dict(values.get("sources", {}))
    sources.update({k: str(v) for k, v in data.get("sources", {}).items()})
    for key, val in data.items():
        if key in _FIELD_TYPES and key != "sources":
            values[key] = val
            sources.setdefault(key, f"user chip file {origin}")
    values["sources"] = sources
    values.setdefault("description", f"user chip from {origin}")
    values.setdefault("grid", (1, values.get("cores", 1)))
    missing = [k for k in _FIELD_TYPES if k not in values]
    for key in missing:
        errors.append(f"{key}: missing (set it, or start from a preset with base = \"ipu-mk2\")")
    if not missing:
        errors.extend(_check_values(values))
    if errors:
        raise ChipError(f"chip file {origin}:\n  " + "\n  ".join(errors))
    values["grid"] = tuple(int(x) for x in values["grid"])
    values["matmul_unit"] = tuple(int(x) for x in values["matmul_unit"])
    values["clock_hz"] = float(values["clock_hz"])
    return Chip(**values)


def _check_values(v: dict[str, Any]) -> list[str]:
    errors = []
    for key in ("cores", "sram_bytes_per_core", "compute_overhead_cycles", "link_bytes_per_cycle",
                "hop_latency_cycles", "sync_cycles"):
        val = v[key]
        low = 1 if key in ("cores", "sram_bytes_per_core", "link_bytes_per_cycle") else 0
        if not isinstance(val, int) or isinstance(val, bool) or val < low:
            errors.append(f"{key}: expected an integer >= {low}, got {val!r}")
    if not isinstance(v["clock_hz"], (int, float)) or v["clock_hz"] <= 0:
        errors.append(f"clock_hz: expected a positive number, got {v['clock_hz']!r}")
    if v["topology"] not in TOPOLOGIES:
        errors.append(f"topology: {v['topology']!r} is not one of {', '.join(TOPOLOGIES)}")
    for key in ("matmul_macs_per_cycle", "vector_ops_per_cycle"):
        table = v[key]
        if not isinstance(table, dict) or set(table) != set(DTYPES) or not all(
                isinstance(x, int) and x > 0 for x in table.values()):
            errors.append(f"{key}: expected a table with positive integers for "
                          f"{', '.join(DTYPES)}, got {table!r}")
    for key in ("grid", "matmul_unit"):
        val = v[key]
        if not (isinstance(val, (list, tuple)) and len(val) == 2
                and all(isinstance(x, int) and x > 0 for x in val)):
            errors.append(f"{key}: expected two positive integers, got {val!r}")
    if (v["topology"] != "all-to-all" and isinstance(v["grid"], (list, tuple))
            and isinstance(v["cores"], int) and math.prod(v["grid"]) != v["cores"]):
        errors.append(f"grid: {v['grid']} has {math.prod(v['grid'])} cores but "
                      f"cores = {v['cores']}")
    if v["topology"] != "all-to-all" and not errors:
        errors.append(f"topology: {v['topology']} chips are not supported by this version of t10c "
                      "yet; use all-to-all")
    return errors


def describe(chip: Chip) -> list[tuple[str, str]]:
    """Rows of (figure, value) for `t10c chips`."""
    return [
        ("cores", f"{chip.cores} ({chip.topology})"),
        ("SRAM per core", f"{chip.sram_bytes_per_core / 1024:.0f} KiB "
                          f"({chip.total_sram_bytes / 1e6:.0f} MB total)"),
        ("clock", f"{chip.clock_hz / 1e9:.3f} GHz"),
        ("peak fp16 / fp32", f"{chip.peak_flops('fp16') / 1e12:.1f} / "
                             f"{chip.peak_flops('fp32') / 1e12:.1f} TFLOP/s"),
        ("exchange", f"{chip.link_bytes_per_cycle} B/cycle per core "
                     f"({chip.link_bytes_per_cycle * chip.clock_hz * chip.cores / 1e12:.1f} TB/s), "
                     f"sync {chip.sync_cycles} cycles"),
    ]
