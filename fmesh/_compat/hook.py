"""torch's own DeviceMesh methods on fmesh's meshes, routed through fmesh.

Every DeviceMesh torch derives (``__getitem__``, ``_flatten``, ``_unflatten``,
``_concatenate``) is built by ``DeviceMesh.__init__`` over its root's rank-map tensor,
and every group torch makes for it comes from ``DeviceMesh._init_process_groups``.
Both are wrapped here, once per process, when fmesh hands out its first DeviceMesh.
A call whose rank map is one fmesh registered (:func:`register_space`) is answered by
fmesh: fields from fmesh's coordinates (no O(world) search) and groups through
``fmesh.realize``. Any other call goes to the function that was there before
(torch's, or a wrapper another library installed earlier).

Off with ``FMESH_TORCH_HOOK=0`` in the environment (read when fmesh first hands out
a DeviceMesh); never installed on a torch outside 2.11-2.15.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from .c10d import torch_version
from .mesh import GroupSpec, Modes, init_fields, layout_axes

if TYPE_CHECKING:
    import torch

__all__ = [
    "RankTuple",
    "Space",
    "install",
    "installed",
    "register_space",
    "space_of",
    "supported",
]

SUPPORTED = ((2, 11), (2, 15))
"""The torch versions whose DeviceMesh internals the wrappers know (inclusive)."""

BackendConfigs = Sequence[tuple[Any, Any]]
"""torch's ``backend_override`` per dim: (backend name or None, options or None)."""


class Space(Protocol):
    """What fmesh knows of one rank space it made DeviceMeshes over."""

    @property
    def flat(self) -> tuple[int, ...]:
        """The rank map as a tuple (torch's ``_flatten_rank_map``), one object shared
        by every DeviceMesh over it."""

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


class RankTuple(tuple[int, ...]):
    """A rank map shared by every DeviceMesh of a root: equal to itself at once and
    hashed once (a plain tuple compares and hashes all of its O(world) items each
    time torch checks ``mesh != root`` or hashes a mesh). Pickles as a plain tuple."""

    def __eq__(self, other: object) -> bool:
        return self is other or tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return self is not other and tuple.__ne__(self, other)

    def __hash__(self) -> int:
        cached: int | None = self.__dict__.get("hash")
        if cached is None:
            cached = self.__dict__["hash"] = tuple.__hash__(self)
        return cached

    def __reduce__(self) -> tuple[Any, ...]:
        return tuple, (tuple(self),)


_lock = threading.Lock()
_spaces: dict[int, tuple[weakref.ref[torch.Tensor], Space]] = {}
_installed = False


def register_space(rank_map: torch.Tensor, space: Space) -> None:
    """Route torch's methods on every DeviceMesh over ``rank_map`` (this tensor object)
    through ``space``."""
    key = id(rank_map)

    # Bound now: at interpreter exit the module's globals may already be gone.
    def forget(
        ref: weakref.ref[torch.Tensor],
        key: int = key,
        lock: threading.Lock = _lock,
        spaces: dict[int, tuple[weakref.ref[torch.Tensor], Space]] = _spaces,
    ) -> None:
        with lock:
            if key in spaces and spaces[key][0] is ref:
                del spaces[key]

    with _lock:
        _spaces[key] = (weakref.ref(rank_map, forget), space)


def space_of(rank_map: object) -> Space | None:
    """The space ``rank_map`` was registered with (``None``: not fmesh's)."""
    entry = _spaces.get(id(rank_map))
    if entry is None or entry[0]() is not rank_map:
        return None
    return entry[1]


def installed() -> bool:
    return _installed


def supported(version: tuple[int, int]) -> bool:
    """Whether the wrappers know the DeviceMesh internals of this torch version."""
    return SUPPORTED[0] <= version <= SUPPORTED[1]


def install() -> bool:
    """Wrap ``DeviceMesh.__init__`` and ``_init_process_groups`` once per process.
    Returns whether routing is installed (not on unknown torch versions, nor with
    ``FMESH_TORCH_HOOK=0``)."""
    global _installed
    if os.environ.get("FMESH_TORCH_HOOK", "1") == "0":
        return False
    if not supported(torch_version()):
        return False
    with _lock:
        if _installed:
            return True
        from torch.distributed.device_mesh import DeviceMesh

        cls: Any = DeviceMesh
        cls.__init__ = _wrap_init(cls.__init__)
        groups = cls.__dict__["_init_process_groups"]
        cls._init_process_groups = staticmethod(_wrap_groups(groups.__func__))
        _installed = True
    return True


def _torchcomms() -> bool:
    import torch.distributed as dist

    config = getattr(dist, "config", None)
    return bool(getattr(config, "use_torchcomms", False))


def _wrap_groups(previous: Callable[..., list[str]]) -> Callable[..., list[str]]:
    @functools.wraps(previous)
    def _init_process_groups(
        layout: Any,
        rank_map: Any,
        mesh_dim_names: Sequence[str] | None,
        backend_override: BackendConfigs,
        *args: Any,
        **kwargs: Any,
    ) -> list[str]:
        space = space_of(rank_map)
        if space is not None and not _torchcomms():
            specs = space.groups(layout_axes(layout), mesh_dim_names, backend_override)
            if specs is not None:
                return [name for name, _ in specs]
        return previous(layout, rank_map, mesh_dim_names, backend_override, *args, **kwargs)

    return _init_process_groups


_INIT_KWARGS = frozenset(
    {
        "mesh_dim_names",
        "backend_override",
        "_init_backend",
        "_rank",
        "_layout",
        "_rank_map",
        "_root_mesh",
        "preserve_rank_order",  # torch 2.15
    }
)


def _wrap_init(previous: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(previous)
    def __init__(
        self: Any, device_type: str, mesh: Any = None, *args: Any, **kwargs: Any
    ) -> None:
        if mesh is None and not args and kwargs.keys() <= _INIT_KWARGS:
            space = space_of(kwargs.get("_rank_map"))
            if space is not None and _fast_init(self, space, device_type, kwargs):
                return
        previous(self, device_type, mesh, *args, **kwargs)

    return __init__


def _fast_init(dm: Any, space: Space, device_type: str, kwargs: dict[str, Any]) -> bool:
    """Set what ``DeviceMesh.__init__`` sets, from fmesh's facts; False (nothing set)
    where torch's own ``__init__`` should run instead."""
    import torch.distributed as dist

    layout = kwargs.get("_layout")
    if layout is None or device_type == "xla" or not dist.is_initialized():
        return False
    if dist.get_backend() == "threaded" or _torchcomms():
        return False
    axes = layout_axes(layout)
    rank = kwargs.get("_rank")
    known, coordinate = space.coordinate(axes, rank)
    if not known:
        return False
    names = kwargs.get("mesh_dim_names")
    root = kwargs.get("_root_mesh")
    fields: dict[str, Any] = dict(
        _device_type=device_type,
        _layout=layout,
        _rank_map=kwargs["_rank_map"],
        _mesh_dim_names=tuple(names) if names else None,
        _root_mesh=root,
        _flatten_rank_map=space.flat,
        _thread_id=None,
        _flatten_mapping={},
        _pg_registry={},
        _rank=dist.get_rank() if rank is None else rank,
        _coordinate_on_dim=coordinate,
        _hash=None,  # torch 2.13+
        _preserve_rank_order=kwargs.get("preserve_rank_order", False),  # torch 2.15
    )
    wanted = init_fields()
    if not wanted <= fields.keys():
        return False  # this torch sets more than fmesh knows of: let __init__ run
    init_backend = kwargs.get("_init_backend", True)
    overrides = kwargs.get("backend_override") or ((None, None),) * len(axes)
    if len(overrides) != len(axes):
        return False  # torch raises its own ValueError
    dm.__dict__.update((k, v) for k, v in fields.items() if k in wanted)
    if init_backend:
        dm._setup_world_group_and_device()
        extra = (
            {"preserve_rank_order": fields["_preserve_rank_order"]}
            if torch_version() >= (2, 15)
            else {}
        )
        group_names = type(dm)._init_process_groups(
            layout, kwargs["_rank_map"], dm._mesh_dim_names, overrides, **extra
        )
        dm._dim_group_names = group_names
        registry = (root if root is not None else dm)._pg_registry
        for name in group_names:
            pg = _resolve(name)
            if pg is not None:
                registry[name] = pg
    return True


def _resolve(name: str) -> Any:
    from torch.distributed import distributed_c10d

    return cast(Any, distributed_c10d)._resolve_process_group(name)
