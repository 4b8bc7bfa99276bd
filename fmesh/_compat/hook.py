"""torch's own DeviceMesh methods on fmesh's meshes, routed through fmesh.

Every DeviceMesh torch derives (``__getitem__``, ``_flatten``, ``_unflatten``,
``_concatenate``) is built by ``DeviceMesh.__init__`` over its root's rank-map tensor,
and every group torch makes for it comes from ``DeviceMesh._init_process_groups``.
Both are wrapped here, once per process, when fmesh hands out its first DeviceMesh.
A call whose rank map is one fmesh registered (``register_space``) is answered by
fmesh: fields from fmesh's coordinates (no O(world) search) and groups through
``fmesh.realize``. So is ``DeviceMesh(device_type, tensor)`` where the tensor is a
view of the whole of a registered rank map (FSDP2's ``mesh.mesh.view(-1, r)``;
``view_of``): its groups come from ``fmesh.realize``. Any other call goes to the
function that was there before (torch's, or a wrapper another library installed
earlier).

Off with ``FMESH_TORCH_HOOK=0`` (or ``false``, ``off``, ``no``) in the environment, read
when fmesh first hands out a DeviceMesh; never installed on a torch outside 2.11-2.15.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

from .c10d import torch_version
from .mesh import init_fields, layout_axes
from .spaces import (
    BackendConfigs,
    SharedRanks,
    Space,
    View,
    register_space,
    space_of,
    unregister_space,
    view_of,
)

__all__ = [
    "SharedRanks",
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

_lock = threading.Lock()
"""Guards installing and uninstalling the wrappers."""
_installed = False


def installed() -> bool:
    return _installed


def supported(version: tuple[int, int]) -> bool:
    """Whether the wrappers know the DeviceMesh internals of this torch version."""
    return SUPPORTED[0] <= version <= SUPPORTED[1]


_OFF = ("0", "false", "off", "no")
_ON = ("1", "true", "on", "yes")


def switch(name: str, value: str | None, on_means: str, off_means: str) -> bool:
    """An environment variable's value as a switch: unset or empty is on; the usual
    spellings of on and off in any case, spaces trimmed; anything else a ValueError
    (not a MeshError: _compat sits beside _core, and this is no mesh's fault)."""
    word = (value or "").strip().lower()
    if word in ("", *_ON):
        return True
    if word in _OFF:
        return False
    raise ValueError(
        f"{name}={value!r} is not a switch: {', '.join(_OFF)} {off_means}, "
        f"{', '.join(_ON)} (or unset, the default) {on_means}; any case"
    )


def hook_enabled(value: str | None) -> bool:
    """``FMESH_TORCH_HOOK``'s value as a switch (``switch``)."""
    return switch(
        "FMESH_TORCH_HOOK",
        value,
        "keep it on",
        "turn the routing of torch's DeviceMesh methods through fmesh off",
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
    """Undo ``install`` (``fmesh plan`` leaves torch as it found it). Returns
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
