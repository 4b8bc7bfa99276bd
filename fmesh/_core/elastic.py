"""Elastic recovery, the pure part: a mesh without the slices that lost a rank
(``shrink``), and a mesh with hot spares in place of lost ranks (``replace``).

Both return new meshes with rank maps; neither creates a process group nor imports
torch. Unlike the other operations they enumerate the index space (they build a new
rank map), so they cost O(index space) once per call.

How ``shrink`` lays out its result: the index space is a mixed-radix number whose
digits are the modes of every axis plus the complement. The shrunk axis's digits are
replaced by one digit of the remaining size, standing where its slowest mode stood;
every other digit keeps its place. So the other axes keep their layouts up to the
strides the new digit shifts, ranks keep their relative order, and shrinking commutes
with slicing, flattening, unflattening and renaming the other axes (equal values, not
just equal groups).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from .axes import axis_position
from .errors import MeshError
from .layout import Layout, Mode, complement_modes
from .mesh import Mesh, require_mesh
from .queries import coordinate, index_of
from .rank_map import rank_map_info

__all__ = ["replace", "shrink"]

_SHOWN = 8  # longest rank list an error message prints in full


def _listed(values: Sequence[int]) -> str:
    """``[3, 5]``, or ``[0, 1, 2, 3, 4, 5, 6, ..., 99] (20 in all)`` for a long list."""
    if len(values) <= _SHOWN:
        return "[" + ", ".join(map(str, values)) + "]"
    head = ", ".join(map(str, values[: _SHOWN - 1]))
    return f"[{head}, ..., {values[-1]}] ({len(values)} in all)"


def _covers(mesh: Mesh) -> str:
    if mesh.rank_map is None:
        return f"ranks 0..{mesh.index_size - 1}"
    return f"the {mesh.index_size} ranks in its rank_map"


def _rank(value: object, fn: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(
            f"{fn}() {what} must be int, got {value!r} of type {type(value).__name__}"
        )
    if value < 0:
        raise MeshError(f"{fn}() got {what} {value}; global ranks are >= 0")
    return int(value)


def _rank_array(mesh: Mesh) -> npt.NDArray[np.int64]:
    """Global rank of every index (O(index space))."""
    if mesh.rank_map is None:
        return np.arange(mesh.index_size, dtype=np.int64)
    return rank_map_info(mesh.rank_map).array


def _indices(mesh: Mesh, ranks: Iterable[int], fn: str, what: str, fix: str) -> list[int]:
    """The index of each rank; a ``MeshError`` naming every rank not in the mesh."""
    found: list[int] = []
    missing: list[int] = []
    for rank in ranks:
        index = index_of(mesh, rank)
        if index is None:
            missing.append(rank)
        else:
            found.append(index)
    if missing:
        named = (
            f"{what}s {_listed(missing)} are"
            if len(missing) > 1
            else f"{what} {missing[0]} is"
        )
        raise MeshError(
            f"{fn}(): {named} not in {mesh!r}, which covers {_covers(mesh)}; {fix}"
        )
    return found


# -- shrink -----------------------------------------------------------------------------


def _lost_ranks(lost: object) -> list[int]:
    if isinstance(lost, str | bytes | Mapping) or not isinstance(lost, Iterable):
        raise TypeError(
            f"shrink() takes the lost ranks as a collection of int, got {lost!r}; "
            "write e.g. shrink(mesh, {3, 5}, axis='dp')"
        )
    return sorted({_rank(r, "shrink", "lost rank") for r in lost})


def _moved_stride(stride: int, a_modes: Sequence[Mode], top: int, kept: int) -> int:
    """Where an index stride of another axis lands once the shrunk axis's digits
    (``a_modes``, slowest stride ``top``) become one digit of ``kept`` values."""
    # A mode of another axis holds none of the shrunk axis's digits (the axes are
    # strongly non-overlapping), so each of those digits is wholly below or above it.
    below = math.prod(s for s, d in a_modes if d < stride)
    return stride // below * (kept if stride > top else 1)


def shrink(mesh: Mesh, lost: Iterable[int], *, axis: str) -> Mesh:
    """The mesh without every slice along ``axis`` that holds a lost rank.

    The slice at coordinate ``c`` is every rank of the mesh whose coordinate along
    ``axis`` is ``c``, in every instance; e.g. shrinking along ``"dp"`` drops the
    data-parallel replicas that lost a rank. The result keeps the axis names and their
    order; ``axis`` gets shorter, and the remaining ranks keep their relative order
    along every axis (coordinates close up). A mesh with several instances (a slice of
    a larger mesh) loses the same coordinates in each instance, so its instances stay
    congruent: ranks of other instances that sit in a dropped slice go too. Shrinking
    the root mesh and then slicing gives the same value.

    The result carries a rank map (``None`` when it is the identity); no process group
    is touched. Cost: O(index space), to build that rank map.

    Args:
        mesh: the mesh to shrink.
        lost: the lost global ranks, any collection of int (a set, a list, the
            ``frozenset`` that ``fmesh.recover`` returns); each must be in ``mesh``.
            Empty: ``mesh`` itself is returned, unchanged.
        axis: the axis along which whole slices are dropped (keyword-only).

    Returns:
        A [`Mesh`][fmesh.Mesh] with the same axes, ``axis`` of size ``size - k`` for the ``k``
        slices that hold a lost rank, and as many instances as ``mesh``.

    Raises:
        TypeError: when ``mesh`` is not a mesh, ``lost`` is not a collection of int,
            or ``axis`` is not a str.
        AxisNotFoundError: when ``mesh`` has no axis ``axis``.
        MeshError: when a lost rank is negative or not in ``mesh`` (all such ranks are
            named), or when every slice along ``axis`` holds a lost rank, so nothing
            would remain.

    >>> from fmesh import make_mesh, shrink, group
    >>> m = shrink(make_mesh({"dp": 4, "tp": 2}), {3, 5}, axis="dp")
    >>> m
    Mesh(dp=2, tp=2, rank_map=[0, 1, 6, 7])
    >>> group(m, "dp", 7)
    (1, 7)
    """
    require_mesh(mesh, "shrink")
    pos = axis_position(mesh, axis, "shrink")
    ranks = _lost_ranks(lost)
    if not ranks:
        return mesh
    layout = mesh.axes[pos]
    fix = (
        "pass only the lost ranks this mesh holds, e.g. "
        "{r for r in lost if fmesh.coordinate(mesh, r) is not None}"
    )
    indices = _indices(mesh, ranks, "shrink", "lost rank", fix)
    dropped = sorted({layout.coordinate_of(i) for i in indices})
    gone = set(dropped)
    kept = [c for c in range(layout.size) if c not in gone]
    if not kept:
        raise MeshError(
            f"shrink(): every slice along axis {axis!r} of {mesh!r} holds a lost rank "
            f"(lost ranks {_listed(ranks)} sit at {axis} coordinates {_listed(dropped)} "
            f"of {layout.size}), so nothing would remain; shrink along another axis, "
            "or give the lost ranks hot spares with fmesh.replace"
        )
    a_modes = layout.modes
    top = max(d for _, d in a_modes)
    rest = complement_modes(a_modes, mesh.index_size)  # slowest first
    low = math.prod(s for s, d in rest if d < top)  # rest digits faster than the axis
    high = mesh.index_size // (layout.size * low)
    # Old index of every new index, new index = (high digit, axis digit, low digit).
    rest_values = np.asarray(Layout._from_modes(rest).values(), dtype=np.int64)
    axis_values = np.asarray([layout(c) for c in kept], dtype=np.int64)
    old = rest_values.reshape(high, 1, low) + axis_values.reshape(1, -1, 1)
    rank_map = tuple(_rank_array(mesh)[old.reshape(-1)].tolist())
    axes = tuple(
        Layout._from_modes([(len(kept), low)])
        if i == pos
        else Layout._from_modes(
            (s, _moved_stride(d, a_modes, top, len(kept))) for s, d in other.modes
        )
        for i, other in enumerate(mesh.axes)
    )
    return attrs.evolve(mesh, axes=axes, index_size=len(rank_map), rank_map=rank_map)


# -- replace ----------------------------------------------------------------------------


def replace(mesh: Mesh, spares: Mapping[int, int]) -> Mesh:
    """The same mesh with ranks substituted: ``spares[old]`` takes the place of ``old``.

    Every position, group and instance is unchanged except that the new rank stands
    where the old one stood (hot spares for lost ranks). The substitution is
    simultaneous, so a spare may be a rank of the mesh only when that rank is itself
    replaced in the same call: ``{3: 5, 5: 3}`` swaps two ranks. A mapping of a rank
    to itself changes nothing. The result carries a rank map (``None`` when it is the
    identity); no process group is touched. Cost: O(index space).

    Args:
        mesh: the mesh.
        spares: a mapping old global rank -> new global rank. Empty: ``mesh`` itself is
            returned, unchanged.

    Returns:
        A [`Mesh`][fmesh.Mesh] with the same axes, layouts and index space.

    Raises:
        TypeError: when ``mesh`` is not a mesh, ``spares`` not a mapping, or a rank in
            it not an int.
        MeshError: when a rank is negative, an old rank is not in ``mesh``, two old
            ranks get the same spare, or a spare is already in ``mesh`` and is not
            replaced itself (the result would hold it twice).

    >>> from fmesh import make_mesh, replace, group
    >>> m = replace(make_mesh({"dp": 2, "tp": 2}), {1: 8})
    >>> m
    Mesh(dp=2, tp=2, rank_map=[0, 8, 2, 3])
    >>> group(m, "dp", 8)
    (8, 3)
    """
    require_mesh(mesh, "replace")
    if not isinstance(spares, Mapping):
        raise TypeError(
            f"replace() takes a mapping old rank -> spare rank, got {spares!r}; "
            "write e.g. replace(mesh, {3: 8, 5: 9})"
        )
    pairs = sorted(
        (_rank(old, "replace", "old rank"), _rank(new, "replace", "spare rank"))
        for old, new in spares.items()
    )
    if not pairs:
        return mesh
    fix = "only ranks of the mesh can be replaced"
    indices = _indices(mesh, [old for old, _ in pairs], "replace", "rank", fix)
    given: dict[int, int] = {}
    for old, new in pairs:
        if new in given:
            raise MeshError(
                f"replace(): spare rank {new} is given to ranks {given[new]} and {old}; "
                "give each replaced rank its own spare"
            )
        given[new] = old
    olds = {old for old, _ in pairs}
    for old, new in pairs:
        coord = None if new in olds else coordinate(mesh, new)
        if coord is not None:
            where = ", ".join(f"{n}={c}" for n, c in zip(mesh.axis_names, coord))
            raise MeshError(
                f"replace(): spare rank {new} (for rank {old}) is already in {mesh!r} at "
                f"({where}) and is not replaced itself, so the mesh would hold it twice; "
                "a spare must be a rank outside the mesh, or be replaced in the same "
                "call (e.g. {3: 5, 5: 3} swaps two ranks)"
            )
    array = _rank_array(mesh).copy()
    array[np.asarray(indices, dtype=np.int64)] = [new for _, new in pairs]
    return attrs.evolve(mesh, rank_map=tuple(array.tolist()))
