"""The SPMD program: buffers, instructions with per-core tables, and its text form.

Every core runs the same instruction stream; per-core differences live in tables indexed by core
(the source core of a shift, the slice a compute reads). A buffer has one SRAM address on all
cores. Instructions name the op and the phase they belong to, for the timeline.

Instructions (tables are numpy arrays whose first axis is the core, over the first ``ncores``;
an instruction with a ``cores`` array instead has one table row per listed physical core, in that
order: how ops placed on a mesh name their cores. Core numbers inside tables are physical):

- ``Alloc(buf)`` / ``Free(buf)``: the buffer's bytes at its address become live / dead.
- ``Load(buf, tensor, shape, tile, origin, index)``: host -> chip before the run (weights,
  inputs). Core c's buffer is the ``tile``-shaped block of ``tensor`` (read as ``shape``: its
  own, a reshape of it, or with ``src_shape`` and ``perm`` a reshape of it transposed,
  `Load.read_as`) starting at ``origin[c]``, zero outside the tensor (`tile_elements`); or,
  when ``index`` is given,
  ``index[c, e]`` is the flat element of ``tensor`` for element e, -1 for padding (zero); or
  that table as a copy pattern (``pat``, ``pat_start``, ``runs``: `codegen/pattern.py`, the
  source core being 0, or -1 for zero).
- ``Fill(buf, value)``: set a buffer (accumulator initialisation).
- ``Exchange(dst, src, src_core, src_off)``: re-layout; ``dst[c, e] = src[src_core[c, e],
  src_off[c, e]]``, zero where ``src_core`` is -1. Codegen gives the table as a copy pattern
  instead (``pat``, ``pat_start``, ``runs``, the table fields None: each row's buffer as runs
  of consecutive elements of one source core, equal rows stored once, `codegen/pattern.py`),
  and keeps the table only where the pattern would be larger. ``multicast`` (meshes): the
  rows of one distinct pattern read the same elements, so each source core of a pattern sends
  them once, along one route tree to the cores of all those rows (`t10c.multicast`:
  dimension-order, X or Y first, each tree link carrying the bytes once), or, where that is
  faster, each source core sends all it sends once along one tree to every core that reads
  any of it (`t10c.multicast.exchange_trees`), or each pattern's elements are gathered onto
  one of its cores and sent on from there as one tree (`t10c.multicast.relayed`); the values
  are the table's either way, only the routes differ. False: one unicast per (source core,
  destination core).
- ``Compute(expr, out, ins, sub, offsets, origin, accumulate)``: one sub-task of ``expr`` per core
  with axis sizes ``sub``; ``offsets[k][c]`` is where the sub-task starts in operand k's buffer
  on core c (inputs then output); ``origin[c]`` is the sub-task's global position, which masks
  padding on reduction axes.
- ``Shift(dst, src, src_core)``: rotation; ``dst[c] = src[src_core[c]]``.
- ``Reduce(dst, src, combine, group, offset)``: reduce-scatter; ``dst[c] = combine over g of
  src[group[c, g], offset[c] : offset[c] + dst.elems]``, the combine's identity
  past the end of src; ``sizes[c]`` (optional) is how much of core c's chunk is real data,
  the rest padding that is not sent.
- ``Sync()``: bulk-synchronous barrier.
- ``Store(tensor, src, src_core, src_off, index, base)``: chip -> host after the run (graph
  outputs). With ``index``, only those flat elements of the tensor are stored, the rest being
  graph input ``base``, which begins it (a decode step's KV cache grown in place by the new
  token's rows: the host holds the past rows already).
- ``DmaLoad(...)``: as ``Load``, but from the chip's off-chip DRAM during the run: the DMA
  engine starts it when it is issued and works while the cores compute (chips with DRAM,
  `partition/dram.py`); the buffer may be read only after its ``DmaWait``.
- ``DmaStore(tensor, src, src_core, src_off, dtype, cores)``: as ``Store``, but into the
  chip's DRAM during the run (a decode step's KV cache, written back): the DMA engine takes it
  when it is issued, on the same queue as the loads; ``src`` may be neither written nor freed
  until its ``DmaWait``. ``dtype`` is the tensor's storage type in DRAM, ``cores`` the
  physical cores that hold it (their chips' channels carry it).
- ``DmaWait(buf)``: the cores wait until the DMA load into (or store from) ``buf`` is done.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from t10c.digest import digest_of
from t10c.dtypes import DTYPES
from t10c.ir import Gathered, TensorExpr, expr_from_json, expr_to_json, tile_elements

from .pattern import Pattern, compact, encode, expand, expand_offsets, from_table, width

# the emulator's view of patterns (it may import codegen's program types only)
from .pattern import chip_pair_counts as chip_pair_counts
from .pattern import multicast_trees as multicast_trees
from .pattern import pair_counts as pair_counts
from .pattern import received as received
from .pattern import unique_expand as unique_expand

DTYPE_BYTES = {name: d.bytes for name, d in DTYPES.items()}


@dataclass(frozen=True)
class Buffer:
    id: int
    name: str
    elems: int
    dtype: str
    offset: int  # bytes, the same on every core

    @property
    def nbytes(self) -> int:
        return self.elems * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Instr:
    op: str
    phase: str

    def row_of(self, core: int, rows: int) -> int | None:
        """The table row of physical ``core`` in an instruction with ``rows`` rows (None if
        the core takes no part)."""
        cores = getattr(self, "cores", None)
        if cores is None:
            return core if core < rows else None
        hit = np.flatnonzero(cores == core)
        return int(hit[0]) if len(hit) else None


@dataclass(frozen=True)
class Alloc(Instr):
    buf: int


@dataclass(frozen=True)
class Free(Instr):
    buf: int


@dataclass(frozen=True)
class Load(Instr):
    buf: int
    tensor: str
    shape: tuple[int, ...]
    tile: tuple[int, ...]
    origin: np.ndarray
    index: np.ndarray | None = None
    cores: np.ndarray | None = None
    pat: np.ndarray | None = None  # ``index`` as a `Pattern` (source core 0, or -1: zero)
    pat_start: np.ndarray | None = None
    runs: np.ndarray | None = None
    #: the tensor read through a transpose: reshaped to ``src_shape``, then its dimensions
    #: permuted by ``perm``, before it is read as ``shape`` (both empty: no transpose)
    src_shape: tuple[int, ...] = ()
    perm: tuple[int, ...] = ()

    @property
    def ncores(self) -> int:
        return len(self.origin)

    def read_as(self, value: np.ndarray) -> np.ndarray:
        """The host tensor ``value`` as this load reads it: ``shape``, through the transpose
        if there is one (the same elements, in another order)."""
        if self.perm:
            value = value.reshape(self.src_shape).transpose(self.perm)
        return value.reshape(self.shape)

    @property
    def indexed(self) -> bool:
        """Whether elements are given one by one (``index`` or its pattern), not as tiles."""
        return self.index is not None or self.pat is not None

    def pattern(self) -> Pattern | None:
        if self.pat is not None:
            return Pattern(self.pat, self.pat_start, self.runs)  # type: ignore[arg-type]
        if self.index is not None:
            return from_table(np.where(self.index >= 0, 0, -1), self.index)
        return None

    def elements(self) -> tuple[np.ndarray, np.ndarray]:
        """(flat tensor element, valid) for every buffer element of every core."""
        if self.pat is not None:
            p = self.pattern()
            core, flat = expand(p, width(p))  # type: ignore[arg-type]
            return np.maximum(flat, 0), core >= 0
        if self.index is not None:
            return np.maximum(self.index, 0), self.index >= 0
        return tile_elements(self.origin, self.tile, self.shape)


def indexed_load(op: str, phase: str, buf: int, tensor: str, shape: tuple[int, ...],
                 elems: int, index: np.ndarray, pat: np.ndarray | None,
                 cores: np.ndarray | None) -> Load:
    """A load of ``elems`` elements per core given one by one: row r of the table is
    ``index[pat[r]]`` (``pat`` None: row r is ``index[r]``), the flat element of ``tensor``
    or -1 (zero). Held as a pattern where that is smaller than the table."""
    return pattern_load(op, phase, buf, tensor, shape, elems,
                        encode(np.where(index >= 0, 0, -1), index, pat), cores)


def pattern_load(op: str, phase: str, buf: int, tensor: str, shape: tuple[int, ...],
                 elems: int, p: Pattern, cores: np.ndarray | None) -> Load:
    """`indexed_load` of a table already encoded as ``p`` (source core 0, or -1: zero)."""
    rows = p.rows
    origin = np.zeros((rows, 1), dtype=np.int32)
    if compact(p, rows, elems, per_element=1):
        return Load(op, phase, buf, tensor, shape, (elems,), origin, None, cores,
                    p.pat, p.start, p.runs)
    flat = expand_offsets(p, elems)
    return Load(op, phase, buf, tensor, shape, (elems,), origin, flat, cores)


@dataclass(frozen=True)
class Fill(Instr):
    buf: int
    value: float
    ncores: int
    cores: np.ndarray | None = None


@dataclass(frozen=True)
class Exchange(Instr):
    dst: int
    src: int
    src_core: np.ndarray | None  # the element table, where no pattern is given
    src_off: np.ndarray | None
    cores: np.ndarray | None = None
    pat: np.ndarray | None = None  # the table as a `Pattern` (codegen/pattern.py)
    pat_start: np.ndarray | None = None
    runs: np.ndarray | None = None
    multicast: bool = False  # rows of one pattern share a route tree per source core

    @property
    def nrows(self) -> int:
        return len(self.pat) if self.pat is not None else len(self.src_core)  # type: ignore

    def pattern(self) -> Pattern:
        """The copy pattern (encoded from the table where the instruction holds one)."""
        if self.pat is not None:
            return Pattern(self.pat, self.pat_start, self.runs)  # type: ignore[arg-type]
        return from_table(self.src_core, self.src_off)  # type: ignore[arg-type]

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """The element table ``(src_core, src_off)``, expanded from the pattern if need be."""
        if self.src_core is not None and self.src_off is not None:
            return self.src_core, self.src_off
        p = self.pattern()
        return expand(p, width(p))


def exchange(op: str, phase: str, dst: int, src: int, p: Pattern, elems: int,
             cores: np.ndarray | None, multicast: bool = False) -> Exchange:
    """An exchange of pattern ``p`` into a buffer of ``elems``: the pattern where it is
    smaller than the element table, else the table; ``multicast`` as `Exchange`'s."""
    if compact(p, p.rows, elems):
        return Exchange(op, phase, dst, src, None, None, cores, p.pat, p.start, p.runs,
                        multicast)
    core, off = expand(p, elems)
    return Exchange(op, phase, dst, src, core, off, cores, multicast=multicast)


@dataclass(frozen=True)
class Compute(Instr):
    expr: int  # index into Program.exprs
    out: int
    ins: tuple[int, ...]
    sub: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...]  # buffer shape of each operand (inputs then output)
    offsets: tuple[np.ndarray, ...]
    origin: np.ndarray
    accumulate: bool
    cores: np.ndarray | None = None


@dataclass(frozen=True)
class Shift(Instr):
    dst: int
    src: int
    src_core: np.ndarray
    cores: np.ndarray | None = None


@dataclass(frozen=True)
class Reduce(Instr):
    dst: int
    src: int
    combine: str
    group: np.ndarray
    offset: np.ndarray
    cores: np.ndarray | None = None
    #: per row, the elements of its chunk inside the source block (None: all); the rest is
    #: padding that holds the combine's identity and that no transfer carries
    sizes: np.ndarray | None = None


@dataclass(frozen=True)
class Sync(Instr):
    pass


@dataclass(frozen=True)
class Store(Instr):
    tensor: str
    shape: tuple[int, ...]
    src: int
    src_core: np.ndarray
    src_off: np.ndarray
    #: the flat elements of ``tensor`` stored, in table order (None: all of them); the
    #: others are graph input ``base``'s, which begins the tensor (a KV cache grown in place
    #: by the new token's rows); keyword-only, so that `DmaStore`'s own fields follow ours
    index: np.ndarray | None = field(default=None, kw_only=True)
    base: str = field(default="", kw_only=True)

    def whole(self, values: np.ndarray, host: dict[str, np.ndarray]) -> np.ndarray:
        """The whole tensor once the stored ``values`` (in table order) landed beside
        ``base``'s (from ``host``, the program's inputs)."""
        if self.index is None:
            return values.reshape(self.shape)
        out = np.zeros(self.shape, dtype=np.float32)
        if self.base:
            kept = np.asarray(host[self.base], dtype=np.float32)
            out[tuple(slice(0, n) for n in kept.shape)] = kept
        out.reshape(-1)[self.index] = values
        return out


@dataclass(frozen=True)
class DmaLoad(Load):
    """DRAM -> SRAM by the DMA engine, concurrent with compute (fields as `Load`)."""


@dataclass(frozen=True)
class DmaStore(Store):
    """SRAM -> DRAM by the DMA engine, concurrent with compute (fields as `Store`)."""

    dtype: str = "fp16"
    cores: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """The bytes written to DRAM: every stored element of the tensor once."""
        count = len(self.index) if self.index is not None else int(np.prod(self.shape,
                                                                          dtype=np.int64))
        return count * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class DmaWait(Instr):
    buf: int


@dataclass(frozen=True)
class Program:
    """An SPMD program for one chip, ready for the emulator."""

    name: str
    chip: str
    dtype: str
    cores: int
    buffers: tuple[Buffer, ...]
    exprs: tuple[TensorExpr, ...]
    instrs: tuple[Instr, ...]
    inputs: dict[str, tuple[tuple[int, ...], str]]
    outputs: tuple[str, ...]
    peak_sram_bytes_per_core: int  # highest address in use
    live_sram_bytes_per_core: int = 0  # the most bytes alive at once (the layout's lower bound)
    sram_layout: str = ""  # how the addresses were found
    #: tensors the DMA engine gathers from a table in DRAM by ids among the ``inputs``
    #: (`t10c.ir.Gathered`): loaded as inputs are, fed by nobody (`host_tensors`)
    gathers: dict[str, Gathered] = field(default_factory=dict)

    def host_tensors(self, inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
        """What the program's loads read, by tensor: the weights, the inputs, and the rows
        each gathered tensor's ids pick from its table (raises `ValueError` for an id
        outside the table)."""
        host = {**constants, **inputs}
        for name, g in self.gathers.items():
            for t in (g.table, g.ids):
                if t not in host:
                    raise ValueError(f"no tensor {t!r} to gather {name} from")
            host[name] = g.rows(host[g.table], host[g.ids], name)
        return host

    def for_core(self, core: int) -> list[str]:
        """Core ``core``'s own instruction list as readable assembly."""
        if not 0 <= core < self.cores:
            raise ValueError(f"core {core} does not exist (the chip has {self.cores} cores)")
        return [line for ins in self.instrs if (line := _asm(self, ins, core)) is not None]

    def save(self, directory: Path) -> None:
        """Write ``program.json`` (instructions) and ``program.npz`` (their tables). Equal
        tables (repeated layers exchange, compute and reduce by the same ones) are stored
        once, under the name of their first use."""
        arrays: dict[str, np.ndarray] = {}
        seen: dict[tuple[str, tuple[int, ...], bytes], str] = {}
        #: by array object: the instructions of repeated layers share their tables (and keep
        #: them alive, so an id is not reused while this runs)
        digests: dict[int, bytes] = {}

        def put(key: str, arr: np.ndarray) -> str:
            digest = digests.get(id(arr))
            if digest is None:
                digest = digests[id(arr)] = digest_of(np.ascontiguousarray(arr))
            ident = (arr.dtype.str, arr.shape, digest)
            if ident not in seen:
                seen[ident] = key
                arrays[key] = arr
            return seen[ident]

        records = []
        for n, ins in enumerate(self.instrs):
            rec: dict[str, object] = {"kind": type(ins).__name__}
            for f in fields(ins):
                val = getattr(ins, f.name)
                if isinstance(val, np.ndarray):
                    rec[f.name] = {"npz": put(f"i{n}.{f.name}", val)}
                elif isinstance(val, tuple) and val and isinstance(val[0], np.ndarray):
                    rec[f.name] = {"npz": [put(f"i{n}.{f.name}.{k}", arr)
                                           for k, arr in enumerate(val)]}
                else:
                    rec[f.name] = val
            records.append(rec)
        doc = {"format": "t10c-program/1", "name": self.name, "chip": self.chip,
               "dtype": self.dtype, "cores": self.cores,
               "buffers": [vars(b) for b in self.buffers],
               "exprs": [expr_to_json(e) for e in self.exprs],
               "inputs": {k: [list(s), d] for k, (s, d) in self.inputs.items()},
               "outputs": list(self.outputs),
               "peak_sram_bytes_per_core": self.peak_sram_bytes_per_core,
               "live_sram_bytes_per_core": self.live_sram_bytes_per_core,
               "sram_layout": self.sram_layout, "instrs": records}
        if self.gathers:
            doc["gathers"] = {k: {"table": g.table, "ids": g.ids}
                              for k, g in self.gathers.items()}
        (directory / "program.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        with open(directory / "program.npz", "wb") as fh:
            np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]  # numpy's stub

    @staticmethod
    def parse(directory: Path) -> Program:
        """Read a program written by `save`, unverified: use `codegen.load_program`, which
        also verifies it. Anything missing, truncated or malformed is one `ProgramError` that
        says which file and what is wrong."""
        return _read(Path(directory))


class ProgramError(ValueError):
    """A program file (or a program) that cannot be run: what is wrong, and where."""


def _read(directory: Path) -> Program:
    import zipfile

    path = directory / "program.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProgramError(f"{path} is missing; write the directory again with "
                           "t10c compile MODEL -o DIR") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ProgramError(f"{path} is not a readable JSON file ({exc}); write the directory "
                           "again with t10c compile MODEL -o DIR") from None
    if not isinstance(doc, dict) or doc.get("format") != "t10c-program/1":
        raise ProgramError(f"{path} is not a t10c-program/1 file")
    npz_path = directory / "program.npz"
    try:
        with np.load(npz_path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise ProgramError(f"{npz_path} is missing; write the directory again with "
                           "t10c compile MODEL -o DIR") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise ProgramError(f"{npz_path} is not a readable program table file ({exc})") from None
    try:
        return _from_doc(doc, arrays)
    except _Malformed as exc:
        raise ProgramError(f"{path}: {exc}") from None


class _Malformed(Exception):
    pass


_KINDS: dict[str, type[Instr]] = {}  # filled below, once the classes exist


def _field(name: str, kind: str, v: object, arrays: dict[str, np.ndarray]) -> object:
    """One instruction field from its JSON form, checked against its declared type."""

    def ints(x: object) -> tuple[int, ...]:
        if not isinstance(x, list) or not all(type(i) is int for i in x):
            raise _Malformed(f"{name} is not a list of integers")
        return tuple(x)

    def array(ref: object) -> np.ndarray:
        if not isinstance(ref, str) or ref not in arrays:
            raise _Malformed(f"{name} names table {ref!r}, which program.npz lacks")
        return arrays[ref]

    if kind == "str":
        if not isinstance(v, str):
            raise _Malformed(f"{name} is not a string")
        return v
    if kind == "int":
        if type(v) is not int:
            raise _Malformed(f"{name} is not an integer")
        return v
    if kind == "bool":
        if type(v) is not bool:
            raise _Malformed(f"{name} is not true or false")
        return v
    if kind == "float":
        if type(v) not in (int, float):
            raise _Malformed(f"{name} is not a number")
        return float(v)  # type: ignore[arg-type]
    if kind == "tuple[int, ...]":
        return ints(v)
    if kind == "tuple[tuple[int, ...], ...]":
        if not isinstance(v, list):
            raise _Malformed(f"{name} is not a list of shapes")
        return tuple(ints(x) for x in v)
    if kind == "np.ndarray | None" and v is None:
        return None
    ref = v.get("npz") if isinstance(v, dict) and len(v) == 1 else None
    if kind in ("np.ndarray", "np.ndarray | None"):
        return array(ref)
    if kind == "tuple[np.ndarray, ...]":
        if not isinstance(ref, list):
            raise _Malformed(f"{name} is not a list of tables")
        return tuple(array(r) for r in ref)
    raise AssertionError(f"field type {kind} has no reader")  # pragma: no cover


def _from_doc(doc: dict[str, object], arrays: dict[str, np.ndarray]) -> Program:
    def need(key: str, typ: type | tuple[type, ...]) -> Any:
        v = doc.get(key)
        if not isinstance(v, typ) or isinstance(v, bool):
            raise _Malformed(f"field {key!r} is missing or malformed")
        return v

    records = need("instrs", list)
    instrs: list[Instr] = []
    for n, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise _Malformed(f"instruction {n} is not an object")
        cls = _KINDS.get(rec.get("kind"))  # type: ignore[arg-type]  # any JSON value
        if cls is None:
            raise _Malformed(f"instruction {n} has unknown kind {rec.get('kind')!r} (known: "
                             f"{', '.join(_KINDS)})")
        known = {f.name: f for f in fields(cls)}
        extra = set(rec) - set(known) - {"kind"}
        if extra:
            raise _Malformed(f"instruction {n} ({cls.__name__}) has unknown fields "
                             f"{', '.join(sorted(extra))}")
        values: dict[str, Any] = {}
        for name, f in known.items():
            if name not in rec:
                if f.default is MISSING:
                    raise _Malformed(f"instruction {n} ({cls.__name__}) lacks field {name}")
                continue
            try:
                values[name] = _field(name, str(f.type), rec[name], arrays)
            except _Malformed as exc:
                raise _Malformed(f"instruction {n} ({cls.__name__}): {exc}") from None
        instrs.append(cls(**values))
    try:
        buffers = []
        for b in need("buffers", list):
            if not (isinstance(b, dict) and set(b) == {"id", "name", "elems", "dtype", "offset"}
                    and all(type(b[k]) is int for k in ("id", "elems", "offset"))
                    and isinstance(b["name"], str) and isinstance(b["dtype"], str)):
                raise _Malformed(f"buffer {b!r} is malformed")
            buffers.append(Buffer(**b))
        exprs = tuple(expr_from_json(_expr_json(k, e))
                      for k, e in enumerate(need("exprs", list)))
        inputs = {str(k): (ints_of(s), str(d))
                  for k, (s, d) in need("inputs", dict).items()}
        outputs = tuple(str(o) for o in need("outputs", list))
        cores = need("cores", int)
        peak = need("peak_sram_bytes_per_core", int)
        live = doc.get("live_sram_bytes_per_core", 0)
        if type(live) is not int:
            raise _Malformed("field 'live_sram_bytes_per_core' is malformed")
        gathers = doc.get("gathers", {})
        if not (isinstance(gathers, dict) and all(
                isinstance(g, dict) and set(g) == {"table", "ids"}
                and all(isinstance(v, str) for v in g.values()) for g in gathers.values())):
            raise _Malformed("field 'gathers' is malformed")
        return Program(str(need("name", str)), str(need("chip", str)), str(need("dtype", str)),
                       cores, tuple(buffers), exprs, tuple(instrs), inputs,
                       outputs, peak, live, str(doc.get("sram_layout", "")),
                       {str(k): Gathered(g["table"], g["ids"]) for k, g in gathers.items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _Malformed(f"malformed header or expression ({type(exc).__name__}: {exc})"
                         ) from None


def _expr_json(k: int, e: object) -> dict[str, Any]:
    """Expression ``k``'s JSON, checked for the types `expr_from_json` expects."""

    def axis_pair(x: object) -> bool:
        return isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) \
            and type(x[1]) is int

    def dim(x: object) -> bool:
        if isinstance(x, dict):
            return set(x) == {"terms", "offset"} and type(x["offset"]) is int \
                and isinstance(x["terms"], list) and all(axis_pair(t) for t in x["terms"])
        return isinstance(x, str)

    def operand(o: object) -> bool:
        return isinstance(o, dict) and set(o) == {"tensor", "axes"} \
            and isinstance(o["tensor"], str) and isinstance(o["axes"], list) \
            and all(dim(x) for x in o["axes"])

    def body(b: object) -> bool:
        if isinstance(b, list):
            return bool(b) and isinstance(b[0], str) and all(body(x) for x in b[1:])
        return type(b) in (int, float)

    def prologue(p: object) -> bool:  # [[input slot, body], ...]
        return isinstance(p, list) and all(
            isinstance(x, list) and len(x) == 2 and type(x[0]) is int and body(x[1])
            for x in p)

    ok = (isinstance(e, dict) and set(e) <= {"name", "axes", "output", "inputs", "combine",
                                              "body", "source", "prologue"}
          and prologue(e.get("prologue", []))
          and isinstance(e.get("name"), str) and isinstance(e.get("source", ""), str)
          and isinstance(e.get("axes"), list) and all(axis_pair(a) for a in e["axes"])
          and operand(e.get("output")) and isinstance(e.get("inputs"), list)
          and all(operand(o) for o in e["inputs"])
          and (e.get("combine") is None or isinstance(e.get("combine"), str))
          and body(e.get("body")))
    if not ok:
        raise _Malformed(f"expression {k} is malformed")
    return e  # type: ignore[return-value]


def ints_of(x: object) -> tuple[int, ...]:
    """A JSON list of integers as a shape."""
    if not isinstance(x, list) or not all(type(i) is int and i >= 0 for i in x):
        raise _Malformed(f"{x!r} is not a shape")
    return tuple(x)


def _asm(prog: Program, ins: Instr, core: int) -> str | None:
    buf = prog.buffers

    def b(i: int) -> str:
        return f"%{buf[i].name}"

    tag = f"  ; {ins.op}" if ins.op else ""
    if isinstance(ins, Alloc):
        x = buf[ins.buf]
        return f"alloc  {b(ins.buf)} {x.dtype}[{x.elems}] @ {x.offset:#x}{tag}"
    if isinstance(ins, Free):
        return f"free   {b(ins.buf)}{tag}"
    if isinstance(ins, DmaWait):
        return f"wait   {b(ins.buf)} (dma){tag}"
    if isinstance(ins, Load):
        row = ins.row_of(core, ins.ncores)
        if row is None:
            return None
        p = ins.pattern()
        if p is not None:  # the row's runs of valid elements
            runs = p.runs[p.start[p.pat[row]]:p.start[p.pat[row] + 1]].astype(np.int64)
            runs = runs[runs[:, 0] >= 0]
            count = int(runs[:, 2].sum())
            last = runs[:, 1] + runs[:, 3] * (runs[:, 2] - 1)
            lo, hi = (np.minimum(runs[:, 1], last).min(),
                      np.maximum(runs[:, 1], last).max()) if count else (0, 0)
        else:
            flat, ok = tile_elements(ins.origin[row:row + 1], ins.tile, ins.shape)
            valid = flat[0][ok[0]]
            count = len(valid)
            lo, hi = (valid.min(), valid.max()) if count else (0, 0)
        span = f"{lo}..{hi}" if count else "padding"
        kind, where = ("dma   ", "dram") if isinstance(ins, DmaLoad) else ("load  ", "host")
        return f"{kind} {b(ins.buf)} <- {where}:{ins.tensor}[{span}] ({count} elems){tag}"
    if isinstance(ins, Fill):
        row = ins.row_of(core, ins.ncores)
        return f"fill   {b(ins.buf)}, {ins.value}{tag}" if row is not None else None
    if isinstance(ins, Exchange):
        row = ins.row_of(core, ins.nrows)
        if row is None:
            return None
        p = ins.pattern()
        runs = p.runs[p.start[p.pat[row]]:p.start[p.pat[row] + 1]].astype(np.int64)
        runs = runs[runs[:, 0] >= 0]
        cores = np.unique(runs[:, 0])
        remote = int(runs[runs[:, 0] != core, 2].sum())
        how = "mcast " if ins.multicast else "exch  "
        return (f"{how} {b(ins.dst)} <- {b(ins.src)} from {len(cores)} cores "
                f"({remote} remote elems, {len(runs)} runs){tag}")
    if isinstance(ins, Compute):
        row = ins.row_of(core, len(ins.origin))
        if row is None:
            return None
        expr = prog.exprs[ins.expr]
        origin = ",".join(str(int(x)) for x in ins.origin[row])
        sub = "x".join(str(s) for s in ins.sub)
        ins_s = ", ".join(b(i) for i in ins.ins)
        acc = " +=" if ins.accumulate else " ="
        return f"comp   {b(ins.out)}{acc} {expr.kind}({ins_s}) tile {sub} at [{origin}]{tag}"
    if isinstance(ins, Shift):
        row = ins.row_of(core, len(ins.src_core))
        if row is None:
            return None
        return f"shift  {b(ins.dst)} <- core {int(ins.src_core[row])}:{b(ins.src)}{tag}"
    if isinstance(ins, Reduce):
        row = ins.row_of(core, len(ins.group))
        if row is None:
            return None
        grp = ",".join(str(int(g)) for g in ins.group[row])
        return (f"reduce {b(ins.dst)} = {ins.combine} {b(ins.src)}[{int(ins.offset[row])}:] "
                f"over cores {grp}{tag}")
    if isinstance(ins, Sync):
        return f"sync{tag}"
    if isinstance(ins, Store):
        held = int((ins.src_core == core).sum())
        where = "dram" if isinstance(ins, DmaStore) else "host"
        return f"store  {where}:{ins.tensor} <- {b(ins.src)} ({held} elems){tag}" if held else None
    raise TypeError(f"unknown instruction {type(ins).__name__}")


_KINDS.update({cls.__name__: cls for cls in (Alloc, Free, Load, Fill, Exchange, Compute, Shift,
                                              Reduce, Sync, Store, DmaLoad, DmaStore,
                                              DmaWait)})
