"""The :class:`Mesh` value and its constructors.

A mesh is axis names plus one canonical :class:`~fmesh.Layout` per axis over an index
space ``[0, index_size)``, and an optional ``rank_map`` from index to global rank. It
holds no resources and never talks to torch; see :func:`fmesh.realize` for that.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping, Sequence
from typing import final, overload

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import MeshError
from ._layout import Layout, complement_modes, row_major
from ._rankmap import rank_map_info

__all__ = ["Mesh", "RanksLike", "make_mesh"]

RanksLike = Sequence[int] | npt.NDArray[np.integer]
"""Global ranks in row-major order: a sequence of int or an integer array."""


def _check_size(name: str, size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int | np.integer):
        raise TypeError(
            f"axis {name!r} has size {size!r} of type {type(size).__name__}; "
            "axis sizes must be int (not bool or float)"
        )
    if size < 1:
        raise MeshError(
            f"axis {name!r} has size {size}; axis sizes must be >= 1 "
            "(use 1 for an axis that is present but not split)"
        )
    return int(size)


def _check_names(names: object) -> tuple[str, ...]:
    if not isinstance(names, tuple):
        raise TypeError(f"axis_names must be a tuple of str, got {names!r}")
    for name in names:
        if not isinstance(name, str):
            raise TypeError(
                f"axis names must be str, got {name!r} of type {type(name).__name__} "
                f"in {names!r}"
            )
        if not name:
            raise MeshError(
                f"axis names must be non-empty strings, got {names!r}; "
                "name every axis, e.g. ('dp', 'tp')"
            )
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise MeshError(
                f"axis name {name!r} appears more than once in {names!r}; "
                "axis names must be unique"
            )
        seen.add(name)
    return names


def _check_axes(axes: object) -> tuple[Layout, ...]:
    if not isinstance(axes, tuple) or not all(isinstance(a, Layout) for a in axes):
        raise TypeError(f"axes must be a tuple of fmesh.Layout, got {axes!r}")
    return axes


def _check_index_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"index_size must be int, got {value!r}")
    if value < 1:
        raise MeshError(f"index_size must be >= 1, got {value}")
    return value


def _checked_rank_map(value: object) -> tuple[int, ...] | None:
    """Validated once per tuple object; ``Mesh`` turns an identity map into ``None``
    after checking its length."""
    if value is None:
        return None
    if not isinstance(value, tuple):
        raise TypeError(
            f"rank_map must be a tuple of int or None, got {type(value).__name__}; "
            "use make_mesh(..., ranks=...) or Mesh.from_ranks to pass a list or array"
        )
    rank_map_info(value)
    return value


@final
@attrs.frozen(slots=True, repr=False, cache_hash=True)
class Mesh:
    """An immutable, hashable device mesh: named axes over a space of ranks.

    A mesh describes a *family* of congruent sub-meshes ("instances") tiling the
    index space: a root mesh has one instance, and ``slice(m, "tp")`` of a
    ``(dp=2, tp=4)`` mesh has two. Every rank computes the same value (SPMD).

    >>> from fmesh import make_mesh
    >>> m = make_mesh({"dp": 2, "tp": 4})
    >>> m
    Mesh(dp=2, tp=4)
    >>> dict(m.shape), m.size, m.ndim
    ({'dp': 2, 'tp': 4}, 8, 2)
    """

    axis_names: tuple[str, ...] = attrs.field(converter=_check_names)
    """Unique, non-empty axis names, in axis order."""
    axes: tuple[Layout, ...] = attrs.field(converter=_check_axes)
    """One canonical layout per axis, over the index space."""
    index_size: int = attrs.field(converter=_check_index_size)
    """Size N of the index space the mesh tiles."""
    rank_map: tuple[int, ...] | None = attrs.field(default=None, converter=_checked_rank_map)
    """Global rank of each index; ``None`` means index == rank."""

    def __attrs_post_init__(self) -> None:
        if len(self.axis_names) != len(self.axes):
            raise MeshError(
                f"{len(self.axis_names)} axis names {self.axis_names} but "
                f"{len(self.axes)} layouts; give exactly one layout per axis"
            )
        modes = [m for layout in self.axes for m in layout.modes]
        try:
            complement_modes(modes, self.index_size)
        except MeshError as err:
            raise MeshError(
                f"axes {self._axes_str()} are not a valid mesh over "
                f"{self.index_size} indices: {err}"
            ) from None
        if self.rank_map is not None:
            if len(self.rank_map) != self.index_size:
                raise MeshError(
                    f"rank_map has {len(self.rank_map)} entries but the index space "
                    f"has {self.index_size}; give one global rank per index"
                )
            if rank_map_info(self.rank_map).is_identity:
                # Canonical form: the identity map is None, so equal meshes compare
                # equal. Frozen attrs classes allow this in __attrs_post_init__.
                object.__setattr__(self, "rank_map", None)

    # -- constructors ---------------------------------------------------------------

    @classmethod
    def from_ranks(cls, ranks: npt.ArrayLike, axis_names: Sequence[str]) -> Mesh:
        """A root mesh from an explicit N-d array of global ranks.

        >>> Mesh.from_ranks([[0, 2], [1, 3]], ("dp", "tp"))
        Mesh(dp=2, tp=2, rank_map=[0, 2, 1, 3])
        """
        names = _names_tuple(axis_names)
        array = np.asarray(ranks)
        if array.dtype.kind not in "iu":
            raise TypeError(
                f"Mesh.from_ranks needs an integer array of global ranks, got dtype "
                f"{array.dtype} from {ranks!r}"
            )
        if array.ndim != len(names):
            raise MeshError(
                f"rank array has {array.ndim} dimensions (shape {array.shape}) but "
                f"{len(names)} axis names {names}; give one name per dimension"
            )
        if array.size == 0:
            raise MeshError(f"rank array of shape {array.shape} is empty")
        sizes = tuple(int(s) for s in array.shape)
        flat = tuple(int(r) for r in array.reshape(-1))
        return cls(names, row_major(sizes), array.size, flat)

    # -- derived ----------------------------------------------------------------------

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        """Size of each axis, in axis order."""
        return tuple(layout.size for layout in self.axes)

    @property
    def shape(self) -> Mapping[str, int]:
        """Read-only ordered mapping from axis name to size (like JAX)."""
        return types.MappingProxyType(dict(zip(self.axis_names, self.axis_sizes)))

    @property
    def size(self) -> int:
        """Number of ranks in one instance of the mesh."""
        return math.prod(self.axis_sizes)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.axes)

    @property
    def num_instances(self) -> int:
        """How many congruent instances tile the index space."""
        return self.index_size // self.size

    def axis_index(self, name: str) -> int:
        """Position of axis ``name``; raises :class:`AxisNotFoundError` if absent."""
        from ._ops import axis_position

        return axis_position(self, name, "Mesh.axis_index")

    def _axes_str(self) -> str:
        return ", ".join(f"{n}={layout}" for n, layout in zip(self.axis_names, self.axes))

    def _is_default_layout(self) -> bool:
        return self.index_size == self.size and self.axes == row_major(self.axis_sizes)

    def __repr__(self) -> str:
        parts = [f"{n}={s}" for n, s in zip(self.axis_names, self.axis_sizes)]
        if not self._is_default_layout():
            parts.append(f"layouts=({self._axes_str()})")
            parts.append(f"index_size={self.index_size}")
        if self.rank_map is not None:
            shown = ", ".join(str(r) for r in self.rank_map[:8])
            more = ", ..." if len(self.rank_map) > 8 else ""
            parts.append(f"rank_map=[{shown}{more}]")
        return f"Mesh({', '.join(parts)})"


def _names_tuple(axis_names: object) -> tuple[str, ...]:
    if isinstance(axis_names, str):
        raise TypeError(
            f"axis_names must be a sequence of names, got the string {axis_names!r}; "
            f"write ({axis_names!r},) for a single axis"
        )
    if not isinstance(axis_names, Sequence):
        raise TypeError(f"axis_names must be a sequence of str, got {axis_names!r}")
    return _check_names(tuple(axis_names))


@overload
def make_mesh(
    axis_sizes: Mapping[str, int],
    axis_names: None = None,
    *,
    ranks: RanksLike | None = None,
) -> Mesh: ...


@overload
def make_mesh(
    axis_sizes: Sequence[int],
    axis_names: Sequence[str],
    *,
    ranks: RanksLike | None = None,
) -> Mesh: ...


def make_mesh(
    axis_sizes: Mapping[str, int] | Sequence[int],
    axis_names: Sequence[str] | None = None,
    *,
    ranks: RanksLike | None = None,
) -> Mesh:
    """Make a root mesh with row-major axes (JAX-style).

    Args:
        axis_sizes: sizes in axis order, or a mapping name -> size.
        axis_names: one name per size; omit it when ``axis_sizes`` is a mapping.
        ranks: optional global ranks in row-major order (a sequence or an array of
            any shape with the right number of entries), for custom device orders
            and meshes over a subset of the world. Default: ranks ``0..size-1``.

    Returns:
        A :class:`Mesh` with one instance.

    Raises:
        TypeError: for sizes that are not int, or names that are not str.
        MeshError: for sizes < 1, duplicate or empty names, or a bad ``ranks``.

    >>> make_mesh((2, 4), ("dp", "tp"))
    Mesh(dp=2, tp=4)
    >>> make_mesh({"dp": 2}, ranks=[4, 6])
    Mesh(dp=2, rank_map=[4, 6])
    """
    if isinstance(axis_sizes, Mapping):
        if axis_names is not None:
            raise TypeError(
                "make_mesh got a mapping of axis sizes and axis_names; the mapping "
                "already names the axes, so drop axis_names"
            )
        names = _names_tuple(tuple(axis_sizes.keys()))
        sizes_in: tuple[object, ...] = tuple(axis_sizes.values())
    else:
        if isinstance(axis_sizes, str | bytes) or not isinstance(axis_sizes, Sequence):
            raise TypeError(
                f"axis_sizes must be a sequence of int or a mapping name -> size, "
                f"got {axis_sizes!r}"
            )
        if axis_names is None:
            raise TypeError(
                "make_mesh needs axis_names when axis_sizes is a sequence; "
                "e.g. make_mesh((2, 4), ('dp', 'tp')) or make_mesh({'dp': 2, 'tp': 4})"
            )
        names = _names_tuple(axis_names)
        sizes_in = tuple(axis_sizes)
        if len(sizes_in) != len(names):
            raise MeshError(
                f"make_mesh got {len(sizes_in)} sizes {sizes_in} but {len(names)} "
                f"names {names}; give one name per axis"
            )
    sizes = tuple(_check_size(n, s) for n, s in zip(names, sizes_in))
    size = math.prod(sizes)
    rank_map: tuple[int, ...] | None = None
    if ranks is not None:
        if isinstance(ranks, np.ndarray):
            if ranks.dtype.kind not in "iu":
                raise TypeError(
                    f"ranks must hold integers, got an array of dtype {ranks.dtype}"
                )
            flat = tuple(int(r) for r in ranks.reshape(-1))
        elif isinstance(ranks, Sequence) and not isinstance(ranks, str | bytes):
            # Numpy integers (e.g. from list(array)) count as ints, as for sizes.
            flat = tuple(int(r) if isinstance(r, np.integer) else r for r in ranks)
        else:
            raise TypeError(
                f"ranks must be a sequence of int or an integer array, got {ranks!r}"
            )
        if len(flat) != size:
            raise MeshError(
                f"ranks has {len(flat)} entries but the mesh {dict(zip(names, sizes))} "
                f"has {size} positions; give exactly one global rank per position"
            )
        rank_map = flat
    return Mesh(names, row_major(sizes), size, rank_map)
