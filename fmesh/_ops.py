"""Pure operations on meshes (each returns a new Mesh) and rank queries.

Nothing here enumerates the rank space: transformations cost O(number of modes) and
queries O(number of modes) or O(size of the answer). The only O(world) functions are
:func:`instances` (which returns the whole world) and the first use of a custom rank
map (validated once per rank-map object).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from ._axes import axis_position, check_names, check_size
from ._errors import MeshError, UnrepresentableSplitError
from ._layout import Layout, complement_modes
from ._mesh import Mesh, select_axes
from ._rankmap import rank_map_info

__all__ = [
    "axis_position",
    "coordinate",
    "flatten",
    "group",
    "index_of",
    "instance",
    "instances",
    "rank_at",
    "rank_of",
    "rename",
    "slice",
    "unflatten",
]


def _require_mesh(mesh: object, fn: str) -> Mesh:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{fn}() needs an fmesh.Mesh, got {type(mesh).__name__}")
    return mesh


def _evolve(mesh: Mesh, names: tuple[str, ...], axes: tuple[Layout, ...]) -> Mesh:
    return attrs.evolve(mesh, axis_names=names, axes=axes)


# -- transformations ----------------------------------------------------------------


def slice(mesh: Mesh, *axis_names: str) -> Mesh:  # noqa: A001 - the contract's name
    """Keep the named axes, **in the order given**.

    Any order is valid; each kept axis keeps its layout, so ranks keep their groups.
    The result has more instances when axes are dropped.

    >>> from fmesh import make_mesh, slice, group
    >>> m = make_mesh({"dp": 2, "cp": 2, "tp": 2})
    >>> s = slice(m, "tp", "dp")
    >>> s, s.num_instances
    (Mesh(tp=2, dp=2, layouts=(tp=(2):(1), dp=(2):(4)), index_size=8), 2)
    >>> group(s, "dp", 3)
    (3, 7)
    """
    _require_mesh(mesh, "slice")
    return select_axes(mesh, axis_names, "slice")


def flatten(mesh: Mesh, axis_names: Sequence[str], name: str | None = None) -> Mesh:
    """Merge the listed axes into one axis, row-major over them in the listed order.

    The axes may be any subset, adjacent or not, in any order. The new axis stands
    where the first listed axis stood; its default name is ``"_".join(axis_names)``.

    >>> from fmesh import make_mesh, flatten, group
    >>> m = make_mesh({"dp": 2, "cp": 2, "tp": 2})
    >>> f = flatten(m, ("tp", "dp"))
    >>> f.axis_names, group(f, "tp_dp", 0)
    (('tp_dp', 'cp'), (0, 4, 1, 5))
    """
    _require_mesh(mesh, "flatten")
    if isinstance(axis_names, str) or not isinstance(axis_names, Sequence):
        raise TypeError(
            f"flatten() takes a sequence of axis names, got {axis_names!r}; write "
            f"flatten(mesh, {_names_hint(axis_names)})"
        )
    names = tuple(axis_names)
    if not names:
        raise MeshError(
            f"flatten() needs at least one axis name; valid names are {list(mesh.axis_names)}"
        )
    positions = [axis_position(mesh, n, "flatten") for n in names]
    if len(set(positions)) != len(positions):
        dup = next(n for n in names if names.count(n) > 1)
        raise MeshError(f"flatten() got axis {dup!r} more than once in {names}")
    new_name = "_".join(names) if name is None else name
    if not isinstance(new_name, str):
        raise TypeError(f"flatten() name must be str, got {new_name!r}")
    kept = [n for n in mesh.axis_names if n not in names]
    if new_name in kept:
        raise MeshError(
            f"flatten() would name the new axis {new_name!r}, but the mesh keeps an "
            f"axis of that name; pass name=... with a name not in {kept}"
        )
    merged = Layout.concat(mesh.axes[p] for p in positions)
    first = min(positions)
    new_names: list[str] = []
    new_axes: list[Layout] = []
    for i, (n, layout) in enumerate(zip(mesh.axis_names, mesh.axes)):
        if i == first:
            new_names.append(new_name)
            new_axes.append(merged)
        elif i not in positions:
            new_names.append(n)
            new_axes.append(layout)
    return _evolve(mesh, check_names(tuple(new_names)), tuple(new_axes))


def _names_hint(text: object) -> str:
    """A tuple of names for a string the user meant as several: ``'dp,tp'``."""
    if not isinstance(text, str):
        return "('dp', 'tp')"
    parts = [p for p in re.split(r"[\s,]+", text) if p]
    return repr(tuple(parts)) if len(parts) > 1 else f"({text!r}, ...)"


def _working_splits(layout: Layout, count: int, limit: int = 6) -> list[tuple[int, ...]]:
    """Up to ``limit`` splits of ``layout`` into ``count`` sizes that are layouts."""
    size = layout.size
    divisors = (
        [d for d in range(1, size + 1) if size % d == 0]
        if size < 1 << 16
        else [d for d in (1 << k for k in range(size.bit_length())) if size % d == 0]
    )
    found: list[tuple[int, ...]] = []
    tried = 0

    def rec(prefix: tuple[int, ...], rest: int) -> None:
        nonlocal tried
        if len(found) >= limit or tried > 20000:
            return
        if len(prefix) == count - 1:
            tried += 1
            candidate = (*prefix, rest)
            if 1 in candidate and size > 1 and count > 1:
                return
            try:
                layout.split(candidate)
            except UnrepresentableSplitError:
                return
            found.append(candidate)
            return
        for d in divisors:
            if rest % d == 0:
                rec((*prefix, d), rest // d)

    rec((), size)
    return found


def unflatten(mesh: Mesh, axis_name: str, sizes: Mapping[str, int]) -> Mesh:
    """Split one axis into several, row-major, named and sized by ``sizes``.

    The new axes replace ``axis_name`` in mapping order, and their sizes must
    multiply to its size. A new name may reuse ``axis_name`` but no other axis.

    Raises:
        UnrepresentableSplitError: when the split is not a layout (e.g. splitting a
            flattened ``(2,3):(6,1)`` axis into (3, 2)); the message lists splits
            that would work.

    >>> from fmesh import make_mesh, unflatten, group
    >>> m = unflatten(make_mesh({"world": 8}), "world", {"dp": 2, "tp": 4})
    >>> m, group(m, "dp", 5)
    (Mesh(dp=2, tp=4), (1, 5))
    """
    _require_mesh(mesh, "unflatten")
    pos = axis_position(mesh, axis_name, "unflatten")
    if not isinstance(sizes, Mapping):
        raise TypeError(
            f"unflatten() sizes must be a mapping name -> size, got {sizes!r}; "
            "e.g. unflatten(mesh, 'world', {'dp': 2, 'tp': 4})"
        )
    if not sizes:
        raise MeshError("unflatten() needs at least one new axis in sizes")
    new_names = tuple(sizes.keys())
    for n in new_names:
        if not isinstance(n, str):
            raise TypeError(f"unflatten() new axis names must be str, got {n!r}")
    new_sizes = tuple(check_size(n, s) for n, s in sizes.items())
    layout = mesh.axes[pos]
    if math.prod(new_sizes) != layout.size:
        raise MeshError(
            f"unflatten(): sizes {dict(sizes)} multiply to {math.prod(new_sizes)}, "
            f"but axis {axis_name!r} has size {layout.size}; the sizes must multiply "
            f"to {layout.size}"
        )
    others = [n for n in mesh.axis_names if n != axis_name]
    clash = [n for n in new_names if n in others]
    if clash:
        raise MeshError(
            f"unflatten(): new axis names {clash} already name other axes of "
            f"{mesh!r}; choose names not in {others}"
        )
    try:
        parts = layout.split(new_sizes)
    except UnrepresentableSplitError as err:
        good = _working_splits(layout, len(new_sizes))
        hint = (
            f"splits of size {layout.size} into {len(new_sizes)} axes that work: "
            + ", ".join(str(g) for g in good)
            if good
            else f"no split of it into {len(new_sizes)} axes (all > 1) is a layout"
        )
        raise UnrepresentableSplitError(
            f"unflatten(): cannot split axis {axis_name!r} with layout {layout} into "
            f"{dict(sizes)}: ranks in row-major order over those sizes do not form a "
            f"strided layout ({err}); {hint}"
        ) from None
    names = (*mesh.axis_names[:pos], *new_names, *mesh.axis_names[pos + 1 :])
    axes = (*mesh.axes[:pos], *parts, *mesh.axes[pos + 1 :])
    return _evolve(mesh, check_names(tuple(names)), tuple(axes))


def rename(mesh: Mesh, names: Mapping[str, str]) -> Mesh:
    """Rename axes: ``rename(m, {"dp": "data"})``.

    >>> from fmesh import make_mesh, rename
    >>> rename(make_mesh({"dp": 2, "tp": 4}), {"dp": "data"})
    Mesh(data=2, tp=4)
    """
    _require_mesh(mesh, "rename")
    if not isinstance(names, Mapping):
        raise TypeError(f"rename() takes a mapping old -> new, got {names!r}")
    for old in names:
        axis_position(mesh, old, "rename")
    new = tuple(names.get(n, n) for n in mesh.axis_names)
    try:
        checked = check_names(new)
    except MeshError as err:
        raise MeshError(f"rename({dict(names)}) of {mesh!r}: {err}") from None
    return _evolve(mesh, checked, mesh.axes)


# -- queries --------------------------------------------------------------------------


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
    _require_mesh(mesh, "coordinate")
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
    _require_mesh(mesh, "group")
    pos = axis_position(mesh, axis_name, "group")
    index = _located(mesh, rank, "group")
    layout = mesh.axes[pos]
    base = layout.group_base(index)
    if mesh.rank_map is None:
        return tuple(base + v for v in layout.values())
    rmap = mesh.rank_map
    return tuple(rmap[base + v] for v in layout.values())


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

    The inverse of :func:`coordinate`: ``rank_at(mesh, coordinate(mesh, r), k) == r``
    for the instance ``k`` holding ``r``. Instances are numbered as in
    :func:`instances` (by their base index), so
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
    _require_mesh(mesh, "rank_at")
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
    _require_mesh(mesh, "instance")
    index = _located(mesh, rank, "instance")
    return _ranks_array(mesh, _grid(mesh) + _instance_base(mesh, index))


def instances(mesh: Mesh) -> npt.NDArray[np.int64]:
    """Every instance, shaped ``(num_instances, *axis_sizes)`` (O(world)).

    Instances are ordered by their base index.

    >>> from fmesh import make_mesh, slice, instances
    >>> instances(slice(make_mesh({"dp": 2, "tp": 2}), "dp")).tolist()
    [[0, 2], [1, 3]]
    """
    _require_mesh(mesh, "instances")
    bases = _instance_bases(mesh).values()
    base_arr = np.asarray(bases, dtype=np.int64).reshape((-1,) + (1,) * mesh.ndim)
    return _ranks_array(mesh, _grid(mesh)[None, ...] + base_arr)
