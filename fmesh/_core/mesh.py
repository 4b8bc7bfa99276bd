"""The ``Mesh`` value and its constructors.

A mesh is axis names plus one canonical ``Layout`` per axis over an index
space ``[0, index_size)``, and an optional ``rank_map`` from index to global rank. It
holds no resources and never talks to torch; see ``fmesh.realize`` for that.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping, Sequence
from typing import final, overload

import attrs
import numpy as np
import numpy.typing as npt

from . import mesh_json
from .axes import axis_position, check_names, check_size, names_tuple
from .errors import MeshError
from .layout import Layout, complement_modes, row_major
from .rank_map import rank_map_info

__all__ = ["Mesh", "RanksLike", "make_mesh", "select_axes"]

RanksLike = Sequence[int] | npt.NDArray[np.integer]
"""Global ranks in row-major order: a sequence of int or an integer array."""


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

    axis_names: tuple[str, ...] = attrs.field(converter=check_names)
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
        names = names_tuple(axis_names)
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
        """Position of axis ``name``, or [`AxisNotFoundError`][fmesh.AxisNotFoundError]."""
        return axis_position(self, name, "Mesh.axis_index")

    def __getitem__(self, key: str | tuple[str, ...]) -> Mesh:
        """``mesh["dp"]``, ``mesh["dp", "tp"]``: the same as ``fmesh.slice(mesh, ...)``.

        Raises:
            TypeError: for a key that is not a str or a tuple of str.
            AxisNotFoundError: for an axis the mesh does not have.
            MeshError: for an empty tuple or an axis named twice.

        >>> import fmesh
        >>> m = make_mesh({"dp": 2, "cp": 2, "tp": 2})
        >>> m["tp", "dp"] == fmesh.slice(m, "tp", "dp")
        True
        >>> m["tp"]
        Mesh(tp=2, layouts=(tp=(2):(1)), index_size=8)
        """
        if isinstance(key, str):
            return select_axes(self, (key,), "Mesh.__getitem__")
        if not isinstance(key, tuple):
            raise TypeError(
                f"mesh[...] takes axis names, got {key!r} of type {type(key).__name__}; "
                "write mesh['dp'] or mesh['dp', 'tp']"
            )
        return select_axes(self, key, "Mesh.__getitem__")

    def to_json(self) -> str:
        """One line of JSON that [`from_json`][fmesh.Mesh.from_json] reads back exactly.

        The schema is versioned: ``{"fmesh_mesh": 1, "axes": [{"name", "shape",
        "stride"}, ...], "index_size": N, "rank_map": null or [rank, ...]}``, each
        axis a canonical layout over the index space (see [`Layout`][fmesh.Layout]).

        >>> import json
        >>> json.loads(make_mesh({"dp": 2}, ranks=[4, 6]).to_json())
        {'fmesh_mesh': 1, 'axes': [{'name': 'dp', 'shape': [2], 'stride': [1]}],
         'index_size': 2, 'rank_map': [4, 6]}
        """
        return mesh_json.dumps(self.axis_names, self.axes, self.index_size, self.rank_map)

    @classmethod
    def from_json(cls, text: str) -> Mesh:
        """The mesh [`to_json`][fmesh.Mesh.to_json] wrote: ``from_json(m.to_json()) == m``.

        Args:
            text: JSON text in the schema [`to_json`][fmesh.Mesh.to_json] documents
                (version 1).

        Returns:
            The [`Mesh`][fmesh.Mesh], validated like any other.

        Raises:
            TypeError: when ``text`` is not a str.
            MeshError: when the text is not JSON, not an fmesh mesh, of another
                schema version, has missing or unknown fields, or describes no
                valid mesh; the message says which.

        >>> m = make_mesh({"dp": 2, "tp": 4}, ranks=range(7, -1, -1))["dp"]
        >>> Mesh.from_json(m.to_json()) == m
        True
        """
        if not isinstance(text, str):
            hint = (
                "; decode bytes first, e.g. data.decode()" if isinstance(text, bytes) else ""
            )
            raise TypeError(f"Mesh.from_json() takes a str, got {type(text).__name__}{hint}")
        names, layouts, index_size, rank_map = mesh_json.loads(text)
        try:
            return cls(names, layouts, index_size, rank_map)
        except MeshError as err:
            raise MeshError(
                f"Mesh.from_json(): the JSON describes no valid mesh: {err}"
            ) from None

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


def select_axes(mesh: Mesh, names: tuple[object, ...], fn: str) -> Mesh:
    """The named axes of ``mesh`` in the given order (``slice`` and ``mesh[...]``)."""
    if not names:
        raise MeshError(
            f"{fn}() needs at least one axis name; valid names are {list(mesh.axis_names)}"
        )
    positions = [axis_position(mesh, n, fn) for n in names]
    if len(set(positions)) != len(positions):
        dup = next(n for n in names if names.count(n) > 1)
        raise MeshError(
            f"{fn}() got axis {dup!r} more than once in {names}; name each axis once"
        )
    return attrs.evolve(
        mesh,
        axis_names=tuple(mesh.axis_names[p] for p in positions),
        axes=tuple(mesh.axes[p] for p in positions),
    )


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
        A [`Mesh`][fmesh.Mesh] with one instance.

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
        names = names_tuple(tuple(axis_sizes.keys()))
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
        names = names_tuple(axis_names)
        sizes_in = tuple(axis_sizes)
        if len(sizes_in) != len(names):
            raise MeshError(
                f"make_mesh got {len(sizes_in)} sizes {sizes_in} but {len(names)} "
                f"names {names}; give one name per axis"
            )
    sizes = tuple(check_size(n, s) for n, s in zip(names, sizes_in))
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


def require_mesh(mesh: object, fn: str, arg: str = "", *, needs: str = "") -> Mesh:
    """``mesh`` if it is a ``Mesh``; the TypeError names ``fn()`` (and ``arg``),
    or starts with ``needs`` where the caller words it itself."""
    if not isinstance(mesh, Mesh):
        where = f" as {arg}" if arg else ""
        start = needs or f"{fn}() needs an fmesh.Mesh{where}"
        raise TypeError(f"{start}, got {type(mesh).__name__}")
    return mesh
