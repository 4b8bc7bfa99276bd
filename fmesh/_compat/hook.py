"""torch's own DeviceMesh methods on fmesh's meshes, routed through fmesh.

Every DeviceMesh torch derives (``__getitem__``, ``_flatten``, ``_unflatten``,
``_concatenate``) is built by ``DeviceMesh.__init__`` over its root's rank-map tensor,
and every group torch makes for it comes from ``DeviceMesh._init_process_groups``.
Both are wrapped here, once per process, when fmesh hands out its first DeviceMesh.
A call whose rank map is one fmesh registered (``register_space``) is answered by
fmesh: fields from fmesh's coordinates (no O(world) search) and groups through
``fmesh.realize``. So is ``DeviceMesh(device_type, tensor)`` where the tensor is a
view of the whole of a registered rank map (FSDP2's ``mesh.mesh.view(-1, r)``;
:func:`view_of`): its groups come from ``fmesh.realize``. Any other call goes to the
function that was there before (torch's, or a wrapper another library installed
earlier).

Off with ``FMESH_TORCH_HOOK=0`` (or ``false``, ``off``, ``no``) in the environment, read
when fmesh first hands out a DeviceMesh; never installed on a torch outside 2.11-2.15.
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
    "uninstall",
    "unregister_space",
    "view_of",
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

    def coordinate(self, axes: Sequence[Modes]) -> tuple[bool, tuple[int, ...] | None]:
        """(known, this rank's coordinate) in a mesh of ``axes``; known is False where
        fmesh leaves the answer to torch (an invalid layout, or torch's own error)."""

    def groups(
        self, axes: Sequence[Modes], names: Sequence[str] | None, configs: BackendConfigs
    ) -> list[GroupSpec] | None:
        """This rank's group for each dim (``[]`` off the mesh), or ``None`` to let
        torch create them."""

    def in_view(self, axes: Sequence[Modes], offset: int) -> bool | None:
        """Whether this rank is in the instance of the mesh of ``axes`` that starts at
        index ``offset``; ``None`` where no instance of a mesh over this space does."""


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
_by_storage: dict[int, int] = {}
"""The data pointer of a registered rank map's storage -> the rank map's id."""
_installed = False


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


def installed() -> bool:
    return _installed


def supported(version: tuple[int, int]) -> bool:
    """Whether the wrappers know the DeviceMesh internals of this torch version."""
    return SUPPORTED[0] <= version <= SUPPORTED[1]


_HOOK_OFF = ("0", "false", "off", "no")
_HOOK_ON = ("1", "true", "on", "yes")


def hook_enabled(value: str | None) -> bool:
    """``FMESH_TORCH_HOOK``'s value as a switch: unset or empty is on; the usual
    spellings of on and off in any case, spaces trimmed; anything else a ValueError
    (not a MeshError: _compat sits beside _core, and this is no mesh's fault)."""
    word = (value or "").strip().lower()
    if word in ("", *_HOOK_ON):
        return True
    if word in _HOOK_OFF:
        return False
    raise ValueError(
        f"FMESH_TORCH_HOOK={value!r} is not a switch: {', '.join(_HOOK_OFF)} turn the "
        f"routing of torch's DeviceMesh methods through fmesh off, {', '.join(_HOOK_ON)} "
        "(or unset, the default) keep it on; any case"
    )


def install() -> bool:
    """Wrap ``DeviceMesh.__init__`` and ``_init_process_groups`` once per process.
    Returns whether routing is installed (not on unknown torch versions, nor with
    ``FMESH_TORCH_HOOK`` off: ``0``, ``false``, ``off``, ``no``)."""
    global _installed
    if not hook_enabled(os.environ.get("FMESH_TORCH_HOOK")):
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


_VIEW_KWARGS = frozenset({"mesh_dim_names", "backend_override", "_init_backend", "_rank"})


def _wrap_init(previous: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(previous)
    def __init__(
        self: Any, device_type: str, mesh: Any = None, *args: Any, **kwargs: Any
    ) -> None:
        if mesh is None and not args and kwargs.keys() <= _INIT_KWARGS:
            space = space_of(kwargs.get("_rank_map"))
            if space is not None and _fast_init(self, space, device_type, kwargs):
                return
        elif mesh is not None and not args and kwargs.keys() <= _VIEW_KWARGS:
            view = view_of(mesh)
            if view is not None and _view_init(
                self, previous, view, device_type, mesh, kwargs
            ):
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
    known, coordinate = space.coordinate(axes)
    if not known:
        return False
    names = kwargs.get("mesh_dim_names")
    root = kwargs.get("_root_mesh")
    rank = kwargs.get("_rank")
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


def _view_init(
    dm: Any,
    previous: Callable[..., None],
    view: View,
    device_type: str,
    mesh: Any,
    kwargs: dict[str, Any],
) -> bool:
    """``DeviceMesh(device_type, mesh)`` over a view of a registered space: torch's
    ``__init__`` sets the fields (no groups), fmesh makes the groups. A view listing
    the rank map in order shares the space's rank map, so the meshes torch derives
    from it are routed too. Any other view is realized as the mesh of its layout over
    the space on every rank (so ranks that each pass their own instance, as FSDP2
    does with a slice's ``mesh``, make one agreed call), and a rank outside the given
    instance gets no groups, as on torch. False (nothing done) where torch should
    build it all."""
    import torch.distributed as dist

    space, base, axes, offset, in_order = view
    if device_type == "xla" or not dist.is_initialized() or _torchcomms():
        return False
    if dist.get_backend() == "threaded" or kwargs.get("_rank") not in (None, dist.get_rank()):
        return False
    member = space.in_view(axes, offset)
    if member is None:
        return False
    init_backend = kwargs.get("_init_backend", True)
    previous(dm, device_type, mesh, **{**kwargs, "_init_backend": False})
    if in_order:  # the same ranks in the same order: the space's own rank map
        dm._rank_map, dm._flatten_rank_map = base, space.flat
    if not init_backend:
        return True
    dm._setup_world_group_and_device()
    overrides = kwargs.get("backend_override") or ((None, None),) * len(axes)
    specs = None if in_order else space.groups(axes, dm._mesh_dim_names, overrides)
    if specs is not None:
        names = [name for name, _ in specs] if member else []
    else:
        names = type(dm)._init_process_groups(
            dm._layout, dm._rank_map, dm._mesh_dim_names, overrides
        )
    dm._dim_group_names = names
    for name in names:
        pg = _resolve(name)
        if pg is not None:
            dm._pg_registry[name] = pg
    return True


def _resolve(name: str) -> Any:
    from torch.distributed import distributed_c10d

    return cast(Any, distributed_c10d)._resolve_process_group(name)


def uninstall() -> bool:
    """Undo :func:`install` (``fmesh plan`` leaves torch as it found it). Returns
    False, changing nothing, when the methods are no longer fmesh's wrappers (another
    library wrapped them since); True when nothing of fmesh's is installed after it."""
    global _installed
    with _lock:
        if not _installed:
            return True
        from torch.distributed.device_mesh import DeviceMesh

        cls: Any = DeviceMesh
        init = cls.__dict__["__init__"]
        groups = cls.__dict__["_init_process_groups"].__func__
        ours = (
            getattr(init, "__code__", None) is _wrap_init(_noop).__code__
            and getattr(groups, "__code__", None) is _wrap_groups(_noop).__code__
        )
        if not ours:
            return False
        cls.__init__ = init.__wrapped__
        cls._init_process_groups = staticmethod(groups.__wrapped__)
        _installed = False
    return True


def _noop(*args: Any, **kwargs: Any) -> Any:
    """A stand-in to wrap: its wrapper has the code object fmesh's wrappers share."""
