"""Every private torch name fmesh uses for DeviceMesh, gated where torch changed.

The DeviceMesh part of the compat package; what changed across torch 2.11-2.15:
``docs/design/device-mesh-internals.md``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from . import torch_version

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "GroupSpec",
    "Known",
    "Modes",
    "add_flatten",
    "device_mesh_axes",
    "device_mesh_rank_map",
    "init_fields",
    "layout_axes",
    "make_device_mesh",
    "probe_fields",
]

Modes = tuple[tuple[int, int], ...]
"""One axis as (size, stride) modes, row-major, as ``fmesh.Layout.modes``."""
GroupSpec = tuple[str, Any]
"""What a DeviceMesh needs of one dimension's group: its name and the group."""
Known = tuple[tuple[int, ...] | None, Sequence[int]]
"""What fmesh knows of a DeviceMesh it makes: this rank's coordinate (``None`` off the
mesh) and the root's rank map as torch's ``_flatten_rank_map`` (``SharedRanks``)."""


def _mesh_layout_module() -> Any:
    """``torch.distributed._mesh_layout``, typed loosely: its classes differ between
    torch 2.11 (one pycute layout) and 2.13+ (a tuple of ``_FlatLayout`` axes), and so
    do their stubs."""
    return importlib.import_module("torch.distributed._mesh_layout")


def _torch_layout(axes: Sequence[Modes]) -> Any:
    """torch's mesh layout for one dimension per entry of ``axes``.

    A size-1 axis (no modes) becomes a ``(1):(d)`` dimension with the stride a
    row-major root gives it (the span of the dimensions after it), as torch's
    ``init_device_mesh`` does; torch 2.11 refuses to slice a dimension with no stride.
    """
    dims: list[Modes] = []
    for i, modes in enumerate(axes):
        if not modes:
            after = [s * d for later in axes[i + 1 :] for s, d in later]
            modes = ((1, max(after, default=1)),)
        dims.append(modes)
    ml = _mesh_layout_module()
    if torch_version() >= (2, 13):
        return ml._MeshLayout(
            [ml._FlatLayout(tuple(s for s, _ in m), tuple(d for _, d in m)) for m in dims]
        )
    shape = tuple(m[0][0] if len(m) == 1 else tuple(s for s, _ in m) for m in dims)
    stride = tuple(m[0][1] if len(m) == 1 else tuple(d for _, d in m) for m in dims)
    return ml._MeshLayout(shape, stride)


def _flattened_layout(modes: Modes) -> Any:
    """The layout torch's ``_flatten`` computes for a 1-d mesh over ``modes``."""
    if torch_version() >= (2, 13):
        return _mesh_layout_module()._MeshLayout([_torch_layout([modes]).collapse()])
    layout = _torch_layout([((s, d),) for s, d in modes]).coalesce()
    return layout.nest() if len(layout) > 1 else layout


def _flat_modes(shape: object, stride: object) -> Modes:
    def flat(x: object) -> list[int]:
        if isinstance(x, int):
            return [x]
        assert isinstance(x, tuple)
        return [v for item in x for v in flat(item)]

    return tuple(zip(flat(shape), flat(stride), strict=True))


def device_mesh_axes(device_mesh: DeviceMesh) -> list[Modes]:
    """Each dimension of ``device_mesh`` as (size, stride) modes over its rank map."""
    return layout_axes(device_mesh._layout)


def layout_axes(layout: Any) -> list[Modes]:
    """Each dimension of a torch mesh layout as (size, stride) modes."""
    if torch_version() >= (2, 13):  # each axis a _FlatLayout: flat tuples of ints
        return [tuple(zip(ax.shape, ax.stride, strict=True)) for ax in layout]
    return [_flat_modes(layout[i].shape, layout[i].stride) for i in range(len(layout))]


def device_mesh_rank_map(device_mesh: DeviceMesh) -> tuple[int, ...]:
    """The rank map the layout of ``device_mesh`` indexes (its root's, for slices)."""
    return tuple(int(r) for r in device_mesh._rank_map.tolist())


_FIELDS_213 = frozenset(
    {
        "_coordinate_on_dim",
        "_device_type",
        "_flatten_mapping",
        "_flatten_rank_map",
        "_hash",
        "_layout",
        "_mesh_dim_names",
        "_pg_registry",
        "_rank",
        "_rank_map",
        "_root_mesh",
        "_thread_id",
    }
)
KNOWN_FIELDS = {(2, 13): _FIELDS_213, (2, 15): _FIELDS_213 | {"_preserve_rank_order"}}
"""What ``DeviceMesh.__init__`` sets, on the torch versions it was read off
(``tests/test_torch_layout.py`` reads it again on the torch that runs the tests)."""


@functools.cache
def init_fields() -> frozenset[str]:
    """The attributes ``DeviceMesh.__init__`` (without a backend) sets on this torch:
    known for the versions in ``KNOWN_FIELDS`` (a probe builds a DeviceMesh, which
    costs a process's first mesh about a millisecond), else read off a one-rank mesh."""
    known = KNOWN_FIELDS.get(torch_version())
    return known if known is not None else probe_fields()


def probe_fields() -> frozenset[str]:
    """The attributes ``DeviceMesh.__init__`` (without a backend) sets, read off a
    one-rank mesh."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    probe = DeviceMesh(
        "cpu",
        _layout=_torch_layout([((1, 1),)]),
        _rank_map=torch.zeros(1, dtype=torch.int),
        _init_backend=False,
        _rank=0,
    )
    return frozenset(vars(probe))


def make_device_mesh(
    device_type: str,
    axes: Sequence[Modes],
    rank_map: torch.Tensor,
    names: tuple[Any, ...] | None,
    groups: Sequence[GroupSpec] | None,
    root: DeviceMesh | None,
    known: Known | None = None,
) -> DeviceMesh:
    """A DeviceMesh over ``rank_map`` with ``axes``, using existing groups.

    ``groups`` is one (name, group) per dimension for a member rank, or ``None`` on
    a rank outside the mesh (torch's non-participating rank: no groups). ``root`` is
    the root mesh this one is a slice of, or ``None`` to make a root. ``names`` is
    ``None`` for an unnamed mesh (as ``init_device_mesh`` without names makes).

    With ``known`` the DeviceMesh is assembled field by field, as ``__init__`` would,
    without its O(world) searches (tests compare both on every torch version).
    """
    import threading

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    dm: DeviceMesh | None = None
    if known is not None:
        threaded = dist.is_initialized() and dist.get_backend() == "threaded"
        fields = dict(
            _device_type=device_type,
            _layout=_torch_layout(axes),
            _rank_map=rank_map,
            _mesh_dim_names=tuple(names) if names else None,
            _root_mesh=root,
            _flatten_rank_map=known[1],
            _thread_id=threading.get_ident() if threaded else None,
            _flatten_mapping={},
            _pg_registry={},
            _rank=dist.get_rank(),
            _coordinate_on_dim=known[0],
            _hash=None,  # torch 2.13+
            _preserve_rank_order=False,  # torch 2.15: __init__'s default
        )
        init = init_fields()  # only the fields this torch sets; if it sets more: __init__
        if init <= fields.keys():
            dm = DeviceMesh.__new__(DeviceMesh)
            cast(Any, dm).__dict__.update((k, v) for k, v in fields.items() if k in init)
    if dm is None:
        dm = DeviceMesh(
            device_type,
            _layout=_torch_layout(axes),
            _rank_map=rank_map,
            mesh_dim_names=names,
            _root_mesh=root,
            _init_backend=False,
        )
    registry = (root if root is not None else dm)._pg_registry
    cast(Any, dm)._dim_group_names = [name for name, _ in groups or ()]
    for name, pg in groups or ():
        registry[name] = pg
    return dm


def add_flatten(
    root: DeviceMesh, name: str, modes: Modes, group: GroupSpec, coordinate: int | None
) -> bool:
    """Register an existing 1-d group where torch's ``_flatten`` looks first.

    Afterwards ``submesh._flatten(name)`` over the same layout returns this mesh and
    its group instead of creating new groups. Returns False (and registers nothing)
    when ``name`` is a dimension of ``root`` or already names another layout.
    ``coordinate`` is this rank's position along the flattened axis (``None`` off it).
    """
    if name in (root.mesh_dim_names or ()):
        return False
    layout = _flattened_layout(modes)
    known = root._flatten_mapping.get(name)
    if known is not None:
        return bool(known._layout == layout)
    facts = (None if coordinate is None else (coordinate,), root._flatten_rank_map)
    flat = make_device_mesh(
        root.device_type, [modes], root._rank_map, (name,), [group], root, facts
    )
    flat._layout = layout
    root._flatten_mapping[name] = flat
    return True
