"""Every private torch name fmesh uses, in one place, gated where torch changed.

fmesh supports torch 2.11 through 2.15. Everything here reaches into torch internals
(names that start with an underscore, or attributes torch does not document); the
rest of the package calls these small typed functions and torch's public API only,
and ``tests/test_static.py`` fails if a private torch name appears anywhere else.

What changed across the range, and where it matters:

* ``_new_process_group_helper`` returns ``ProcessGroup | Literal[-100]`` (2.14) or a
  ``_NonGroupMember`` (2.15) for non-members instead of ``None`` (2.11-2.13).
* ``split_group`` takes ``backend=`` from 2.13 on; 2.15 returns a non-member sentinel.
* ``shrink_group`` (NCCL communicator shrink) is used where it exists and the
  group's backend says it supports shrinking.
* ``DeviceMesh._layout`` is a pycute layout with nested modes on 2.11 and a tuple of
  ``_FlatLayout`` axes from 2.13 on; flattened layouts normalize differently.
* ``DeviceMesh.__init__`` sets ``_hash`` from 2.13 on and ``_preserve_rank_order``
  from 2.15 on; fmesh assembles exactly the fields the installed torch sets.
"""

from __future__ import annotations

import datetime
import functools
import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch
    from torch._C._distributed_c10d import Backend as _C10dBackend
    from torch._C._distributed_c10d import Store
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Placement

__all__ = [
    "BackendOptions",
    "GroupSpec",
    "Known",
    "backend_options_type",
    "debug_detail",
    "Store",
    "add_flatten",
    "default_store",
    "default_timeout",
    "device_mesh_axes",
    "device_mesh_rank_map",
    "explicit_shard_order",
    "fake_store",
    "init_fake_world",
    "is_live",
    "make_device_mesh",
    "memory_store",
    "new_named_group",
    "shrink_from",
    "split_from_world",
    "strided_shard",
    "strided_shard_parts",
    "torch_version",
]

Modes = tuple[tuple[int, int], ...]
"""One axis as (size, stride) modes, row-major, as ``fmesh.Layout.modes``."""
if TYPE_CHECKING:
    BackendOptions = _C10dBackend.Options
    """Options for a c10d backend (e.g. ``ProcessGroupNCCL.Options``)."""
GroupSpec = tuple[str, Any]
"""What a DeviceMesh needs of one dimension's group: its name and the group."""
Known = tuple[tuple[int, ...] | None, tuple[int, ...]]
"""What fmesh knows of a DeviceMesh it makes: this rank's coordinate (``None`` off the
mesh) and the root's rank map as a tuple (torch's ``_flatten_rank_map``)."""


@functools.cache
def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch."""
    import torch

    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


# -- c10d -------------------------------------------------------------------------------


def backend_options_type() -> type:
    """torch's class of backend options (``ProcessGroupNCCL.Options`` derives from it)."""
    from torch._C._distributed_c10d import Backend

    return Backend.Options


def default_store() -> Store:
    """The default group's store (where torch's own rendezvous keys live)."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


def memory_store() -> Store:
    """A new in-process store (torch's ``HashStore``): rendezvous with nobody else."""
    from torch._C._distributed_c10d import HashStore

    return HashStore()


def default_timeout(backend: str) -> datetime.timedelta:
    """torch's default creation/collective timeout for ``backend``."""
    from torch.distributed import Backend
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_timeout(Backend(backend))


def debug_detail() -> bool:
    """torch's own debug switch is at DETAIL (``TORCH_DISTRIBUTED_DEBUG=DETAIL``)."""
    from torch._C._distributed_c10d import DebugLevel, get_debug_level

    return bool(get_debug_level() == DebugLevel.DETAIL)


def is_live(pg: ProcessGroup) -> bool:
    """Whether torch still holds ``pg`` (not destroyed)."""
    from torch.distributed import distributed_c10d as c10d

    return pg in c10d._world.pg_map


def _member_or_none(pg: object) -> ProcessGroup | None:
    from torch.distributed import ProcessGroup

    return pg if isinstance(pg, ProcessGroup) else None


def new_named_group(
    ranks: Sequence[int],
    me: int,
    backend: str,
    options: object,
    timeout: datetime.timedelta,
    name: str,
    desc: str,
    store: Store | None,
) -> ProcessGroup | None:
    """Create one group, ranks in the order given (never sorted), under our name.

    torch's own local-synchronization names hash the number of groups a process
    already holds, which differs between ranks of different meshes and would split the
    rendezvous; so fmesh names groups itself through torch's group constructor.
    Non-members get ``None``. ``store`` defaults to the default group's store.
    """
    from torch.distributed import Backend, group
    from torch.distributed import distributed_c10d as c10d

    world = group.WORLD
    assert world is not None  # realize initialized it
    pg, _ = c10d._new_process_group_helper(
        len(ranks),
        ranks.index(me) if me in ranks else -1,
        list(ranks),
        Backend(backend),
        store if store is not None else c10d._get_default_store(),
        group_name=c10d.GroupName(name),
        backend_options=options,
        timeout=timeout,
        group_desc=desc,
        device_id=world.bound_device_id,
    )
    member = _member_or_none(pg)
    if member is None or me not in ranks:
        return None
    # Keep coordinate order: torch reads group ranks from this table.
    c10d._world.pg_group_ranks[member] = {g: i for i, g in enumerate(ranks)}
    return member


def split_from_world(
    ranks: Sequence[int],
    backend: str,
    options: object,
    timeout: datetime.timedelta | None,
    desc: str,
) -> ProcessGroup | None:
    """``split_group`` of the eagerly initialized world (sorts ranks; collective).

    torch 2.11's ``split_group`` takes no ``backend``: the new group splits the world's
    NCCL communicator and keeps the world's backends.
    """
    import torch.distributed as dist

    kwargs: dict[str, Any] = {}
    if torch_version() >= (2, 13):
        kwargs["backend"] = backend
    pg = dist.split_group(
        split_ranks=[list(ranks)],
        timeout=timeout,
        pg_options=cast(Any, options),
        group_desc=desc,
        **kwargs,
    )
    return _member_or_none(pg)


def shrink_from(parent: ProcessGroup, exclude: Sequence[int]) -> ProcessGroup | None:
    """``shrink_group`` of ``parent`` without its group ranks ``exclude`` (NCCL's
    communicator shrink: no new rendezvous), or ``None`` where torch or the backend
    cannot shrink it. The remaining ranks keep their order."""
    import torch
    import torch.distributed as dist

    shrink = getattr(dist, "shrink_group", None)
    if shrink is None:
        return None
    try:
        device = parent.bound_device_id or torch.device("cuda")
        backend: Any = parent._get_backend(device)
        if not getattr(backend, "supports_shrinking", False):  # not in every version
            return None
    except (RuntimeError, AttributeError):
        return None
    return _member_or_none(shrink(list(exclude), group=parent))


def fake_store() -> Store:
    """A store for torch's ``fake`` backend (one process plays one rank).

    Importing torch's fake_pg module registers the ``fake`` backend.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def init_fake_world(rank: int, world: int) -> None:
    """Initialize the default process group on torch's ``fake`` backend."""
    import torch.distributed as dist

    dist.init_process_group("fake", store=fake_store(), rank=rank, world_size=world)


# -- DeviceMesh -------------------------------------------------------------------------


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
    layout: Any = device_mesh._layout
    if torch_version() >= (2, 13):
        return [_flat_modes(ax.shape, ax.stride) for ax in layout]
    return [_flat_modes(layout[i].shape, layout[i].stride) for i in range(len(layout))]


def device_mesh_rank_map(device_mesh: DeviceMesh) -> tuple[int, ...]:
    """The rank map the layout of ``device_mesh`` indexes (its root's, for slices)."""
    return tuple(int(r) for r in device_mesh._rank_map.tolist())


@functools.cache
def _init_fields() -> frozenset[str]:
    """The attributes ``DeviceMesh.__init__`` (without a backend) sets on this torch,
    read once off a one-rank mesh."""
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
    names: tuple[str, ...] | None,
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
        init = _init_fields()  # only the fields this torch sets; if it sets more: __init__
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


# -- DTensor ----------------------------------------------------------------------------
# ``_StridedShard`` and ``DTensorSpec.shard_order`` are the same on torch 2.11-2.15.


def strided_shard(dim: int, split_factor: int) -> Placement:
    """DTensor's ``_StridedShard(dim, split_factor=split_factor)``."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard(dim, split_factor=split_factor)


def strided_shard_parts(placement: Placement) -> tuple[int, int] | None:
    """``(dim, split_factor)`` of a ``_StridedShard``; ``None`` for any other placement."""
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(placement, _StridedShard):
        return None
    return int(placement.dim), int(placement.split_factor)


def explicit_shard_order(dtensor: DTensor) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """The DTensor's shard order when its spec carries one that its placements do not
    show: plain ``Shard`` placements applied in a non-ascending mesh-dim order.

    ``None`` when the order is the default (ascending mesh dims per tensor dim) or is
    encoded by ``_StridedShard`` placements. ``DTensorSpec.shard_order`` and
    ``use_strided_shard_as_shard_order`` exist on torch 2.11 through 2.15.
    """
    spec = dtensor._spec
    if spec.use_strided_shard_as_shard_order or spec.shard_order is None:
        return None
    order = tuple(
        (int(e.tensor_dim), tuple(int(m) for m in e.mesh_dims)) for e in spec.shard_order
    )
    if all(list(mesh_dims) == sorted(mesh_dims) for _, mesh_dims in order):
        return None
    return order
