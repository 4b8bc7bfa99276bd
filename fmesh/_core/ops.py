"""Pure operations on meshes: each returns a new Mesh (rank queries: ``_queries.py``).

Nothing here enumerates the rank space: transformations cost O(number of modes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import attrs

from .axes import axis_position, check_names, check_size
from .errors import MeshError, UnrepresentableSplitError
from .layout import Layout
from .mesh import Mesh, require_mesh, select_axes

__all__ = [
    "axis_position",
    "flatten",
    "rename",
    "slice",
    "unflatten",
]


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
    require_mesh(mesh, "slice")
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
    require_mesh(mesh, "flatten")
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
    require_mesh(mesh, "unflatten")
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
    require_mesh(mesh, "rename")
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
