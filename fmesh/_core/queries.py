"""Rank queries on meshes (pure): where a rank sits, its groups, its instance.

Queries cost O(number of modes) or O(size of the answer); ``instances`` alone
returns (and so enumerates) the whole world, and a custom rank map is validated and
inverted once per rank-map object.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .axes import axis_position
from .errors import MeshError
from .layout import Layout, complement_modes
from .mesh import Mesh, require_mesh
from .rank_map import rank_map_info

__all__ = [
    "coordinate",
    "group",
    "index_of",
    "instance",
    "instances",
    "placement",
    "rank_at",
    "rank_of",
]


def _check_rank(rank: object, fn: str) -> int:
    if type(rank) is int and rank >= 0:  # the common case, checked cheaply
        return rank
    if isinstance(rank, bool) or not isinstance(rank, int | np.integer):
        raise TypeError(f"{fn}() rank must be int, got {rank!r}")
    if rank < 0:
        raise MeshError(f"{fn}() got rank {rank}; global ranks are >= 0")
    return int(rank)


def index_of(mesh: Mesh, rank: int) -> int | None:
    """The index of global ``rank`` in the mesh's index space, or ``None``."""
    return _index(mesh, rank, "index_of")


def _index(mesh: Mesh, rank: object, fn: str) -> int | None:
    # `fn` names the public function the user called, for the error message.
    rank = _check_rank(rank, fn)
    if mesh.rank_map is None:
        return rank if rank < mesh.index_size else None
    return rank_map_info(mesh.rank_map).index_of(rank)


def rank_of(mesh: Mesh, index: int) -> int:
    """The global rank at ``index`` of the index space."""
    return index if mesh.rank_map is None else mesh.rank_map[index]


def _ranks_array(mesh: Mesh, indices: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    if mesh.rank_map is None:
        return indices
    return rank_map_info(mesh.rank_map).array[indices]


def coordinate(mesh: Mesh, rank: int) -> tuple[int, ...] | None:
    """The coordinate of ``rank`` along every axis, or ``None`` if not in the mesh.

    >>> from fmesh import make_mesh, coordinate
    >>> coordinate(make_mesh({"dp": 2, "tp": 4}), 6)
    (1, 2)
    """
    require_mesh(mesh, "coordinate")
    index = _index(mesh, rank, "coordinate")
    if index is None:
        return None
    return tuple([layout.coordinate_of(index) for layout in mesh.axes])


def _located(mesh: Mesh, rank: int, fn: str) -> int:
    index = _index(mesh, rank, fn)
    if index is None:
        where = (
            f"ranks 0..{mesh.index_size - 1}"
            if mesh.rank_map is None
            else "the ranks in its rank_map"
        )
        raise MeshError(f"{fn}(): rank {rank} is not in {mesh!r}, which covers {where}")
    return index


def group(mesh: Mesh, axis_name: str, rank: int) -> tuple[int, ...]:
    """Global ranks of the 1-d group along ``axis_name`` that contains ``rank``.

    Ranks are in coordinate order: ``rank`` sits at position
    ``coordinate(mesh, rank)[axis]``.

    >>> from fmesh import make_mesh, group
    >>> group(make_mesh({"dp": 2, "tp": 4}), "dp", 6)
    (2, 6)
    """
    require_mesh(mesh, "group")
    pos = axis_position(mesh, axis_name, "group")
    return _members(mesh, mesh.axes[pos], _located(mesh, rank, "group"))


def _members(mesh: Mesh, layout: Layout, index: int) -> tuple[int, ...]:
    """Global ranks of the group along ``layout`` that holds ``index``."""
    indices = [layout.group_base(index)]
    for size, stride in layout.modes:  # each mode's runs as ranges: C speed
        span = size * stride
        indices = list(
            itertools.chain.from_iterable(range(b, b + span, stride) for b in indices)
        )
    if mesh.rank_map is None:
        return tuple(indices)
    return tuple(map(mesh.rank_map.__getitem__, indices))


def placement(
    mesh: Mesh, rank: int, wanted: Sequence[bool]
) -> tuple[tuple[int, ...] | None, tuple[tuple[int, ...], ...]]:
    """Where ``rank`` sits in ``mesh``, in one pass (the mesh is not checked again):
    its coordinate (``None`` off the mesh) and, per axis, its group in coordinate
    order where ``wanted`` (off the mesh: the group at the mesh's first index, which
    a non-member names in a world-wide split), else ``()``."""
    index = _index(mesh, rank, "realize")
    at = 0 if index is None else index
    groups = tuple(
        _members(mesh, layout, at) if want else () for layout, want in zip(mesh.axes, wanted)
    )
    if index is None:
        return None, groups
    return tuple([layout.coordinate_of(index) for layout in mesh.axes]), groups


def _instance_base(mesh: Mesh, index: int) -> int:
    """The base of the instance holding ``index``: its index at coordinate (0, ..., 0).

    The axes own disjoint digits of the index, so taking each axis's group base in
    turn clears them all.
    """
    for layout in mesh.axes:
        index = layout.group_base(index)
    return index


def _instance_bases(mesh: Mesh) -> Layout:
    """The layout of instance bases, in instance order (ascending)."""
    modes = [m for layout in mesh.axes for m in layout.modes]
    return Layout._from_modes(complement_modes(modes, mesh.index_size))


def rank_at(mesh: Mesh, coordinate: Sequence[int], instance: int = 0) -> int:
    """The global rank at ``coordinate`` of instance number ``instance`` (O(modes)).

    The inverse of [`coordinate`][fmesh.coordinate]:
    ``rank_at(mesh, coordinate(mesh, r), k) == r`` for the instance ``k`` holding
    ``r``. Instances are numbered as in [`instances`][fmesh.instances] (by their base
    index), so
    ``rank_at(mesh, c, k) == instances(mesh)[(k, *c)]``.

    Args:
        mesh: the mesh.
        coordinate: one coordinate per axis, each in ``0..size-1``.
        instance: which instance, ``0..mesh.num_instances-1`` (default the first;
            a root mesh has only that one).

    Returns:
        The global rank at that position.

    Raises:
        TypeError: when ``coordinate`` is not a sequence of int or ``instance`` not
            an int.
        MeshError: when the coordinate has the wrong length or is out of range, or
            the instance does not exist.

    >>> from fmesh import make_mesh, rank_at, slice
    >>> rank_at(make_mesh({"dp": 2, "tp": 4}), (1, 2))
    6
    >>> rank_at(slice(make_mesh({"dp": 2, "tp": 4}), "dp"), (1,), instance=3)
    7
    """
    require_mesh(mesh, "rank_at")
    if isinstance(coordinate, str | bytes) or not isinstance(coordinate, Sequence):
        raise TypeError(
            f"rank_at() takes a coordinate as a sequence of int, got {coordinate!r}; "
            f"e.g. rank_at(mesh, {tuple(0 for _ in mesh.axes)!r})"
        )
    if len(coordinate) != mesh.ndim:
        raise MeshError(
            f"rank_at(): coordinate {tuple(coordinate)!r} has {len(coordinate)} entries "
            f"but {mesh!r} has {mesh.ndim} axes {mesh.axis_names}; give one per axis"
        )
    index = 0
    for name, layout, c in zip(mesh.axis_names, mesh.axes, coordinate):
        if isinstance(c, bool) or not isinstance(c, int | np.integer):
            raise TypeError(
                f"rank_at() coordinate entries must be int, got {c!r} for axis {name!r}"
            )
        if not 0 <= c < layout.size:
            raise MeshError(
                f"rank_at(): coordinate {c} along axis {name!r} is outside 0.."
                f"{layout.size - 1}; the axis has size {layout.size}"
            )
        index += layout(int(c))
    if isinstance(instance, bool) or not isinstance(instance, int | np.integer):
        raise TypeError(f"rank_at() instance must be int, got {instance!r}")
    if not 0 <= instance < mesh.num_instances:
        raise MeshError(
            f"rank_at(): instance {instance} does not exist; {mesh!r} has "
            f"{mesh.num_instances} instance{'s' if mesh.num_instances != 1 else ''} "
            f"(0..{mesh.num_instances - 1})"
        )
    if mesh.num_instances > 1:
        index += _instance_bases(mesh)(int(instance))
    return rank_of(mesh, index)


def _grid(mesh: Mesh) -> npt.NDArray[np.int64]:
    """Index offsets of one instance, shaped ``axis_sizes`` (O(mesh size))."""
    grid = np.zeros(mesh.axis_sizes, dtype=np.int64)
    for axis, layout in enumerate(mesh.axes):
        shape = [1] * mesh.ndim
        shape[axis] = layout.size
        grid = grid + np.asarray(layout.values(), dtype=np.int64).reshape(shape)
    return grid


def instance(mesh: Mesh, rank: int) -> npt.NDArray[np.int64]:
    """The instance containing ``rank``: global ranks shaped ``axis_sizes``.

    This is what torch's ``DeviceMesh.mesh`` shows on that rank.

    >>> from fmesh import make_mesh, slice, instance
    >>> instance(slice(make_mesh({"dp": 2, "tp": 4}), "dp"), 3).tolist()
    [3, 7]
    """
    require_mesh(mesh, "instance")
    index = _located(mesh, rank, "instance")
    return _ranks_array(mesh, _grid(mesh) + _instance_base(mesh, index))


def instances(mesh: Mesh) -> npt.NDArray[np.int64]:
    """Every instance, shaped ``(num_instances, *axis_sizes)`` (O(world)).

    Instances are ordered by their base index.

    >>> from fmesh import make_mesh, slice, instances
    >>> instances(slice(make_mesh({"dp": 2, "tp": 2}), "dp")).tolist()
    [[0, 2], [1, 3]]
    """
    require_mesh(mesh, "instances")
    bases = _instance_bases(mesh).values()
    base_arr = np.asarray(bases, dtype=np.int64).reshape((-1,) + (1,) * mesh.ndim)
    return _ranks_array(mesh, _grid(mesh)[None, ...] + base_arr)
