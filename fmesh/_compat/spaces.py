"""The rank spaces fmesh made DeviceMeshes over, as torch's wrappers see them.

``hook.py`` asks this registry whether a rank-map tensor (or a view of one) is
fmesh's: a table keyed by the tensor's ``id`` and checked against a weak reference,
so a tensor that died and whose id was reused never matches, and one keyed by its
storage for views (FSDP2's ``mesh.mesh.view(-1, r)``). ``SharedRanks`` is the rank map
as every DeviceMesh of a space holds it for torch's ``==`` and ``hash``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, overload

from .mesh import GroupSpec, Modes

if TYPE_CHECKING:
    import torch

__all__ = [
    "BackendConfigs",
    "SharedRanks",
    "Space",
    "View",
    "register_space",
    "space_of",
    "unregister_space",
    "view_of",
]

BackendConfigs = Sequence[tuple[Any, Any]]
"""torch's ``backend_override`` per dim: (backend name or None, options or None)."""


class Space(Protocol):
    """What fmesh knows of one rank space it made DeviceMeshes over."""

    @property
    def flat(self) -> SharedRanks:
        """The rank map as torch's ``_flatten_rank_map``, one object shared by every
        DeviceMesh over it."""

    def coordinate(
        self, axes: Sequence[Modes], rank: int | None = None
    ) -> tuple[bool, tuple[int, ...] | None]:
        """(known, the coordinate of ``rank``, by default this process's) in a mesh of
        ``axes``; known is False where fmesh leaves the answer to torch (an invalid
        layout, or torch's own error)."""

    def groups(
        self, axes: Sequence[Modes], names: Sequence[str] | None, configs: BackendConfigs
    ) -> list[GroupSpec] | None:
        """This rank's group for each dim (``[]`` off the mesh), or ``None`` to let
        torch create them."""

    def in_view(self, axes: Sequence[Modes], offset: int) -> bool | None:
        """Whether this rank is in the instance of the mesh of ``axes`` that starts at
        index ``offset``; ``None`` where no instance of a mesh over this space does."""


class SharedRanks(Sequence[int]):
    """A rank map as torch's ``_flatten_rank_map`` holds it, one object shared by every
    DeviceMesh of a rank space, equal to and hashed as the tuple of its ranks.

    torch only compares it (``DeviceMesh.__eq__``, so every slice's ``mesh != root``
    check, and ``_concatenate``), hashes it and hands it to ``torch.compile``'s guards.
    Against itself ``==`` answers at once; the tuple of the whole world is built the
    first time something needs its values (a hash, a comparison with another tuple),
    once per space, not with each DeviceMesh. It pickles and copies as that plain tuple.
    """

    __slots__ = ("_hash", "_ranks", "_size")

    def __init__(self, size: int, ranks: tuple[int, ...] | None) -> None:
        self._size = size
        self._ranks = ranks
        """The ranks, or ``None`` for ``0..size-1`` not built yet."""
        self._hash: int | None = None

    @property
    def built(self) -> bool:
        """Whether the tuple of the ranks exists (given, or built by ``values``)."""
        return self._ranks is not None

    def values(self) -> tuple[int, ...]:
        """The ranks as a tuple (built once: two threads at once build equal ones)."""
        ranks = self._ranks
        if ranks is None:
            ranks = self._ranks = tuple(range(self._size))
        return ranks

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        return self.values()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._size) if self._ranks is None else self._ranks)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, SharedRanks):
            return self._size == other._size and self.values() == other.values()
        if isinstance(other, tuple):
            return len(other) == self._size and self.values() == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self.values())
        return self._hash

    def __repr__(self) -> str:
        return repr(self.values())

    def __reduce__(self) -> tuple[Any, ...]:
        return tuple, (self.values(),)


_lock = threading.Lock()
_spaces: dict[int, tuple[weakref.ref[torch.Tensor], Space]] = {}
_by_storage: dict[int, int] = {}
"""The data pointer of a registered rank map's storage -> the rank map's id."""


def register_space(rank_map: torch.Tensor, space: Space) -> None:
    """Route torch's methods on every DeviceMesh over ``rank_map`` (this tensor object)
    through ``space``."""
    key = id(rank_map)
    ptr = rank_map.untyped_storage().data_ptr()

    # Bound now: at interpreter exit the module's globals may already be gone.
    def forget(
        ref: weakref.ref[torch.Tensor],
        key: int = key,
        ptr: int = ptr,
        lock: threading.Lock = _lock,
        spaces: dict[int, tuple[weakref.ref[torch.Tensor], Space]] = _spaces,
        by_storage: dict[int, int] = _by_storage,
    ) -> None:
        with lock:
            if key in spaces and spaces[key][0] is ref:
                del spaces[key]
                if by_storage.get(ptr) == key:
                    del by_storage[ptr]

    with _lock:
        _spaces[key] = (weakref.ref(rank_map, forget), space)
        if ptr:
            _by_storage[ptr] = key


def unregister_space(rank_map: torch.Tensor) -> None:
    """Stop routing DeviceMeshes over ``rank_map`` (the space holds the tensor, so
    without this neither would ever be freed)."""
    with _lock:
        entry = _spaces.get(id(rank_map))
        if entry is not None and entry[0]() is rank_map:
            del _spaces[id(rank_map)]
            ptr = rank_map.untyped_storage().data_ptr()
            if _by_storage.get(ptr) == id(rank_map):
                del _by_storage[ptr]


def space_of(rank_map: object) -> Space | None:
    """The space ``rank_map`` was registered with (``None``: not fmesh's)."""
    entry = _spaces.get(id(rank_map))
    if entry is None or entry[0]() is not rank_map:
        return None
    return entry[1]


View = tuple[Space, "torch.Tensor", list[Modes], int, bool]
"""A tensor seen as a mesh of a registered space: (space, its rank map, the tensor's
dims as modes over the rank map, the index of its first element, whether the tensor
lists the whole rank map in order)."""


def view_of(mesh: object) -> View | None:
    """The registered space ``mesh`` (a tensor given to ``DeviceMesh(device_type,
    mesh)``) is a view of, O(ndim): a CPU int tensor over a registered rank map's own
    storage (the whole of it, in any order, or one instance of a mesh over it, such
    as the row of a slice that ``slice.mesh`` returns). ``None`` for anything else
    (torch builds that mesh)."""
    import torch

    if type(mesh) is not torch.Tensor or mesh.device.type != "cpu" or mesh.ndim == 0:
        return None
    if mesh.dtype != torch.int or mesh.requires_grad:
        return None
    ptr = mesh.untyped_storage().data_ptr()
    key = _by_storage.get(ptr)
    entry = None if key is None else _spaces.get(key)
    base = None if entry is None else entry[0]()
    if entry is None or base is None or base.untyped_storage().data_ptr() != ptr:
        return None
    offset = int(mesh.storage_offset()) - int(base.storage_offset())
    if base.dtype != mesh.dtype or offset < 0 or mesh.numel() > base.numel():
        return None
    if base.ndim != 1 or not base.is_contiguous():
        return None
    axes: list[Modes] = [((int(s), int(d)),) for s, d in zip(mesh.shape, mesh.stride())]
    whole = mesh.is_contiguous() and mesh.numel() == base.numel()
    return entry[1], base, axes, offset, whole
