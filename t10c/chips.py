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
import difflib
import math
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t10c.dtypes import STORAGE_DTYPES, ceil_div, dtype_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOPOLOGIES = ("all-to-all", "mesh2d", "torus2d")
DTYPES = {name: dtype_bytes(name) for name in STORAGE_DTYPES}  # storage sizes


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
    #: all-to-all: bytes one core can receive per cycle over the exchange; mesh and torus: bytes
    #: per cycle over one link in one direction (a core has four links each way)
    link_bytes_per_cycle: int
    hop_latency_cycles: int
    #: cost of one bulk-synchronous barrier across the chip (on a mesh: of the neighbour
    #: handshake that starts a step)
    sync_cycles: int
    #: whether a core's compute and its transfers overlap: a shift that follows a compute step
    #: then costs only what it takes beyond that step (double-buffered rotation); False is the
    #: IPU's strict bulk-synchronous alternation
    overlap: bool = False
    #: routes (Cerebras "colours") a core's router can hold at once; 0 for no limit
    routes_per_core: int = 0
    #: off-chip memory (DRAM) capacity in bytes; 0 for none (every tensor lives in SRAM)
    dram_bytes: int = 0
    #: DRAM bandwidth in bytes per cycle: "edge", of the whole chip (its channels together);
    #: "stacked", of each core's own bank
    dram_bytes_per_cycle: int = 0
    #: cycles from a DMA request to its first bytes (the DRAM access, before any network hop)
    dram_latency_cycles: int = 0
    #: how the DRAM attaches: "edge" (GDDR/HBM channels at the chip's edge, reached over the
    #: on-chip network) or "stacked" (a 3D-stacked bank under every core)
    dram_attach: str = ""
    #: a pod: ``chips`` chips of ``cores // chips`` cores each (chip k holds cores
    #: [k * cores_per_chip, (k + 1) * cores_per_chip)), planned as one machine; 1 for one chip
    chips: int = 1
    #: inter-chip links of each chip (IPU-Links), and each link's bytes per cycle in one
    #: direction: bytes an exchange moves between chips go at ``chip_links *
    #: chip_link_bytes_per_cycle`` per chip and direction (`pod_cycles`)
    chip_links: int = 0
    chip_link_bytes_per_cycle: int = 0
    #: cycles from a core to the first bytes on another chip (link, serdes, routing)
    chip_link_latency_cycles: int = 0
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def is_mesh(self) -> bool:
        """A 2D mesh or torus: transfers are routed hop by hop over links between neighbours."""
        return self.topology != "all-to-all"

    @property
    def rows(self) -> int:
        return self.grid[0]

    @property
    def cols(self) -> int:
        return self.grid[1]

    def hops(self, src: Any, dst: Any) -> Any:
        """Hops between cores (arrays of row-major core numbers) under dimension-order
        routing: 1 for every distinct pair on an all-to-all chip."""
        import numpy as np

        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        if not self.is_mesh:
            return (src != dst).astype(np.int64)
        (sr, sc), (dr, dc) = np.divmod(src, self.cols), np.divmod(dst, self.cols)
        dy, dx = np.abs(sr - dr), np.abs(sc - dc)
        if self.topology == "torus2d":
            dy, dx = np.minimum(dy, self.rows - dy), np.minimum(dx, self.cols - dx)
        return dy + dx

    @property
    def is_pod(self) -> bool:
        """Several chips joined by inter-chip links, planned as one machine."""
        return self.chips > 1

    @property
    def cores_per_chip(self) -> int:
        return self.cores // self.chips

    @property
    def pod_bytes_per_cycle(self) -> int:
        """Bytes per cycle one chip sends (and, separately, receives) over all its links."""
        return self.chip_links * self.chip_link_bytes_per_cycle

    def chip_of(self, cores: Any) -> Any:
        """The chip each core (an array of core numbers) belongs to."""
        return cores // self.cores_per_chip

    def pod_cycles(self, cross_bytes: int) -> int:
        """Cycles for the busiest chip of a pod to send or receive ``cross_bytes`` over its
        inter-chip links (bytes in and bytes out travel apart: the larger counts)."""
        if cross_bytes <= 0 or not self.is_pod:
            return 0
        return self.chip_link_latency_cycles + ceil_div(cross_bytes, self.pod_bytes_per_cycle)

    def exchange_cycles(self, bytes_per_core: int, cross_bytes: int = 0, hops: int = 1) -> int:
        """One exchange phase on an all-to-all chip or pod: the larger of the per-core bound
        (`transfer_cycles`) and, on a pod, the busiest chip's bytes over its inter-chip links
        (`pod_cycles`). The planner and the emulator both price an exchange so."""
        return max(self.transfer_cycles(bytes_per_core, hops), self.pod_cycles(cross_bytes))

    @property
    def has_dram(self) -> bool:
        """Whether tensors that do not fit SRAM can live off chip."""
        return self.dram_bytes > 0

    @property
    def dram_edge_hops(self) -> int:
        """Hops from an edge DRAM channel to the farthest core (mesh and torus: the largest
        distance of a core to the grid's border, plus the hop onto the grid; all-to-all: one
        exchange hop); 0 for stacked DRAM, which sits under every core."""
        if self.dram_attach != "edge":
            return 0
        if not self.is_mesh:
            return 1
        return 1 + min((self.rows - 1) // 2, (self.cols - 1) // 2)

    @property
    def dram_peak_bytes_per_cycle(self) -> int:
        """The chip's whole DRAM bandwidth, bytes per cycle (stacked: every bank at once)."""
        if self.dram_attach == "stacked":
            return self.dram_bytes_per_cycle * self.cores
        return self.dram_bytes_per_cycle

    def dram_cycles(self, total_bytes: int, max_core_bytes: int,
                    chip_bytes: int | None = None) -> int:
        """Cycles of one DMA load of ``total_bytes`` in all, at most ``max_core_bytes`` into
        one core. Edge: the latency, the hops to the farthest core, and the larger of the
        channels' time for everything and the core's one link for its share. Stacked: the
        latency and each bank's time for its own core's share (banks work in parallel).

        On a pod each chip's cores load from that chip's own DRAM, ``1 / chips`` of the
        pod's bandwidth: the channels' time is that of the busiest chip's ``chip_bytes``
        (all of ``total_bytes`` when not given)."""
        if total_bytes <= 0:
            return 0
        if self.dram_attach == "stacked":
            return self.dram_latency_cycles + ceil_div(max_core_bytes,
                                                       self.dram_bytes_per_cycle)
        channels = ceil_div(total_bytes, self.dram_bytes_per_cycle)
        if self.is_pod:
            channels = ceil_div(total_bytes if chip_bytes is None else chip_bytes,
                                self.dram_bytes_per_cycle // self.chips)
        return (self.dram_latency_cycles + self.hop_latency_cycles * self.dram_edge_hops
                + max(channels, ceil_div(max_core_bytes, self.link_bytes_per_cycle)))

    def dma_load_cycles(self, elem_bytes: int, counts: Any, cores: Any) -> int:
        """Cycles of one DMA load that brings ``counts[c]`` elements of ``elem_bytes`` each
        into the c-th of ``cores`` (physical core numbers, or a count n for cores 0 .. n-1):
        `dram_cycles` of the tensor's bytes that the tiles hold, not of the tiles' padding
        past its edge, which the engine does not carry (the planner and the emulator both
        time a load so)."""
        import numpy as np

        counts = np.asarray(counts, dtype=np.int64)
        if not counts.size:
            return 0
        chip_bytes = self.busiest_chip_cores(cores, counts) * elem_bytes if self.is_pod else None
        return self.dram_cycles(int(counts.sum()) * elem_bytes, int(counts.max()) * elem_bytes,
                                chip_bytes)

    def dram_store_cycles(self, total_bytes: int, core_bytes: int, cores: Any) -> int:
        """Cycles of one DMA store of a tensor's ``total_bytes`` from ``cores`` (an array of
        core numbers, or a count), each holding at most ``core_bytes`` of it (the planner
        and the emulator both time a write-back so). A replicated result is written once,
        its bytes taken evenly from its cores: on a pod each chip writes its cores' share
        into its own DRAM."""
        ncores = cores if isinstance(cores, int) else len(cores)
        if total_bytes <= 0 or ncores <= 0:
            return 0
        chip_bytes = ceil_div(total_bytes * self.busiest_chip_cores(cores), ncores)
        return self.dram_cycles(total_bytes, min(core_bytes, total_bytes), chip_bytes)

    def busiest_chip_cores(self, cores: Any, weights: Any = None) -> int:
        """How many of ``cores`` (an array of core numbers, or a count n for cores 0 .. n-1)
        the pod's busiest chip holds: its share of a load into those cores; with
        ``weights`` (one per core), the largest sum of them over one chip's cores."""
        import numpy as np

        if isinstance(cores, (int, np.integer)):
            if weights is None:
                return min(int(cores), self.cores_per_chip)
            cores = np.arange(int(cores))
        cores = np.asarray(cores, dtype=np.int64)
        if not cores.size:
            return 0
        return int(np.bincount(self.chip_of(cores), weights=weights, minlength=self.chips).max())

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
        macs = batch * m * (ceil_div(k, uk) * uk) * (ceil_div(n, un) * un)
        return self.compute_overhead_cycles + ceil_div(macs, self.matmul_macs_per_cycle[dtype])

    def vector_cycles(self, ops: int, dtype: str) -> int:
        """Cycles for ``ops`` elementwise operations on one core's vector unit."""
        return self.compute_overhead_cycles + ceil_div(ops, self.vector_ops_per_cycle[dtype])

    def transfer_cycles(self, bytes_per_core: int, hops: int = 1) -> int:
        """Cycles for each core to receive ``bytes_per_core`` (the exchange phase, no barrier)."""
        if bytes_per_core <= 0:
            return 0
        return self.hop_latency_cycles * hops + ceil_div(bytes_per_core, self.link_bytes_per_cycle)


_IPU_SRC = "Graphcore IPU-M2000 / GC200 datasheet (docs.graphcore.ai); T10 (SOSP 2024)"
_ASSUMED = "t10c modelling assumption (approximate)"
_WSE_SRC = "Cerebras SDK documentation (sdk.cerebras.net); WaferLLM (OSDI 2025)"
_WSE3_SRC = "Cerebras WSE-3 announcement (cerebras.ai, 2024); WaferLLM repository"
_TT_SRC = "docs.tenstorrent.com; tt-isa-documentation (github.com/tenstorrent)"
_TT_N150_SRC = ("Tenstorrent Wormhole n150 product page (tenstorrent.com); docs.tenstorrent.com "
                "tt-vscode-toolkit version-compat: \"N150 (Single Chip) - DRAM: 12GB\"")
_TT_P150_SRC = ("Tenstorrent Blackhole p150 product page (tenstorrent.com); docs.tenstorrent.com "
                "tt-system-firmware, Blackhole overview: \"8 GDDR6 channels\", \"32 GB of "
                "on-board GDDR6 memory\"")
_VOXEL_SRC = ("Voxel, 'Exploring the Efficiency of 3D-Stacked AI Chip Architecture for LLM "
              "Inference' (arXiv 2604.26821, 2026), default configuration")

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
    "wse2": Chip(
        name="wse2",
        description="Cerebras WSE-2: 757 x 996 PE fabric (2D mesh), 48 KiB SRAM per PE",
        cores=757 * 996, topology="mesh2d", grid=(757, 996),
        sram_bytes_per_core=48 * 1024, clock_hz=1.1e9,
        matmul_macs_per_cycle={"fp16": 4, "fp32": 1}, matmul_unit=(1, 4),
        vector_ops_per_cycle={"fp16": 4, "fp32": 1}, compute_overhead_cycles=8,
        link_bytes_per_cycle=4, hop_latency_cycles=1, sync_cycles=8, overlap=True,
        routes_per_core=24,
        sources={
            "routes_per_core": "24 routing colours (" + _WSE_SRC + ")",
            "cores": _WSE_SRC + " (850,000 PEs; 757 x 996 of them are the fabric an SDK "
                                "program gets)",
            "grid": _WSE_SRC, "sram_bytes_per_core": _WSE_SRC,
            "clock_hz": _WSE_SRC + " (about 1.1 GHz)",
            "matmul_macs_per_cycle": "derived: about 7.5 PFLOP/s fp16 over 850,000 PEs at "
                                     "1.1 GHz is 4 fp16 MACs per PE per cycle (" + _WSE_SRC
                                     + "); fp32 at a quarter is " + _ASSUMED,
            "link_bytes_per_cycle": "one 32-bit wavelet per cycle per link and direction ("
                                    + _WSE_SRC + ")",
            "hop_latency_cycles": "about 1 cycle per hop (" + _WSE_SRC + ")",
            "sync_cycles": "no global barrier: a step starts on a neighbour handshake; "
                           + _ASSUMED,
            "overlap": "the router moves wavelets while the PE computes (dataflow); "
                       + _WSE_SRC,
            "matmul_unit": "4-wide fp16 SIMD; " + _ASSUMED,
            "vector_ops_per_cycle": _ASSUMED, "compute_overhead_cycles": _ASSUMED,
        },
    ),
    "wormhole-n150": Chip(
        name="wormhole-n150",
        description="Tenstorrent Wormhole n150: 72 Tensix cores on a 2D torus NoC, 1.5 MB each",
        cores=72, topology="torus2d", grid=(8, 9),
        sram_bytes_per_core=1464 * 1024, clock_hz=1.0e9,
        matmul_macs_per_cycle={"fp16": 512, "fp32": 128}, matmul_unit=(32, 32),
        vector_ops_per_cycle={"fp16": 64, "fp32": 32}, compute_overhead_cycles=64,
        link_bytes_per_cycle=32, hop_latency_cycles=9, sync_cycles=200, overlap=True,
        sources={
            "cores": _TT_SRC + " (72 Tensix cores; t10c arranges them 8 x 9)",
            "grid": "8 x 9 is t10c's arrangement of the 72 usable cores of the 8 x 10 Tensix "
                    "grid; " + _ASSUMED,
            "sram_bytes_per_core": _TT_SRC + " (1.5 MB, 1464 KiB, of L1 SRAM per Tensix core)",
            "clock_hz": _TT_SRC + " (1 GHz)",
            "matmul_macs_per_cycle": "derived: about 74 TFLOP/s fp16 over 72 cores at 1 GHz is "
                                     "about 512 MACs per core per cycle (" + _TT_SRC
                                     + "); fp32 at a quarter is " + _ASSUMED,
            "matmul_unit": "the FPU works on 32 x 32 tiles (" + _TT_SRC + ")",
            "link_bytes_per_cycle": "32 B per cycle per NoC link (" + _TT_SRC + ")",
            "hop_latency_cycles": "about 9 cycles per hop (" + _TT_SRC + ")",
            "overlap": "the data-movement RISC-V cores move tiles while the compute cores run "
                       "(" + _TT_SRC + ")",
            "vector_ops_per_cycle": _ASSUMED, "compute_overhead_cycles": _ASSUMED,
            "sync_cycles": _ASSUMED,
            "topology": "two 2D-torus NoCs (" + _TT_SRC + "); t10c models one",
            "dram_bytes": "12 GB of GDDR6 on the n150 board (" + _TT_N150_SRC + ")",
            "dram_bytes_per_cycle": "288 GB/s of GDDR6 bandwidth (" + _TT_N150_SRC
                                    + ") at the 1 GHz clock",
            "dram_attach": "GDDR6 channels on the NoC's edge, reached over the NoC ("
                           + _TT_SRC + ")",
            "dram_latency_cycles": "about 400 cycles of GDDR6 access; " + _ASSUMED,
        },
        dram_bytes=12 * 1024 ** 3, dram_bytes_per_cycle=288, dram_latency_cycles=400,
        dram_attach="edge",
    ),
}

# WSE-3 keeps WSE-2's PE, router and links; the fabric is larger and the PE about twice as fast
PRESETS["wse3"] = dataclasses.replace(
    PRESETS["wse2"], name="wse3",
    description="Cerebras WSE-3: 762 x 1172 PE fabric (2D mesh), 48 KiB SRAM per PE",
    cores=762 * 1172, grid=(762, 1172),
    matmul_macs_per_cycle={"fp16": 8, "fp32": 2}, matmul_unit=(1, 8),
    vector_ops_per_cycle={"fp16": 8, "fp32": 2},
    sources={
        **{k: f"as WSE-2: {v}" for k, v in PRESETS["wse2"].sources.items()},
        "cores": _WSE3_SRC + " (900,000 PEs; fabric 762 x 1172)", "grid": _WSE3_SRC,
        "sram_bytes_per_core": _WSE3_SRC + " (48 KiB per PE, 44 GB total)",
        "matmul_macs_per_cycle": "about twice WSE-2's throughput per PE (WSE-3 is quoted at "
                                 "125 PFLOP/s sparse fp16); " + _ASSUMED,
        "matmul_unit": _ASSUMED, "vector_ops_per_cycle": _ASSUMED,
    })

# Blackhole keeps Wormhole's Tensix core (t10c's assumption for its rates); more cores, a
# faster clock and 64-byte NoC flits
PRESETS["blackhole-p150"] = dataclasses.replace(
    PRESETS["wormhole-n150"], name="blackhole-p150",
    description="Tenstorrent Blackhole p150: 140 Tensix cores on a 2D torus NoC, 1.5 MB each",
    cores=140, grid=(10, 14), clock_hz=1.35e9, link_bytes_per_cycle=64,
    sources={
        **PRESETS["wormhole-n150"].sources,
        "cores": _TT_SRC + " (140 Tensix tiles in 14 columns by 10 rows of the NoC grid)",
        "grid": _TT_SRC + " (Tensix columns 1-7 and 9-15, rows 1-10)",
        "clock_hz": _TT_SRC + " (1.35 GHz)",
        "link_bytes_per_cycle": "64 B flits per cycle per NoC link (" + _TT_SRC + ")",
        "matmul_macs_per_cycle": "per-core rate as Wormhole's; " + _ASSUMED,
        "hop_latency_cycles": "as Wormhole; " + _ASSUMED,
        "topology": "2D torus (" + _TT_SRC + ")",
        "dram_bytes": "32 GB of GDDR6 (" + _TT_P150_SRC + ")",
        "dram_bytes_per_cycle": "512 GB/s of GDDR6 bandwidth (" + _TT_P150_SRC + ") at the "
                                "1.35 GHz clock is 379.3 B/cycle, rounded down",
        "dram_attach": "8 GDDR6 channels on the NoC's edge (" + _TT_P150_SRC + ")",
    },
    dram_bytes=32 * 1024 ** 3, dram_bytes_per_cycle=379)

# A 3D-stacked chip after Voxel's defaults: a DRAM bank under every core
PRESETS["voxel-3d"] = Chip(
    name="voxel-3d",
    description="A 3D-stacked chip after Voxel's defaults: 256 cores on a 2D mesh, 2 MB SRAM "
                "each, a DRAM bank under every core",
    cores=256, topology="mesh2d", grid=(16, 16),
    sram_bytes_per_core=2 * 1024 * 1024, clock_hz=1.0e9,
    matmul_macs_per_cycle={"fp16": 512, "fp32": 128}, matmul_unit=(32, 32),
    vector_ops_per_cycle={"fp16": 64, "fp32": 32}, compute_overhead_cycles=64,
    link_bytes_per_cycle=16, hop_latency_cycles=4, sync_cycles=200, overlap=True,
    dram_bytes=256 * 64 * 1024 ** 2, dram_bytes_per_cycle=32, dram_latency_cycles=100,
    dram_attach="stacked",
    sources={
        "cores": _VOXEL_SRC + " (256 cores; t10c arranges them 16 x 16)",
        "grid": "16 x 16; " + _ASSUMED, "topology": "2D mesh NoC (" + _VOXEL_SRC + ")",
        "sram_bytes_per_core": "2 MB of SRAM per core (" + _VOXEL_SRC + ")",
        "link_bytes_per_cycle": "16 B/cycle per mesh link (" + _VOXEL_SRC + ")",
        "dram_bytes_per_cycle": "32 B/cycle of stacked DRAM per core (" + _VOXEL_SRC + ")",
        "dram_attach": "a DRAM bank stacked on every core through TSVs (" + _VOXEL_SRC + ")",
        "dram_bytes": "64 MiB per bank; " + _ASSUMED,
        "dram_latency_cycles": _ASSUMED, "clock_hz": "1 GHz; " + _ASSUMED,
        "matmul_macs_per_cycle": "a Tensix-like core (as wormhole-n150); " + _ASSUMED,
        "matmul_unit": _ASSUMED, "vector_ops_per_cycle": _ASSUMED,
        "compute_overhead_cycles": _ASSUMED, "hop_latency_cycles": _ASSUMED,
        "sync_cycles": _ASSUMED, "overlap": "DMA engines and NoC beside the compute; "
                                            + _ASSUMED,
    })

# A small chip with edge DRAM, for functional runs and tests of the DRAM path
PRESETS["test64-dram"] = dataclasses.replace(
    PRESETS["test16"], name="test64-dram",
    description="A 64-core all-to-all test chip with 256 KiB per core and 64 MiB of edge DRAM",
    cores=64, grid=(8, 8), sram_bytes_per_core=256 * 1024, dram_bytes=64 * 1024 ** 2,
    dram_bytes_per_cycle=64, dram_latency_cycles=100, dram_attach="edge",
    sources={"*": "t10c test chip: test16's rates; 16 MiB of SRAM in all, so that "
                  "llama-tiny's 16.4 MiB of fp16 weights cannot all be resident; the DRAM "
                  "figures are chosen for tests"})
# Pods: MK2s joined by IPU-Links, planned as one all-to-all machine of 4 x 1472 tiles whose
# inter-chip bytes go at the links' rate (`Chip.exchange_cycles`)
_ELK_SRC = ("ELK, 'Exploring the Efficiency of Inter-core Connected AI Chips with Deep Learning "
            "Compiler Techniques' (MICRO 2025, arXiv 2507.11506) and its artifact "
            "(github.com/platformxlab/elk, benchmark_scripts/generate_data_from_sim.py: "
            "num_cores 5888, core_mem_kb 624, hbm_bw 16000 GB/s, bw_per_core 4000/1472)")
_LINK_SRC = ("Colossus MK2 GC200: 10 IPU-Links, 320 GB/s chip to chip (Graphcore GC200 "
             "datasheet, as quoted by thecharlieblake.co.uk/ipus)")
_M2000_SRC = ("Graphcore IPU-M2000 datasheet (docs.graphcore.ai): four GC200 IPUs, up to 448 GB "
              "of Streaming Memory behind the IPU-Gateway; the gateway's 2.8 Tbps "
              "(convergedigest.com, 2020-07-19, Graphcore's M2000 launch)")
_POD_LINKS = {
    "chips": "four MK2 IPUs (" + _M2000_SRC + ")",
    "chip_links": "10 IPU-Links per IPU (" + _LINK_SRC + ")",
    "chip_link_bytes_per_cycle": "320 GB/s over 10 links is 32 GB/s per link, 24.2 B/cycle at "
                                 "1.325 GHz, rounded down (" + _LINK_SRC + ")",
    "chip_link_latency_cycles": "about 150 ns across an IPU-Link; " + _ASSUMED,
}
#: four MK2s over their IPU-Links (sources in `_POD_LINKS`): elk-pod4 and ipu-pod4 alike
_POD4_GEOMETRY: dict[str, Any] = dict(
    cores=4 * 1472, grid=(1, 4 * 1472), chips=4, chip_links=10, chip_link_bytes_per_cycle=24,
    chip_link_latency_cycles=200)
PRESETS["elk-pod4"] = dataclasses.replace(
    PRESETS["ipu-mk2"], name="elk-pod4",
    description="ELK's evaluated system: 4 x 1472 IPU cores (624 KiB each) over IPU-Links, "
                "16 TB/s of HBM in all (4 TB/s per chip)",
    **_POD4_GEOMETRY,
    dram_bytes=4 * 80 * 1024 ** 3, dram_bytes_per_cycle=12072, dram_latency_cycles=200,
    dram_attach="edge",
    sources={
        **PRESETS["ipu-mk2"].sources, **_POD_LINKS,
        "cores": "4 x 1472 = 5888 cores (" + _ELK_SRC + ")",
        "sram_bytes_per_core": "624 KB per core (" + _ELK_SRC + ")",
        "chips": "an IPU-POD4's four MK2s (" + _ELK_SRC + ": 'an emulator based on a real ICCA "
                 "chip IPU-POD4'); ELK's artifact plans the 5888 cores as one exchange without "
                 "slower inter-chip links, t10c prices the IPU-Links",
        "dram_bytes_per_cycle": "16 TB/s of HBM in all, 4 TB/s per 1472-core chip ("
                                + _ELK_SRC + "), 12,075 B/cycle at 1.325 GHz, rounded down "
                                "to a multiple of the 4 chips",
        "dram_attach": "HBM beside each chip, reached by that chip's own cores over its "
                       "exchange (" + _ELK_SRC + "; how it attaches is t10c's assumption)",
        "dram_bytes": "80 GiB of HBM per chip: ELK gives the bandwidth, not the capacity; "
                      + _ASSUMED,
        "dram_latency_cycles": "about 150 ns of HBM access; " + _ASSUMED,
    })
PRESETS["ipu-pod4"] = dataclasses.replace(
    PRESETS["ipu-mk2"], name="ipu-pod4",
    description="Graphcore IPU-POD4: four MK2s (4 x 1472 tiles) over IPU-Links, with the "
                "M2000's Streaming Memory",
    **_POD4_GEOMETRY,
    dram_bytes=448 * 1000 ** 3, dram_bytes_per_cycle=264, dram_latency_cycles=1000,
    dram_attach="edge",
    sources={
        **PRESETS["ipu-mk2"].sources, **_POD_LINKS,
        "cores": "4 x 1472 tiles (" + _M2000_SRC + ")",
        "dram_bytes": "up to 448 GB of Streaming Memory (" + _M2000_SRC + ")",
        "dram_bytes_per_cycle": "the IPU-Gateway's 2.8 Tbps, 350 GB/s, is 264 B/cycle at "
                                "1.325 GHz (" + _M2000_SRC + "); the DIMMs' own rate is not "
                                "published, so this is an upper bound",
        "dram_attach": "DDR4 DIMMs behind the IPU-Gateway, reached over the gateway links ("
                       + _M2000_SRC + "); t10c splits it evenly over the four IPUs",
        "dram_latency_cycles": "about 750 ns through the gateway; " + _ASSUMED,
    })
PRESETS["test-pod2"] = dataclasses.replace(
    PRESETS["test16"], name="test-pod2",
    description="A 2-chip test pod: two 8-core all-to-all chips, 640 KiB per core, one 2 "
                "B/cycle link between them",
    cores=16, grid=(1, 16), chips=2, chip_links=1, chip_link_bytes_per_cycle=2,
    chip_link_latency_cycles=50,
    sources={"*": "t10c test pod: test16's rates; a link slower than a core's exchange so "
                  "that crossing chips shows in every figure"})
PRESETS = {name: PRESETS[name] for name in ("ipu-mk2", "test16", "wse2", "wse3",
                                            "wormhole-n150", "blackhole-p150", "voxel-3d",
                                            "test64-dram", "elk-pod4", "ipu-pod4",
                                            "test-pod2")}

_FIELD_TYPES: dict[str, type] = {f.name: f.type for f in dataclasses.fields(Chip)}  # type: ignore
_OPTIONAL = {f.name for f in dataclasses.fields(Chip) if f.default is not dataclasses.MISSING
             or f.default_factory is not dataclasses.MISSING}


#: a chip file is a few dozen lines; anything much larger is not one (and is not read)
MAX_CHIP_FILE_BYTES = 1 << 20

#: integer fields and their least legal value (0 where zero means "none" or "free")
_INT_FIELDS = {"cores": 1, "sram_bytes_per_core": 1, "link_bytes_per_cycle": 1,
               "compute_overhead_cycles": 0, "hop_latency_cycles": 0, "sync_cycles": 0,
               "routes_per_core": 0, "dram_bytes_per_cycle": 0, "dram_latency_cycles": 0,
               "chips": 1, "chip_links": 0, "chip_link_bytes_per_cycle": 0,
               "chip_link_latency_cycles": 0}
#: the largest integer any field takes: far beyond every real chip, and small enough that
#: products such as cores x SRAM stay inside the int64 arithmetic of the planner and emulator
_INT_MAX = 2**31 - 1
#: the largest DRAM capacity a chip file may give (1 PiB: beyond any board)
_DRAM_MAX = 2**50
ATTACHMENTS = ("edge", "stacked")


def load_chip(spec: str) -> Chip:
    """A preset by name, or a chip from a TOML file path.

    Raises `ChipError` (the CLI exits 2) for an unknown name, a path that is not a readable
    regular file, a file that is not UTF-8 TOML, or fields `chip_from_dict` refuses.
    """
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        raise ChipError(f"chip file {spec!r} is a directory; give a .toml chip file")
    if path.exists():
        return chip_from_dict(_read_toml(path), origin=spec)
    if path.suffix == ".toml" or len(path.parts) > 1:
        raise ChipError(f"chip file {spec!r} does not exist")
    close = difflib.get_close_matches(spec.lower(), list(PRESETS), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ChipError(f"unknown chip {spec!r}: {hint}use one of {', '.join(PRESETS)} "
                    "or a path to a .toml chip file (see `t10c chips`)")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ChipError(f"chip file {str(path)!r} is not a regular file; give a .toml file")
        if st.st_size > MAX_CHIP_FILE_BYTES:
            raise ChipError(f"chip file {path} is {st.st_size:,} bytes, too large for a chip "
                            "file (a few lines of TOML)")
        data = path.read_bytes()
    except OSError as exc:
        raise ChipError(f"chip file {path}: cannot read it ({exc.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChipError(f"chip file {path}: not UTF-8 text (byte {exc.start}); save it as "
                        "UTF-8 TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ChipError(f"chip file {path}: not valid TOML: {exc}") from None


def chip_from_dict(data: dict[str, Any], origin: str = "<dict>") -> Chip:
    """Build and validate a chip from TOML data; every wrong field is reported at once, in
    one `ChipError` line."""
    errors: list[str] = []
    data = dict(data)
    base_name = data.pop("base", None)
    values: dict[str, Any] = {}
    if base_name is not None:
        if not isinstance(base_name, str) or base_name not in PRESETS:
            errors.append(f"base: unknown preset {base_name!r} (presets: {', '.join(PRESETS)})")
        else:
            values = dataclasses.asdict(PRESETS[base_name])
            values["sources"] = dict(values["sources"])
    for key in data:
        if key not in _FIELD_TYPES:
            errors.append(f"{key}: unknown field (valid fields: base, {', '.join(_FIELD_TYPES)})")
    sources = dict(values.get("sources", {}))
    user_sources = data.get("sources", {})
    if not isinstance(user_sources, dict) or not all(
            isinstance(v, str) for v in user_sources.values()):
        errors.append(f"sources: expected a table of strings ([sources] with field = \"where "
                      f"the figure comes from\"), got {user_sources!r}")
    else:
        sources.update(user_sources)
    for key, val in data.items():
        if key in _FIELD_TYPES and key != "sources":
            values[key] = val
            sources.setdefault(key, f"user chip file {origin}")
    values["sources"] = sources
    values.setdefault("description", f"user chip from {origin}")
    if "grid" not in values and "cores" in values:
        # an all-to-all chip's grid is one row; a wrong cores is reported on its own
        values["grid"] = (1, values["cores"] if _is_int(values["cores"]) else 1)
    missing = [k for k in _FIELD_TYPES if k not in values and k not in _OPTIONAL]
    if missing:
        errors.append(f"missing {', '.join(missing)} (set them, or start from a preset with "
                      f"base = \"ipu-mk2\")")
    errors.extend(_check_values(values))
    if errors:
        raise ChipError(f"chip file {origin}: " + "; ".join(errors))
    values["grid"] = tuple(values["grid"])
    values["matmul_unit"] = tuple(values["matmul_unit"])
    values["clock_hz"] = float(values["clock_hz"])
    return Chip(**values)


def _is_int(val: Any) -> bool:
    # TOML's true and false are Python bools, which are ints: never a count
    return isinstance(val, int) and not isinstance(val, bool) and val <= _INT_MAX


def _check_values(v: dict[str, Any]) -> list[str]:
    """One message per wrong field among those present (missing ones are reported apart)."""
    errors = []
    for key in ("name", "description"):
        if key in v and (not isinstance(v[key], str) or not v[key].strip()):
            errors.append(f"{key}: expected a non-empty string, got {v[key]!r}")
    for key, low in _INT_FIELDS.items():
        if key in v and (not _is_int(v[key]) or v[key] < low):
            errors.append(f"{key}: expected an integer from {low} to {_INT_MAX}, got "
                          f"{v[key]!r}")
    if "clock_hz" in v:
        hz = v["clock_hz"]
        if not isinstance(hz, (int, float)) or isinstance(hz, bool) or not math.isfinite(hz) \
                or not 0 < hz <= 1e15:
            errors.append(f"clock_hz: expected a finite positive number (at most 1e15), got "
                          f"{hz!r}")
    if "topology" in v and (not isinstance(v["topology"], str)
                            or v["topology"] not in TOPOLOGIES):
        errors.append(f"topology: {v['topology']!r} is not one of {', '.join(TOPOLOGIES)}")
    for key in ("matmul_macs_per_cycle", "vector_ops_per_cycle"):
        table = v.get(key)
        if key in v and not (isinstance(table, dict) and set(table) == set(DTYPES) and all(
                _is_int(x) and x > 0 for x in table.values())):
            errors.append(f"{key}: expected a table with positive integers for "
                          f"{', '.join(DTYPES)}, got {table!r}")
    for key in ("grid", "matmul_unit"):
        val = v.get(key)
        if key in v and not (isinstance(val, (list, tuple)) and len(val) == 2
                             and all(_is_int(x) and x > 0 for x in val)):
            errors.append(f"{key}: expected two positive integers, got {val!r}")
    grid, cores = v.get("grid"), v.get("cores")
    if (v.get("topology") in ("mesh2d", "torus2d") and isinstance(grid, (list, tuple))
            and len(grid) == 2 and all(_is_int(x) for x in grid) and _is_int(cores)
            and math.prod(grid) != cores):
        errors.append(f"grid: {list(grid)} has {math.prod(grid)} cores but cores = {cores}")
    errors.extend(_check_dram(v))
    errors.extend(_check_pod(v))
    if not isinstance(v.get("overlap", False), bool):
        errors.append(f"overlap: expected true or false, got {v['overlap']!r}")
    return errors


def _check_dram(v: dict[str, Any]) -> list[str]:
    """The off-chip memory fields: all unset (no DRAM), or a capacity with a bandwidth and
    an attachment."""
    errors = []
    size = v.get("dram_bytes", 0)
    if not (isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= _DRAM_MAX):
        return [f"dram_bytes: expected an integer from 0 (no DRAM) to {_DRAM_MAX}, got {size!r}"]
    attach = v.get("dram_attach", "")
    rate = v.get("dram_bytes_per_cycle", 0)
    if size == 0:
        given = [k for k in ("dram_bytes_per_cycle", "dram_latency_cycles", "dram_attach")
                 if v.get(k) not in (None, 0, "")]
        if given:
            errors.append(f"{', '.join(given)}: set for a chip without DRAM; give dram_bytes "
                          "(the capacity) too, or remove them")
        return errors
    if attach not in ATTACHMENTS:
        errors.append(f"dram_attach: {attach!r} is not one of {', '.join(ATTACHMENTS)} "
                      "(required with dram_bytes)")
    if _is_int(rate) and rate < 1:
        errors.append("dram_bytes_per_cycle: a chip with DRAM needs a bandwidth of at least 1 "
                      "byte per cycle")
    return errors


POD_LINK_FIELDS = ("chip_links", "chip_link_bytes_per_cycle", "chip_link_latency_cycles")


def _check_pod(v: dict[str, Any]) -> list[str]:
    """The pod fields: one chip and no links, or chips that divide the cores on an
    all-to-all exchange, with links of at least one byte per cycle."""
    chips = v.get("chips", 1)
    if not _is_int(chips) or chips < 1:
        return []  # reported with the integer fields
    if chips == 1:
        given = [k for k in POD_LINK_FIELDS if v.get(k) not in (None, 0)]
        return [f"{', '.join(given)}: set for a single chip; give chips (how many chips the "
                "pod joins) too, or remove them"] if given else []
    errors = []
    cores = v.get("cores")
    if _is_int(cores) and cores % chips:
        errors.append(f"chips: {chips} chips do not divide cores = {cores} (cores is the "
                      "whole pod's: chips x the cores of one chip)")
    if v.get("topology", "all-to-all") != "all-to-all":
        errors.append(f"chips: a pod of {v['topology']} chips is not modelled; pods join "
                      "all-to-all chips")
    for key in ("chip_links", "chip_link_bytes_per_cycle"):
        if _is_int(v.get(key, 0)) and v.get(key, 0) < 1:
            errors.append(f"{key}: a pod of {chips} chips needs at least 1 (the inter-chip "
                          "links of each chip and their bytes per cycle)")
    rate = v.get("dram_bytes_per_cycle", 0)
    if (v.get("dram_attach") == "edge" and _is_int(rate) and rate >= 1
            and rate % chips):
        errors.append(f"dram_bytes_per_cycle: {rate} is the pod's whole DRAM bandwidth, "
                      f"shared evenly by its {chips} chips: give a multiple of {chips}")
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
                     f"sync {chip.sync_cycles} cycles") if not chip.is_mesh else
        ("links", f"{chip.rows} x {chip.cols} {chip.topology}, {chip.link_bytes_per_cycle} "
                  f"B/cycle per link and direction, {chip.hop_latency_cycles} "
                  f"cycle{'s' if chip.hop_latency_cycles != 1 else ''} per hop, "
                  f"sync {chip.sync_cycles} cycles"),
        ("compute/transfer overlap", "yes" if chip.overlap else "no"),
        ("off-chip memory", _describe_dram(chip)),
        *([("pod", _describe_pod(chip))] if chip.is_pod else []),
    ]


def _describe_pod(chip: Chip) -> str:
    rate = chip.pod_bytes_per_cycle * chip.clock_hz / 1e9
    links = f"{chip.chip_links} link{'s' if chip.chip_links != 1 else ''}"
    return (f"{chip.chips} chips of {chip.cores_per_chip} cores, {links} per "
            f"chip of {chip.chip_link_bytes_per_cycle} B/cycle each way ({rate:.0f} GB/s per "
            f"chip and direction), latency {chip.chip_link_latency_cycles} cycles")


def _describe_dram(chip: Chip) -> str:
    if not chip.has_dram:
        return "none (every tensor lives in SRAM)"
    rate = chip.dram_bytes_per_cycle * chip.clock_hz / 1e9
    where = (f"edge channels, {chip.dram_bytes_per_cycle} B/cycle ({rate:.0f} GB/s) in all"
             if chip.dram_attach == "edge" else
             f"stacked, {chip.dram_bytes_per_cycle} B/cycle ({rate:.0f} GB/s) per core, "
             f"{chip.dram_peak_bytes_per_cycle * chip.clock_hz / 1e12:.1f} TB/s in all")
    size = (f"{chip.dram_bytes / 1024 ** 3:.1f} GiB" if chip.dram_bytes >= 1024 ** 3
            else f"{chip.dram_bytes / 1024 ** 2:.0f} MiB")
    each = (f"; each of the {chip.chips} chips reaches its own 1/{chip.chips}"
            if chip.is_pod and chip.dram_attach == "edge" else "")
    return (f"{size}, {where}, latency "
            f"{chip.dram_latency_cycles} cycles{each}")
