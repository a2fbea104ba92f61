"""rTensor plans of one op and their geometry (DESIGN.md section 3).

An `OpPlan` fixes, for an op with axes ``a_1..a_n``:

- ``F[a]``: the operator partition factor. The op runs on ``prod(F)`` cores arranged as a grid
  with one coordinate ``i_a`` per axis (row-major core numbering). Core ``i`` owns the block
  ``[i_a * b_a, (i_a + 1) * b_a)`` of every axis, where the block ``b_a`` is the extent divided by
  ``F[a] * T[a]``, rounded up, times ``T[a]`` (padding is counted as waste by the cost model).
- ``T[a]``: the number of compute steps along axis a. A core's block is cut into ``T[a]``
  sub-blocks of ``u_a = b_a / T[a]``; at step ``s`` (mixed-radix digits ``s_a``, last axis
  fastest) core ``i`` computes sub-block ``t_a = (s_a + r_a(i)) mod T[a]`` where the skew
  ``r_a(i) = sum of i_b over the driver axes of a``.
- ``rot[X]``: the axes along which operand X rotates. X's temporal factor is ``f_t[a] = T[a]`` on
  those axes and 1 on the others: a core holds X's whole block along a non-rotating axis and one
  sub-block along a rotating one. A rotating operand must lack one of a's driver axes: the cores
  that share X's block then hold different sub-blocks (the skew differs along the driver), and the
  neighbour whose driver coordinate is one higher holds the sub-block needed at the next step. That
  neighbour is where the next partition comes from, so rotation is a ring shift along the driver
  (rings of ``T[a]`` cores; ``T[a]`` divides ``F[driver]``). The output may rotate too: its
  partial sums then travel the ring (the driver is a reduction axis) and accumulate.

Every tensor rotates along at most one axis. An input may rotate at a slower pace than the
axis' steps (a divisibility chain, ``f_t = chain[X]`` dividing ``T[a]``): it then holds
``T[a] / f_t`` consecutive sub-blocks and a core fetches the next partition only when its
sub-block index crosses a partition boundary. Because the rings are skewed, different rings
cross at different steps, so under bulk-synchronous timing such a plan pays a shift at every
step like the full rotation (``f_t = T[a]``) while holding more: it is legal but dominated,
and enumerated only on request (`SearchOptions.chains`). The output never chain-rotates: a
partial sum must move, not be copied, or it would be counted twice.

After the steps, cores that differ only along reduction axes hold partial sums of the same output
block; ``group`` of them (``prod F`` over reduction axes, divided by the output's ``f_t``) are
combined by a reduce-scatter, each member ending with ``1/group`` of the block.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np

from t10c.dtypes import ceil_div
from t10c.ir import INDIRECT, Graph, TensorExpr, Window

from .place import Embedding, grid_axis, grid_columns, grid_coords, grid_physical_cores


@dataclass(frozen=True)
class Cycles:
    """Predicted cycles of one op, split by phase."""

    compute: int
    shift: int
    sync: int
    reduce: int

    @property
    def total(self) -> int:
        return self.compute + self.shift + self.sync + self.reduce

    def as_dict(self) -> dict[str, int]:
        return {"compute": self.compute, "shift": self.shift, "sync": self.sync,
                "reduce": self.reduce, "total": self.total}


@dataclass(frozen=True)
class OpPlan:
    """One rTensor plan of one op: factors, rotation, predicted cost and memory."""

    op: str
    F: tuple[int, ...]
    T: tuple[int, ...]
    rot: tuple[tuple[str, ...], ...]  # per operand (inputs then output)
    drivers: tuple[tuple[str, ...], ...]  # per op axis
    chain: tuple[int, ...]  # per operand: its f_t along its rotation axis (1 if it does not rotate)
    cycles: Cycles
    hot_bytes_per_core: int
    cold_bytes_per_core: int
    out_bytes_per_core: int  # what the result occupies after the op, until its consumers read it
    #: weights kept in a compact idle layout (spread over all cores) and warmed up into this
    #: plan's layout before each run, instead of staying resident in it
    home: bool = False
    #: where the op's grid sits on a mesh chip (`place.Embedding`); None: logical core c is
    #: physical core c (all-to-all chips, and plans made under the all-to-all assumption)
    embed: Embedding | None = None
    #: on an all-to-all chip, the physical core each logical core runs on, when it is not
    #: core c: a plan aligned to the layout its producer leaves (`partition/align.py`)
    cores: tuple[int, ...] | None = None
    #: the input whose producer's layout this plan was built to match (`partition/align.py`):
    #: the solver pairs it only with producer plans that leave that layout; -1 for none
    aligned: int = -1
    #: bytes per core this plan loads from off-chip DRAM before it runs (its graph inputs'
    #: tiles, and its weights' with ``dram_weights``): its preload footprint
    dram_bytes_per_core: int = 0
    #: cycles of those DMA loads (`Chip.dram_cycles`, one load per operand, in sequence)
    dram_cycles: int = 0
    #: the weights live in DRAM and are loaded before each run instead of staying resident
    dram_weights: bool = False

    @property
    def steps(self) -> int:
        return math.prod(self.T)

    def __hash__(self) -> int:
        """The hash of its fields, taken once: plans key the planner's caches (under their
        names, or `unnamed`) hundreds of thousands of times a wafer compile, and an aligned
        plan's fields hold its core map. A named plan's is of its name and its `unnamed`
        plan's hash, which every copy of it under another name shares (`named`)."""
        got = self.__dict__.get("_hash")
        if got is None:
            got = (hash((self.op, hash(self.unnamed))) if self.op
                   else hash(tuple(getattr(self, f) for f in _FIELDS)))
            self.__dict__["_hash"] = got
        return got

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_hash", None)  # (strings hash otherwise in another process)
        return state

    def named(self, op: str) -> OpPlan:
        """This plan as op ``op``'s (a search's plans serve every op of its kind): the plan
        `dataclasses.replace` would make with that name, made without the constructor, and
        keeping what was worked out of its other fields (`layout`, `unnamed`). A wafer
        compile renames plans about 90,000 times; a replace takes 40 us."""
        if op == self.op:
            return self
        if not op and "unnamed" in self.__dict__:
            return self.__dict__["unnamed"]
        plan = object.__new__(OpPlan)
        state = plan.__dict__
        state.update(self.__dict__)
        state.pop("_hash", None)
        state["op"] = op
        if op:  # every copy under a name shares one name-less plan, and so its hash
            state["unnamed"] = self.unnamed
        return plan

    @cached_property
    def unnamed(self) -> OpPlan:
        """This plan without its op's name: the key of the caches that equal ops share, made
        once per plan (and its copies under other names), its hash then taken once."""
        return self.named("")

    @cached_property
    def layout(self) -> HashedKey:
        """The fields that place its tiles (`geometry`; not its name, its costs or whether it
        warms its weights up) as one key, hashed once: the one key of that layout while any
        plan holds it (`HashedKey.of`), so that the plans of one layout (a plan and its
        copies, twins that differ in their costs) give keys that compare at once. Keys made
        apart compare their values: an aligned wafer plan's core map, 20 us a time, which a
        bert-large compile on wse2 asked 47,000 times."""
        return HashedKey.of((self.F, self.T, self.rot, self.drivers, self.chain, self.embed,
                             self.cores))

    def f_t(self, op: TensorExpr, index: int) -> dict[str, int]:
        """Temporal factor of operand ``index`` per axis it indexes."""
        return {a: (self.chain[index] if a in self.rot[index] else 1)
                for a in op.operands[index].plain_axes}


#: `OpPlan`'s fields, in order (its hash is of their values)
_FIELDS = tuple(f.name for f in fields(OpPlan))


class Geometry:
    """Per-core index arithmetic of one plan, vectorised over the cores it uses."""

    def __init__(self, op: TensorExpr, F: tuple[int, ...], T: tuple[int, ...],
                 rot: tuple[tuple[str, ...], ...], drivers: tuple[tuple[str, ...], ...],
                 shapes: dict[str, tuple[int, ...]], chain: tuple[int, ...] | None = None,
                 embed: Embedding | None = None, cores: tuple[int, ...] | None = None
                 ) -> None:
        self.op = op
        self.axes = op.axis_names
        self.E = tuple(e for _, e in op.axes)
        self.F, self.T, self.rot, self.drivers = F, T, rot, drivers
        if chain is None:  # full rotation: f_t is the axis' step count
            chain = tuple(T[self.axes.index(r[0])] if r else 1 for r in rot)
        self.chain = chain
        self.shapes = shapes  # tensor shapes, for INDIRECT dimensions
        self.ncores = math.prod(F)
        self.b = tuple(ceil_div(e, (f * t)) * t for e, f, t in zip(self.E, F, T))
        self.u = tuple(b // t for b, t in zip(self.b, T))
        self.steps = math.prod(T)
        self.embed = embed
        self.cores = cores
        self._recent: dict[str, dict[int, np.ndarray]] = {}
        self._rings: dict[int, np.ndarray] = {}

    @cached_property
    def phys(self) -> np.ndarray:
        """(ncores,): the physical core each logical core runs on (read-only)."""
        if self.cores is not None:
            phys = np.asarray(self.cores, dtype=np.int64)
        elif self.embed is None:
            phys = np.arange(self.ncores, dtype=np.int64)
        else:
            reduction = {a for a in self.axes if a not in self.op.output.axes}
            phys = grid_physical_cores(self.F, self.axes, reduction, self.embed)
        phys.flags.writeable = False
        return phys

    @property
    def placed(self) -> bool:
        """Whether logical and physical core numbers differ (a mesh embedding, or a plan
        aligned to its producer's layout)."""
        return self.embed is not None or self.cores is not None

    @cached_property
    def coords(self) -> np.ndarray:
        """(ncores, naxes): core c's coordinate on each axis of the core grid (read-only)."""
        coords = grid_coords(self.F)
        coords.flags.writeable = False
        return coords

    @cached_property
    def block_origin(self) -> np.ndarray:
        """(ncores, naxes): where each core's block starts on every axis (read-only)."""
        block = grid_coords(self.F, self.b)
        block.flags.writeable = False
        return block

    @cached_property
    def skew(self) -> np.ndarray:
        """(ncores, naxes): r_a of each core (zero on an axis of one step)."""
        skew = self._grid([self._skew_of(j) for j in range(len(self.axes))])
        skew.flags.writeable = False
        return skew

    def _axis(self, j: int) -> np.ndarray:
        """Axis ``j``'s coordinate on the core grid, shaped to broadcast over it (F_j long)."""
        return grid_axis(self.F, j)

    def _skew_of(self, j: int) -> np.ndarray | int:
        """Axis ``j``'s skew, the sum of its drivers' coordinates mod T_j, shaped to
        broadcast over the core grid (the drivers' extents long), or 0."""
        if self.T[j] == 1 or not self.drivers[j]:
            return 0
        col = sum((self._axis(self.axes.index(d)) for d in self.drivers[j]),
                  np.zeros((1,) * len(self.F), dtype=np.int64))
        return col % self.T[j]

    def _sub_of(self, j: int, digit: int) -> np.ndarray | int:
        """Axis ``j``'s sub-block at a step whose digit there is ``digit``: (digit + skew)
        mod T_j, shaped to broadcast over the core grid."""
        t = self.T[j]
        return 0 if t == 1 else (self._skew_of(j) + digit) % t

    def _grid(self, columns: list[np.ndarray | int]) -> np.ndarray:
        """(ncores, len(columns)) from columns made over the core grid's axes
        (`place.grid_columns`)."""
        return grid_columns(self.F, columns)

    def digits(self, step: int) -> tuple[int, ...]:
        return tuple(int(x) for x in np.unravel_index(step, self.T))

    def sub_index(self, step: int) -> np.ndarray:
        """(ncores, naxes): the sub-block t_a each core computes at ``step``."""
        return self._per_step("sub", step, lambda: self._sub_index(step))

    def _sub_index(self, step: int) -> np.ndarray:
        return self._grid([self._sub_of(j, digit) for j, digit in enumerate(self.digits(step))])

    def origin(self, step: int) -> np.ndarray:
        """(ncores, naxes): global origin of each core's sub-task at ``step``."""
        return self._per_step("origin", step, lambda: self._origin(step))

    def _origin(self, step: int) -> np.ndarray:
        # the block's origin plus the sub-block's (on an axis of one step the sub-block is
        # the block)
        return self._grid([self._axis(j) * b + self._sub_of(j, digit) * u
                           for j, (b, u, digit) in enumerate(zip(self.b, self.u,
                                                                 self.digits(step)))])

    def _per_step(self, what: str, step: int, make) -> np.ndarray:
        """Codegen asks for the same step's arrays several times in a row: keep the last two
        steps of each kind (read-only; they are large on wafer-sized chips)."""
        cache = self._recent.setdefault(what, {})
        if step not in cache:
            if len(cache) >= 2:
                del cache[min(cache)]
            cache[step] = make()
            cache[step].flags.writeable = False
        return cache[step]

    def dim_axes(self, index: int) -> list[int | Window | None]:
        """Per dimension of operand ``index``: its op-axis position, its window, or None for
        a dimension indexed by data."""
        out: list[int | Window | None] = []
        for d in self.op.operands[index].axes:
            out.append(d if isinstance(d, Window) else None if d == INDIRECT
                       else self.axes.index(d))
        return out

    def _window(self, w: Window, sizes: tuple[int, ...]) -> int:
        return sum(c * (sizes[self.axes.index(a)] - 1) for a, c in w.terms) + 1

    def tile_shape(self, index: int) -> tuple[int, ...]:
        """Shape of operand ``index``'s buffer on one core (a window's whole block, halo
        included)."""
        operand = self.op.operands[index]
        shape = []
        for d, j in enumerate(self.dim_axes(index)):
            if j is None:
                shape.append(self.shapes[operand.tensor][d])
            elif isinstance(j, Window):
                shape.append(self._window(j, self.b))
            elif self.axes[j] in self.rot[index]:
                shape.append(self.u[j] * (self.T[j] // self.chain[index]))
            else:
                shape.append(self.b[j])
        return tuple(shape)

    def _dims(self, index: int, per_axis: np.ndarray, offsets: bool = True) -> np.ndarray:
        """Per core, operand ``index``'s position on each of its dimensions for the op-axis
        positions ``per_axis`` (a window's offset added unless ``offsets`` is False: the
        map is then linear, and a difference of positions is the map of the difference)."""
        dims = self.dim_axes(index)
        plain = [j for j in dims if isinstance(j, int)]
        if len(plain) == len(dims):  # each dimension one axis: the axes' columns, one gather
            return np.take(per_axis, plain, axis=1) if dims else \
                np.zeros((self.ncores, 0), dtype=np.int64)
        cols = []
        for j in dims:
            if j is None:
                cols.append(np.zeros(self.ncores, dtype=np.int64))
            elif isinstance(j, Window):
                col = np.full(self.ncores, j.offset if offsets else 0, dtype=np.int64)
                for a, c in j.terms:
                    col = col + c * per_axis[:, self.axes.index(a)]
                cols.append(col)
            else:
                cols.append(per_axis[:, j])
        return np.stack(cols, axis=1)

    def tile_origin(self, index: int, step: int) -> np.ndarray:
        """(ncores, ndim): global origin of operand ``index``'s buffer on each core at ``step``
        (negative where a window starts in the padding)."""
        rot = self.rotation_axis(index)
        moved: np.ndarray | int = 0
        if rot is not None:
            # the partition holding this step's sub-block: T / f_t consecutive sub-blocks
            per = self.T[rot] // self.chain[index]
            moved = self._sub_of(rot, self.digits(step)[rot]) // per * (per * self.u[rot])
        dims = self.dim_axes(index)
        if all(isinstance(j, int) for j in dims):  # each dimension one axis: its block's
            # start (the rotating one moved), made over the core grid's axes and broadcast
            return self._grid([self._axis(j) * self.b[j] + (moved if j == rot else 0)
                               for j in dims if isinstance(j, int)])
        block = self.block_origin
        if rot is not None:
            block = block.copy()
            block.reshape(*self.F, len(self.axes))[..., rot] += moved
        return self._dims(index, block)

    def partition(self, index: int, step: int) -> np.ndarray:
        """(ncores,): which partition of its block operand ``index`` holds at ``step``."""
        rot = self.rotation_axis(index)
        assert rot is not None
        return self.sub_index(step)[:, rot] // (self.T[rot] // self.chain[index])

    def restore_source(self, index: int) -> np.ndarray:
        """(ncores,): the shift after the last step that brings operand ``index`` back to its
        step-0 placement (the odometer wraps: one more ring shift)."""
        moves = self.partition(index, self.steps - 1) != self.partition(index, 0)
        return np.where(moves, self.ring_source(index), np.arange(self.ncores))

    def shift_source(self, index: int, step: int) -> np.ndarray:
        """(ncores,): where each core gets operand ``index`` from after ``step``: its ring
        neighbour when its partition changes, itself otherwise."""
        moves = self.partition(index, step) != self.partition(index, step + 1)
        return np.where(moves, self.ring_source(index), np.arange(self.ncores))

    def slice_offsets(self, index: int, step: int) -> np.ndarray:
        """(ncores, ndim): where the step's sub-task starts inside operand ``index``'s buffer:
        its origin (`origin`) less the buffer's (`tile_origin`), both mapped from op-axis
        positions that start at the core's block, so the block cancels and only the
        sub-block's place within it is mapped (one map instead of two on every core)."""
        sub = self.sub_index(step)
        rel = sub * np.asarray(self.u)
        rot = self.rotation_axis(index)
        if rot is not None:  # the buffer holds the partition with this step's sub-block
            per = self.T[rot] // self.chain[index]
            rel[:, rot] -= sub[:, rot] // per * per * self.u[rot]
        return self._dims(index, rel, offsets=False)

    def rotation_axis(self, index: int) -> int | None:
        rot = self.rot[index]
        return self.axes.index(rot[0]) if rot else None

    def changes(self, step: int) -> set[int]:
        """Op-axis positions whose digit changes between ``step`` and ``step + 1``."""
        before, after = self.digits(step), self.digits(step + 1)
        return {j for j in range(len(self.axes)) if before[j] != after[j]}

    def ring_source(self, index: int) -> np.ndarray:
        if index not in self._rings:
            self._rings[index] = self._ring_source(index)
            self._rings[index].flags.writeable = False
        return self._rings[index]

    def _ring_source(self, index: int) -> np.ndarray:
        """(ncores,): the core each core receives operand ``index`` from when it rotates.

        The ring runs along the operand's driver axis: the neighbour one higher (within aligned
        groups of T cores) holds, at every step, the sub-block this core needs next.
        """
        j = self.rotation_axis(index)
        assert j is not None
        driver = self.driver_of(index)
        k = self.axes.index(driver)
        t = self.T[j]
        coords = self.coords.copy()
        base = coords[:, k] // t * t
        coords[:, k] = base + (coords[:, k] - base + 1) % t
        return np.ravel_multi_index(tuple(coords.T), self.F).astype(np.int64)

    def driver_of(self, index: int) -> str:
        """The driver axis operand ``index`` rotates along (one it lacks)."""
        j = self.rotation_axis(index)
        assert j is not None
        own = set(self.op.operands[index].axis_set)
        for d in self.drivers[j]:
            if d not in own:
                return d
        raise AssertionError("rotating operand without a driver it lacks")

    @cached_property
    def reduce_group(self) -> int:
        """How many cores hold partial sums of each output element after the steps."""
        out = len(self.op.inputs)
        red = [j for j, a in enumerate(self.axes) if a not in self.op.output.axes]
        group = math.prod(self.F[j] for j in red)
        j = self.rotation_axis(out)
        return group // self.T[j] if j is not None else group


def operand_shapes(graph: Graph, op: TensorExpr) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor ``op`` names: its operands and its epilogue's extras."""
    return {o.tensor: graph.tensors[o.tensor].shape for o in (*op.operands, *op.extra)}


#: cores from which the re-layout pricing's loops over a chip's cores and a tensor's
#: elements run compiled, one pass each (`kernels.py`: `transitions`' `result_owner`,
#: `_wanted` and `_local_counts`, `epilogue`'s remote elements); below, as the numpy passes
#: they replace (the same integers: `tests/test_relayout.py`). numba and its kernels take
#: about 200 MiB and half a second to load, which an all-to-all chip's 1,472 cores do not
#: repay (bert-large on ipu-mk2: a 2.02 GB peak against 1.86 GB, and no faster); a wafer's
#: 750,000 do
KERNEL_CORES = 1 << 16


class HashedKey:
    """A cache key whose hash is taken once: the planner's caches are keyed by tuples that
    hold an op's key (`transitions.Views.op_key`: its signature, a nested tuple, 80 us to
    hash) and a plan's layout key (`OpPlan.layout`: an aligned wafer plan's core map, tens of
    thousands of cores), looked up tens of thousands of times a compile, and a plain tuple
    hashes what it holds anew at each lookup. `of` gives one key per distinct value, so that
    equal keys are identical and compare at once, while any is held (a key nothing holds is
    dropped: a process that compiles many models does not keep every plan's)."""

    __slots__ = ("value", "_hash", "__weakref__")
    _made: weakref.WeakValueDictionary[tuple, HashedKey] = weakref.WeakValueDictionary()
    _lock = threading.Lock()

    def __init__(self, value: tuple) -> None:
        self.value = value
        self._hash = hash(value)

    @classmethod
    def of(cls, value: tuple) -> HashedKey:
        """The one key of ``value`` (made at the first ask; codegen's thread and the timing
        thread beside it may ask at once)."""
        with cls._lock:
            got = cls._made.get(value)
            if got is None:
                got = cls(value)
                cls._made[value] = got
            return got

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, HashedKey) and self._hash == other._hash
                                 and self.value == other.value)

    def __reduce__(self) -> tuple:  # (hashed again where it is unpickled, and made one)
        return _hashed_key, (self.value,)


def _hashed_key(value: tuple) -> HashedKey:
    """`HashedKey.of`, as unpickling calls it."""
    return HashedKey.of(value)


#: the geometries made last, by op and layout (`geometry`)
_GEOMETRIES: OrderedDict[tuple, Geometry] = OrderedDict()
#: how many `_GEOMETRIES` keeps: a wafer plan's per-core arrays take tens of MB each
_GEOMETRIES_KEPT = 4
_GEOMETRIES_LOCK = threading.Lock()


def geometry(graph: Graph, op: TensorExpr, plan: OpPlan) -> Geometry:
    """The `Geometry` of ``op`` (an op of ``graph``) under ``plan``. The last few are kept:
    the planner asks for one plan's several times in a row (its owner table, its boxes, its
    reduce-scatter, its wanted tiles), and on a wafer each of its per-core arrays takes
    milliseconds to build. Their arrays are read-only, so sharing them is safe."""
    shapes = operand_shapes(graph, op)
    key = (id(op), plan.layout, tuple(shapes.items()))
    with _GEOMETRIES_LOCK:
        geo = _GEOMETRIES.get(key)
        if geo is not None and geo.op is op:  # (an id outlives its op: the op is checked)
            _GEOMETRIES.move_to_end(key)
            return geo
    geo = Geometry(op, plan.F, plan.T, plan.rot, plan.drivers, shapes, plan.chain, plan.embed,
                   plan.cores)
    with _GEOMETRIES_LOCK:
        _GEOMETRIES[key] = geo
        while len(_GEOMETRIES) > _GEOMETRIES_KEPT:
            _GEOMETRIES.popitem(last=False)
    return geo
