"""An independent brute-force model of meshes, for checking fmesh against.

A :class:`Model` is an explicit numpy array of index-space positions shaped
``(num_instances, *axis_sizes)`` plus the rank map; slice, flatten and unflatten are
numpy transposes and reshapes. Nothing here uses fmesh's layout algebra.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
from strategies import Flatten, MeshSpec, Op, Slice, Unflatten

import fmesh

Array = npt.NDArray[np.int64]


def _sorted_by_base(index: Array) -> Array:
    """Instances ordered by their base: the index at coordinate (0, ..., 0)."""
    bases = index.reshape(index.shape[0], -1)[:, 0]
    return index[np.argsort(bases, kind="stable")]


@dataclass(frozen=True)
class Model:
    """A mesh as an explicit array of index-space positions and a rank map."""

    names: tuple[str, ...]
    index: Array
    """Shape ``(num_instances, *sizes)``; instances ordered by base index."""
    rank_map: Array
    """Global rank of each index."""

    @classmethod
    def root(cls, sizes: Sequence[int], names: Sequence[str], ranks: Sequence[int]) -> Model:
        n = math.prod(sizes)
        index = np.arange(n, dtype=np.int64).reshape((1, *sizes))
        return cls(tuple(names), index, np.asarray(ranks, dtype=np.int64))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.index.shape[1:])

    @property
    def ranks(self) -> Array:
        """Global ranks shaped ``(num_instances, *sizes)``."""
        return self.rank_map[self.index]

    def axis(self, name: str) -> int:
        return self.names.index(name)

    def slice(self, names: Sequence[str]) -> Model:
        kept = [self.axis(n) for n in names]
        dropped = [i for i in range(len(self.names)) if i not in kept]
        moved = np.transpose(
            self.index, [0, *(1 + i for i in dropped), *(1 + i for i in kept)]
        )
        index = moved.reshape((-1, *(self.sizes[i] for i in kept)))
        return Model(tuple(names), _sorted_by_base(index), self.rank_map)

    def flatten(self, names: Sequence[str], name: str | None) -> Model:
        listed = [self.axis(n) for n in names]
        first = min(listed)
        order: list[int] = []
        new_names: list[str] = []
        new_sizes: list[int] = []
        for i, n in enumerate(self.names):
            if i == first:
                order.extend(listed)
                new_names.append("_".join(names) if name is None else name)
                new_sizes.append(math.prod(self.sizes[j] for j in listed))
            elif i not in listed:
                order.append(i)
                new_names.append(n)
                new_sizes.append(self.sizes[i])
        moved = np.transpose(self.index, [0, *(1 + i for i in order)])
        index = moved.reshape((moved.shape[0], *new_sizes))
        return Model(tuple(new_names), index, self.rank_map)

    def unflatten(self, name: str, sizes: Sequence[tuple[str, int]]) -> Model:
        pos = self.axis(name)
        shape = self.index.shape
        new_shape = (*shape[: pos + 1], *(s for _, s in sizes), *shape[pos + 2 :])
        names = (*self.names[:pos], *(n for n, _ in sizes), *self.names[pos + 1 :])
        return Model(names, self.index.reshape(new_shape), self.rank_map)

    def rename(self, mapping: Sequence[tuple[str, str]]) -> Model:
        table = dict(mapping)
        return Model(tuple(table.get(n, n) for n in self.names), self.index, self.rank_map)

    def apply(self, op: Op) -> Model:
        if isinstance(op, Slice):
            return self.slice(op.names)
        if isinstance(op, Flatten):
            return self.flatten(op.names, op.name)
        if isinstance(op, Unflatten):
            return self.unflatten(op.axis, op.sizes)
        return self.rename(op.mapping)

    # -- answers to the queries, by search ----------------------------------------------

    def locations(self) -> dict[int, tuple[int, ...]]:
        """Global rank -> (instance, *coordinate), by enumerating every position."""
        ranks = self.ranks
        return {int(ranks[pos]): tuple(int(p) for p in pos) for pos in np.ndindex(ranks.shape)}

    def groups(self, name: str) -> list[tuple[int, ...]]:
        """Every 1-d group along axis ``name`` (ranks in coordinate order)."""
        pos = 1 + self.axis(name)
        rows = np.moveaxis(self.ranks, pos, -1).reshape(-1, self.ranks.shape[pos])
        return [tuple(int(r) for r in row) for row in rows]

    def axis_is_layout(self, name: str) -> bool:
        """Whether the groups along ``name`` are one strided layout over the index space.

        True when every group's offsets from its base (its first index) are the same,
        and those offsets are a row-major layout function with positive strides.
        """
        pos = 1 + self.axis(name)
        rows = np.moveaxis(self.index, pos, -1).reshape(-1, self.index.shape[pos])
        offsets = rows - rows[:, :1]
        if not bool(np.all(offsets == offsets[0])):
            return False
        return is_layout_function(tuple(int(v) for v in offsets[0]))


def model_of(spec: MeshSpec, chain: Sequence[Op] = ()) -> Model:
    """The model of a root mesh after a chain of operations."""
    model = Model.root(spec.sizes, spec.names, spec.rank_list())
    for op in chain:
        model = model.apply(op)
    return model


@functools.lru_cache(maxsize=4096)
def is_layout_function(values: tuple[int, ...]) -> bool:
    """Whether some row-major layout with positive strides lists exactly ``values``.

    Brute force over the fastest mode's size ``s`` (any divisor > 1 of the length):
    its stride must be ``values[1]``, every block of ``s`` consecutive values must
    step by it, and the block starts must again be a layout function.
    """
    t = len(values)
    if values[0] != 0:
        return False
    if t == 1:
        return True
    step = values[1]
    if step < 1:
        return False
    for s in range(2, t + 1):
        if t % s:
            continue
        blocks_ok = all(
            values[q * s + r] == values[q * s] + r * step
            for q in range(t // s)
            for r in range(s)
        )
        if blocks_ok and is_layout_function(values[::s]):
            return True
    return False


def layout_values(shape: Sequence[int], stride: Sequence[int]) -> list[int]:
    """Indices of the row-major layout ``shape:stride``, by enumerating coordinates."""
    out = []
    for coord in np.ndindex(*shape):
        out.append(sum(int(c) * int(d) for c, d in zip(coord, stride, strict=True)))
    return out


def check_mesh(mesh: fmesh.Mesh, model: Model) -> None:
    """Assert that every fmesh query on ``mesh`` agrees with the brute-force model."""
    ranks = model.ranks
    assert mesh.axis_names == model.names
    assert mesh.axis_sizes == model.sizes
    assert dict(mesh.shape) == dict(zip(model.names, model.sizes, strict=True))
    assert mesh.ndim == len(model.names)
    assert mesh.size == math.prod(model.sizes)
    assert mesh.num_instances == ranks.shape[0]
    assert mesh.index_size == model.rank_map.size
    got = fmesh.instances(mesh)
    assert got.shape == ranks.shape
    assert np.array_equal(got, ranks)

    where = model.locations()
    for name in model.names:
        table = {r: g for g in model.groups(name) for r in g}
        axis = model.axis(name)
        for rank, (_, *coord) in where.items():
            group = fmesh.group(mesh, name, rank)
            assert group == table[rank]
            assert group[coord[axis]] == rank  # the group order rule
    for rank, (k, *coord) in where.items():
        assert fmesh.coordinate(mesh, rank) == tuple(coord)
        assert np.array_equal(fmesh.instance(mesh, rank), ranks[k])
    absent = [
        r for r in range(max(int(r) for r in model.rank_map.tolist()) + 3) if r not in where
    ]
    for rank in absent[:3]:
        assert fmesh.coordinate(mesh, rank) is None
        with pytest.raises(fmesh.MeshError, match=f"rank {rank} is not in"):
            fmesh.group(mesh, model.names[0], rank)
        with pytest.raises(fmesh.MeshError, match=f"rank {rank} is not in"):
            fmesh.instance(mesh, rank)
